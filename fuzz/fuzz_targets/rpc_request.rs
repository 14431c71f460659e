//! Arbitrary bytes as a JSON-RPC request body to the development chain's
//! server: it never panics, and always answers with Core's HTTP statuses and
//! a JSON-RPC reply. Mining requests are skipped (a request for 10^9 blocks is
//! slow by design, not a bug).
#![no_main]

use std::sync::OnceLock;

use chain::dev::server::handle_body;
use chain::DevChain;
use libfuzzer_sys::fuzz_target;

fn chain() -> &'static DevChain {
    static CHAIN: OnceLock<DevChain> = OnceLock::new();
    CHAIN.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("potluck-fuzz-chain-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        DevChain::open(&dir).expect("a fresh development chain opens")
    })
}

fuzz_target!(|data: &[u8]| {
    if data.windows(8).any(|w| w.eq_ignore_ascii_case(b"generate")) {
        return;
    }
    let (status, reply) = handle_body(chain(), data);
    assert!(matches!(status, 200 | 400 | 404 | 500), "status {status}");
    assert!(reply.is_object() || reply.is_array(), "reply {reply}");
});
