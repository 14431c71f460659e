//! The proto2 and parity rules, provoked with hand-built bytes.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

use wire::{DecodeErrorKind, Packet};

/// Minimal protobuf writer for building packets byte by byte.
fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}
fn key(number: u64, wire_type: u8) -> Vec<u8> {
    let mut out = Vec::new();
    varint(number << 3 | u64::from(wire_type), &mut out);
    out
}
fn f_varint(number: u64, v: u64) -> Vec<u8> {
    let mut out = key(number, 0);
    varint(v, &mut out);
    out
}
fn f_fixed64(number: u64, v: u64) -> Vec<u8> {
    let mut out = key(number, 1);
    out.extend_from_slice(&v.to_le_bytes());
    out
}
fn f_fixed32(number: u64, v: u32) -> Vec<u8> {
    let mut out = key(number, 5);
    out.extend_from_slice(&v.to_le_bytes());
    out
}
fn f_len(number: u64, body: &[u8]) -> Vec<u8> {
    let mut out = key(number, 2);
    varint(body.len() as u64, &mut out);
    out.extend_from_slice(body);
    out
}
fn f_group(number: u64, body: &[u8]) -> Vec<u8> {
    let mut out = key(number, 3);
    out.extend_from_slice(body);
    out.extend(key(number, 4));
    out
}
fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

fn sha(fill: u64) -> Vec<u8> {
    cat(&[
        f_fixed64(1, fill),
        f_fixed64(2, fill),
        f_fixed64(3, fill),
        f_fixed64(4, fill),
    ])
}

fn signature() -> Vec<u8> {
    (1..=8)
        .map(|n| f_fixed64(n, 1))
        .collect::<Vec<_>>()
        .concat()
}

const KEY_HEX: &str = "034f355bdcb7cc0af728ef3cceb9615d90684bb5b2ca5f859ab0f0b704075871aa";

fn chain_pubkey(extra: &[u8]) -> Vec<u8> {
    cat(&[f_len(1, &hex::decode(KEY_HEX).unwrap()), extra.to_vec()])
}

fn auth(node_id_extra: &[u8], auth_extra: &[u8]) -> Vec<u8> {
    let body = cat(&[
        f_len(1, &chain_pubkey(node_id_extra)),
        f_len(2, &signature()),
        auth_extra.to_vec(),
    ]);
    f_len(50, &body)
}

fn update(sha_extra: &[u8]) -> Vec<u8> {
    let body = cat(&[
        f_len(1, &cat(&[sha(7), sha_extra.to_vec()])),
        f_varint(2, 5),
    ]);
    f_len(1, &body)
}

fn err_kind(bytes: &[u8]) -> (DecodeErrorKind, Vec<&'static str>) {
    let e = Packet::decode(bytes).expect_err("must be rejected");
    (e.kind().clone(), e.path().to_vec())
}

#[test]
fn baseline_packets_decode() {
    assert!(matches!(
        Packet::decode(&auth(&[], &[])),
        Ok(Packet::Auth(_))
    ));
    assert!(matches!(Packet::decode(&update(&[])), Ok(Packet::Update(u)) if u.delta_msat == -3));
}

#[test]
fn unknown_even_field_fails_at_every_level_and_is_named() {
    // In pkt itself.
    let (kind, path) = err_kind(&cat(&[update(&[]), f_varint(42, 1)]));
    assert_eq!(
        kind,
        DecodeErrorKind::UnknownEvenField {
            message: "pkt",
            field: 42
        }
    );
    assert!(path.is_empty());

    // In authenticate.
    let (kind, path) = err_kind(&auth(&[], &f_varint(4, 1)));
    assert_eq!(
        kind,
        DecodeErrorKind::UnknownEvenField {
            message: "authenticate",
            field: 4
        }
    );
    assert_eq!(path, ["auth"]);

    // In authenticate.node_id (chain_pubkey).
    let bytes = auth(&f_len(2, b"x"), &[]);
    let e = Packet::decode(&bytes).unwrap_err();
    assert_eq!(
        *e.kind(),
        DecodeErrorKind::UnknownEvenField {
            message: "chain_pubkey",
            field: 2
        }
    );
    assert_eq!(e.path(), ["auth", "node_id"]);
    let text = e.to_string();
    assert!(
        text.contains("chain_pubkey") && text.contains('2') && text.contains("pkt.auth.node_id"),
        "{text}"
    );

    // In a sha256_hash three levels down, with a large field number.
    let (kind, path) = err_kind(&update(&f_fixed64(1_000_000, 9)));
    assert_eq!(
        kind,
        DecodeErrorKind::UnknownEvenField {
            message: "sha256_hash",
            field: 1_000_000
        }
    );
    assert_eq!(path, ["update", "revocation_hash"]);
}

#[test]
fn unknown_odd_fields_of_every_wire_type_are_ignored_at_every_level() {
    let odd = cat(&[
        f_varint(5, u64::MAX),
        f_fixed64(7, 3),
        f_len(9, b"anything at all"),
        f_fixed32(11, 4),
        f_group(
            13,
            &cat(&[f_varint(2, 1), f_group(3, &f_len(4, b"nested"))]),
        ),
    ]);
    let plain = Packet::decode(&auth(&[], &[])).unwrap();
    assert_eq!(Packet::decode(&auth(&odd, &[])).unwrap(), plain);
    assert_eq!(Packet::decode(&auth(&[], &odd)).unwrap(), plain);
    assert_eq!(
        Packet::decode(&cat(&[auth(&[], &[]), f_varint(51, 0)])).unwrap(),
        plain
    );
    let plain = Packet::decode(&update(&[])).unwrap();
    assert_eq!(Packet::decode(&update(&odd)).unwrap(), plain);
}

#[test]
fn missing_required_fields_fail() {
    let (kind, _) = err_kind(&f_len(1, &f_len(1, &sha(1))));
    assert_eq!(
        kind,
        DecodeErrorKind::MissingRequired {
            message: "update",
            field: "delta_msat",
            number: 2
        }
    );
    let three_words = cat(&[f_fixed64(1, 1), f_fixed64(2, 1), f_fixed64(4, 1)]);
    let (kind, path) = err_kind(&f_len(1, &cat(&[f_len(1, &three_words), f_varint(2, 0)])));
    assert_eq!(
        kind,
        DecodeErrorKind::MissingRequired {
            message: "sha256_hash",
            field: "c",
            number: 3
        }
    );
    assert_eq!(path, ["update", "revocation_hash"]);
    let (kind, _) = err_kind(&f_len(50, &f_len(1, &chain_pubkey(&[]))));
    assert_eq!(
        kind,
        DecodeErrorKind::MissingRequired {
            message: "authenticate",
            field: "session_sig",
            number: 2
        }
    );
}

#[test]
fn oneofs_that_need_exactly_one_member() {
    for empty in [vec![], f_varint(41, 1)] {
        let (kind, _) = err_kind(&empty);
        assert_eq!(
            kind,
            DecodeErrorKind::OneofEmpty {
                message: "pkt",
                oneof: "pkt"
            }
        );
    }
    let (kind, _) = err_kind(&cat(&[update(&[]), f_len(40, &[])]));
    assert_eq!(
        kind,
        DecodeErrorKind::OneofSeveral {
            message: "pkt",
            oneof: "pkt",
            first: "update",
            second: "error"
        }
    );
    // The same member twice is proto2's "last one wins", not two members.
    assert!(Packet::decode(&cat(&[f_len(40, &[]), f_len(40, &f_len(1, b"x"))])).is_ok());

    let htlc = |expiry: &[u8]| {
        f_len(
            2,
            &cat(&[
                f_len(1, &sha(1)),
                f_varint(2, 10),
                f_len(3, &sha(2)),
                f_len(4, expiry),
            ]),
        )
    };
    assert!(Packet::decode(&htlc(&f_varint(2, 700))).is_ok());
    let (kind, path) = err_kind(&htlc(&[]));
    assert_eq!(
        kind,
        DecodeErrorKind::OneofEmpty {
            message: "locktime",
            oneof: "locktime"
        }
    );
    assert_eq!(path, ["update_add_htlc", "expiry"]);
    let (kind, _) = err_kind(&htlc(&cat(&[f_varint(1, 5), f_varint(2, 6)])));
    assert!(matches!(
        kind,
        DecodeErrorKind::OneofSeveral {
            message: "locktime",
            ..
        }
    ));
}

#[test]
fn decline_reason_may_be_absent_but_not_double() {
    assert!(matches!(
        Packet::decode(&f_len(6, &[])),
        Ok(Packet::UpdateDeclineHtlc(d)) if d.reason.is_none()
    ));
    let (kind, _) = err_kind(&f_len(6, &cat(&[f_len(1, &[]), f_varint(2, 1)])));
    assert!(matches!(
        kind,
        DecodeErrorKind::OneofSeveral {
            message: "update_decline_htlc",
            ..
        }
    ));
    let (kind, _) = err_kind(&f_len(6, &f_varint(2, 2)));
    assert!(matches!(
        kind,
        DecodeErrorKind::OutOfRange {
            field: "cannot_route",
            value: 2,
            ..
        }
    ));
}

fn open_channel(anch: u64) -> Vec<u8> {
    let key = chain_pubkey(&[]);
    f_len(
        20,
        &cat(&[
            f_len(1, &f_varint(1, 86400)),
            f_len(2, &sha(3)),
            f_len(3, &key),
            f_len(4, &key),
            f_varint(5, anch),
            f_varint(7, 1000),
        ]),
    )
}

#[test]
fn enum_values_outside_the_enum_fail() {
    assert!(Packet::decode(&open_channel(1)).is_ok());
    assert!(Packet::decode(&open_channel(2)).is_ok());
    for bad in [0, 3, u64::MAX] {
        let (kind, path) = err_kind(&open_channel(bad));
        assert!(
            matches!(
                kind,
                DecodeErrorKind::InvalidEnum {
                    message: "open_channel",
                    field: "anch",
                    ..
                }
            ),
            "{bad}: {kind:?}"
        );
        assert_eq!(path, ["open"]);
    }
}

#[test]
fn values_outside_their_type_and_wrong_wire_types_fail() {
    let htlc = |amount: u64| {
        f_len(
            2,
            &cat(&[
                f_len(1, &sha(1)),
                f_varint(2, amount),
                f_len(3, &sha(2)),
                f_len(4, &f_varint(1, 1)),
            ]),
        )
    };
    assert!(Packet::decode(&htlc(u64::from(u32::MAX))).is_ok());
    let (kind, _) = err_kind(&htlc(1 << 32));
    assert!(matches!(
        kind,
        DecodeErrorKind::OutOfRange {
            field: "amount_msat",
            ..
        }
    ));

    let (kind, _) = err_kind(&f_len(1, &cat(&[f_len(1, &sha(1)), f_fixed64(2, 5)])));
    assert!(matches!(
        kind,
        DecodeErrorKind::WrongWireType {
            field: "delta_msat",
            wire_type: 1,
            expected: 0,
            ..
        }
    ));
    let (kind, _) = err_kind(&f_varint(1, 5));
    assert!(matches!(
        kind,
        DecodeErrorKind::WrongWireType {
            field: "update",
            ..
        }
    ));
    let (kind, _) = err_kind(&f_len(40, &f_len(1, &[0xff, 0xfe])));
    assert!(matches!(
        kind,
        DecodeErrorKind::InvalidUtf8 {
            field: "problem",
            ..
        }
    ));
}

#[test]
fn malformed_bytes_fail_without_allocating() {
    // A length of 2^62 must be refused before anything is reserved for it.
    let mut huge = key(40, 2);
    varint(1 << 62, &mut huge);
    assert!(matches!(
        err_kind(&huge).0,
        DecodeErrorKind::Malformed { .. }
    ));
    for bad in [
        vec![0x80],                     // truncated varint
        vec![0xff; 11],                 // varint too long
        vec![0x00],                     // field number 0
        key(33, 6),                     // wire type 6
        key(33, 4),                     // stray end group
        f_group(33, &[])[..1].to_vec(), // unterminated group
        cat(&[key(33, 3), key(35, 4)]), // mismatched end group
    ] {
        assert!(
            matches!(err_kind(&bad).0, DecodeErrorKind::Malformed { .. }),
            "{bad:02x?}"
        );
    }
    // Groups nested deeper than any packet can be are refused, not recursed into.
    let mut deep = Vec::new();
    for _ in 0..64 {
        deep = f_group(33, &deep);
    }
    assert_eq!(err_kind(&deep).0, DecodeErrorKind::TooDeep);
}

#[test]
fn every_truncation_of_a_valid_packet_is_refused() {
    let full = cat(&[f_varint(41, 1), auth(&[], &[])]);
    assert!(Packet::decode(&full).is_ok());
    for cut in 0..full.len() {
        assert!(
            Packet::decode(&full[..cut]).is_err(),
            "prefix of {cut} bytes accepted"
        );
    }
}

#[test]
fn domain_checks_name_the_field() {
    let e = Packet::decode(&f_len(
        50,
        &cat(&[f_len(1, &f_len(1, &[2; 32])), f_len(2, &signature())]),
    ))
    .unwrap_err();
    assert_eq!(*e.kind(), DecodeErrorKind::PubkeyLength { len: 32 });
    assert_eq!(e.path(), ["auth", "node_id"]);
    let zero_sig = (1..=8)
        .map(|n| f_fixed64(n, 0))
        .collect::<Vec<_>>()
        .concat();
    let e = Packet::decode(&f_len(22, &f_len(1, &zero_sig))).unwrap_err();
    assert_eq!(*e.kind(), DecodeErrorKind::InvalidSignature { half: "r" });
    assert_eq!(e.path(), ["open_commit_sig", "sig"]);
}
