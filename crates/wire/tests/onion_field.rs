//! `update_add_htlc.onion` (field 5, odd, optional): absent it changes nothing, present it round-trips, any size but 1366 is refused.
// Test code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use bitcoin_hashes::{sha256, Hash};
use prost::Message as _;
use wire::{DecodeErrorKind, Locktime, Onion, Packet, UpdateAddHtlc};

fn vectors() -> serde_json::Value {
    let dir = std::env::var_os("POTLUCK_VECTORS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vectors")
        });
    let text = std::fs::read_to_string(dir.join("packets_and_encodings.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn add(onion: Option<Onion>) -> Packet {
    Packet::UpdateAddHtlc(UpdateAddHtlc {
        revocation_hash: sha256::Hash::hash(b"revocation"),
        amount_msat: 5_000_000,
        r_hash: sha256::Hash::hash(b"r"),
        expiry: Locktime::Blocks(800_123),
        onion,
    })
}

/// Bytes that are not all one value, so that a shifted or truncated copy differs.
fn onion_bytes(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 256) as u8).collect()
}

#[test]
fn the_reference_add_without_onion_decodes_as_before_and_reencodes_byte_exact() {
    let file = vectors();
    let adds: Vec<Vec<u8>> = file["packets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["pkt_case"].as_u64() == Some(2))
        .map(|p| hex::decode(p["protobuf_hex"].as_str().unwrap()).unwrap())
        .collect();
    assert!(!adds.is_empty(), "the vectors hold an update_add_htlc");
    for bytes in adds {
        let Packet::UpdateAddHtlc(a) = Packet::decode(&bytes).unwrap() else {
            panic!("pkt_case 2 is update_add_htlc");
        };
        assert_eq!(a.onion, None);
        assert_eq!(Packet::UpdateAddHtlc(a).encode(), bytes);
    }
}

#[test]
fn an_add_with_an_onion_round_trips_and_carries_it_in_field_5() {
    let onion = Onion::try_from(onion_bytes(Onion::LEN).as_slice()).unwrap();
    let packet = add(Some(onion.clone()));
    let bytes = packet.encode();
    assert_eq!(Packet::decode(&bytes).unwrap(), packet);

    let pb = wire::pb::Pkt::decode(bytes.as_slice()).unwrap();
    let Some(wire::pb::pkt::Pkt::UpdateAddHtlc(raw)) = pb.pkt else {
        panic!("an update_add_htlc");
    };
    assert_eq!(raw.onion.as_deref(), Some(onion.as_bytes().as_slice()));
    // Field 5, wire type 2, then the 1366 length as a varint: 0x2a 0xd6 0x0a.
    let inner = raw.encode_to_vec();
    let tail = &inner[inner.len() - Onion::LEN - 3..];
    assert_eq!(&tail[..3], &[0x2a, 0xd6, 0x0a]);
}

#[test]
fn the_add_without_onion_is_the_old_encoding() {
    let without = add(None).encode();
    let with = add(Some(
        Onion::try_from(onion_bytes(Onion::LEN).as_slice()).unwrap(),
    ))
    .encode();
    // The onion adds exactly its field (3-byte key and length, the bytes) to the
    // add and to the add's length prefix in pkt (1 byte → 2 bytes here).
    assert_eq!(with.len() - without.len(), 3 + Onion::LEN + 1);
    let pb = wire::pb::Pkt::decode(without.as_slice()).unwrap();
    let Some(wire::pb::pkt::Pkt::UpdateAddHtlc(raw)) = pb.pkt else {
        panic!("an update_add_htlc");
    };
    assert_eq!(raw.onion, None);
}

#[test]
fn an_onion_of_any_other_size_is_refused() {
    for len in [0, 1, Onion::LEN - 1, Onion::LEN + 1, 2 * Onion::LEN] {
        let mut pb = wire::pb::Pkt::from(&add(None));
        let Some(wire::pb::pkt::Pkt::UpdateAddHtlc(raw)) = pb.pkt.as_mut() else {
            panic!("an update_add_htlc");
        };
        raw.onion = Some(onion_bytes(len));
        let err = Packet::decode(&pb.encode_to_vec()).unwrap_err();
        assert_eq!(
            err.kind(),
            &DecodeErrorKind::OnionLength { len },
            "len {len}"
        );
        assert_eq!(err.path(), ["update_add_htlc", "onion"]);

        assert_eq!(
            Onion::try_from(onion_bytes(len).as_slice()).unwrap_err(),
            DecodeErrorKind::OnionLength { len }
        );
    }
}

/// Channel snapshots keep an incoming HTLC's onion (docs/channel.md): it is written as hex
/// and only an exact-size lowercase hex string reads back.
#[test]
fn an_onion_is_stored_as_hex_and_only_its_exact_size_reads_back() {
    let onion = Onion::try_from(&onion_bytes(Onion::LEN)[..]).unwrap();
    let json = serde_json::to_string(&onion).unwrap();
    assert_eq!(
        json.len(),
        2 * Onion::LEN + 2,
        "a JSON string of hex digits"
    );
    assert_eq!(&json[..9], "\"00070e15");
    assert_eq!(serde_json::from_str::<Onion>(&json).unwrap(), onion);
    let short = format!("\"{}\"", &json[1..json.len() - 3]);
    let err = serde_json::from_str::<Onion>(&short)
        .unwrap_err()
        .to_string();
    assert!(err.contains("2730 hex digits"), "{err}");
    let upper = json.to_uppercase();
    let err = serde_json::from_str::<Onion>(&upper)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not lowercase hex"), "{err}");
    assert!(serde_json::from_str::<Onion>("[0, 1]").is_err());
}
