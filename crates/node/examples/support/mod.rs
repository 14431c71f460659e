//! Measurements the node's benches share (docs/benchmarks.md, "Node"): CPU time from
//! `/proc`, the in-memory state machines as the baseline, and the latencies that make up the
//! sequential bound of one channel (a durable write, a packet's round trip).
// Included by each bench with `#[path]`; not every bench uses every item.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use bitcoin::Amount;
use channel::{Action, AnchorRole, Channel, ChannelConfig, ChannelSecrets};
use secp256k1::SecretKey;
use wire::{Locktime, Packet, Preimage};

/// CPU time the process has used so far (user + system), in seconds: unlike wall time it
/// does not grow while another process holds the cores, so it compares builds on a busy
/// machine.
pub fn cpu_seconds() -> f64 {
    cpu_seconds_of("/proc/self/stat")
}

/// CPU time of the calling thread so far (user + system), in seconds.
pub fn thread_cpu_seconds() -> f64 {
    // schedstat's first field is the thread's time on a CPU in nanoseconds; `stat` counts
    // clock ticks (10 ms), too coarse for a baseline of a few tens of milliseconds.
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map_or_else(|| cpu_seconds_of("/proc/thread-self/stat"), |ns| ns / 1e9)
}

/// User + system time of a `/proc/.../stat` file, in seconds.
pub fn cpu_seconds_of(path: &str) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    // The fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; the
    // kernel counts them in USER_HZ, 100 on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

/// Each HTLC: just above the dust limit (546 sat), which the channel declines below; 300
/// pairs on one channel move 180,000 sat, inside a 250,000-sat channel.
pub const HTLC_MSAT: u64 = 600_000;

/// What one add+fulfill pair costs the state machines alone.
pub struct InMemory {
    /// Pairs per second.
    pub pairs_per_s: f64,
    /// Durable writes (`Action::Persist`, both sides) per pair: each precedes the packet or
    /// the completion that the next step waits for, so all are on the critical path.
    pub persists_per_pair: f64,
    /// Packets per pair (both directions).
    pub packets_per_pair: f64,
    /// Time per pair in the accepting side's calls alone (the side that receives the
    /// HTLC and fulfills it: a hub whose peers opened the channels), in seconds.
    pub acceptor_s_per_pair: f64,
    /// CPU time per pair of the accepting side's calls, in seconds: the run's thread CPU
    /// time times the accepting side's share of its wall time. On a busy machine the wall
    /// time also counts the time other processes held the core, which CPU time does not;
    /// the node under test is measured in CPU time, so its baseline must be too.
    pub acceptor_cpu_s_per_pair: f64,
    /// The accepting side's channel as JSON after the run, in bytes (what one durable
    /// write of it stores).
    pub snapshot_bytes: usize,
}

/// Two channels back to back in memory, counting what their actions would cost a node.
struct Back2Back {
    a: Channel,
    b: Channel,
    to_a: Vec<Packet>,
    to_b: Vec<Packet>,
    anchor: Option<(bitcoin::ScriptBuf, Amount)>,
    persists: u64,
    packets: u64,
    /// Time spent in the accepting side's (b's) calls.
    acceptor: Duration,
}

/// Which side's packets an action list adds to.
#[derive(Clone, Copy)]
enum To {
    A,
    B,
}

impl Back2Back {
    /// A channel funded by `a`, open and live at height 100.
    fn live() -> Self {
        let secrets = |t: u8| ChannelSecrets {
            commit_key: SecretKey::from_slice(&[t; 32]).unwrap(),
            final_key: SecretKey::from_slice(&[t + 0x40; 32]).unwrap(),
            revocation_seed: [t + 0x80; 32],
        };
        let cfg = ChannelConfig::default();
        let a = Channel::new(
            cfg.clone(),
            secrets(1),
            AnchorRole::Fund {
                anchor_sat: 10_000_000,
            },
        );
        let b = Channel::new(cfg, secrets(2), AnchorRole::Accept);
        let mut pair = Back2Back {
            a,
            b,
            to_a: Vec::new(),
            to_b: Vec::new(),
            anchor: None,
            persists: 0,
            packets: 0,
            acceptor: Duration::ZERO,
        };
        let (start_a, start_b) = (pair.a.start().unwrap(), pair.b.start().unwrap());
        pair.take(start_a, To::B);
        pair.take(start_b, To::A);
        pair.pump();
        let (script_pubkey, value) = pair.anchor.take().unwrap();
        let tx = bitcoin::Transaction {
            version: bitcoin::transaction::Version::TWO,
            lock_time: bitcoin::absolute::LockTime::ZERO,
            input: vec![bitcoin::TxIn::default()],
            output: vec![bitcoin::TxOut {
                value,
                script_pubkey,
            }],
        };
        let created = pair.a.anchor_created(tx, 0).unwrap();
        pair.take(created, To::B);
        pair.pump();
        let (depth_a, depth_b) = (pair.a.anchor_depth(1), pair.b.anchor_depth(1));
        pair.take(depth_a, To::B);
        pair.take(depth_b, To::A);
        pair.pump();
        pair.a.block_height(100);
        pair.b.block_height(100);
        pair
    }

    /// Counts `actions` and queues their packets for `to`.
    fn take(&mut self, actions: Vec<Action>, to: To) {
        for act in actions {
            match act {
                Action::Persist => self.persists += 1,
                Action::Send(p) => {
                    self.packets += 1;
                    match to {
                        To::A => self.to_a.push(p),
                        To::B => self.to_b.push(p),
                    }
                }
                Action::Notify(channel::Event::AnchorNeeded {
                    script_pubkey,
                    amount,
                }) => self.anchor = Some((script_pubkey, amount)),
                _ => {}
            }
        }
    }

    /// Delivers packets both ways until none is left.
    fn pump(&mut self) {
        while !self.to_a.is_empty() || !self.to_b.is_empty() {
            for p in std::mem::take(&mut self.to_b) {
                let t = Instant::now();
                let acts = self.b.handle_packet(&p, 0).unwrap();
                self.acceptor += t.elapsed();
                self.take(acts, To::A);
            }
            for p in std::mem::take(&mut self.to_a) {
                let acts = self.a.handle_packet(&p, 0).unwrap();
                self.take(acts, To::B);
            }
        }
    }

    /// a offers an HTLC, b fulfills it, both complete.
    fn pair(&mut self, i: u32) {
        let mut r = [0u8; 32];
        r[..4].copy_from_slice(&i.to_le_bytes());
        let pre = Preimage(r);
        let offered = self
            .a
            .add_htlc(HTLC_MSAT, pre.hash(), Locktime::Blocks(1000), 0)
            .unwrap();
        self.take(offered, To::B);
        self.pump();
        let t = Instant::now();
        let fulfilled = self.b.fulfill_htlc(pre, 0).unwrap();
        self.acceptor += t.elapsed();
        self.take(fulfilled, To::A);
        self.pump();
    }
}

/// The baseline: two channels back to back in memory, add+fulfill pairs per second.
pub fn in_memory_pairs(pairs: u32) -> InMemory {
    let mut pair = Back2Back::live();
    let (persists0, packets0, acceptor0) = (pair.persists, pair.packets, pair.acceptor);
    let start = Instant::now();
    let cpu0 = thread_cpu_seconds();
    for i in 0..pairs {
        pair.pair(i);
    }
    let cpu = thread_cpu_seconds() - cpu0;
    let elapsed = start.elapsed().as_secs_f64();
    let per_pair = |n: f64| n / f64::from(pairs);
    let acceptor_wall = (pair.acceptor - acceptor0).as_secs_f64();
    InMemory {
        acceptor_cpu_s_per_pair: per_pair(cpu * acceptor_wall / elapsed),
        pairs_per_s: f64::from(pairs) / elapsed,
        persists_per_pair: per_pair((pair.persists - persists0) as f64),
        packets_per_pair: per_pair((pair.packets - packets0) as f64),
        acceptor_s_per_pair: per_pair((pair.acceptor - acceptor0).as_secs_f64()),
        snapshot_bytes: node::snapshot_codec::encode(&pair.b).map_or(0, |s| s.len()),
    }
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Latencies of durable writes on `dir`'s disk: `blocks` × 4 KiB written into a file whose size
/// does not change, then fdatasync (what an SQLite WAL commit with synchronous = FULL costs
/// once the WAL is allocated: the data, no metadata); and the CPU time of one such write
/// (the calling thread's user + system time over all of them).
pub fn fsync_latency(dir: &std::path::Path, blocks: u64) -> (Vec<f64>, f64) {
    use std::io::{Seek as _, SeekFrom, Write as _};
    let mut f = std::fs::File::create(dir.join("fsync-probe")).unwrap();
    f.write_all(&vec![0u8; 1 << 20]).unwrap();
    f.sync_all().unwrap();
    let block = vec![0x5au8; 4096 * blocks as usize];
    let cpu_start = thread_cpu_seconds();
    let samples: Vec<f64> = (0..1000u64)
        .map(|i| {
            f.seek(SeekFrom::Start((i % (256 / blocks)) * 4096 * blocks))
                .unwrap();
            let t = Instant::now();
            f.write_all(&block).unwrap();
            f.sync_data().unwrap();
            t.elapsed().as_secs_f64()
        })
        .collect();
    let cpu = (thread_cpu_seconds() - cpu_start) / samples.len() as f64;
    (samples, cpu)
}

/// Latencies of durable writes as the node makes them: one `UPDATE` of a `bytes`-long row
/// through sqlx on an SQLite connection configured as the node's (WAL, `synchronous =
/// FULL`, exclusive locking) in `dir`. Beside the flush itself this holds SQLite's work for
/// the row and the hand-off to sqlx's worker thread and back: a floor every write of a node
/// built on these parts pays, which a raw `fdatasync` of the same disk does not show (and
/// which moves with the machine's halt-polling, as every thread hand-off does).
///
/// Two sets of 300: writes 50–350 of a new database, each of which grows the WAL (its
/// flush also writes the file's size and new blocks, as a node's first writes after a
/// start do), and the last 300 of 1,750, after a checkpoint sent the WAL back to its start,
/// overwriting it in place (a node that has run a while).
pub async fn sqlite_commit_latency(dir: &std::path::Path, bytes: usize) -> (Vec<f64>, Vec<f64>) {
    use sqlx::sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqliteLockingMode, SqliteSynchronous,
    };
    use sqlx::{ConnectOptions as _, Connection as _};
    let path = dir.join("commit-probe.sqlite");
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .locking_mode(SqliteLockingMode::Exclusive)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full);
    let mut conn = options.connect().await.unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS probe (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("INSERT OR REPLACE INTO probe (id, v) VALUES (1, '')")
        .execute(&mut conn)
        .await
        .unwrap();
    let mut samples = Vec::new();
    let mut wrapped = Vec::new();
    let wal = || std::fs::metadata(format!("{}-wal", path.display())).map_or(0, |m| m.len());
    let mut wal_before = 0;
    for i in 0..1_750u32 {
        // A different row each time, as each snapshot differs from the last.
        let row = format!("{i:08}{}", "x".repeat(bytes.saturating_sub(8))).into_bytes();
        if i == 1_450 {
            wal_before = wal();
        }
        let t = Instant::now();
        sqlx::query("UPDATE probe SET v = ? WHERE id = 1")
            .bind(row)
            .execute(&mut conn)
            .await
            .unwrap();
        match i {
            50..350 => samples.push(t.elapsed().as_secs_f64()),
            1_450.. => wrapped.push(t.elapsed().as_secs_f64()),
            _ => {}
        }
    }
    // SQLite's default checkpoint at 1,000 frames (one a commit here) sent the WAL back to
    // its start: the last 300 commits overwrote it in place.
    assert_eq!(wal(), wal_before, "the probe's WAL still grew");
    conn.close().await.unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    (samples, wrapped)
}

/// Mean of `v`.
pub fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// "median … us, mean … us, p90 … us, p99 … us" of seconds `v`, with `decimals`.
pub fn distribution_us(v: &[f64], decimals: usize) -> String {
    let us = |x: f64| format!("{:.*}", decimals, x * 1e6);
    format!(
        "median {} us, mean {} us, p90 {} us, p99 {} us",
        us(median(v.to_vec())),
        us(mean(v)),
        us(quantile(v.to_vec(), 0.9)),
        us(quantile(v.to_vec(), 0.99))
    )
}

/// The `q` quantile of `v` (0 to 1).
pub fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Round trips of one packet over a v3 session on loopback (sent, echoed back). The echo
/// runs on a thread of its own with its own runtime, as a peer node is a process of its own:
/// each packet wakes a thread that was waiting for it, which no packet between two nodes
/// skips (on a virtual machine that wake-up is most of the trip). Both ends on one runtime
/// measured 10 us, one task handing the packet to the next on the same thread.
pub async fn packet_rtt() -> Vec<f64> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = session::Config::default();
    let server_key = SecretKey::from_slice(&[0x43; 32]).unwrap();
    let scfg = cfg.clone();
    let echo = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            listener.set_nonblocking(true).unwrap();
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let (stream, _) = listener.accept().await.unwrap();
            let mut s = session::accept(stream, &server_key, &scfg).await.unwrap();
            while let Ok(p) = s.recv().await {
                if s.send(&p).await.is_err() {
                    break;
                }
            }
        });
    });
    let key = SecretKey::from_slice(&[0x44; 32]).unwrap();
    let mut s = session::connect(addr, &key, &cfg).await.unwrap();
    let pkt = Packet::OpenComplete(wire::OpenComplete::default());
    let mut samples = Vec::new();
    for _ in 0..500 {
        let t = Instant::now();
        s.send(&pkt).await.unwrap();
        s.recv().await.unwrap();
        samples.push(t.elapsed().as_secs_f64());
    }
    drop(s);
    echo.join().unwrap();
    samples
}

/// How this machine's idle CPUs wait for work. On a virtual machine a halted vCPU costs an
/// exit to the host and back on every wake-up, which every hand-off between threads and every
/// completed flush pays; `guest_halt_poll_ns` above 0 makes the guest poll first. The figures
/// move with it (docs/node.md, "The machine's share"), so the run names it.
pub fn idle_policy() -> String {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_owned());
    let driver =
        read("/sys/devices/system/cpu/cpuidle/current_driver").unwrap_or_else(|_| "unknown".into());
    match read("/sys/module/haltpoll/parameters/guest_halt_poll_ns") {
        Ok(ns) => format!("cpuidle driver {driver}, guest_halt_poll_ns {ns}"),
        Err(_) => format!("cpuidle driver {driver}"),
    }
}

/// One channel's sequential pairs on the least a node can be built of: the two state
/// machines of [`in_memory_pairs`], each on a thread and one-thread runtime of its own (as a
/// `potluck node` runs), joined by a loopback TCP socket carrying each packet's bytes, each
/// committing its channel's snapshot through sqlx (the node's settings, its WAL overwritten
/// in place) before the packets after a persist leave, in the actions' order. No session
/// encryption, no control API, no manager, registry or group writer: what a node does beyond
/// this is its own cost. Where a node's pair waits for the owner's two control calls, the
/// skeleton's sides tell each other to go on with an empty frame, a one-way trip each.
/// Summed terms, each measured on its own and back to back, leave out what a chain of them
/// pays where every step starts after a wait: its writes take longer (printed beside the
/// probe's), and the skeleton pays that as a node does.
/// Returns seconds per pair and the durations of both sides' writes among the pairs timed.
pub fn skeleton_pairs(dir: &std::path::Path, pairs: u32) -> (f64, Vec<f64>) {
    let Back2Back { a, b, .. } = Back2Back::live();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (db_a, db_b) = (dir.join("skeleton-a.sqlite"), dir.join("skeleton-b.sqlite"));
    let accept = std::thread::spawn(move || {
        let (socket, _) = listener.accept().unwrap();
        on_own_runtime(skeleton_side(b, socket, db_b, pairs, false))
    });
    let offer = std::thread::spawn(move || {
        let socket = std::net::TcpStream::connect(addr).unwrap();
        on_own_runtime(skeleton_side(a, socket, db_a, pairs, true))
    });
    let (per_pair, mut writes) = offer.join().unwrap();
    writes.extend(accept.join().unwrap().1);
    for side in ["a", "b"] {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(dir.join(format!("skeleton-{side}.sqlite{suffix}")));
        }
    }
    (per_pair, writes)
}

fn on_own_runtime<T>(work: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(work)
}

/// One side of [`skeleton_pairs`]: the offerer adds each HTLC, the other fulfills it once
/// told the add completed. Returns seconds per pair (after the first, which warms both
/// sides) and the durations of this side's writes after the first pair.
async fn skeleton_side(
    mut channel: Channel,
    socket: std::net::TcpStream,
    db: std::path::PathBuf,
    pairs: u32,
    offers: bool,
) -> (f64, Vec<f64>) {
    let mut io = SkeletonIo::open(socket, &db, &channel).await;
    let mut start = Instant::now();
    for i in 0..pairs {
        if i == 1 {
            start = Instant::now();
            io.writes.clear();
        }
        let mut r = [0u8; 32];
        r[..4].copy_from_slice(&i.to_le_bytes());
        let pre = Preimage(r);
        // Each side in turn proposes its update and takes the other's until told to go on.
        for proposing in [offers, !offers] {
            if proposing {
                let mut actions = if offers {
                    channel.add_htlc(HTLC_MSAT, pre.hash(), Locktime::Blocks(1000), 0)
                } else {
                    channel.fulfill_htlc(pre, 0)
                }
                .unwrap();
                while !io.perform(&channel, actions).await {
                    let packet = io.receive().await.expect("a packet, not a go-on");
                    actions = channel.handle_packet(&packet, 0).unwrap();
                }
                // The owner's control call answered: the other side's turn.
                io.send(&[]).await;
            } else {
                while let Some(packet) = io.receive().await {
                    let actions = channel.handle_packet(&packet, 0).unwrap();
                    io.perform(&channel, actions).await;
                }
            }
        }
    }
    let per_pair = start.elapsed().as_secs_f64() / f64::from(pairs.saturating_sub(1).max(1));
    (per_pair, io.writes)
}

/// A skeleton side's socket and database.
struct SkeletonIo {
    socket: tokio::net::TcpStream,
    conn: sqlx::SqliteConnection,
    /// Each write's duration, seconds.
    writes: Vec<f64>,
}

impl SkeletonIo {
    /// A database configured as a node's, its WAL past its first checkpoint so that it is
    /// overwritten in place, as a node's that has run a while.
    async fn open(socket: std::net::TcpStream, db: &std::path::Path, channel: &Channel) -> Self {
        use sqlx::sqlite::{
            SqliteConnectOptions, SqliteJournalMode, SqliteLockingMode, SqliteSynchronous,
        };
        use sqlx::ConnectOptions as _;
        socket.set_nodelay(true).unwrap();
        socket.set_nonblocking(true).unwrap();
        let mut io = SkeletonIo {
            socket: tokio::net::TcpStream::from_std(socket).unwrap(),
            conn: SqliteConnectOptions::new()
                .filename(db)
                .create_if_missing(true)
                .locking_mode(SqliteLockingMode::Exclusive)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
                .connect()
                .await
                .unwrap(),
            writes: Vec::new(),
        };
        for statement in [
            "CREATE TABLE channel (id INTEGER PRIMARY KEY, v TEXT NOT NULL)",
            "INSERT INTO channel (id, v) VALUES (1, '')",
        ] {
            sqlx::query(statement).execute(&mut io.conn).await.unwrap();
        }
        // Past SQLite's checkpoint at 1,000 frames, then none among the pairs timed: a node
        // checkpoints every 10,000 frames.
        for _ in 0..1_100 {
            io.persist(channel).await;
        }
        sqlx::query("PRAGMA wal_autocheckpoint = 10000")
            .execute(&mut io.conn)
            .await
            .unwrap();
        io
    }

    /// The channel's snapshot, as the node encodes it, committed: one `UPDATE` in
    /// autocommit, as a node's lone write.
    async fn persist(&mut self, channel: &Channel) {
        let t = Instant::now();
        sqlx::query("UPDATE channel SET v = ? WHERE id = 1")
            .bind(node::snapshot_codec::encode(channel).unwrap())
            .execute(&mut self.conn)
            .await
            .unwrap();
        self.writes.push(t.elapsed().as_secs_f64());
    }

    /// The next frame's packet; none for a go-on.
    async fn receive(&mut self) -> Option<Packet> {
        use tokio::io::AsyncReadExt as _;
        let len = self.socket.read_u32().await.unwrap() as usize;
        if len == 0 {
            return None;
        }
        let mut frame = vec![0; len];
        self.socket.read_exact(&mut frame).await.unwrap();
        Some(Packet::decode(&frame).unwrap())
    }

    /// A frame: its length, then its bytes (none: go on).
    async fn send(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt as _;
        let mut out = (bytes.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(bytes);
        self.socket.write_all(&out).await.unwrap();
    }

    /// Performs `actions` in order; true once the update this side proposed completed.
    async fn perform(&mut self, channel: &Channel, actions: Vec<Action>) -> bool {
        let mut completed = false;
        for act in actions {
            match act {
                Action::Persist => self.persist(channel).await,
                Action::Send(p) => self.send(&p.encode()).await,
                Action::Notify(channel::Event::UpdateCompleted {
                    by: channel::Who::Us,
                    ..
                }) => completed = true,
                _ => {}
            }
        }
        completed
    }
}
