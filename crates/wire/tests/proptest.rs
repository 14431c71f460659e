//! Property tests: every packet type round-trips, and random unknown fields obey the parity rule.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

use bitcoin_hashes::{sha256, sha256d, Hash};
use proptest::prelude::*;
use secp256k1::{ecdsa::Signature, PublicKey, Secp256k1, SecretKey};
use wire::{
    AnchorOffer, Authenticate, ChainPubkey, CloseChannel, CloseChannelComplete, DeclineReason,
    DecodeErrorKind, ErrorPacket, Funding, Locktime, Onion, OpenAnchor, OpenChannel, OpenCommitSig,
    OpenComplete, Packet, Preimage, Update, UpdateAccept, UpdateAddHtlc, UpdateComplete,
    UpdateDeclineHtlc, UpdateFulfillHtlc, UpdateRoutefailHtlc, UpdateSignature, UpdateTimedoutHtlc,
};

/// 32 bytes below the curve order and not zero (top bit cleared, bottom bit set).
fn scalar() -> impl Strategy<Value = [u8; 32]> {
    any::<[u8; 32]>().prop_map(|mut b| {
        b[0] &= 0x7f;
        b[31] |= 1;
        b
    })
}

fn signature() -> impl Strategy<Value = Signature> {
    (scalar(), scalar()).prop_map(|(r, s)| {
        let mut compact = [0u8; 64];
        compact[..32].copy_from_slice(&r);
        compact[32..].copy_from_slice(&s);
        Signature::from_compact(&compact).expect("r and s are in range")
    })
}

fn key() -> impl Strategy<Value = ChainPubkey> {
    (scalar(), any::<bool>()).prop_map(|(sk, compressed)| {
        let sk = SecretKey::from_slice(&sk).expect("in range");
        let pk = PublicKey::from_secret_key(&Secp256k1::signing_only(), &sk);
        if compressed {
            ChainPubkey::new(pk)
        } else {
            ChainPubkey::uncompressed(pk)
        }
    })
}

fn hash() -> impl Strategy<Value = sha256::Hash> {
    any::<[u8; 32]>().prop_map(sha256::Hash::from_byte_array)
}

fn hash_d() -> impl Strategy<Value = sha256d::Hash> {
    any::<[u8; 32]>().prop_map(sha256d::Hash::from_byte_array)
}

fn preimage() -> impl Strategy<Value = Preimage> {
    any::<[u8; 32]>().prop_map(Preimage)
}

fn locktime() -> impl Strategy<Value = Locktime> {
    prop_oneof![
        any::<u32>().prop_map(Locktime::Seconds),
        any::<u32>().prop_map(Locktime::Blocks)
    ]
}

/// Absent, or random bytes of the one size the field allows.
fn onion() -> impl Strategy<Value = Option<Onion>> {
    proptest::option::of(
        proptest::collection::vec(any::<u8>(), Onion::LEN)
            .prop_map(|b| Onion::try_from(b.as_slice()).unwrap()),
    )
}

fn packet() -> impl Strategy<Value = Packet> {
    prop_oneof![
        (key(), signature()).prop_map(|(node_id, session_sig)| Packet::Auth(Authenticate {
            node_id,
            session_sig
        })),
        (
            locktime(),
            hash(),
            key(),
            key(),
            any::<bool>(),
            any::<Option<u32>>(),
            any::<u64>()
        )
            .prop_map(
                |(delay, revocation_hash, commit_key, final_key, will, min_depth, fee)| {
                    Packet::Open(OpenChannel {
                        delay,
                        revocation_hash,
                        commit_key,
                        final_key,
                        anch: if will {
                            AnchorOffer::WillCreateAnchor
                        } else {
                            AnchorOffer::WontCreateAnchor
                        },
                        min_depth,
                        commitment_fee: fee,
                    })
                }
            ),
        (hash_d(), any::<u32>(), any::<u64>(), signature()).prop_map(
            |(txid, output_index, amount, commit_sig)| Packet::OpenAnchor(OpenAnchor {
                txid,
                output_index,
                amount,
                commit_sig
            })
        ),
        signature().prop_map(|sig| Packet::OpenCommitSig(OpenCommitSig { sig })),
        proptest::option::of(hash_d())
            .prop_map(|blockid| Packet::OpenComplete(OpenComplete { blockid })),
        (hash(), any::<i64>()).prop_map(|(revocation_hash, delta_msat)| Packet::Update(Update {
            revocation_hash,
            delta_msat
        })),
        (hash(), any::<u32>(), hash(), locktime(), onion()).prop_map(
            |(revocation_hash, amount_msat, r_hash, expiry, onion)| Packet::UpdateAddHtlc(
                UpdateAddHtlc {
                    revocation_hash,
                    amount_msat,
                    r_hash,
                    expiry,
                    onion
                }
            )
        ),
        (signature(), hash()).prop_map(|(sig, revocation_hash)| Packet::UpdateAccept(
            UpdateAccept {
                sig,
                revocation_hash
            }
        )),
        (signature(), preimage()).prop_map(|(sig, revocation_preimage)| {
            Packet::UpdateSignature(UpdateSignature {
                sig,
                revocation_preimage,
            })
        }),
        preimage().prop_map(
            |revocation_preimage| Packet::UpdateComplete(UpdateComplete {
                revocation_preimage
            })
        ),
        prop_oneof![
            Just(None),
            any::<bool>().prop_map(|b| Some(DeclineReason::CannotRoute(b))),
            (any::<Option<i64>>(), any::<Option<i32>>()).prop_map(|(fixed, per_micro_unit)| {
                Some(DeclineReason::InsufficientFunds(Funding {
                    fixed,
                    per_micro_unit,
                }))
            }),
        ]
        .prop_map(|reason| Packet::UpdateDeclineHtlc(UpdateDeclineHtlc { reason })),
        (hash(), preimage()).prop_map(|(revocation_hash, r)| Packet::UpdateFulfillHtlc(
            UpdateFulfillHtlc { revocation_hash, r }
        )),
        (hash(), hash()).prop_map(|(revocation_hash, r_hash)| Packet::UpdateTimedoutHtlc(
            UpdateTimedoutHtlc {
                revocation_hash,
                r_hash
            }
        )),
        (hash(), hash()).prop_map(|(revocation_hash, r_hash)| Packet::UpdateRoutefailHtlc(
            UpdateRoutefailHtlc {
                revocation_hash,
                r_hash
            }
        )),
        (signature(), any::<u64>())
            .prop_map(|(sig, close_fee)| Packet::Close(CloseChannel { sig, close_fee })),
        signature().prop_map(|sig| Packet::CloseComplete(CloseChannelComplete { sig })),
        Just(Packet::CloseAck),
        proptest::option::of(".{0,40}").prop_map(|problem| Packet::Error(ErrorPacket { problem })),
    ]
}

/// An independent map of which fields hold which messages, used to walk encodings in the test.
fn child(message: &str, field: u64) -> Option<&'static str> {
    Some(match (message, field) {
        ("pkt", 50) => "authenticate",
        ("pkt", 20) => "open_channel",
        ("pkt", 21) => "open_anchor",
        ("pkt", 22) => "open_commit_sig",
        ("pkt", 23) => "open_complete",
        ("pkt", 1) => "update",
        ("pkt", 2) => "update_add_htlc",
        ("pkt", 3) => "update_accept",
        ("pkt", 4) => "update_signature",
        ("pkt", 5) => "update_complete",
        ("pkt", 6) => "update_decline_htlc",
        ("pkt", 7) => "update_fulfill_htlc",
        ("pkt", 8) => "update_timedout_htlc",
        ("pkt", 9) => "update_routefail_htlc",
        ("pkt", 30) => "close_channel",
        ("pkt", 31) => "close_channel_complete",
        ("pkt", 32) => "close_channel_ack",
        ("pkt", 40) => "error",
        ("authenticate", 1) | ("open_channel", 3 | 4) => "chain_pubkey",
        ("authenticate", 2)
        | ("open_anchor", 4)
        | ("open_commit_sig" | "update_accept" | "update_signature", 1)
        | ("close_channel" | "close_channel_complete", 1) => "signature",
        ("open_channel", 1) | ("update_add_htlc", 4) => "locktime",
        ("update_decline_htlc", 1) => "funding",
        ("open_channel", 2)
        | ("open_anchor" | "open_complete" | "update" | "update_add_htlc", 1)
        | ("update_add_htlc", 3)
        | ("update_fulfill_htlc" | "update_timedout_htlc" | "update_routefail_htlc", 1 | 2)
        | ("update_accept" | "update_signature", 2)
        | ("update_complete", 1) => "sha256_hash",
        _ => return None,
    })
}

/// A parsed message: its fields in order, sub-messages expanded.
struct Node {
    name: &'static str,
    fields: Vec<(u64, u8, Value)>,
}

enum Value {
    Raw(Vec<u8>),
    Msg(Node),
}

fn read_varint(buf: &mut &[u8]) -> u64 {
    let mut v = 0u64;
    for i in 0.. {
        let b = buf[0];
        *buf = &buf[1..];
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            break;
        }
    }
    v
}

fn write_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn parse(name: &'static str, mut buf: &[u8]) -> Node {
    let mut fields = Vec::new();
    while !buf.is_empty() {
        let k = read_varint(&mut buf);
        let (number, wire) = (k >> 3, (k & 7) as u8);
        let value = match wire {
            0 => {
                let start = buf;
                read_varint(&mut buf);
                Value::Raw(start[..start.len() - buf.len()].to_vec())
            }
            1 => {
                let (v, rest) = buf.split_at(8);
                buf = rest;
                Value::Raw(v.to_vec())
            }
            2 => {
                let len = read_varint(&mut buf) as usize;
                let (body, rest) = buf.split_at(len);
                buf = rest;
                match child(name, number) {
                    Some(inner) => Value::Msg(parse(inner, body)),
                    None => Value::Raw(body.to_vec()),
                }
            }
            other => panic!("prost never writes wire type {other}"),
        };
        fields.push((number, wire, value));
    }
    Node { name, fields }
}

fn write(node: &Node, out: &mut Vec<u8>) {
    for (number, wire, value) in &node.fields {
        write_varint(number << 3 | u64::from(*wire), out);
        match value {
            Value::Raw(bytes) if *wire == 2 => {
                write_varint(bytes.len() as u64, out);
                out.extend_from_slice(bytes);
            }
            Value::Raw(bytes) => out.extend_from_slice(bytes),
            Value::Msg(inner) => {
                let mut body = Vec::new();
                write(inner, &mut body);
                write_varint(body.len() as u64, out);
                out.extend_from_slice(&body);
            }
        }
    }
}

/// Visits message nodes depth-first; the `target`-th (mod count) gets the field. Returns its name and depth.
fn insert(
    node: &mut Node,
    target: &mut usize,
    depth: usize,
    field: &(u64, u8, Vec<u8>),
    position: usize,
) -> Option<(&'static str, usize)> {
    if *target == 0 {
        let at = position % (node.fields.len() + 1);
        node.fields
            .insert(at, (field.0, field.1, Value::Raw(field.2.clone())));
        return Some((node.name, depth));
    }
    *target -= 1;
    for (_, _, value) in node.fields.iter_mut() {
        if let Value::Msg(inner) = value {
            if let Some(hit) = insert(inner, target, depth + 1, field, position) {
                return Some(hit);
            }
        }
    }
    None
}

fn count(node: &Node) -> usize {
    1 + node
        .fields
        .iter()
        .map(|(_, _, v)| match v {
            Value::Msg(inner) => count(inner),
            Value::Raw(_) => 0,
        })
        .sum::<usize>()
}

/// An unknown field: number above every known one, any wire type, a matching payload.
fn unknown_field() -> impl Strategy<Value = (u64, u8, Vec<u8>)> {
    (
        51u64..(1 << 29),
        prop_oneof![Just(0u8), Just(1), Just(2), Just(5)],
        proptest::collection::vec(any::<u8>(), 0..24),
        any::<u64>(),
    )
        .prop_map(|(number, wire, bytes, v)| {
            let payload = match wire {
                0 => {
                    let mut out = Vec::new();
                    write_varint(v, &mut out);
                    out
                }
                1 => v.to_le_bytes().to_vec(),
                5 => (v as u32).to_le_bytes().to_vec(),
                _ => bytes,
            };
            (number, wire, payload)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_packet_round_trips(p in packet()) {
        let bytes = p.encode();
        let back = Packet::decode(&bytes).expect("our own encoding decodes");
        prop_assert_eq!(&back, &p);
        prop_assert_eq!(back.encode(), bytes);
    }

    #[test]
    fn unknown_fields_obey_the_parity_rule(
        p in packet(),
        field in unknown_field(),
        target in any::<usize>(),
        position in any::<usize>(),
    ) {
        let mut tree = parse("pkt", &p.encode());
        let mut target = target % count(&tree);
        let (message, depth) = insert(&mut tree, &mut target, 0, &field, position)
            .expect("target is within the tree");
        let mut bytes = Vec::new();
        write(&tree, &mut bytes);
        match Packet::decode(&bytes) {
            Ok(decoded) => {
                prop_assert!(field.0 % 2 == 1, "even field {} in {} accepted", field.0, message);
                prop_assert_eq!(decoded, p);
            }
            Err(e) => {
                prop_assert!(field.0 % 2 == 0, "odd field {} in {} refused: {}", field.0, message, e);
                prop_assert_eq!(
                    e.kind().clone(),
                    DecodeErrorKind::UnknownEvenField { message, field: field.0 }
                );
                prop_assert_eq!(e.path().len(), depth);
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Packet::decode(&bytes);
    }
}
