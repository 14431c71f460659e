//! BOLT 4's published onion vectors, byte for byte: building the onion, and every hop peeling it.
// Test code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use hmac::{Hmac, Mac};
use onion::{build, peel, Hop, Next, PeelError};
use secp256k1::{ecdh::SharedSecret, PublicKey, Scalar, Secp256k1, SecretKey};
use serde_json::Value;
use sha2::Sha256;
use wire::Onion;

fn load(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/vectors")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn unhex(v: &Value) -> Vec<u8> {
    hex::decode(v.as_str().unwrap()).unwrap()
}

fn secret(v: &Value) -> SecretKey {
    SecretKey::from_slice(&unhex(v)).unwrap()
}

fn pubkey(v: &Value) -> PublicKey {
    PublicKey::from_slice(&unhex(v)).unwrap()
}

fn onion(v: &Value) -> Onion {
    Onion::try_from(unhex(v).as_slice()).unwrap()
}

/// The vectors write each payload with its BigSize length in front; the API takes the payload alone.
fn without_length(prefixed: &[u8]) -> Vec<u8> {
    let (len, at) = match prefixed[0] {
        0xfd => (
            usize::from(u16::from_be_bytes([prefixed[1], prefixed[2]])),
            3,
        ),
        small => (usize::from(small), 1),
    };
    assert_eq!(prefixed.len(), at + len, "the vector's length prefix");
    prefixed[at..].to_vec()
}

/// The route of a vector: (node id, payload) per hop.
fn route(hops: &Value, key: &str) -> Vec<(PublicKey, Vec<u8>)> {
    hops.as_array()
        .unwrap()
        .iter()
        .map(|h| (pubkey(&h[key]), without_length(&unhex(&h["payload"]))))
        .collect()
}

fn hops(route: &[(PublicKey, Vec<u8>)]) -> Vec<Hop<'_>> {
    route
        .iter()
        .map(|(node_id, payload)| Hop {
            node_id: *node_id,
            payload,
        })
        .collect()
}

#[test]
fn the_onion_test_vector_is_built_byte_exact() {
    let v = load("bolt04-onion-test.json");
    let g = &v["generate"];
    let route = route(&g["hops"], "pubkey");
    let built = build(
        &Secp256k1::new(),
        &secret(&g["session_key"]),
        &hops(&route),
        &unhex(&g["associated_data"]),
    )
    .unwrap();
    assert_eq!(
        hex::encode(built.packet.as_bytes()),
        v["onion"].as_str().unwrap()
    );
    assert_eq!(built.shared_secrets.len(), route.len());
}

#[test]
fn each_hop_of_the_onion_test_vector_peels_exactly_its_payload() {
    let v = load("bolt04-onion-test.json");
    let secp = Secp256k1::new();
    let route = route(&v["generate"]["hops"], "pubkey");
    let ad = unhex(&v["generate"]["associated_data"]);
    let keys: Vec<SecretKey> = v["decode"].as_array().unwrap().iter().map(secret).collect();
    assert_eq!(keys.len(), route.len());

    let mut packet = onion(&v["onion"]);
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(PublicKey::from_secret_key(&secp, key), route[i].0);
        let peeled = peel(&secp, key, &packet, &ad).unwrap();
        assert_eq!(peeled.payload, route[i].1, "hop {i}");
        match (peeled.next, i + 1 == keys.len()) {
            (Next::Forward(next), false) => packet = next,
            (Next::Final, true) => {}
            (next, last) => panic!("hop {i}: {next:?}, last hop: {last}"),
        }
    }
}

/// The private key that the sender encrypted a blinded hop's layer to: the node
/// key times HMAC("blinded_node_id", ECDH(path key, node key)) (BOLT 4, route blinding).
fn blinded(key: &SecretKey, path_key: &PublicKey) -> SecretKey {
    let ss = SharedSecret::new(path_key, key);
    let mut mac = Hmac::<Sha256>::new_from_slice(b"blinded_node_id").unwrap();
    mac.update(&ss.secret_bytes());
    let tweak = Scalar::from_be_bytes(mac.finalize().into_bytes().into()).unwrap();
    key.mul_tweak(&tweak).unwrap()
}

#[test]
fn the_blinded_payment_vector_is_built_and_every_intermediate_onion_is_byte_exact() {
    let v = load("bolt04-blinded-payment-onion-test.json");
    let secp = Secp256k1::new();
    let g = &v["generate"];
    let route = route(&g["full_route"]["hops"], "pubkey");
    let ad = unhex(&g["associated_data"]);
    let built = build(&secp, &secret(&g["session_key"]), &hops(&route), &ad).unwrap();
    assert_eq!(
        hex::encode(built.packet.as_bytes()),
        g["onion"].as_str().unwrap()
    );

    let decrypt = v["decrypt"]["hops"].as_array().unwrap();
    assert_eq!(decrypt.len(), route.len());
    for (i, hop) in decrypt.iter().enumerate() {
        let node_key = secret(&hop["node_privkey"]);
        // Alice is an ordinary hop and Bob, the introduction node, is reached by
        // his real id; from Carol on, each layer is encrypted to a blinded id.
        let key = match i {
            0 | 1 => node_key,
            _ => blinded(&node_key, &pubkey(&decrypt[i - 1]["next_path_key"])),
        };
        let peeled = peel(&secp, &key, &onion(&hop["onion"]), &ad)
            .unwrap_or_else(|e| panic!("{}: {e:?}", hop["alias"]));
        assert_eq!(peeled.payload, route[i].1, "{}", hop["alias"]);
        match (peeled.next, decrypt.get(i + 1)) {
            (Next::Forward(next), Some(after)) => {
                assert_eq!(
                    hex::encode(next.as_bytes()),
                    after["onion"].as_str().unwrap(),
                    "the onion {} forwards",
                    hop["alias"]
                );
            }
            (Next::Final, None) => {}
            (next, after) => panic!("{}: {next:?}, next hop: {after:?}", hop["alias"]),
        }
    }
}

#[test]
fn a_flipped_bit_anywhere_is_refused() {
    let v = load("bolt04-onion-test.json");
    let secp = Secp256k1::new();
    let ad = unhex(&v["generate"]["associated_data"]);
    let key = secret(&v["decode"][0]);
    let good = unhex(&v["onion"]);
    assert!(peel(&secp, &key, &onion(&v["onion"]), &ad).is_ok());
    for bit in 0..good.len() * 8 {
        let mut bad = good.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        let err = peel(&secp, &key, &Onion::try_from(bad.as_slice()).unwrap(), &ad).unwrap_err();
        match bit / 8 {
            0 => assert_eq!(err, PeelError::Version(bad[0]), "bit {bit}"),
            // A changed key may leave the curve; if not, the HMAC catches it.
            1..=33 => assert!(
                matches!(err, PeelError::EphemeralKey(_) | PeelError::Hmac),
                "bit {bit}: {err:?}"
            ),
            _ => assert_eq!(err, PeelError::Hmac, "bit {bit}"),
        }
    }
    // The associated data (the payment hash) is under the HMAC too.
    let mut other_ad = ad.clone();
    other_ad[31] ^= 1;
    assert_eq!(
        peel(&secp, &key, &onion(&v["onion"]), &other_ad).unwrap_err(),
        PeelError::Hmac
    );
    // And so is the hop's key: another node cannot open it.
    let other = secret(&v["decode"][1]);
    assert_eq!(
        peel(&secp, &other, &onion(&v["onion"]), &ad).unwrap_err(),
        PeelError::Hmac
    );
}

#[test]
fn a_truncated_or_oversized_packet_is_not_an_onion() {
    let v = load("bolt04-onion-test.json");
    let good = unhex(&v["onion"]);
    for len in [0, 1, 34, good.len() - 1] {
        assert_eq!(
            Onion::try_from(&good[..len]).unwrap_err(),
            wire::DecodeErrorKind::OnionLength { len }
        );
    }
    let mut long = good.clone();
    long.push(0);
    assert!(Onion::try_from(long.as_slice()).is_err());
}
