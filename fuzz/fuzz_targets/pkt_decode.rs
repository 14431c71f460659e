//! Arbitrary bytes as a frame's plaintext: decoding must never panic, and what decodes must re-encode and decode to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::Packet;

fuzz_target!(|data: &[u8]| {
    if let Ok(packet) = Packet::decode(data) {
        let again = Packet::decode(&packet.encode()).expect("our encoding of a valid packet decodes");
        assert_eq!(again, packet);
    }
});
