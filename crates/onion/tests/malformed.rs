//! Onions with a valid HMAC whose content is wrong (a sender's bug or malice): each is a typed refusal, never a panic.
// Test code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

use chacha20::cipher::{KeyIvInit, StreamCipher};
use chacha20::ChaCha20;
use hmac::{Hmac, Mac};
use onion::{build, peel, BuildError, Hop, Next, PeelError, HOP_PAYLOADS_LEN};
use secp256k1::{ecdh::SharedSecret, PublicKey, Secp256k1, SecretKey};
use sha2::Sha256;
use wire::Onion;

const AD: [u8; 32] = [0x42; 32];

fn key(fill: u8) -> SecretKey {
    SecretKey::from_slice(&[fill; 32]).unwrap()
}

fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(key).unwrap();
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// An onion for node `node` whose decrypted hop payloads are `plain`, with a correct HMAC:
/// written here from BOLT 4's key derivation, independently of the crate.
fn craft(node: &SecretKey, plain: &[u8; HOP_PAYLOADS_LEN]) -> Onion {
    let secp = Secp256k1::new();
    let session = key(0x77);
    let secret = SharedSecret::new(&PublicKey::from_secret_key(&secp, node), &session);
    let rho = mac(b"rho", &[&secret.secret_bytes()]);
    let mu = mac(b"mu", &[&secret.secret_bytes()]);
    let mut payloads = *plain;
    ChaCha20::new(&rho.into(), &[0u8; 12].into()).apply_keystream(&mut payloads);
    let mut bytes = vec![0u8];
    bytes.extend_from_slice(&PublicKey::from_secret_key(&secp, &session).serialize());
    bytes.extend_from_slice(&payloads);
    bytes.extend_from_slice(&mac(&mu, &[&payloads, &AD]));
    Onion::try_from(bytes.as_slice()).unwrap()
}

fn peel_plain(prefix: &[u8]) -> Result<onion::Peeled, PeelError> {
    let node = key(0x11);
    let mut plain = [0u8; HOP_PAYLOADS_LEN];
    plain[..prefix.len()].copy_from_slice(prefix);
    peel(&Secp256k1::new(), &node, &craft(&node, &plain), &AD)
}

#[test]
fn the_crafting_matches_the_crate_so_the_refusals_below_are_about_content() {
    // Length 2, payload "ab", all-zero next HMAC: a final hop.
    let peeled = peel_plain(&[2, b'a', b'b']).unwrap();
    assert_eq!(peeled.payload, b"ab");
    assert_eq!(peeled.next, Next::Final);
}

#[test]
fn a_payload_length_past_the_end_is_refused() {
    // The longest payload that leaves room for its prefix and the next HMAC: 1300 - 3 - 32.
    let fits = (HOP_PAYLOADS_LEN - 3 - 32) as u16;
    let [hi, lo] = fits.to_be_bytes();
    assert_eq!(
        peel_plain(&[0xfd, hi, lo]).unwrap().payload.len(),
        usize::from(fits)
    );
    let [hi, lo] = (fits + 1).to_be_bytes();
    assert_eq!(
        peel_plain(&[0xfd, hi, lo]).unwrap_err(),
        PeelError::PayloadTooLong(u64::from(fits) + 1)
    );
    assert_eq!(
        peel_plain(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]).unwrap_err(),
        PeelError::PayloadTooLong(u64::MAX)
    );
}

#[test]
fn a_payload_under_two_bytes_or_a_non_canonical_length_is_refused() {
    assert_eq!(peel_plain(&[0]).unwrap_err(), PeelError::PayloadTooShort(0));
    assert_eq!(
        peel_plain(&[1, 9]).unwrap_err(),
        PeelError::PayloadTooShort(1)
    );
    // 16 written in three bytes where one would do.
    assert_eq!(
        peel_plain(&[0xfd, 0x00, 0x10]).unwrap_err(),
        PeelError::PayloadLength
    );
}

#[test]
fn a_wrong_version_is_refused_before_anything_else() {
    let node = key(0x11);
    let mut plain = [0u8; HOP_PAYLOADS_LEN];
    plain[..3].copy_from_slice(&[2, 1, 2]);
    let mut bytes = craft(&node, &plain).as_bytes().to_vec();
    for version in [1u8, 2, 0xff] {
        bytes[0] = version;
        let packet = Onion::try_from(bytes.as_slice()).unwrap();
        assert_eq!(
            peel(&Secp256k1::new(), &node, &packet, &AD).unwrap_err(),
            PeelError::Version(version)
        );
    }
}

#[test]
fn an_ephemeral_key_off_the_curve_is_refused() {
    let node = key(0x11);
    let mut bytes = craft(&node, &[0u8; HOP_PAYLOADS_LEN]).as_bytes().to_vec();
    // x = 5 is not on secp256k1.
    bytes[1..34].copy_from_slice(&[&[2u8][..], &[0; 31], &[5]].concat());
    let packet = Onion::try_from(bytes.as_slice()).unwrap();
    assert!(matches!(
        peel(&Secp256k1::new(), &node, &packet, &AD).unwrap_err(),
        PeelError::EphemeralKey(_)
    ));
}

#[test]
fn routes_that_cannot_be_built_are_refused() {
    let secp = Secp256k1::new();
    let node_id = PublicKey::from_secret_key(&secp, &key(0x11));
    assert_eq!(
        build(&secp, &key(1), &[], &AD).unwrap_err(),
        BuildError::EmptyRoute
    );
    let short = Hop {
        node_id,
        payload: &[7],
    };
    assert_eq!(
        build(&secp, &key(1), &[short], &AD).unwrap_err(),
        BuildError::PayloadTooShort { hop: 0, len: 1 }
    );
    // Two hops of 600 bytes: 2 × (3 + 600 + 32) = 1270 fit; a third of 2 bytes (35) does not.
    let big = vec![1u8; 600];
    let route = [
        Hop {
            node_id,
            payload: &big,
        },
        Hop {
            node_id,
            payload: &big,
        },
    ];
    assert!(build(&secp, &key(1), &route, &AD).is_ok());
    let mut longer = route.to_vec();
    longer.push(Hop {
        node_id,
        payload: &[1, 2],
    });
    assert_eq!(
        build(&secp, &key(1), &longer, &AD).unwrap_err(),
        BuildError::RouteTooLong { needed: 1270 + 35 }
    );
}
