//! Arbitrary bytes as the development chain's `blocks.dat` and `mempool.dat`:
//! opening the data directory never panics; it either loads or reports a
//! typed error.
#![no_main]

use chain::DevChain;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("potluck-fuzz-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (blocks, mempool) = data.split_at(data.len() / 2);
    std::fs::write(dir.join("blocks.dat"), blocks).expect("write");
    std::fs::write(dir.join("mempool.dat"), mempool).expect("write");
    // A key so that opening does not depend on the OS random source.
    std::fs::write(dir.join("faucet.key"), "01".repeat(32)).expect("write");
    let _ = DevChain::open(&dir);
});
