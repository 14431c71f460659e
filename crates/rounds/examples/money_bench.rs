//! Money figures of docs/benchmarks.md (issue 6): bets per second accepted end to end over HTTP (each builds, signs, records and broadcasts a transaction) against the same build+sign+broadcast without HTTP and database, and the time from a mined draw block to a broadcast payout of a round with N bets.
//!
//! `cargo run --release -p potluck-rounds --example money_bench -- [DATABASE_URL] [BETS] [CLIENTS] [REPS]`
//! (default: SQLite in a temporary directory, 1000 bets, 8 clients, 5 repetitions).
//!
//! The bare baseline and the bets over HTTP alternate `REPS` times in one
//! process (bare, HTTP, bare, HTTP, …), so each ratio compares two phases a
//! second apart on a machine whose speed drifts; the summary lines print the
//! medians (of bets/s, of tx/s, and of the per-repetition ratios), and one
//! line per repetition precedes them. Each repetition's bets are one round,
//! paid out (and timed) before the next repetition.
//!
//! To profile the HTTP phases only: `mkfifo ctl; perf record -g --control
//! fifo:ctl --delay=-1 -- env MONEY_BENCH_PERF_CTL=ctl money_bench …`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bitcoin::{Amount, FeeRate, TxOut};
use chain::Chain as _;
use potluck_rounds::http::state::AppState;
use potluck_rounds::security::password::HashParams;
use potluck_rounds::{Application, ChainSource, Config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One keep-alive HTTP/1.1 connection.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn open(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Self {
            stream,
            buf: Vec::new(),
        }
    }

    async fn call(
        &mut self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: &str,
    ) -> (u16, String) {
        let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
        let req = format!(
            "{method} {path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n{auth}content-length: {}\r\n\r\n{body}",
            body.len()
        );
        self.stream.write_all(req.as_bytes()).await.expect("write");
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).to_string();
                let status: u16 = head[9..12].parse().expect("status");
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap_or(0))
                    })
                    .unwrap_or(0);
                while self.buf.len() < end + 4 + len {
                    self.read().await;
                }
                let body = String::from_utf8_lossy(&self.buf[end + 4..end + 4 + len]).to_string();
                self.buf.drain(..end + 4 + len);
                return (status, body);
            }
            self.read().await;
        }
    }

    async fn read(&mut self) {
        let mut chunk = [0u8; 16384];
        let n = self.stream.read(&mut chunk).await.expect("read");
        assert!(n > 0, "connection closed");
        self.buf.extend_from_slice(&chunk[..n]);
    }
}

/// Closes the current round now (the bench does not wait out its timer),
/// lets the engine fix the commitment (it opens the next round), mines the
/// draw block and returns the seconds until the payout is broadcast.
async fn pay_out(store: &potluck_rounds::store::Store, dev: &chain::DevChain) -> f64 {
    let round = store.current_round().await.expect("round").expect("exists");
    sqlx::query("UPDATE rounds SET closes_at = 0 WHERE id = $1")
        .bind(round.id)
        .execute(store.pool())
        .await
        .expect("close");
    let detail = |id: i64| {
        let store = store.clone();
        async move {
            store
                .round_detail(id)
                .await
                .expect("detail")
                .expect("round")
        }
    };
    while detail(round.id).await.round.status != potluck_rounds::domain::round::RoundStatus::Drawing
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    dev.mine(1, dev.faucet_script()).expect("mine");
    let mined = Instant::now();
    loop {
        if detail(round.id)
            .await
            .payout
            .as_ref()
            .is_some_and(|p| p.status == potluck_rounds::domain::round::TransferStatus::Broadcast)
        {
            break;
        }
        assert!(
            mined.elapsed() < Duration::from_secs(300),
            "payout did not happen"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    mined.elapsed().as_secs_f64()
}

/// With `MONEY_BENCH_PERF_CTL` naming the control FIFO of a `perf record
/// --control fifo:… --delay=-1`, profiles only the HTTP phases: `enable`
/// before, `disable` after.
fn perf_control(command: &[u8]) {
    use std::io::Write as _;
    if let Some(path) = std::env::var_os("MONEY_BENCH_PERF_CTL") {
        if let Ok(mut f) = std::fs::OpenOptions::new().write(true).open(path) {
            let _ = f.write_all(command);
        }
    }
}

/// The output of `tx` that pays `key`, as a wallet input.
fn output_to(tx: &bitcoin::Transaction, key: &wallet::DerivedKey) -> wallet::SpendableOutput {
    let script = key.address.script_pubkey();
    let vout = tx
        .output
        .iter()
        .position(|o| o.script_pubkey == script)
        .expect("an output to the key");
    wallet::SpendableOutput {
        outpoint: bitcoin::OutPoint {
            txid: tx.compute_txid(),
            vout: vout as u32,
        },
        txout: tx.output[vout].clone(),
        path: key.path,
    }
}

/// The median (the mean of the middle two for an even count).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("{e}: {s}"))
}

/// The service in this process on `db` (SQLite in `dir` when None), with
/// cheap Argon2, no request quota to speak of and a round that stays open;
/// its address, state and store.
async fn start_service(
    db: Option<String>,
    dir: std::path::PathBuf,
) -> (SocketAddr, AppState, potluck_rounds::store::Store) {
    let mut config = Config::new(dir);
    config.bind = "127.0.0.1:0".parse().expect("addr");
    config.database_url = db.map(Into::into);
    config.admin_token = Some("bench-admin-token-16".into());
    config.hash_params = HashParams {
        memory_kib: 64,
        iterations: 1,
        parallelism: 1,
    };
    config.quota.limit = 1_000_000;
    config.default_round_duration_seconds = 3600;
    config.chain = ChainSource::Dev {
        block_interval: None,
        rpc_bind: None,
    };
    let app = Application::build(config).await.expect("build");
    let addr = app.local_addr();
    let state = app.state().clone();
    let store = app.store().clone();
    tokio::spawn(app.run_until_stopped(std::future::pending()));
    (addr, state, store)
}

/// `users` users, each with `per_user` confirmed outputs (one mined block);
/// their tokens.
async fn users_with_coins(
    addr: SocketAddr,
    dev: &chain::DevChain,
    users: usize,
    per_user: usize,
) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut c = Conn::open(addr).await;
    let mut paid = 0u32;
    for i in 0..users {
        let body = format!(r#"{{"username":"bench{i}","password":"benchmark-password"}}"#);
        let (s, reg) = c.call("POST", "/auth/register", None, &body).await;
        assert_eq!(s, 201, "{reg}");
        let (_, login) = c.call("POST", "/auth/login", None, &body).await;
        tokens.push(
            json(&login)["access_token"]
                .as_str()
                .expect("token")
                .to_string(),
        );
        let address: bitcoin::Address = json(&reg)["address"]
            .as_str()
            .expect("address")
            .parse::<bitcoin::Address<_>>()
            .expect("parse")
            .assume_checked();
        for _ in 0..per_user {
            dev.faucet(&address.script_pubkey(), Amount::from_sat(100_000))
                .expect("faucet");
            // The faucet's payments chain on its change: a block before the
            // chain reaches the mempool's ancestor limit (25).
            paid += 1;
            if paid % 20 == 0 {
                dev.mine(1, dev.faucet_script()).expect("mine");
            }
        }
    }
    dev.mine(1, dev.faucet_script()).expect("mine");
    tokens
}

/// The same wallet work and broadcast as a bet, without HTTP and database:
/// 300 outputs of one key, each spent to a pot with change back.
struct Baseline {
    wallet: Arc<wallet::Wallet>,
    key: wallet::DerivedKey,
    outs: Vec<wallet::SpendableOutput>,
    pot: bitcoin::ScriptBuf,
}

impl Baseline {
    const N: usize = 300;

    /// The key's outputs, faucet-funded and confirmed.
    async fn prepare(wallet: Arc<wallet::Wallet>, dev: &chain::DevChain) -> Self {
        let base_n = Self::N;
        let key = wallet
            .derive(wallet::KeyPath {
                branch: 9,
                index: 0,
            })
            .expect("key");
        let mut outs = Vec::new();
        for i in 0..base_n {
            if i % 20 == 19 {
                dev.mine(1, dev.faucet_script()).expect("mine");
            }
            let txid = dev
                .faucet(&key.address.script_pubkey(), Amount::from_sat(100_000))
                .expect("faucet");
            let tx = dev.transaction(txid).await.expect("tx").expect("known").tx;
            outs.push(output_to(&tx, &key));
        }
        dev.mine(1, dev.faucet_script()).expect("mine");
        let pot = wallet
            .derive(wallet::KeyPath {
                branch: 9,
                index: 1,
            })
            .expect("key")
            .address
            .script_pubkey();
        Self {
            wallet,
            key,
            outs,
            pot,
        }
    }

    /// One pass over the outputs (each transaction's change is the next
    /// pass's input), confirmed after; the transactions per second.
    async fn run(&mut self, dev: &chain::DevChain) -> f64 {
        let (wallet, key, pot) = (&self.wallet, &self.key, &self.pot);
        let base_n = Self::N;
        let t = Instant::now();
        let mut change = Vec::with_capacity(self.outs.len());
        for o in &self.outs {
            let built = wallet
                .build_signed(
                    std::slice::from_ref(o),
                    &[TxOut {
                        value: Amount::from_sat(10_000),
                        script_pubkey: pot.clone(),
                    }],
                    Some(&key.address.script_pubkey()),
                    FeeRate::from_sat_per_vb_u32(2),
                )
                .expect("build");
            change.push(output_to(&built.tx, key));
            dev.broadcast(built.tx).await.expect("broadcast");
        }
        let base_rate = base_n as f64 / t.elapsed().as_secs_f64();
        self.outs = change;
        dev.mine(1, dev.faucet_script()).expect("mine");
        base_rate
    }
}

/// `per_user` bets of each of `tokens` over HTTP from `clients` connections;
/// how many were placed and in what time.
async fn bets_over_http(
    addr: SocketAddr,
    tokens: &Arc<Vec<String>>,
    clients: usize,
    per_user: usize,
) -> (usize, Duration) {
    let t = Instant::now();
    let mut tasks = Vec::new();
    for k in 0..clients {
        let tokens = tokens.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::open(addr).await;
            let mut ok = 0usize;
            for u in (k..tokens.len()).step_by(clients) {
                for _ in 0..per_user {
                    let (s, b) = c
                        .call(
                            "POST",
                            "/rounds/current/bets",
                            Some(&tokens[u]),
                            r#"{"amount_sats":10000}"#,
                        )
                        .await;
                    assert_eq!(s, 201, "{b}");
                    ok += 1;
                }
            }
            ok
        }));
    }
    let mut n = 0;
    for t in tasks {
        n += t.await.expect("client");
    }
    let elapsed = t.elapsed();
    (n, elapsed)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let db = args.get(1).cloned().filter(|s| s != "sqlite");
    let bets: usize = args.get(2).map_or(1000, |s| s.parse().expect("BETS"));
    let clients: usize = args.get(3).map_or(8, |s| s.parse().expect("CLIENTS"));
    let reps: usize = args.get(4).map_or(5, |s| s.parse().expect("REPS")).max(1);
    let users = clients * 4;
    let per_user = bets.div_ceil(users);
    let dir = std::env::temp_dir().join(format!("potluck-money-bench-{}", std::process::id()));
    let (addr, state, store) = start_service(db.clone(), dir.clone()).await;
    let dev = state.dev_chain.clone().expect("dev chain");
    let tokens = users_with_coins(addr, &dev, users, per_user).await;
    state.engine.run_once().await.expect("sync");
    let mut baseline = Baseline::prepare(state.engine.wallet().clone(), &dev).await;
    let tokens = Arc::new(tokens);
    let (mut base_rates, mut rates, mut ratios, mut times, mut payouts) =
        (vec![], vec![], vec![], vec![], vec![]);
    let mut placed = 0usize;
    for rep in 0..reps {
        let base_rate = baseline.run(&dev).await;
        perf_control(b"enable\n");
        let (n, elapsed) = bets_over_http(addr, &tokens, clients, per_user).await;
        perf_control(b"disable\n");
        let rate = n as f64 / elapsed.as_secs_f64();
        placed += n;
        println!(
            "rep {}: bare {base_rate:.0} tx/s, HTTP {rate:.0} bets/s, HTTP/bare = {:.2}",
            rep + 1,
            rate / base_rate
        );
        base_rates.push(base_rate);
        rates.push(rate);
        ratios.push(rate / base_rate);
        times.push(elapsed.as_secs_f64());
        // Each repetition's bets are one round, paid out before the next (a
        // round takes at most MAX_ROUND_BETS, so that its payout fits in one
        // standard transaction); its change, confirmed and synced, is the
        // next repetition's coins.
        payouts.push(pay_out(&store, &dev).await);
        dev.mine(1, dev.faucet_script()).expect("mine");
        state.engine.run_once().await.expect("sync");
    }
    let per_rep = placed / reps;
    let (rate, base_rate, ratio, secs, payout) = (
        median(rates),
        median(base_rates),
        median(ratios),
        median(times),
        median(payouts),
    );
    let backend = if db.is_some() { "postgres" } else { "sqlite" };
    println!("backend {backend}: {per_rep} bets from {clients} clients in {secs:.2}s = {rate:.0} bets/s over HTTP (median of {reps})");
    println!("baseline (build+sign+broadcast, no HTTP/DB, 1 thread): {base_rate:.0} tx/s; HTTP/baseline = {ratio:.2} (medians of {reps}, ratio per repetition)");
    println!(
        "draw block mined -> payout of {per_rep} bets broadcast: {:.0} ms (median of {reps})",
        payout * 1000.0
    );
    let _ = std::fs::remove_dir_all(&dir);
    std::process::exit(0);
}
