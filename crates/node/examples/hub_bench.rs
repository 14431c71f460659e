//! The node under test alone (issue 33, docs/benchmarks.md, "Node under test"): the release
//! `potluck node` binary runs as its own process, the hub, and its peers run in this one, each
//! with a channel that the peer opened; the peers pay the hub (`newhtlc`) and the hub fulfills
//! (`fulfillhtlc`), both through the control API as users drive a node. Every figure is the
//! hub's alone: its CPU time from `/proc/<pid>/stat`, its context switches summed over its
//! threads, and its system calls by kind from `perf stat` (tracepoints) or, where perf has
//! none, `strace -c -f`. Beside them, measured in the same run, the in-memory cost of the
//! hub's own side of the two state machines. The counts do not depend on the machine's speed:
//! they are the figures to judge.
//!
//! `cargo build --release -p potluck && cargo run --release -p potluck-node --example hub_bench [-- CHANNELS PAIRS]`
//! (`scripts/bench-hub.sh`); `POTLUCK_BIN` names the binary (default `target/release/potluck`).
// Benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

#[path = "support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bitcoin::hashes::{sha256, Hash as _};
use bitcoin::{Address, Amount};
use chain::{Auth, BitcoindRpc, Chain, DevChain, DevChainConfig, RpcConfig};
use serde_json::{json, Value};
use support::{
    cpu_seconds_of, distribution_us, fsync_latency, idle_policy, in_memory_pairs, mean, median,
    packet_rtt, skeleton_pairs, sqlite_commit_latency, HTLC_MSAT,
};

/// A node's control API.
struct Control {
    rpc: BitcoindRpc,
    node_id: String,
}

impl Control {
    fn new(url: String, cookie: PathBuf, node_id: String) -> Self {
        let mut rc = RpcConfig::new(url, Auth::Cookie(cookie));
        rc.retries = 0;
        rc.timeout = Duration::from_secs(120);
        Self {
            rpc: BitcoindRpc::new(rc).unwrap(),
            node_id,
        }
    }

    async fn call(&self, method: &str, params: Value) -> Value {
        self.rpc
            .call::<Value>(method, params)
            .await
            .unwrap_or_else(|e| panic!("{method}: {e}"))
    }
}

/// A peer: a node in this process.
struct Peer {
    control: Control,
    _node: PeerNode,
}

/// Where a peer's node runs.
enum PeerNode {
    /// On the bench's runtime, beside the others: the peers that only load the hub.
    Shared {
        _running: node::RunningNode,
        _dir: tempfile::TempDir,
    },
    /// On a thread and a one-thread runtime of its own, as a `potluck node` process runs by
    /// default: the sequential phase's peers, whose every step is on the channel's
    /// critical path. On the bench's multi-thread runtime each of their tasks could be
    /// handed between its workers (a wake-up of a sleeping thread) where a real peer's
    /// would not. Dropping it ends the runtime, its tasks and then its directory.
    Own(
        Option<tokio::sync::oneshot::Sender<()>>,
        Option<std::thread::JoinHandle<()>>,
    ),
}

impl Drop for PeerNode {
    fn drop(&mut self) {
        if let PeerNode::Own(stop, thread) = self {
            drop(stop.take());
            if let Some(thread) = thread.take() {
                let _ = thread.join();
            }
        }
    }
}

/// Where the peers that only load the hub keep their databases: in memory (`/dev/shm`)
/// where the machine has it. On disk, their hundred databases' flushes end in block-device
/// interrupts, and a kernel without IRQ time accounting (`CONFIG_IRQ_TIME_ACCOUNTING`, off
/// on the machines of docs/benchmarks.md) charges an interrupt's work to whatever task it
/// interrupted, often the hub: a profile of the busy hub showed ~5 % of its samples
/// completing block requests, nearly all the peers' (they flush 16 times as often as the
/// hub). A hub's real peers are other machines, whose disks interrupt other CPUs.
const LOAD_PEER_DIR: &str = "/dev/shm";

/// How many peers, the first ones, keep their databases on disk beside the hub's: the
/// one-channel phase's peer and the bound's. A sequential channel waits for both ends'
/// flushes, as between two real nodes.
const PEERS_ON_DISK: usize = 2;

fn peer_dir(on_disk: bool) -> tempfile::TempDir {
    let in_memory = (!on_disk)
        .then(|| tempfile::Builder::new().tempdir_in(LOAD_PEER_DIR).ok())
        .flatten();
    in_memory.unwrap_or_else(|| tempfile::tempdir().unwrap())
}

async fn start_peer(chain: &DevChain, on_disk: bool) -> Peer {
    if on_disk {
        return start_own_peer(chain).await;
    }
    let dir = peer_dir(false);
    let running = run_peer(chain, dir.path()).await;
    Peer {
        control: peer_control(&running),
        _node: PeerNode::Shared {
            _running: running,
            _dir: dir,
        },
    }
}

async fn run_peer(chain: &DevChain, dir: &Path) -> node::RunningNode {
    let mut config = node::NodeConfig::new(dir);
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.rpc_bind = "127.0.0.1:0".parse().unwrap();
    node::start(config, Arc::new(chain.clone()) as Arc<dyn Chain>)
        .await
        .unwrap()
}

fn peer_control(running: &node::RunningNode) -> Control {
    Control::new(
        format!("http://{}/", running.rpc_addr),
        running.cookie_path.clone(),
        running.node_id.to_string(),
    )
}

/// A peer on a thread and runtime of its own ([`PeerNode::Own`]), its database on disk.
async fn start_own_peer(chain: &DevChain) -> Peer {
    let (started, control) = tokio::sync::oneshot::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let chain = chain.clone();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = peer_dir(true);
        let running = runtime.block_on(run_peer(&chain, dir.path()));
        let _ = started.send(peer_control(&running));
        // The runtime runs its tasks while its thread waits in `block_on`: until the stop
        // (the sender dropped, which is all it ever does).
        let _ = runtime.block_on(stopped);
        drop(running);
        drop(runtime);
        drop(dir);
    });
    Peer {
        control: control.await.unwrap(),
        _node: PeerNode::Own(Some(stop), Some(thread)),
    }
}

/// The node under test: `potluck node` in its own process.
struct Hub {
    child: Child,
    control: Control,
    p2p: String,
    dir: tempfile::TempDir,
}

impl Drop for Hub {
    fn drop(&mut self) {
        // The bench's end: a hub left running would hold its ports and its data directory.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn start_hub(bin: &Path, chain_url: &str, chain_cookie: &Path) -> Hub {
    let dir = tempfile::tempdir().unwrap();
    let p2p = format!("127.0.0.1:{}", free_port());
    let rpc = format!("127.0.0.1:{}", free_port());
    let child = Command::new(bin)
        .args(["node", "--listen", &p2p, "--rpc-bind", &rpc])
        .args(["--bitcoind-url", chain_url, "--bitcoind-cookie"])
        .arg(chain_cookie)
        .arg("--data-dir")
        .arg(dir.path())
        // Every peer opens at once: the hub takes them all before the anchors confirm.
        .args(["--max-pending-openings", "100000"])
        .env("POTLUCK_LOG", "warn")
        .envs(
            // The hub's runtime threads (`--runtime-threads`, one unless asked):
            // `HUB_RUNTIME_THREADS=2` measures one per core on this machine against it.
            std::env::var("HUB_RUNTIME_THREADS")
                .ok()
                .map(|n| ("POTLUCK_RUNTIME_THREADS", n)),
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (build it: cargo build --release -p potluck)",
                bin.display()
            )
        });
    let cookie = dir.path().join(node::identity::COOKIE_FILE);
    let url = format!("http://{rpc}/");
    wait_until("the hub's control API", async || cookie.exists()).await;
    let control = Control::new(url, cookie, String::new());
    let mut info = Value::Null;
    wait_until("the hub answers getinfo", async || {
        match control.rpc.call::<Value>("getinfo", json!([])).await {
            Ok(v) => {
                info = v;
                true
            }
            Err(_) => false,
        }
    })
    .await;
    let node_id = info["node_id"].as_str().unwrap().to_owned();
    Hub {
        child,
        control: Control { node_id, ..control },
        p2p,
        dir,
    }
}

async fn wait_until(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `pairs` pairs on `peer`'s channel: the peer offers, the hub fulfills.
async fn pairs_through(hub: &Control, peer: &Control, pairs: u32, tag: u32, expiry: u32) {
    for i in 0..pairs {
        let mut r = [0u8; 32];
        r[..4].copy_from_slice(&tag.to_le_bytes());
        r[4..8].copy_from_slice(&i.to_le_bytes());
        let hash = sha256::Hash::hash(&r);
        peer.call(
            "newhtlc",
            json!([
                hub.node_id,
                HTLC_MSAT,
                hex::encode(hash.to_byte_array()),
                expiry
            ]),
        )
        .await;
        hub.call("fulfillhtlc", json!([peer.node_id, hex::encode(r)]))
            .await;
    }
}

/// The hub's counters at one moment: CPU seconds and context switches (all threads).
#[derive(Clone, Copy)]
struct Counters {
    cpu_s: f64,
    switches: u64,
}

fn counters(pid: u32) -> Counters {
    let mut switches = 0;
    // The process's own status counts only its main thread: sum the tasks. Threads that
    // ended during the phase are missed, which only lowers the count; tokio's workers live
    // as long as the node.
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            for line in status.lines() {
                if line.starts_with("voluntary_ctxt_switches:")
                    || line.starts_with("nonvoluntary_ctxt_switches:")
                {
                    switches += line
                        .split_whitespace()
                        .nth(1)
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0);
                }
            }
        }
    }
    Counters {
        cpu_s: cpu_seconds_of(&format!("/proc/{pid}/stat")),
        switches,
    }
}

/// The system calls the report names, in this order; the rest are summed as "other".
const SYSCALLS: &[&str] = &[
    "fdatasync",
    "fsync",
    "fcntl",
    "pwrite64",
    "pread64",
    "write",
    "writev",
    "read",
    "recvfrom",
    "sendto",
    "futex",
    "epoll_wait",
    "epoll_ctl",
    "sched_yield",
];

/// Counts system calls of a process by kind while it runs.
enum Tracer {
    Perf(Child, PathBuf),
    Strace(Child, PathBuf),
    None,
}

impl Tracer {
    /// perf's syscall tracepoints where the kernel has them, else strace (which slows the
    /// process it traces: its CPU figures are then not the ones to read).
    fn attach(pid: u32, out: &Path) -> Tracer {
        let perf_ok = Command::new("perf")
            .args(["stat", "-e", "syscalls:sys_enter_fdatasync", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if perf_ok {
            let mut events: Vec<String> = SYSCALLS
                .iter()
                .map(|s| format!("syscalls:sys_enter_{s}"))
                .collect();
            events.push("raw_syscalls:sys_enter".into());
            let path = out.join("perf.csv");
            if let Ok(child) = Command::new("perf")
                .args(["stat", "-x", ",", "-o"])
                .arg(&path)
                .args(["-e", &events.join(","), "-p", &pid.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
            {
                return Tracer::Perf(child, path);
            }
        }
        let path = out.join("strace.txt");
        match Command::new("strace")
            .args(["-c", "-f", "-o"])
            .arg(&path)
            .args(["-p", &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(child) => Tracer::Strace(child, path),
            Err(_) => Tracer::None,
        }
    }

    /// [`Tracer::attach`], then the moment perf and strace need to attach to every thread.
    async fn attach_settled(pid: u32, out: &Path) -> Tracer {
        let tracer = Tracer::attach(pid, out);
        tokio::time::sleep(Duration::from_millis(500)).await;
        tracer
    }

    /// Stops counting and returns the calls by kind ("total" is every call).
    fn finish(self) -> (&'static str, BTreeMap<String, u64>) {
        let stop = |child: &mut Child| {
            // SIGINT makes both tools print their counts and exit.
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            let _ = child.wait();
        };
        let mut counts = BTreeMap::new();
        match self {
            Tracer::Perf(mut child, path) => {
                stop(&mut child);
                for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
                    let fields: Vec<&str> = line.split(',').collect();
                    let (Some(n), Some(event)) = (fields.first(), fields.get(2)) else {
                        continue;
                    };
                    let Ok(n) = n.trim().parse::<u64>() else {
                        continue;
                    };
                    let name = match event.trim() {
                        "raw_syscalls:sys_enter" => "total".to_owned(),
                        e => e.trim_start_matches("syscalls:sys_enter_").to_owned(),
                    };
                    counts.insert(name, n);
                }
                ("perf", counts)
            }
            Tracer::Strace(mut child, path) => {
                stop(&mut child);
                // strace -c: "% time  seconds  usecs/call  calls  errors syscall".
                for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    if f.len() < 5 {
                        continue;
                    }
                    let (Some(name), Ok(calls)) = (f.last(), f[3].parse::<u64>()) else {
                        continue;
                    };
                    let name = if *name == "total" { "total" } else { name };
                    counts.insert(name.to_string(), calls);
                }
                ("strace", counts)
            }
            Tracer::None => ("none (neither perf nor strace)", counts),
        }
    }
}

/// What one phase cost the hub, per completed pair.
struct PerPair {
    pairs_per_s: f64,
    cpu_ms: f64,
    switches: f64,
    tool: &'static str,
    calls: BTreeMap<String, f64>,
}

impl PerPair {
    /// `pairs` pairs that took `elapsed` seconds, `cpu_s` of the hub's CPU and `switches`,
    /// with the system calls `tracer` counted (it stops here) over `traced` pairs.
    fn of(
        pairs: f64,
        elapsed: f64,
        cpu_s: f64,
        switches: u64,
        (tracer, traced): (Tracer, f64),
    ) -> PerPair {
        let (tool, counts) = tracer.finish();
        PerPair {
            pairs_per_s: pairs / elapsed,
            cpu_ms: cpu_s * 1000.0 / pairs,
            switches: switches as f64 / pairs,
            tool,
            calls: counts
                .into_iter()
                .map(|(k, v)| (k, v as f64 / traced))
                .collect(),
        }
    }

    fn call(&self, name: &str) -> f64 {
        self.calls.get(name).copied().unwrap_or(0.0)
    }

    fn calls_line(&self) -> String {
        let mut named = 0.0;
        let mut parts = Vec::new();
        for s in SYSCALLS {
            let n = self.call(s);
            named += n;
            if n > 0.0 {
                parts.push(format!("{s} {n:.1}"));
            }
        }
        let total = self.call("total");
        if total > named {
            parts.push(format!("other {:.1}", total - named));
        }
        format!("{} (by {}; total {total:.1})", parts.join(", "), self.tool)
    }
}

/// Runs `phase` (which completes `pairs` pairs) while counting what the hub does.
async fn measure(hub: &Hub, pairs: u32, phase: impl std::future::Future<Output = ()>) -> PerPair {
    let pid = hub.child.id();
    let tracer = Tracer::attach_settled(pid, hub.dir.path()).await;
    let before = counters(pid);
    let start = Instant::now();
    phase.await;
    let elapsed = start.elapsed().as_secs_f64();
    let after = counters(pid);
    PerPair::of(
        f64::from(pairs),
        elapsed,
        after.cpu_s - before.cpu_s,
        after.switches - before.switches,
        (tracer, f64::from(pairs)),
    )
}

/// Every peer's channel at once, `per_channel` pairs each; `tag`'s low 12 bits are left
/// for the channel's index (the preimages differ between channels and between calls).
async fn all_channels(
    hub: &Arc<Control>,
    peers: &[Arc<Peer>],
    per_channel: u32,
    tag: u32,
    expiry: u32,
) {
    let mut tasks = Vec::new();
    for (i, p) in peers.iter().enumerate() {
        let hub = Arc::clone(hub);
        let p = Arc::clone(p);
        let tag = tag + i as u32;
        tasks.push(tokio::spawn(async move {
            pairs_through(&hub, &p.control, per_channel, tag, expiry).await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// What each peer is given, and what it puts in its channel: 900,000 sat carry ~1,480 pairs
/// of 600 sat after the commitment fee, more than any channel makes in a run (the first:
/// `PAIRS / 10` to warm up, `PAIRS` sequential, `PAIRS` busy and `PAIRS / 5` traced; 690 at
/// 300).
const FUNDING_SAT: u64 = 1_000_000;
const CHANNEL_SAT: u64 = 900_000;

/// Each peer funds and opens its channel to the hub: the hub is the acceptor, as a node
/// that others connect to is. Returns once every channel is live.
async fn open_channels(chain: &DevChain, hub: &Hub, peers: &[Peer]) {
    let burn = chain.faucet_script().to_owned();
    let channels = peers.len();
    for (i, p) in peers.iter().enumerate() {
        // The faucet's payments chain through its change: a block every 20 keeps them under
        // the mempool's limit of 25 unconfirmed ancestors.
        if i % 20 == 19 {
            chain.mine(1, &burn).unwrap();
        }
        let addr = p.control.call("newaddr", json!([])).await;
        let addr: Address<bitcoin::address::NetworkUnchecked> =
            addr["address"].as_str().unwrap().parse().unwrap();
        chain
            .faucet(
                &addr.assume_checked().script_pubkey(),
                Amount::from_sat(FUNDING_SAT),
            )
            .unwrap();
    }
    chain.mine(1, &burn).unwrap();
    for p in peers {
        wait_until("peer funded", async || {
            p.control.call("listfunds", json!([])).await["total_sat"].as_u64() == Some(FUNDING_SAT)
        })
        .await;
        p.control.call("connect", json!([hub.p2p])).await;
        p.control
            .call("open", json!([hub.control.node_id, CHANNEL_SAT]))
            .await;
    }
    chain.mine(1, &burn).unwrap();
    wait_until("channels live", async || {
        let list = hub.control.call("listchannels", json!([])).await;
        list["channels"]
            .as_array()
            .is_some_and(|c| c.len() == channels && c.iter().all(|c| c["state"] == "normal"))
    })
    .await;
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("idle vCPUs: {}", idle_policy());
    runtime.block_on(bench());
}

async fn bench() {
    let mut args = std::env::args().skip(1);
    let channels: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100);
    let pairs: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(300);
    let bin = PathBuf::from(
        std::env::var("POTLUCK_BIN").unwrap_or_else(|_| "target/release/potluck".into()),
    );
    let dir = tempfile::tempdir().unwrap();
    let dev = DevChain::start(DevChainConfig {
        data_dir: dir.path().join("chain"),
        block_interval: None,
        rpc_bind: Some("127.0.0.1:0".parse().unwrap()),
        rpc_auth: None,
    })
    .await
    .unwrap();
    let chain = dev.chain.clone();
    let hub = start_hub(&bin, &dev.rpc_url().unwrap(), dev.cookie.as_ref().unwrap()).await;
    let mut peers = Vec::new();
    for i in 0..channels {
        peers.push(start_peer(&chain, i < PEERS_ON_DISK).await);
    }

    open_channels(&chain, &hub, &peers).await;
    let expiry = chain.height() + 1000;
    let hub_control = Arc::new(Control {
        rpc: hub.control.rpc.clone(),
        node_id: hub.control.node_id.clone(),
    });
    let peers: Vec<Arc<Peer>> = peers.into_iter().map(Arc::new).collect();

    // The hub's WAL wraps here (its checkpoint every 10,000 frames): in the phases below it
    // writes in place, as a node that has run a while.
    all_channels(&hub_control, &peers, (pairs / 10).max(5), 1 << 12, expiry).await;

    let one_from = boot_clock();
    let one = measure(
        &hub,
        pairs,
        pairs_through(&hub_control, &peers[0].control, pairs, 1 << 20, expiry),
    )
    .await;
    eprintln!(
        "one channel, sequential: boot clock {one_from:.2}..{:.2} s",
        boot_clock()
    );
    let busy_from = boot_clock();
    let busy = busy_in_slices(&hub, &hub_control, &peers, pairs, expiry).await;
    let memory = Memory::of(hub.child.id());
    // For a profile of the busy phase alone: `perf record -k boottime -p PID`, then
    // `perf script --time FROM,TO`.
    eprintln!(
        "busy phase: boot clock {busy_from:.2}..{:.2} s",
        boot_clock()
    );

    // Baseline, same run: the state machines in memory, and the hub's side of them.
    let mem = in_memory_pairs(pairs * 5);

    // Another channel than the traced one: that one has paid out most of its capacity.
    let fresh = &peers.get(1).unwrap_or(&peers[0]).control;
    let bound = one_channel_against_its_bound(&hub, &hub_control, fresh, pairs, expiry).await;
    let run = Run {
        channels,
        // The median of this reading, the busy phase's and those between the bound's rounds.
        own_ms: median(
            [mem.acceptor_cpu_s_per_pair]
                .into_iter()
                .chain(busy.own_cpu.iter().copied())
                .chain(bound.own_cpu.iter().copied())
                .collect(),
        ) * 1000.0,
        own_wall_ms: mem.acceptor_s_per_pair * 1000.0,
        mem_pair_us: 1e6 / mem.pairs_per_s,
        one,
        all: busy.all,
        all_ratios: busy.ratios,
        traced_cpu_ms: busy.traced_cpu_ms,
        memory,
        bound,
    };
    run.report(&bin, hub.child.id());
}

/// The busy phase: every channel at once, in slices.
struct Busy {
    /// The whole phase, per pair.
    all: PerPair,
    /// Per slice: the hub's CPU per pair over its side of a pair in memory read right after.
    ratios: Vec<f64>,
    /// Per slice: that baseline, CPU seconds.
    own_cpu: Vec<f64>,
    /// The hub's CPU per pair, ms, in the slice the tracer counted.
    traced_cpu_ms: f64,
}

/// Every channel busy, `per_channel` pairs each, in `SLICES` slices; after each slice the
/// baseline (the hub's side of a pair in memory) is read again, while the hub is idle. The
/// machine's speed moves between minutes (the baseline by 1.7x between runs on a shared
/// machine, docs/benchmarks.md): a slice and the reading next to it see one speed, and the
/// median of the slices' ratios is the figure, as for the one-channel bound. A slice is
/// `per_channel / 5` pairs on every channel (6,000 at 100 channels and 300 pairs, ~3 s of
/// the hub's CPU): slices of 600 pairs, as before, were ~0.3 s of CPU, which
/// `/proc/<pid>/stat` counts in 10 ms steps, and one run's slices read 2.0x-3.5x. No
/// tracer runs during these slices: the system calls are counted over one more slice
/// after them, which the CPU figures leave out.
async fn busy_in_slices(
    hub: &Hub,
    hub_control: &Arc<Control>,
    peers: &[Arc<Peer>],
    per_channel: u32,
    expiry: u32,
) -> Busy {
    const SLICES: u32 = 5;
    let per_slice = (per_channel / SLICES).max(1);
    let pid = hub.child.id();
    let (mut cpu_s, mut switches, mut elapsed) = (0.0, 0, 0.0);
    let (mut ratios, mut own_cpu) = (Vec::new(), Vec::new());
    let n_slice = f64::from(per_slice) * peers.len() as f64;
    for slice in 0..SLICES {
        let before = counters(pid);
        let start = Instant::now();
        all_channels(hub_control, peers, per_slice, (2 + slice) << 12, expiry).await;
        elapsed += start.elapsed().as_secs_f64();
        let after = counters(pid);
        let slice_cpu = after.cpu_s - before.cpu_s;
        cpu_s += slice_cpu;
        switches += after.switches - before.switches;
        let mem = in_memory_pairs(per_slice * 50);
        ratios.push(slice_cpu / n_slice / mem.acceptor_cpu_s_per_pair);
        own_cpu.push(mem.acceptor_cpu_s_per_pair);
    }
    // The system calls, counted over one more slice: perf's tracepoints run in the hub's
    // system calls and are charged to its CPU (1-16 % more per pair over seven runs,
    // docs/node.md, "How hub_bench reads the hub"), so the slices above run untraced.
    let tracer = Tracer::attach_settled(pid, hub.dir.path()).await;
    let before = counters(pid);
    all_channels(hub_control, peers, per_slice, (2 + SLICES) << 12, expiry).await;
    let traced_cpu_ms = (counters(pid).cpu_s - before.cpu_s) * 1000.0 / n_slice;
    Busy {
        traced_cpu_ms,
        all: PerPair::of(
            n_slice * f64::from(SLICES),
            elapsed,
            cpu_s,
            switches,
            (tracer, n_slice),
        ),
        ratios,
        own_cpu,
    }
}

/// Seconds since boot (`/proc/uptime`, 10 ms steps): the clock `perf record -k boottime` stamps
/// its samples with.
fn boot_clock() -> f64 {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// What one run measured, printed by [`Run::report`].
struct Run {
    channels: usize,
    /// The hub's side of a pair in memory, CPU time, ms (the baseline of the hub's CPU).
    own_ms: f64,
    /// The same side's wall time, ms (equal to `own_ms` on a quiet machine).
    own_wall_ms: f64,
    /// Both state machines' pair in memory, us.
    mem_pair_us: f64,
    one: PerPair,
    all: PerPair,
    /// The busy phase's ratio per slice (CPU per pair over the baseline read next to it).
    all_ratios: Vec<f64>,
    /// The busy phase's CPU per pair while traced, ms.
    traced_cpu_ms: f64,
    /// The hub's memory right after the busy phase.
    memory: Memory,
    bound: Bound,
}

/// A process's resident memory (`/proc/<pid>/status`), KiB: what the allocator's choice
/// costs beside its CPU.
struct Memory {
    rss_kib: u64,
    peak_kib: u64,
}

impl Memory {
    fn of(pid: u32) -> Memory {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        Memory {
            rss_kib: field("VmRSS:"),
            peak_kib: field("VmHWM:"),
        }
    }
}

impl Run {
    /// Prints the figures, ending with the one line a script reads.
    fn report(&self, bin: &Path, pid: u32) {
        let Run {
            channels,
            own_ms,
            own_wall_ms,
            mem_pair_us,
            one,
            all,
            all_ratios,
            traced_cpu_ms,
            memory,
            bound,
        } = self;
        let (channels, own_ms) = (*channels, *own_ms);
        println!(
            "node under test: `{}` (pid {}), {channels} peers in this process",
            bin.display(),
            pid
        );
        println!(
            "in-memory, same run: a pair {mem_pair_us:.1} us for both state machines, the hub's side {:.1} us of CPU ({:.1} us of wall time)",
            own_ms * 1000.0,
            own_wall_ms * 1000.0
        );
        bound.print_terms();
        let all_ratio = median(all_ratios.clone());
        for (name, p, ratio) in [
            ("one channel, sequential", one, one.cpu_ms / own_ms),
            (&*format!("{channels} channels busy"), all, all_ratio),
        ] {
            println!(
                "{name}: {:.0} pairs/s; hub CPU/pair {:.3} ms = {ratio:.1}x its state machine; switches/pair {:.1}",
                p.pairs_per_s,
                p.cpu_ms,
                p.switches
            );
            println!("  syscalls/pair: {}", p.calls_line());
        }
        println!(
            "  (counted over one more slice, in which the tracer's work raised the hub's CPU/pair to {traced_cpu_ms:.3} ms)"
        );
        println!(
            "{channels} channels busy, per slice, CPU/pair over the state machine read after it: {} = median {all_ratio:.1}x",
            all_ratios
                .iter()
                .map(|r| format!("{r:.2}x"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!(
            "the hub's memory after the busy phase: RSS {:.1} MiB (peak {:.1} MiB)",
            memory.rss_kib as f64 / 1024.0,
            memory.peak_kib as f64 / 1024.0
        );
        bound.print_ratios();
        println!(
            "node under test: cpu/pair {:.2} ms = {:.1}x its state machine; fdatasync/pair {:.2}; fcntl/pair {:.1}; switches/pair {:.0}; one channel {:.0}% of the sequential bound (built), {:.0}% of its summed terms, {:.0}% with in-place writes",
            all.cpu_ms,
            all_ratio,
            all.call("fdatasync") + all.call("fsync"),
            all.call("fcntl"),
            all.switches,
            median(bound.ratios_built.clone()) * 100.0,
            median(bound.ratios.clone()) * 100.0,
            median(bound.ratios_wrapped.clone()) * 100.0
        );
    }
}

/// One channel's sequential rate against its bound, measured in alternation.
struct Bound {
    /// Per round: pairs/s of the channel and of its bound.
    rounds: Vec<(f64, f64)>,
    /// Per round: the channel's rate over its bound.
    ratios: Vec<f64>,
    /// The last round's samples, printed: a raw flush of the hub's disk, and a durable
    /// write of a snapshot-sized row through sqlx (the bound's term per write).
    fsyncs: Vec<f64>,
    commits: Vec<f64>,
    /// The same write once the probe's WAL is overwritten in place, not grown.
    commits_wrapped: Vec<f64>,
    /// Per round: the channel's rate over the bound with that write instead.
    ratios_wrapped: Vec<f64>,
    /// The skeleton's writes in the last round (printed beside the probe's).
    skeleton_writes: Vec<f64>,
    /// Per round: seconds per pair of the skeleton ([`support::skeleton_pairs`]).
    skeleton: Vec<f64>,
    /// Per round: the channel's rate over the built bound, the skeleton's with the two
    /// control calls in place of its two go-on frames.
    ratios_built: Vec<f64>,
    /// The bytes of that row (a channel's snapshot).
    snapshot_bytes: usize,
    /// Per round: the hub's side of a pair in memory, CPU seconds (more samples of the
    /// baseline: on a shared machine one reading moved 1.7x between runs).
    own_cpu: Vec<f64>,
    pkts: Vec<f64>,
    /// Control calls to a peer (in this process) and to the hub.
    ctrl: Vec<f64>,
    ctrl_hub: Vec<f64>,
}

impl Bound {
    /// One channel against each bound, per round and the median.
    fn print_ratios(&self) {
        let percents = |ratios: &[f64]| {
            let each: Vec<String> = ratios
                .iter()
                .map(|r| format!("{:.0}%", r * 100.0))
                .collect();
            format!(
                "{} = median {:.0}%",
                each.join(", "),
                median(ratios.to_vec()) * 100.0
            )
        };
        println!(
            "one channel, untraced, alternated with its bound: {} = median {:.0}%",
            self.rounds
                .iter()
                .map(|(rate, b)| format!("{rate:.0}/{b:.0} pairs/s"))
                .collect::<Vec<_>>()
                .join(", "),
            median(self.ratios.clone()) * 100.0
        );
        println!(
            "one channel against the bound with the in-place write instead: {}",
            percents(&self.ratios_wrapped)
        );
        println!(
            "the skeleton (the same state machines, writes and socket, nothing else), per pair: {}",
            self.skeleton
                .iter()
                .map(|s| format!("{:.0} us", s * 1e6))
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!(
            "one channel against the built bound (the skeleton's pairs, its go-on frames replaced by the control calls): {}",
            percents(&self.ratios_built)
        );
    }

    /// The bound's terms as the last round measured them.
    fn print_terms(&self) {
        println!(
            "fdatasync latency of the hub's disk (last round): {}",
            distribution_us(&self.fsyncs, 1)
        );
        println!(
            "a {}-byte row committed through sqlx there (the bound's term per write): {}",
            self.snapshot_bytes,
            distribution_us(&self.commits, 1)
        );
        println!(
        "the same once its WAL is overwritten in place, not grown (a node that has run a while): {}",
        distribution_us(&self.commits_wrapped, 1)
    );
        println!(
            "the skeleton's writes, each after a wait for the other side (last round): {}",
            distribution_us(&self.skeleton_writes, 1)
        );
        println!(
        "packet round trip {:.1} us, control call round trip {:.1} us to a peer, {:.1} us to the hub (last round; means {:.1}, {:.1}, {:.1})",
        median(self.pkts.clone()) * 1e6,
        median(self.ctrl.clone()) * 1e6,
        median(self.ctrl_hub.clone()) * 1e6,
        mean(&self.pkts) * 1e6,
        mean(&self.ctrl) * 1e6,
        mean(&self.ctrl_hub) * 1e6
    );
    }
}

/// Rounds of sequential pairs on one channel, each followed by its bounds measured right
/// after it. The built bound is the skeleton's pairs ([`skeleton_pairs`]: the same state
/// machines, writes and socket chained as a node must chain them, and nothing else), its two
/// go-on frames replaced by the two control calls: the figure. The summed bound adds the
/// same steps measured one at a time, back to back: both state machines in memory, each durable write (a snapshot-sized row
/// committed through sqlx on the hub's disk, where this channel's peer keeps its database
/// too ([`PEERS_ON_DISK`]): the flush, SQLite's work for the row and the hand-off to sqlx's
/// worker thread, which a raw `fdatasync` leaves out although no write of a node on these
/// parts can skip it), each packet's one-way trip and the two control calls, nothing
/// overlapping. Its write is timed on a new database's growing WAL (the bound the bench
/// printed until the built one) and overwriting the WAL in place (as a node that has run a
/// while writes, about half as dear). No chain of these steps reaches the sum: the
/// skeleton's own writes, each after a wait for the other side, take longer than the
/// probe's back to back (both printed). On a
/// machine that other work shares, the load moves between minutes; a rate and a bound
/// measured minutes apart compared the load more than the node (213 % on a loaded run).
/// Alternating, each round's ratio sees one load, and the median of the rounds is the figure.
/// No tracer is attached here: strace slows every system call the rate is made of.
async fn one_channel_against_its_bound(
    hub: &Hub,
    hub_control: &Control,
    peer: &Control,
    pairs: u32,
    expiry: u32,
) -> Bound {
    const ROUNDS: u32 = 5;
    // 30 pairs a round at 300: with the warm-up and the busy phase, the channel pays
    // 540 pairs of 600 sat, within its CHANNEL_SAT.
    let per_round = (pairs / 10).max(20);
    let mut out = Bound {
        rounds: Vec::new(),
        ratios: Vec::new(),
        fsyncs: Vec::new(),
        commits: Vec::new(),
        commits_wrapped: Vec::new(),
        ratios_wrapped: Vec::new(),
        skeleton_writes: Vec::new(),
        skeleton: Vec::new(),
        ratios_built: Vec::new(),
        snapshot_bytes: 0,
        own_cpu: Vec::new(),
        pkts: Vec::new(),
        ctrl: Vec::new(),
        ctrl_hub: Vec::new(),
    };
    for round in 0..ROUNDS {
        let start = Instant::now();
        pairs_through(
            hub_control,
            peer,
            per_round,
            (3 << 20) + (round << 16),
            expiry,
        )
        .await;
        let rate = f64::from(per_round) / start.elapsed().as_secs_f64();
        let mem = in_memory_pairs(per_round * 5);
        let (fsyncs, _) = fsync_latency(hub.dir.path(), 1);
        let (commits, commits_wrapped) =
            sqlite_commit_latency(hub.dir.path(), mem.snapshot_bytes).await;
        let dir = hub.dir.path().to_path_buf();
        let (skeleton, skeleton_writes) =
            tokio::task::spawn_blocking(move || skeleton_pairs(&dir, per_round + 1))
                .await
                .unwrap();
        let pkts = packet_rtt().await;
        // A pair's two control calls: `newhtlc` to the peer (in this process) and
        // `fulfillhtlc` to the hub (another process); each is timed on its own node with
        // a call that reads no state (`help` on one command): the transport's share.
        let (mut ctrl, mut ctrl_hub) = (Vec::new(), Vec::new());
        for _ in 0..100 {
            let t = Instant::now();
            peer.call("help", json!(["listpeers"])).await;
            ctrl.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            hub_control.call("help", json!(["listpeers"])).await;
            ctrl_hub.push(t.elapsed().as_secs_f64());
        }
        let bound_with = |write: f64| {
            1.0 / (1.0 / mem.pairs_per_s
                + mem.persists_per_pair * write
                + mem.packets_per_pair * median(pkts.clone()) / 2.0
                + median(ctrl.clone())
                + median(ctrl_hub.clone()))
        };
        let bound = bound_with(median(commits.clone()));
        out.rounds.push((rate, bound));
        out.ratios.push(rate / bound);
        out.ratios_wrapped
            .push(rate / bound_with(median(commits_wrapped.clone())));
        // The skeleton's two go-on frames are a one-way trip each, half a round trip.
        let built = 1.0
            / (skeleton - median(pkts.clone()) + median(ctrl.clone()) + median(ctrl_hub.clone()));
        out.ratios_built.push(rate / built);
        out.skeleton.push(skeleton);
        out.skeleton_writes = skeleton_writes;
        (
            out.fsyncs,
            out.commits,
            out.commits_wrapped,
            out.pkts,
            out.ctrl,
            out.ctrl_hub,
        ) = (fsyncs, commits, commits_wrapped, pkts, ctrl, ctrl_hub);
        out.snapshot_bytes = mem.snapshot_bytes;
        out.own_cpu.push(mem.acceptor_cpu_s_per_pair);
    }
    out
}
