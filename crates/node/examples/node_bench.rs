//! Figures of the node (docs/benchmarks.md, "Node"): real nodes in one process on loopback,
//! each with its own SQLite database (persistence on, synchronous = FULL), on an in-process
//! development chain, driven through their control APIs (JSON-RPC over HTTP) as users do.
//!
//! `cargo run --release -p potluck-node --example node_bench [-- CHANNELS PAIRS]`
//!
//! - connect+handshake: `session::connect` to a node (TCP, v3 handshake, authenticate, hello);
//! - HTLC add+fulfill pairs/s on one channel (`newhtlc` by A, `fulfillhtlc` by B);
//! - the same across CHANNELS channels (one hub, CHANNELS peers) in parallel;
//! - memory per idle channel (RSS growth from opening CHANNELS channels, both ends in process),
//!   and where the memory goes: per idle node, per idle peer session and per idle channel, each
//!   split into the Rust heap (a counting global allocator), SQLite's heap (with
//!   `NODE_BENCH_SQLITE_HEAP=1` only: SQLite is built without allocation statistics), malloc's
//!   free slack and the rest (thread stacks, mapped files);
//! - baseline, same run: the in-memory state machines alone (no IO), add+fulfill pairs/s.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bitcoin::hashes::{sha256, Hash as _};
use bitcoin::{Address, Amount};
use chain::{Auth, BitcoindRpc, Chain, DevChain, DevChainConfig, RpcConfig};
use secp256k1::SecretKey;
use serde_json::{json, Value};
use support::{
    cpu_seconds, distribution_us, fsync_latency, idle_policy, in_memory_pairs, mean, median,
    packet_rtt, HTLC_MSAT,
};

struct Node {
    running: node::RunningNode,
    rpc: BitcoindRpc,
    _dir: tempfile::TempDir,
}

async fn start_node(chain: &DevChain) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let mut config = node::NodeConfig::new(dir.path());
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.rpc_bind = "127.0.0.1:0".parse().unwrap();
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

impl Node {
    async fn call(&self, method: &str, params: Value) -> Value {
        self.rpc
            .call::<Value>(method, params)
            .await
            .unwrap_or_else(|e| panic!("{method}: {e}"))
    }
}

fn rss_kib() -> u64 {
    status_field("VmRSS:")
}

/// A number field of /proc/self/status (0 if absent).
fn status_field(name: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Where the process's memory is, beyond the RSS: what Rust code holds on the heap, what
/// SQLite holds, and what malloc keeps free. The unsafe code of the workspace lives here only
/// (node's Cargo.toml lowers `unsafe_code` to deny for it; the library forbids it).
#[allow(unsafe_code)]
mod mem {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};

    /// Bytes that Rust code holds on the heap now (requested sizes, without malloc's headers).
    static LIVE: AtomicIsize = AtomicIsize::new(0);
    /// The most `LIVE` reached since the last [`snapshot`].
    static PEAK: AtomicIsize = AtomicIsize::new(0);
    /// Allocations made (a realloc counts as one) and bytes they asked for, since the start.
    static ALLOCS: AtomicIsize = AtomicIsize::new(0);
    static ASKED: AtomicIsize = AtomicIsize::new(0);

    fn grew(by: isize) {
        let now = LIVE.fetch_add(by, Relaxed) + by;
        PEAK.fetch_max(now, Relaxed);
        ALLOCS.fetch_add(1, Relaxed);
        ASKED.fetch_add(by.max(0), Relaxed);
    }

    /// The system allocator, counting live bytes.
    struct Counting;

    // SAFETY: every call is forwarded unchanged to `System`; the counter is only arithmetic.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the caller's contract for `layout` is System's.
            let p = unsafe { System.alloc(layout) };
            if !p.is_null() {
                grew(layout.size() as isize);
            }
            p
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: as `alloc`.
            let p = unsafe { System.alloc_zeroed(layout) };
            if !p.is_null() {
                grew(layout.size() as isize);
            }
            p
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: `ptr` came from this allocator, that is from System, with `layout`.
            unsafe { System.dealloc(ptr, layout) };
            LIVE.fetch_sub(layout.size() as isize, Relaxed);
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: as `dealloc`, and `new_size` is the caller's to get right.
            let p = unsafe { System.realloc(ptr, layout, new_size) };
            if !p.is_null() {
                grew(new_size as isize - layout.size() as isize);
            }
            p
        }
    }

    #[global_allocator]
    static GLOBAL: Counting = Counting;

    /// glibc's `struct mallinfo2` (malloc.h).
    #[repr(C)]
    #[derive(Default)]
    struct MallInfo2 {
        arena: usize,
        ordblks: usize,
        smblks: usize,
        hblks: usize,
        hblkhd: usize,
        usmblks: usize,
        fsmblks: usize,
        uordblks: usize,
        fordblks: usize,
        keepcost: usize,
    }

    extern "C" {
        /// glibc: totals over every malloc arena.
        fn mallinfo2() -> MallInfo2;
        /// SQLite: bytes its allocator holds now (0 unless its statistics are on).
        fn sqlite3_memory_used() -> i64;
        /// SQLite's process-wide settings, before its first use.
        fn sqlite3_config(op: std::ffi::c_int, ...) -> std::ffi::c_int;
    }

    /// `SQLITE_CONFIG_MEMSTATUS`.
    const SQLITE_CONFIG_MEMSTATUS: std::ffi::c_int = 9;

    /// Whether SQLite's heap is counted in this run.
    static SQLITE_STATS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    /// With `NODE_BENCH_SQLITE_HEAP=1`, turns SQLite's allocation statistics on (the build
    /// compiles them out: they take a process-wide mutex on every malloc, which slows the
    /// throughput figures, so a run that counts SQLite's heap is not one to time). Must run
    /// before anything opens a database.
    pub fn count_sqlite_heap_if_asked() {
        if std::env::var_os("NODE_BENCH_SQLITE_HEAP").is_some_and(|v| v == "1") {
            // SAFETY: a documented SQLite setting with one int argument, called before
            // SQLite is initialised (it answers SQLITE_MISUSE otherwise, checked).
            let rc = unsafe { sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 1 as std::ffi::c_int) };
            assert_eq!(rc, 0, "sqlite3_config(MEMSTATUS) before any connection");
            SQLITE_STATS.store(true, Relaxed);
        }
    }

    /// One reading.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct Snapshot {
        /// Resident set, KiB.
        pub rss_kib: i64,
        /// Rust heap, live bytes.
        pub rust: i64,
        /// SQLite's heap (page caches, prepared statements, schemas), live bytes.
        pub sqlite: i64,
        /// Bytes malloc has handed out and not got back (Rust, SQLite, everything else).
        pub malloc_used: i64,
        /// Bytes malloc holds from the system but has free (arena slack, top chunks).
        pub malloc_free: i64,
        /// Threads of the process.
        pub threads: i64,
        /// The highest Rust heap since the previous snapshot.
        pub rust_peak: i64,
        /// Rust allocations so far, and the bytes they asked for.
        pub allocs: i64,
        pub asked: i64,
    }

    /// Reads everything at once.
    pub fn snapshot() -> Snapshot {
        // SAFETY: both are plain C calls without arguments that only read counters.
        let (mi, sqlite) = unsafe { (mallinfo2(), sqlite3_memory_used()) };
        let to_i = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        let num = |name| i64::try_from(super::status_field(name)).unwrap_or(i64::MAX);
        Snapshot {
            rss_kib: num("VmRSS:"),
            rust: LIVE.load(Relaxed) as i64,
            sqlite,
            malloc_used: to_i(mi.uordblks) + to_i(mi.hblkhd),
            malloc_free: to_i(mi.fordblks),
            threads: num("Threads:"),
            rust_peak: PEAK.swap(LIVE.load(Relaxed), Relaxed) as i64,
            allocs: ALLOCS.load(Relaxed) as i64,
            asked: ASKED.load(Relaxed) as i64,
        }
    }

    impl Snapshot {
        /// What grew from `before` to `self`, per `n` things, as one line of KiB.
        pub fn per(&self, before: &Snapshot, n: usize) -> String {
            let n = n as f64;
            let kib = |b: i64| b as f64 / 1024.0 / n;
            let rss = (self.rss_kib - before.rss_kib) as f64 / n;
            let used = self.malloc_used - before.malloc_used;
            let free = self.malloc_free - before.malloc_free;
            let other_malloc = used - (self.rust - before.rust) - (self.sqlite - before.sqlite);
            let sqlite = if SQLITE_STATS.load(Relaxed) {
                format!("SQLite heap {:.1}", kib(self.sqlite - before.sqlite))
            } else {
                "SQLite heap n/a (in other malloc; NODE_BENCH_SQLITE_HEAP=1 counts it)".to_string()
            };
            format!(
                "RSS {rss:.1} = Rust heap {:.1} + {sqlite} + other malloc {:.1} + malloc free {:.1} + rest {:.1} (stacks, mapped files; threads {:+.2}); Rust heap peak above the end {:.0} KiB in all, Rust allocations {:.0} asking {:.1}",
                kib(self.rust - before.rust),
                kib(other_malloc),
                kib(free),
                rss - kib(used + free),
                (self.threads - before.threads) as f64 / n,
                (self.rust_peak - self.rust) as f64 / 1024.0,
                (self.allocs - before.allocs) as f64 / n,
                kib(self.asked - before.asked),
            )
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

/// `pairs` add+fulfill pairs from `a` to `b` (`tag` keeps R unique); returns each pair's time.
async fn htlc_pairs(a: &Node, b: &Node, pairs: u32, tag: u32, expiry: u32) -> Vec<f64> {
    let b_id = b.running.node_id.to_string();
    let a_id = a.running.node_id.to_string();
    let mut times = Vec::with_capacity(pairs as usize);
    for i in 0..pairs {
        let t = Instant::now();
        let mut r = [0u8; 32];
        r[..4].copy_from_slice(&tag.to_le_bytes());
        r[4..8].copy_from_slice(&i.to_le_bytes());
        let hash = sha256::Hash::hash(&r);
        a.call(
            "newhtlc",
            json!([b_id, HTLC_MSAT, hex::encode(hash.to_byte_array()), expiry]),
        )
        .await;
        b.call("fulfillhtlc", json!([a_id, hex::encode(r)])).await;
        times.push(t.elapsed().as_secs_f64());
    }
    times
}

/// `pairs` pairs on one channel, alternating the direction (`a` pays `b`, then `b` pays `a`).
async fn htlc_pairs_both(a: &Node, b: &Node, pairs: u32, tag: u32, expiry: u32) -> Vec<f64> {
    let mut times = Vec::with_capacity(pairs as usize);
    for i in 0..pairs {
        let (from, to) = if i % 2 == 0 { (a, b) } else { (b, a) };
        times.extend(htlc_pairs(from, to, 1, tag + i, expiry).await);
    }
    times
}

/// `per_channel` pairs on every channel at once; returns pairs/s and CPU ms per pair.
async fn every_channel(
    hub: &Arc<Node>,
    peers: &[Arc<Node>],
    per_channel: u32,
    tag: u32,
    expiry: u32,
    both_ways: bool,
) -> (f64, f64) {
    let start = Instant::now();
    let cpu_start = cpu_seconds();
    let mut tasks = Vec::new();
    for (i, p) in peers.iter().enumerate() {
        let hub = Arc::clone(hub);
        let p = Arc::clone(p);
        // Tags apart by more than any run's pairs: every payment hash is new.
        let tag = (tag + i as u32) << 12;
        tasks.push(tokio::spawn(async move {
            if both_ways {
                htlc_pairs_both(&hub, &p, per_channel, tag, expiry).await;
            } else {
                htlc_pairs(&hub, &p, per_channel, tag, expiry).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let n = f64::from(per_channel) * peers.len() as f64;
    (
        n / start.elapsed().as_secs_f64(),
        (cpu_seconds() - cpu_start) * 1000.0 / n,
    )
}

/// The bench's one runtime: tokio's multi-thread scheduler (a worker per core, as
/// `potluck node` runs), or with `NODE_BENCH_RUNTIME=current_thread` every node on one
/// thread, which shows what the hand-offs between threads cost (docs/node.md, "What the
/// remaining gap is not").
fn main() {
    let current_thread =
        std::env::var_os("NODE_BENCH_RUNTIME").is_some_and(|v| v == "current_thread");
    let mut builder = if current_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = builder.enable_all().build().unwrap();
    println!(
        "runtime: {}",
        if current_thread {
            "current_thread (NODE_BENCH_RUNTIME)"
        } else {
            "multi_thread"
        }
    );
    println!("idle vCPUs: {}", idle_policy());
    runtime.block_on(bench());
}

async fn bench() {
    mem::count_sqlite_heap_if_asked();
    let mut args = std::env::args().skip(1);
    let channels: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100);
    let pairs: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(200);
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

    // Settled: the watchers' first passes and the chain's start are behind each reading.
    let settle = || tokio::time::sleep(Duration::from_secs(2));
    settle().await;
    let mem_start = mem::snapshot();
    let hub = start_node(&chain).await;
    let mut peers = Vec::new();
    for _ in 0..channels {
        peers.push(start_node(&chain).await);
    }
    settle().await;
    let mem_nodes = mem::snapshot();

    let connect_ms = connect_ms(&hub).await;

    fund(&chain, &hub, channels).await;
    settle().await;
    let mem_unconnected = mem::snapshot();
    for p in &peers {
        hub.call("connect", json!([p.running.p2p_addr.to_string()]))
            .await;
    }
    settle().await;
    let mem_connected = mem::snapshot();
    let rss_before = rss_kib();
    open_all(&chain, &hub, &peers).await;
    settle().await;
    // What idle nodes cost: their watchers, timers and reconnect loops, no traffic.
    let idle_start = (Instant::now(), cpu_seconds());
    settle().await;
    let idle_cpu = (cpu_seconds() - idle_start.1) / idle_start.0.elapsed().as_secs_f64();
    let rss_after = rss_kib();
    let mem_channels = mem::snapshot();
    let per_channel_kib = (rss_after.saturating_sub(rss_before)) as f64 / channels as f64;
    let expiry = chain.height() + 1000;

    // One channel.
    let start = Instant::now();
    let cpu_start = cpu_seconds();
    let pair_times = htlc_pairs(&hub, &peers[0], pairs, 0, expiry).await;
    let one = f64::from(pairs) / start.elapsed().as_secs_f64();
    let one_cpu_ms = (cpu_seconds() - cpu_start) * 1000.0 / f64::from(pairs);

    // Every channel at once.
    let per_channel = (pairs / 10).max(MIN_PER_CHANNEL);
    let hub = Arc::new(hub);
    let peers: Vec<Arc<Node>> = peers.into_iter().map(Arc::new).collect();
    let (all, all_cpu_ms) = every_channel(&hub, &peers, per_channel, 1, expiry, false).await;

    let warm = steady_state(&hub, &peers, pairs, per_channel, expiry).await;

    let (baseline, bound) = sequential_bound(pairs, &hub, &peers[0], one).await;
    Report {
        channels,
        pair_times,
        connect_ms,
        one,
        one_cpu_ms,
        all,
        all_cpu_ms,
        warm,
        baseline,
        bound,
        per_channel_kib,
        idle_cpu,
    }
    .print();
    print_memory(
        channels,
        [
            &mem_start,
            &mem_nodes,
            &mem_unconnected,
            &mem_connected,
            &mem_channels,
        ],
    );
}

/// What one run measured, printed by [`Report::print`] (memory apart).
struct Report {
    channels: usize,
    /// One channel's pair times, s.
    pair_times: Vec<f64>,
    connect_ms: f64,
    /// One channel's pairs/s and CPU per pair.
    one: f64,
    one_cpu_ms: f64,
    /// Every channel's pairs/s and CPU per pair.
    all: f64,
    all_cpu_ms: f64,
    warm: Warm,
    /// The in-memory state machines' pairs/s and one channel's bound.
    baseline: f64,
    bound: f64,
    per_channel_kib: f64,
    /// Cores kept busy by the idle nodes.
    idle_cpu: f64,
}

impl Report {
    fn print(&self) {
        let Report {
            channels,
            ref pair_times,
            connect_ms,
            one,
            one_cpu_ms,
            all,
            all_cpu_ms,
            ref warm,
            baseline,
            bound,
            per_channel_kib,
            idle_cpu,
        } = *self;
        println!("  one channel's pairs: {}", distribution_us(pair_times, 0));
        println!("connect+handshake (TCP, v3 handshake, authenticate, hello): {connect_ms:.2} ms");
        println!(
            "HTLC add+fulfill pairs/s, one channel: {one:.0}  ({:.1}% of the in-memory state machines)",
            one / baseline * 100.0
        );
        println!(
            "HTLC add+fulfill pairs/s, {channels} channels in parallel: {all:.0}  ({:.2}x one channel)",
            all / one
        );
        println!(
            "steady state (after {WARM_PAIRS} more pairs on every channel, directions alternating): one channel {:.0} pairs/s ({:.0}% of the bound from the medians, pairs median {:.0} us, mean {:.0} us); {channels} channels in parallel {:.0} pairs/s; CPU per pair {:.2} / {:.2} ms",
            warm.one,
            warm.one / bound * 100.0,
            median(warm.times.clone()) * 1e6,
            mean(&warm.times) * 1e6,
            warm.all,
            warm.one_cpu_ms,
            warm.all_cpu_ms
        );
        println!("baseline, in-memory state machines without IO: {baseline:.0} pairs/s");
        println!(
            "CPU time per pair, both ends and the bench's client (user + system): one channel {one_cpu_ms:.2} ms, {channels} channels in parallel {all_cpu_ms:.2} ms; in-memory pair {:.2} ms; cores kept busy: one channel {:.2}, {channels} channels {:.2}",
            1000.0 / baseline,
            one_cpu_ms * one / 1000.0,
            all_cpu_ms * all / 1000.0
        );
        println!(
            "memory per idle channel (both ends, RSS growth / {channels}): {per_channel_kib:.0} KiB"
        );
        println!(
            "CPU of {} idle nodes with {channels} open channels: {:.1}% of one core",
            channels + 1,
            idle_cpu * 100.0
        );
    }
}

/// Mean time of a connect + v3 handshake against the hub's listener, a fresh session each.
async fn connect_ms(hub: &Node) -> f64 {
    let key = SecretKey::from_slice(&[0x42; 32]).unwrap();
    let cfg = session::Config::default();
    let n_connect = 200;
    let start = Instant::now();
    for _ in 0..n_connect {
        let s = session::connect(hub.running.p2p_addr, &key, &cfg)
            .await
            .unwrap();
        let _ = s.close("bench").await;
    }
    start.elapsed().as_secs_f64() * 1000.0 / f64::from(n_connect)
}

/// Funds the hub with one 300,000-sat output per channel, confirmed.
async fn fund(chain: &DevChain, hub: &Node, channels: usize) {
    let burn = chain.faucet_script().to_owned();
    for i in 0..channels {
        // The faucet's payments chain through its change: a block every 20
        // keeps them under the mempool's limit of 25 unconfirmed ancestors.
        if i % 20 == 19 {
            chain.mine(1, &burn).unwrap();
        }
        let addr = hub.call("newaddr", json!([])).await;
        let addr: Address<bitcoin::address::NetworkUnchecked> =
            addr["address"].as_str().unwrap().parse().unwrap();
        let script = addr.assume_checked().script_pubkey();
        chain.faucet(&script, Amount::from_sat(300_000)).unwrap();
    }
    chain.mine(1, &burn).unwrap();
    wait_until("hub funded", async || {
        hub.call("listfunds", json!([])).await["total_sat"].as_u64()
            == Some(300_000 * channels as u64)
    })
    .await;
}

/// The sequential bound of one channel, printed beside `one` (its achieved pairs/s):
/// returns the in-memory pairs/s (the baseline) and the bound from the medians.
async fn sequential_bound(pairs: u32, hub: &Node, peer: &Node, one: f64) -> (f64, f64) {
    let mem = in_memory_pairs(pairs * 5);
    let baseline = mem.pairs_per_s;
    let (fsyncs, fsync_cpu) = fsync_latency(hub._dir.path(), 1);
    // A channel write is one to five WAL frames (a frame is a page plus 24 bytes): does the
    // size of a flush cost time on this disk, or only the flush itself?
    let (fsyncs_16k, _) = fsync_latency(hub._dir.path(), 4);
    let pkts = packet_rtt().await;
    let mut ctrl = Vec::new();
    // On a node with one peer: the call's transport and dispatch, not a listing of 100 peers.
    for _ in 0..300 {
        let t = Instant::now();
        peer.call("listpeers", json!([])).await;
        ctrl.push(t.elapsed().as_secs_f64());
    }
    // One pair, sequentially: the machines' work, every durable write, every packet's
    // one-way trip and the two control calls (newhtlc, fulfillhtlc), nothing overlapping.
    let pair_s = |fsync: f64, pkt_rtt: f64, ctrl_rtt: f64| {
        1.0 / baseline
            + mem.persists_per_pair * fsync
            + mem.packets_per_pair * pkt_rtt / 2.0
            + 2.0 * ctrl_rtt
    };
    let bound = 1.0
        / pair_s(
            median(fsyncs.clone()),
            median(pkts.clone()),
            median(ctrl.clone()),
        );
    // Sequential throughput is 1 / the mean time of a pair: the bound of the means counts
    // the disk's slow flushes as often as a run of pairs meets them.
    let bound_mean = 1.0 / pair_s(mean(&fsyncs), mean(&pkts), mean(&ctrl));
    println!("bound of one channel, sequential pairs:");
    println!("  in-memory time of a pair: {:.1} us", 1e6 / baseline);
    println!(
        "  fsync latency of the data directory's disk (4 KiB + fdatasync, 1,000 samples): {}; CPU time of one: {:.0} us",
        distribution_us(&fsyncs, 1),
        fsync_cpu * 1e6
    );
    println!(
        "  the same with 16 KiB per fdatasync: {}",
        distribution_us(&fsyncs_16k, 1)
    );
    println!(
        "  durable writes on the critical path of a pair: {:.1}",
        mem.persists_per_pair
    );
    println!(
        "  packets per pair: {:.1}; loopback round trip of a packet (v3 session): median {:.1} us, mean {:.1} us",
        mem.packets_per_pair,
        median(pkts.clone()) * 1e6,
        mean(&pkts) * 1e6
    );
    println!(
        "  loopback round trip of a control call (listpeers on a node with one peer): median {:.1} us, mean {:.1} us",
        median(ctrl.clone()) * 1e6,
        mean(&ctrl) * 1e6
    );
    println!(
        "  sequential bound from the medians: {bound:.0} pairs/s; achieved: {one:.0} pairs/s = {:.0}% of the bound",
        one / bound * 100.0
    );
    println!(
        "  sequential bound from the means: {bound_mean:.0} pairs/s; achieved = {:.0}% of it",
        one / bound_mean * 100.0
    );
    (baseline, bound)
}

/// Where the memory goes: `snaps` taken at start, with idle nodes, funded, connected and
/// with channels.
fn print_memory(channels: usize, snaps: [&mem::Snapshot; 5]) {
    let [mem_start, mem_nodes, mem_unconnected, mem_connected, mem_channels] = snaps;
    println!("where the memory goes, KiB:");
    println!(
        "  per idle node ({} started, no peer): {}",
        channels + 1,
        mem_nodes.per(mem_start, channels + 1)
    );
    println!(
        "  per idle peer session (both ends, {channels} sessions): {}",
        mem_connected.per(mem_unconnected, channels)
    );
    println!(
        "  per idle channel (both ends, {channels} channels): {}",
        mem_channels.per(mem_connected, channels)
    );
}

/// The hub opens a 250,000-sat channel to every peer; returns once all are live.
async fn open_all(chain: &DevChain, hub: &Node, peers: &[Node]) {
    let channels = peers.len();
    for p in peers {
        hub.call("open", json!([p.running.node_id.to_string(), 250_000]))
            .await;
    }
    chain.mine(1, chain.faucet_script()).unwrap();
    wait_until("channels live", async || {
        let list = hub.call("listchannels", json!([])).await;
        list["channels"]
            .as_array()
            .is_some_and(|c| c.len() == channels && c.iter().all(|c| c["state"] == "normal"))
    })
    .await;
}

/// Pairs after every channel ran [`WARM_PAIRS`] more: one channel, then all of them.
struct Warm {
    times: Vec<f64>,
    one: f64,
    one_cpu_ms: f64,
    all: f64,
    all_cpu_ms: f64,
}

/// Pairs every channel runs one way (the hub paying) before the phases that alternate
/// directions: a peer pays back only once it holds its share of the commitment fee
/// (PROTOCOL-NOTES §8: about 5,000 sat here) above the HTLC. With 5, `node_bench 2 10` failed
/// in its warm-up: "5600000 msat needed, 3600000 msat available".
const MIN_PER_CHANNEL: u32 = 10;

/// Pairs every channel runs to warm up before the steady-state readings.
const WARM_PAIRS: u32 = 100;

/// Steady state. Every node is fresh, and SQLite's WAL grows until its first checkpoint
/// (1,000 pages, ~333 channel writes); on this file system a commit that grows a file also
/// writes its metadata synchronously (docs/node.md). A node that has run a while rewrites
/// its WAL in place: warm every channel past that point, then measure again. Directions
/// alternate so that no side runs out of funds.
async fn steady_state(
    hub: &Arc<Node>,
    peers: &[Arc<Node>],
    pairs: u32,
    per_channel: u32,
    expiry: u32,
) -> Warm {
    let _ = every_channel(hub, peers, WARM_PAIRS, 1_000, expiry, true).await;
    let start = Instant::now();
    let cpu_start = cpu_seconds();
    let times = htlc_pairs_both(hub, &peers[0], pairs, 2_000, expiry).await;
    let one = f64::from(pairs) / start.elapsed().as_secs_f64();
    let one_cpu_ms = (cpu_seconds() - cpu_start) * 1000.0 / f64::from(pairs);
    let (all, all_cpu_ms) = every_channel(hub, peers, per_channel, 3_000, expiry, true).await;
    Warm {
        times,
        one,
        one_cpu_ms,
        all,
        all_cpu_ms,
    }
}
