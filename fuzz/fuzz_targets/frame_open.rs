//! The opener against arbitrary and against tampered streams.
//!
//! Input: byte 0 = mode. Mode even: the rest is a raw stream fed to the
//! opener. Mode odd: the rest is cut into payloads, sealed with the matching
//! keys, one byte of the stream is flipped at a position taken from the input,
//! and the opener must return only the original payloads, in order, before it
//! stops: never panic, never yield altered data.
#![no_main]

use libfuzzer_sys::fuzz_target;
use session::{DirectionKeys, Opener, Sealer};

fn keys() -> DirectionKeys {
    DirectionKeys {
        aes_key: [1; 16],
        hmac_key: [2; 32],
        iv: [3; 16],
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut opener = Opener::new(&keys());
    if mode % 2 == 0 {
        let mut at = 0;
        while let Ok(Some((_, used))) = opener.open_from(&rest[at..]) {
            at += used;
        }
        return;
    }
    let payloads: Vec<&[u8]> = rest.split(|&b| b == 0xff).filter(|p| !p.is_empty()).collect();
    let mut sealer = Sealer::new(&keys());
    let mut stream = Vec::new();
    for p in &payloads {
        sealer.seal_into(p, &mut stream).expect("fuzz payloads are small");
    }
    if !stream.is_empty() {
        let flip = usize::from(mode) * 7919 % stream.len();
        stream[flip] ^= 1 << (mode % 8);
    }
    let mut at = 0;
    let mut i = 0;
    while let Ok(Some((plain, used))) = opener.open_from(&stream[at..]) {
        assert_eq!(plain, payloads[i], "a tampered frame opened to other data");
        at += used;
        i += 1;
    }
});
