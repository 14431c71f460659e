//! Hop payload TLVs: our records round-trip, BOLT 1's rules hold, and BOLT 4's own payloads are read as BOLT 1 says.
// Test code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

use onion::{HopPayload, PayloadError, TLV_EXPIRY_BLOCKS, TLV_NEXT_NODE};
use proptest::prelude::*;
use secp256k1::{PublicKey, Secp256k1, SecretKey};
use wire::Locktime;

fn node() -> PublicKey {
    PublicKey::from_secret_key(&Secp256k1::new(), &SecretKey::from_slice(&[3; 32]).unwrap())
}

#[test]
fn a_forwarding_payload_has_the_documented_bytes() {
    let p = HopPayload {
        amount_msat: 15_000,
        expiry: Locktime::Blocks(1500),
        next_node: Some(node()),
    };
    let mut expected = hex::decode("02023a98040205dc").unwrap();
    // Type 65537 as BigSize (fe 00010001), length 33, the key.
    expected.extend_from_slice(&[0xfe, 0x00, 0x01, 0x00, 0x01, 33]);
    expected.extend_from_slice(&node().serialize());
    assert_eq!(p.encode(), expected);
    assert_eq!(HopPayload::decode(&expected).unwrap(), p);
}

#[test]
fn a_final_payload_in_seconds_has_no_next_node() {
    let p = HopPayload {
        amount_msat: 1,
        expiry: Locktime::Seconds(1_500_000_000),
        next_node: None,
    };
    // 65536 = fe 00010000; 1_500_000_000 = 0x59682f00.
    assert_eq!(
        p.encode(),
        hex::decode("020101fe000100000459682f00").unwrap()
    );
    assert_eq!(HopPayload::decode(&p.encode()).unwrap(), p);
}

#[test]
fn bolt04s_vector_payload_is_refused_for_its_unknown_even_short_channel_id() {
    // First hop of bolt04/onion-test.json without its length: amount 15000,
    // expiry 1500, then type 6 (short_channel_id), which this protocol lacks.
    let bolt = hex::decode("02023a98040205dc06080000000000000001").unwrap();
    assert_eq!(
        HopPayload::decode(&bolt).unwrap_err(),
        PayloadError::UnknownEven(6)
    );
    // The same with the record's type made odd (7) is read and the record skipped.
    let mut odd = bolt.clone();
    odd[8] = 7;
    assert_eq!(
        HopPayload::decode(&odd).unwrap(),
        HopPayload {
            amount_msat: 15_000,
            expiry: Locktime::Blocks(1500),
            next_node: None
        }
    );
}

#[test]
fn bolt1s_stream_rules_are_enforced() {
    let ok = "020101040101";
    assert!(HopPayload::decode(&hex::decode(ok).unwrap()).is_ok());
    for (bytes, err) in [
        ("040101020101", PayloadError::Order(2)),
        ("020101020101040101", PayloadError::Order(2)),
        ("0202000104010a", PayloadError::Value(2)),
        ("020101", PayloadError::Missing(TLV_EXPIRY_BLOCKS)),
        ("040101", PayloadError::Missing(2)),
        ("0201010401", PayloadError::Malformed),
        ("020101040201", PayloadError::Malformed),
        ("0201010405010000000001", PayloadError::Value(4)),
        (
            "0205010000000004010a",
            PayloadError::AmountTooLarge(1 << 32),
        ),
        ("020101040101fe000100000101", PayloadError::TwoExpiries),
        (
            "020101040101fe000100010402020202",
            PayloadError::Value(TLV_NEXT_NODE),
        ),
        ("fd0002020101", PayloadError::Malformed),
    ] {
        assert_eq!(
            HopPayload::decode(&hex::decode(bytes).unwrap()).unwrap_err(),
            err,
            "{bytes}"
        );
    }
}

proptest! {
    #[test]
    fn every_payload_round_trips(
        amount_msat in any::<u32>(),
        blocks in any::<bool>(),
        when in any::<u32>(),
        // [k; 32] is a valid key for k in 1..=0xfe; [0xff; 32] is above the curve's order.
        next in proptest::option::of(1u8..=0xfe),
    ) {
        let p = HopPayload {
            amount_msat,
            expiry: if blocks { Locktime::Blocks(when) } else { Locktime::Seconds(when) },
            next_node: next.map(|k| PublicKey::from_secret_key(
                &Secp256k1::new(),
                &SecretKey::from_slice(&[k; 32]).unwrap(),
            )),
        };
        prop_assert_eq!(HopPayload::decode(&p.encode()).unwrap(), p);
    }
}
