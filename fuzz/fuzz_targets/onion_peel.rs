//! Peeling arbitrary onions and reading arbitrary hop payloads: never a panic.
//!
//! Input: byte 0 = mode. Mode even: the rest is taken as the packet itself
//! (refused unless 1366 bytes; then almost always at the HMAC). Mode odd: the
//! rest, cut or zero-padded to 1300 bytes, is the decrypted hop payloads of an
//! onion sealed here with a valid HMAC, so that the length and payload checks
//! behind the HMAC are reached. Any payload that decodes must re-encode to
//! itself.
#![no_main]

use chacha20::cipher::{KeyIvInit, StreamCipher};
use chacha20::ChaCha20;
use hmac::{Hmac, Mac};
use libfuzzer_sys::fuzz_target;
use onion::{peel, HopPayload, HOP_PAYLOADS_LEN};
use secp256k1::{ecdh::SharedSecret, PublicKey, Secp256k1, SecretKey};
use sha2::Sha256;
use wire::Onion;

const AD: [u8; 32] = [0x42; 32];

fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// An onion to `node` whose hop payloads decrypt to `plain`, with a correct HMAC.
fn seal(secp: &Secp256k1<secp256k1::All>, node: &SecretKey, plain: &[u8]) -> Onion {
    let session = SecretKey::from_slice(&[0x77; 32]).expect("valid key");
    let secret = SharedSecret::new(&PublicKey::from_secret_key(secp, node), &session);
    let mut payloads = [0u8; HOP_PAYLOADS_LEN];
    let n = plain.len().min(HOP_PAYLOADS_LEN);
    payloads[..n].copy_from_slice(&plain[..n]);
    let rho = mac(b"rho", &[&secret.secret_bytes()]);
    ChaCha20::new(&rho.into(), &[0u8; 12].into()).apply_keystream(&mut payloads);
    let mu = mac(b"mu", &[&secret.secret_bytes()]);
    let mut bytes = vec![0u8];
    bytes.extend_from_slice(&PublicKey::from_secret_key(secp, &session).serialize());
    bytes.extend_from_slice(&payloads);
    bytes.extend_from_slice(&mac(&mu, &[&payloads, &AD]));
    Onion::try_from(bytes.as_slice()).expect("1366 bytes")
}

fn check_payload(bytes: &[u8]) {
    if let Ok(p) = HopPayload::decode(bytes) {
        assert_eq!(HopPayload::decode(&p.encode()), Ok(p));
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    check_payload(rest);
    let secp = Secp256k1::new();
    let node = SecretKey::from_slice(&[0x11; 32]).expect("valid key");
    let packet = if mode % 2 == 0 {
        match Onion::try_from(rest) {
            Ok(p) => p,
            Err(_) => return,
        }
    } else {
        seal(&secp, &node, rest)
    };
    if let Ok(peeled) = peel(&secp, &node, &packet, &AD) {
        check_payload(&peeled.payload);
    }
});
