//! Forwarded payments per second through one hop (docs/benchmarks.md, "Node"): three real
//! nodes A, B, C in one process on loopback, each with its own SQLite database
//! (synchronous = FULL), on an in-process development chain, driven through their control
//! APIs (JSON-RPC over HTTP) as users do. A pays C through B, PAYMENTS times, one after the
//! other: `invoice` on C, then `pay --route B,C`, which answers once the payment ended.
//! Baseline, same run: as many direct payments A → B along a one-node route (`invoice` on
//! B, `pay --route B`): the same calls and channel machinery without the forward. Reported
//! as payments per second and their ratio.
//!
//! `cargo run --release -p potluck-node --example forward_bench [-- PAYMENTS]` (default 100;
//! the channels of 500,000 sat carry about 200 payments of 1,000 sat each way)
// Benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bitcoin::{Address, Amount};
use chain::{Auth, BitcoindRpc, Chain, DevChain, DevChainConfig, RpcConfig};
use serde_json::{json, Value};

/// What each payment delivers (above the dust limit); B's fee on it is 1,010 msat (its
/// default schedule: 1,000 msat + 10 millionths).
const AMOUNT_MSAT: u64 = 1_000_000;
/// B's fee on each.
const FEE_MSAT: u64 = 1_010;
/// Payments made before the measured ones (first writes, WAL creation).
const WARM: u32 = 10;

struct Node {
    running: node::RunningNode,
    rpc: BitcoindRpc,
    _dir: tempfile::TempDir,
}

impl Node {
    async fn start(chain: &DevChain) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let mut config = node::NodeConfig::new(dir.path());
        config.listen = "127.0.0.1:0".parse().unwrap();
        config.rpc_bind = "127.0.0.1:0".parse().unwrap();
        config.channel.min_depth = 1;
        let running = node::start(config, Arc::new(chain.clone()) as Arc<dyn Chain>)
            .await
            .unwrap();
        let mut rc = RpcConfig::new(
            format!("http://{}/", running.rpc_addr),
            Auth::Cookie(running.cookie_path.clone()),
        );
        rc.retries = 0;
        rc.timeout = Duration::from_secs(120);
        Node {
            rpc: BitcoindRpc::new(rc).unwrap(),
            running,
            _dir: dir,
        }
    }

    async fn call(&self, method: &str, params: Value) -> Value {
        self.rpc
            .call::<Value>(method, params)
            .await
            .unwrap_or_else(|e| panic!("{method}: {e}"))
    }

    fn id(&self) -> String {
        self.running.node_id.to_string()
    }

    /// Funds the wallet with `sat` (confirmed).
    async fn fund(&self, chain: &DevChain, sat: u64) {
        let addr = self.call("newaddr", json!([])).await;
        let addr: Address<bitcoin::address::NetworkUnchecked> =
            addr["address"].as_str().unwrap().parse().unwrap();
        let script = addr.assume_checked().script_pubkey();
        chain.faucet(&script, Amount::from_sat(sat)).unwrap();
        chain.mine(1, chain.faucet_script()).unwrap();
        wait_until("funded", async || {
            self.call("listfunds", json!([])).await["total_sat"].as_u64() == Some(sat)
        })
        .await;
    }

    /// Opens a channel of `sat` to `peer` and waits until both list it `normal`.
    async fn open(&self, chain: &DevChain, peer: &Node, sat: u64) {
        self.call("connect", json!([peer.running.p2p_addr.to_string()]))
            .await;
        self.call("open", json!([peer.id(), sat])).await;
        chain.mine(1, chain.faucet_script()).unwrap();
        for (n, other) in [(self, peer), (peer, self)] {
            wait_until("channel live", async || {
                let list = n.call("listchannels", json!([])).await;
                list["channels"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["peer_id"] == other.id().as_str() && c["state"] == "normal")
                })
            })
            .await;
        }
    }
}

async fn wait_until(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `n` payments from `payer` along `route` to `payee`'s invoices (labels `tag`-i); each
/// must end paid. Returns the payments per second.
async fn payments(payer: &Node, payee: &Node, route: &str, n: u32, tag: &str) -> f64 {
    let start = Instant::now();
    for i in 0..n {
        let inv = payee
            .call("invoice", json!([AMOUNT_MSAT, format!("{tag}-{i}")]))
            .await;
        let r_hash = inv["r_hash"].as_str().unwrap();
        let paid = payer
            .call("pay", json!(["--route", route, r_hash, AMOUNT_MSAT]))
            .await;
        assert_eq!(paid["payment"]["status"], "paid", "{paid}");
    }
    f64::from(n) / start.elapsed().as_secs_f64()
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(bench());
}

async fn bench() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let dir = tempfile::tempdir().unwrap();
    let dev = DevChain::start(DevChainConfig {
        data_dir: dir.path().join("chain"),
        block_interval: None,
        rpc_bind: None,
        rpc_auth: None,
    })
    .await
    .unwrap();
    let chain = dev.chain.clone();
    let (a, b, c) = (
        Node::start(&chain).await,
        Node::start(&chain).await,
        Node::start(&chain).await,
    );
    a.fund(&chain, 1_000_000).await;
    b.fund(&chain, 1_000_000).await;
    a.open(&chain, &b, 500_000).await;
    b.open(&chain, &c, 500_000).await;
    let through_b = format!("{},{}", b.id(), c.id());
    let to_b = b.id();
    payments(&a, &c, &through_b, WARM, "warm-forward").await;
    payments(&a, &b, &to_b, WARM, "warm-direct").await;

    let forwarded = payments(&a, &c, &through_b, n, "forward").await;
    let direct = payments(&a, &b, &to_b, n, "direct").await;

    let listed = b.call("listforwards", json!([])).await;
    let total = u64::from(n + WARM);
    assert_eq!(listed["fulfilled"], total, "every forward fulfilled");
    assert_eq!(
        listed["fees_earned_msat"],
        total * FEE_MSAT,
        "B's fee on each"
    );
    println!("payments: {n} each way, {AMOUNT_MSAT} msat each, sequential");
    println!("forwarded A->B->C: {forwarded:.1} payments/s");
    println!("direct A->B (baseline, same run): {direct:.1} payments/s");
    println!("ratio forwarded/direct: {:.2}", forwarded / direct);
    println!(
        "B's forwards: {} fulfilled, {} msat earned",
        listed["fulfilled"], listed["fees_earned_msat"]
    );
}
