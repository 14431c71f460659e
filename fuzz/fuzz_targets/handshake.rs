//! Arbitrary bytes as the peer's side of a handshake, delivered in arbitrary chunks.
//!
//! We are node 0x11×32 with session key 0x33×32 (the transcript's A), so a
//! corpus seeded with B's recorded stream reaches every state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use secp256k1::SecretKey;
use session::{Handshake, Progress};

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, stream)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk.max(1));
    let node = SecretKey::from_slice(&[0x11; 32]).expect("valid key");
    let session = SecretKey::from_slice(&[0x33; 32]).expect("valid key");
    let mut hs = Handshake::new(node, session);
    let mut buffered = Vec::new();
    let mut out = Vec::new();
    for piece in stream.chunks(chunk) {
        buffered.extend_from_slice(piece);
        match hs.read(&buffered, &mut out) {
            Ok(Progress::Consumed(used)) => {
                buffered.drain(..used);
            }
            Ok(Progress::Established { consumed, .. }) => {
                assert!(consumed <= buffered.len());
                return;
            }
            Err(e) => {
                let _ = hs.farewell(&e);
                return;
            }
        }
    }
});
