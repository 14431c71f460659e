//! The Core lane (issue 31): `potluck serve`'s money path and `potluck node`'s channel
//! lifecycle against a chain reached only through bitcoind's JSON-RPC, and funded only the
//! way a real Bitcoin Core allows: blocks mined to a key the test holds, and transactions
//! the test signs and sends with `sendrawtransaction` (no faucet, no `sendtoaddress`).
//!
//! With `POTLUCK_TEST_BITCOIND=/path/to/bitcoind` (as `scripts/test-core.sh` sets it) the
//! chain is that Bitcoin Core, `-regtest` without `-txindex`, in a temporary data directory
//! with cookie authentication. Without it the same tests run on `potluck chain
//! --txindex=false`, so every CI run goes through the same code as the Core lane.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::str::FromStr as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bitcoin::{Address, Amount, FeeRate, Network, OutPoint, TxOut, Txid};
use chain::{Auth, BitcoindRpc, RpcConfig};
use serde_json::{json, Value};
use support::channels::{btc_to_sat, chain_command, start_chain, NodeProc};
use support::{wait_for, wait_for_blocking};
use support::{Db, Env, Server};
use wallet::{KeyPath, SpendableOutput, Wallet};

/// Where the lane's Bitcoin Core is, when it runs against one.
const BITCOIND_VAR: &str = "POTLUCK_TEST_BITCOIND";

/// Which chain the lane runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    /// `bitcoind -regtest` (no `-txindex`), from [`BITCOIND_VAR`].
    Core,
    /// `potluck chain --txindex=false`.
    Dev,
}

/// A chain process, a JSON-RPC client of it, and the test's own coins on it.
struct LaneChain {
    backend: Backend,
    child: Child,
    dir: tempfile::TempDir,
    url: String,
    cookie: PathBuf,
    /// Runs the client's calls; taken (and shut down without blocking) on drop, which may
    /// happen inside an async test.
    rt: Option<tokio::runtime::Runtime>,
    rpc: BitcoindRpc,
    /// The test's wallet: mined blocks pay its first key, payments are signed by it.
    funder: Wallet,
    /// The funder's coins not yet spent: a mature coinbase, then the change of each payment.
    coins: Mutex<Vec<SpendableOutput>>,
    /// Where blocks mined after the start pay (a key of another wallet, so no coinbase
    /// ends up in a wallet under test).
    burn: Address,
}

impl Drop for LaneChain {
    fn drop(&mut self) {
        if std::thread::panicking() && self.backend == Backend::Core {
            let log = self.dir.path().join("regtest").join("debug.log");
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!(
                "---- tail of {} ----\n{}",
                log.display(),
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        }
        if self.backend == Backend::Core {
            // A clean stop, so Core does not leave a half-written data directory behind
            // while the temporary directory is removed.
            let _ = self.try_call("stop", json!([]));
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl LaneChain {
    /// Bitcoin Core when [`BITCOIND_VAR`] names one, else the development chain; then
    /// 101 blocks to the funder, so that the first one's coinbase is spendable.
    fn start() -> LaneChain {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (backend, child, url, cookie) = match std::env::var_os(BITCOIND_VAR) {
            Some(bitcoind) => {
                let (child, url) = start_bitcoind(&PathBuf::from(bitcoind), dir.path());
                let cookie = dir.path().join("regtest").join(".cookie");
                (Backend::Core, child, url, cookie)
            }
            None => {
                let data = dir.path().join("chain");
                let mut cmd = chain_command(&[
                    "--rpc-bind",
                    "127.0.0.1:0",
                    "--block-interval",
                    "0",
                    "--txindex=false",
                ]);
                cmd.arg("--data-dir")
                    .arg(&data)
                    .env("RUST_LOG", "warn")
                    .stderr(Stdio::null());
                let (child, url) = start_chain(cmd);
                (Backend::Dev, child, url, data.join(".cookie"))
            }
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the chain client");
        // Core answers -28 while it loads; the cookie appears once its RPC server is up.
        let rpc = wait_for_blocking("the chain's RPC", Duration::from_secs(60), || {
            if !cookie.exists() {
                return None;
            }
            let mut cfg = RpcConfig::new(url.clone(), Auth::Cookie(cookie.clone()));
            cfg.retries = 0;
            let c = BitcoindRpc::new(cfg).expect("a client");
            on_thread(|| rt.block_on(c.get_block_count()))
                .ok()
                .map(|_| c)
        });
        let funder = Wallet::from_seed(&[31u8; 32], Network::Regtest).expect("the funder wallet");
        let burn = Wallet::from_seed(&[13u8; 32], Network::Regtest)
            .and_then(|w| w.derive_address(0, 0))
            .expect("the burn address");
        let chain = LaneChain {
            backend,
            child,
            dir,
            url,
            cookie,
            rt: Some(rt),
            rpc,
            funder,
            coins: Mutex::new(Vec::new()),
            burn,
        };
        let info = chain.call("getindexinfo", json!([]));
        assert!(info.get("txindex").is_none(), "no -txindex: {info}");
        let path = KeyPath::receive(0);
        let address = chain.funder.derive(path).expect("the funder's key").address;
        let hashes = chain.block_on(chain.rpc.generate_to_address(101, &address));
        let first = chain.block_on(chain.rpc.get_block(&hashes[0]));
        let coinbase = &first.txdata[0];
        let vout = coinbase
            .output
            .iter()
            .position(|o| o.script_pubkey == address.script_pubkey())
            .expect("the coinbase pays the funder");
        chain.coins.lock().expect("coins").push(SpendableOutput {
            outpoint: OutPoint {
                txid: coinbase.compute_txid(),
                vout: vout as u32,
            },
            txout: coinbase.output[vout].clone(),
            path,
        });
        chain
    }

    /// What a report says the lane ran on.
    fn describe(&self) -> String {
        match self.backend {
            Backend::Core => {
                let v = self.call("getnetworkinfo", json!([]));
                format!(
                    "bitcoind {} (-regtest, no -txindex)",
                    v["subversion"].as_str().unwrap_or("?")
                )
            }
            Backend::Dev => "potluck chain --txindex=false".to_owned(),
        }
    }

    /// Runs `f` (a call of the client) to its end on this chain's runtime. On a thread of
    /// its own: a test that is itself async may call it.
    fn block_on<T: Send, E: std::fmt::Display + Send>(
        &self,
        f: impl std::future::Future<Output = Result<T, E>> + Send,
    ) -> T {
        let rt = self.rt.as_ref().expect("the runtime lives until drop");
        on_thread(|| rt.block_on(f)).unwrap_or_else(|e| panic!("chain RPC: {e}"))
    }

    fn try_call(&self, method: &str, params: Value) -> Result<Value, String> {
        let rt = self.rt.as_ref().expect("the runtime lives until drop");
        on_thread(|| rt.block_on(self.rpc.call::<Value>(method, params))).map_err(|e| e.to_string())
    }

    fn call(&self, method: &str, params: Value) -> Value {
        self.try_call(method, params)
            .unwrap_or_else(|e| panic!("chain {method}: {e}"))
    }

    fn mine(&self, n: u32) {
        self.block_on(self.rpc.generate_to_address(n, &self.burn));
    }

    fn height(&self) -> u64 {
        self.call("getblockcount", json!([]))
            .as_u64()
            .expect("a height")
    }

    /// Pays `sat` to `address` from the funder's coins (the newest change first, so the
    /// payments chain in the mempool as a wallet's would) at 2 sat/vB; returns the txid.
    fn send(&self, address: &str, sat: u64) -> Txid {
        let to = Address::from_str(address)
            .expect("an address")
            .require_network(Network::Regtest)
            .expect("a regtest address");
        let mut coins = self.coins.lock().expect("coins");
        let coin = coins.pop().expect("the funder has a coin");
        let change = self
            .funder
            .derive(KeyPath::receive(1))
            .expect("the change key");
        let built = self
            .funder
            .build_signed(
                std::slice::from_ref(&coin),
                &[TxOut {
                    value: Amount::from_sat(sat),
                    script_pubkey: to.script_pubkey(),
                }],
                Some(&change.address.script_pubkey()),
                FeeRate::from_sat_per_vb(2).expect("a fee rate"),
            )
            .expect("the funder pays");
        let txid = self.block_on(self.rpc.send_raw_transaction(&built.tx));
        let (vout, value) = built.change.expect("the funder keeps change");
        coins.push(SpendableOutput {
            outpoint: OutPoint { txid, vout },
            txout: TxOut {
                value,
                script_pubkey: change.address.script_pubkey(),
            },
            path: change.path,
        });
        txid
    }

    /// The decoded transaction. Without the index a confirmed one is found only with its
    /// block hash, so the blocks are searched from the tip down, as a client of Core must.
    fn tx(&self, txid: &str) -> Value {
        if let Ok(tx) = self.try_call("getrawtransaction", json!([txid, true])) {
            return tx;
        }
        for height in (0..=self.height()).rev() {
            let hash = self.call("getblockhash", json!([height]));
            let block = self.call("getblock", json!([hash, 1]));
            if block["tx"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t == txid))
            {
                return self.call("getrawtransaction", json!([txid, true, hash]));
            }
        }
        panic!("transaction {txid} in neither the mempool nor a block")
    }

    /// Fee of a transaction: its inputs' values minus its outputs'.
    fn fee(&self, txid: &str) -> u64 {
        let tx = self.tx(txid);
        let ins: u64 = tx["vin"]
            .as_array()
            .expect("inputs")
            .iter()
            .map(|i| {
                let parent = self.tx(i["txid"].as_str().expect("an input txid"));
                btc_to_sat(&parent["vout"][i["vout"].as_u64().expect("a vout") as usize]["value"])
            })
            .sum();
        let outs: u64 = tx["vout"]
            .as_array()
            .expect("outputs")
            .iter()
            .map(|o| btc_to_sat(&o["value"]))
            .sum();
        ins - outs
    }

    /// The value of `txid:vout` in the chain's UTXO set (mempool spends count), or None.
    fn utxo_sat(&self, txid: &str, vout: u64) -> Option<u64> {
        let v = self.call("gettxout", json!([txid, vout, true]));
        (!v.is_null()).then(|| btc_to_sat(&v["value"]))
    }
}

/// Runs `f` on a scoped thread of its own and returns what it returned: a runtime's
/// `block_on` refuses to run inside another runtime's task.
fn on_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().expect("the RPC thread panicked"))
}

/// Starts `bitcoind -regtest` in `datadir`: RPC on loopback with a cookie, no P2P, no
/// index, no wallet. Core cannot bind port 0 and report the port, so a free one is taken
/// from the OS and given to it; another process could take it in between, so a start
/// that fails is tried again on a new port.
fn start_bitcoind(bitcoind: &std::path::Path, datadir: &std::path::Path) -> (Child, String) {
    for attempt in 1..=3 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut child = Command::new(bitcoind)
            .arg("-regtest")
            .arg(format!("-datadir={}", datadir.display()))
            .args([
                "-server",
                "-listen=0",
                "-dnsseed=0",
                "-fixedseeds=0",
                "-discover=0",
                "-printtoconsole=0",
                "-rpcbind=127.0.0.1",
                "-rpcallowip=127.0.0.1",
            ])
            .arg(format!("-rpcport={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{BITCOIND_VAR}={}: {e}", bitcoind.display()));
        let url = format!("http://127.0.0.1:{port}/");
        // Up once the RPC port answers; a bitcoind that exits (its port was taken) is
        // started again.
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use std::io::Read as _;
                    let _ = e.read_to_string(&mut err);
                }
                eprintln!("bitcoind exited ({status}) on attempt {attempt}: {err}");
                break;
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return (child, url);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("bitcoind did not start")
}

// ---- serve: deposit, a round with bets, the draw, the payout, a withdrawal ----

const ROUND_SECS: &str = "6";
const DEPOSIT_SAT: i64 = 500_000;

/// `potluck serve` on the lane's chain, through `--bitcoind-url` and the cookie.
async fn start_serve(env: &Env, chain: &LaneChain) -> Server {
    let cookie = chain.cookie.display().to_string();
    env.start(&[
        "--bitcoind-url",
        &chain.url,
        "--bitcoind-cookie",
        &cookie,
        "--round-duration-seconds",
        ROUND_SECS,
    ])
    .await
}

/// A round that opened after the current one, so that bets fit in it.
async fn fresh_round(s: &Server) -> i64 {
    let start = s.get("/rounds/current", &[]).await.json()["id"]
        .as_i64()
        .expect("a round id");
    wait_for("a fresh round", Duration::from_secs(60), || async {
        let c = s.get("/rounds/current", &[]).await.json();
        let id = c["id"].as_i64()?;
        (id > start && c["status"] == "open").then_some(id)
    })
    .await
}

async fn round_in(s: &Server, id: i64, status: &str) -> Value {
    wait_for(status, Duration::from_secs(60), || async {
        let r = s.get(&format!("/rounds/{id}"), &[]).await.json();
        (r["status"] == status).then_some(r)
    })
    .await
}

/// `user`'s newest transaction of `kind` once its status is `status`.
async fn transfer_in(s: &Server, user: &str, kind: &str, status: &str) -> Value {
    wait_for(
        &format!("{kind} {status}"),
        Duration::from_secs(60),
        || async {
            let txs = s.transactions(user).await;
            txs["transactions"]
                .as_array()?
                .iter()
                .find(|t| t["kind"] == kind)
                .filter(|t| t["status"] == status)
                .cloned()
        },
    )
    .await
}

/// The ledger balances once everything is mined, and every output it holds is unspent in
/// the chain's UTXO set with the value it books.
async fn assert_ledger_in_utxo_set(s: &Server, chain: &LaneChain, users: &[&str]) {
    wait_for("the ledger synced", Duration::from_secs(60), || async {
        if !chain
            .call("getrawmempool", json!([]))
            .as_array()?
            .is_empty()
        {
            chain.mine(1);
            return None;
        }
        let l = s.admin_get("/admin/ledger").await.json();
        (l["synced_height"].as_u64() == Some(chain.height())).then_some(())
    })
    .await;
    let l = s.admin_get("/admin/ledger").await.json();
    let n = |k: &str| l[k].as_i64().unwrap_or_else(|| panic!("{k} in {l}"));
    assert_eq!(
        n("deposits_sats"),
        n("users_unspent_sats")
            + n("pots_in_flight_sats")
            + n("commission_paid_sats")
            + n("withdrawn_sats")
            + n("miner_fees_sats"),
        "ledger does not balance: {l}"
    );
    let mut listed = 0;
    for o in l["unspent"].as_array().expect("unspent outputs") {
        let txid = o["txid"].as_str().expect("a txid");
        let vout = o["vout"].as_u64().expect("a vout");
        let sat = chain
            .utxo_sat(txid, vout)
            .unwrap_or_else(|| panic!("ledger output {o} is not in the chain's UTXO set"));
        assert_eq!(
            sat as i64,
            o["amount_sats"].as_i64().expect("amount"),
            "{o}"
        );
        listed += sat as i64;
    }
    assert_eq!(listed, n("users_unspent_sats") + n("pots_in_flight_sats"));
    let mut balances = 0;
    for u in users {
        let me = wait_for("settled balances", Duration::from_secs(30), || async {
            let me = s.me(u).await;
            (me["has_pending"] == false).then_some(me)
        })
        .await;
        balances += me["balance_sats"].as_i64().expect("a balance");
    }
    assert_eq!(balances, n("users_unspent_sats"), "balances vs outputs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_deposits_bets_draws_pays_out_and_withdraws() {
    let started = Instant::now();
    let chain = LaneChain::start();
    let env = Env::new(Db::Sqlite).await;
    let mut server = start_serve(&env, &chain).await;
    let s = &server;
    // No faucet: the service does not run the development chain.
    let names = ["alice", "bobby", "carol"];
    let mut tokens = Vec::new();
    for (i, n) in names.iter().enumerate() {
        tokens.push(s.user(n, &format!("10.31.0.{}", i + 1)).await);
    }
    assert_eq!(s.faucet(&tokens[0], json!({})).await.status, 404);

    deposits_credited(s, &chain, &tokens).await;

    // A round of three bets, each in the chain's mempool.
    let id = fresh_round(s).await;
    let amounts = [10_000i64, 20_000, 30_000];
    let mut fees = Vec::new();
    for (t, a) in tokens.iter().zip(amounts) {
        let r = s.bet(t, a).await;
        assert_eq!(r.status, 201, "{}", r.text());
        let b = r.json();
        assert_eq!(b["round_id"], id);
        fees.push(b["fee_sats"].as_i64().expect("a fee"));
        let txid = b["txid"].as_str().expect("a txid");
        let entry = chain.try_call("getmempoolentry", json!([txid]));
        assert!(entry.is_ok(), "bet {txid} in the mempool: {entry:?}");
        assert_eq!(
            s.me(t).await["pending_balance_sats"].as_i64(),
            Some(DEPOSIT_SAT - a - fees.last().copied().unwrap_or_default())
        );
    }

    // The draw: the block after the close, recomputed from the chain's own block hash.
    round_in(s, id, "drawing").await;
    chain.mine(1);
    let r = round_in(s, id, "closed").await;
    let h = r["draw"]["block_height"].as_u64().expect("a draw height");
    let hash = chain.call("getblockhash", json!([h]));
    let winner = support::draw_winner(&r, hash.as_str().expect("a block hash"));
    let wi = names
        .iter()
        .position(|n| *n == winner)
        .expect("a bettor won");

    let (won, miner_fee) = payout_to_the_satoshi(s, &chain, &r, &amounts, &tokens, wi).await;
    chain.mine(1);
    wait_for("payout confirmed", Duration::from_secs(60), || async {
        let r = s.get(&format!("/rounds/{id}"), &[]).await.json();
        (r["payout"]["status"] == "confirmed").then_some(())
    })
    .await;
    for (i, t) in tokens.iter().enumerate() {
        let expected = DEPOSIT_SAT - amounts[i] - fees[i] + if i == wi { won } else { 0 };
        let me = wait_for("settled", Duration::from_secs(30), || async {
            let me = s.me(t).await;
            (me["has_pending"] == false).then_some(me)
        })
        .await;
        assert_eq!(me["balance_sats"], expected, "{}", names[i]);
    }

    let w = withdrawal_found_in_the_utxo_set(s, &chain, &tokens[wi]).await;
    let users: Vec<&str> = tokens.iter().map(String::as_str).collect();
    assert_ledger_in_utxo_set(s, &chain, &users).await;

    // kill -9 and a restart: the service finds the same ledger on the chain.
    let before: Vec<Value> = {
        let mut v = Vec::new();
        for t in &tokens {
            v.push(s.me(t).await["balance_sats"].clone());
        }
        v
    };
    server.stop().await;
    server = start_serve(&env, &chain).await;
    chain.mine(1);
    assert_ledger_in_utxo_set(&server, &chain, &users).await;
    for (t, b) in tokens.iter().zip(&before) {
        assert_eq!(&server.me(t).await["balance_sats"], b);
    }
    eprintln!(
        "serve money path on {}: {:.1} s; bet fees {fees:?} sat, payout fee {miner_fee} sat, withdrawal fee {} sat",
        chain.describe(),
        started.elapsed().as_secs_f64(),
        w["fee_sats"]
    );
    server.stop().await;
}

/// Deposits: the test's coins to each user's address, credited at one confirmation.
async fn deposits_credited(s: &Server, chain: &LaneChain, tokens: &[String]) {
    let mut deposits = Vec::new();
    for t in tokens {
        let address = s.me(t).await["address"]
            .as_str()
            .expect("a deposit address")
            .to_owned();
        deposits.push(chain.send(&address, DEPOSIT_SAT as u64));
    }
    chain.mine(1);
    for (t, txid) in tokens.iter().zip(&deposits) {
        let d = transfer_in(s, t, "deposit", "credited").await;
        assert_eq!(d["txid"], txid.to_string());
        assert_eq!(d["amount_sats"], DEPOSIT_SAT);
        assert_eq!(s.me(t).await["balance_sats"], DEPOSIT_SAT);
    }
}

/// The payout, to the satoshi: commission to the fee address, the rest less the miner fee to the winner (`tokens[wi]`); what the winner won and the miner fee.
async fn payout_to_the_satoshi(
    s: &Server,
    chain: &LaneChain,
    r: &Value,
    amounts: &[i64],
    tokens: &[String],
    wi: usize,
) -> (i64, i64) {
    let payout = &r["payout"];
    let payout_txid = payout["txid"].as_str().expect("a payout txid");
    let tx = chain.tx(payout_txid);
    let pot = amounts.iter().sum::<i64>();
    let commission = pot * 30 / 100;
    let out_sum: i64 = tx["vout"]
        .as_array()
        .expect("outputs")
        .iter()
        .map(|o| btc_to_sat(&o["value"]) as i64)
        .sum();
    let miner_fee = pot - out_sum;
    assert!(miner_fee > 0, "{tx}");
    assert_eq!(payout["fee_sats"], miner_fee);
    assert_eq!(payout["commission_sats"], commission);
    let won = pot - commission - miner_fee;
    assert_eq!(payout["winner_sats"], won);
    let winner_address = s.me(&tokens[wi]).await["address"].clone();
    let fee_address = s.admin_get("/admin/config").await.json()["fee_address"].clone();
    let paid_to = |address: &Value| -> Vec<i64> {
        tx["vout"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|o| o["scriptPubKey"]["address"] == *address)
            .map(|o| btc_to_sat(&o["value"]) as i64)
            .collect()
    };
    assert_eq!(paid_to(&winner_address), [won], "{tx}");
    assert_eq!(paid_to(&fee_address), [commission], "{tx}");
    (won, miner_fee)
}

/// A withdrawal by `t` to an address the test holds, confirmed, and found in the UTXO set; the service's answer.
async fn withdrawal_found_in_the_utxo_set(s: &Server, chain: &LaneChain, t: &str) -> Value {
    // A withdrawal to an address the test holds, confirmed, and found in the UTXO set.
    let to = chain
        .funder
        .derive_address(0, 7)
        .expect("a withdrawal address")
        .to_string();
    let w = s.withdraw(t, &to, 100_000).await;
    assert_eq!(w.status, 201, "{}", w.text());
    let w = w.json();
    let w_txid = w["txid"].as_str().expect("a withdrawal txid").to_owned();
    chain.mine(1);
    let row = transfer_in(s, t, "withdrawal", "confirmed").await;
    assert_eq!(row["txid"], w_txid.as_str());
    let w_tx = chain.tx(&w_txid);
    let vout = w_tx["vout"]
        .as_array()
        .expect("outputs")
        .iter()
        .find(|o| o["scriptPubKey"]["address"] == to.as_str())
        .and_then(|o| o["n"].as_u64())
        .expect("the withdrawal pays the address");
    assert_eq!(chain.utxo_sat(&w_txid, vout), Some(100_000));
    w
}

// ---- node: open, pay, restart, close cooperatively and unilaterally ----

const FUNDING_SAT: u64 = 1_000_000;
const CAPACITY_SAT: u64 = 500_000;
/// `ChannelConfig::default().commitment_fee_sat` (both nodes offer it; the smaller is used).
const COMMIT_FEE_SAT: u64 = 10_000;

fn start_node(chain: &LaneChain) -> NodeProc {
    NodeProc::start_on(&chain.url, &chain.cookie, false, &[])
}

fn msat(ch: &Value, field: &str) -> u64 {
    ch[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {ch}"))
}

/// Funds A by a payment from the test's coins, opens a channel to B and waits until it is
/// live on both. Returns A's wallet total after the anchor confirmed (its change).
fn open_channel(chain: &LaneChain, a: &NodeProc, b: &NodeProc) -> u64 {
    let addr = a.cli(&["newaddr"])["address"]
        .as_str()
        .expect("an address")
        .to_owned();
    chain.send(&addr, FUNDING_SAT);
    chain.mine(1);
    wait_for_blocking("A's funds", Duration::from_secs(60), || {
        (a.funds() == FUNDING_SAT).then_some(())
    });
    let connected = a.cli(&["connect", &b.listen]);
    assert_eq!(connected["node_id"], b.id.as_str());
    let opened = a.cli(&["open", &b.id, &CAPACITY_SAT.to_string()]);
    assert_eq!(opened["state"], "open_wait_complete", "{opened}");
    let anchor = opened["anchor_txid"]
        .as_str()
        .expect("an anchor")
        .to_owned();
    let entry = chain.try_call("getmempoolentry", json!([anchor]));
    assert!(entry.is_ok(), "the anchor in the mempool: {entry:?}");
    chain.mine(1);
    wait_for_blocking("channel live on both", Duration::from_secs(60), || {
        (a.channel_state() == "normal" && b.channel_state() == "normal").then_some(())
    });
    let outs: Vec<u64> = chain.tx(&anchor)["vout"]
        .as_array()
        .expect("outputs")
        .iter()
        .map(|o| btc_to_sat(&o["value"]))
        .collect();
    assert!(outs.contains(&CAPACITY_SAT), "{outs:?}");
    let change = FUNDING_SAT - CAPACITY_SAT - chain.fee(&anchor);
    wait_for_blocking("A's change", Duration::from_secs(60), || {
        (a.funds() == change).then_some(())
    });
    change
}

/// Both nodes agree that A owns `a_total_sat` and B the rest, the commitment fee split as
/// the rules say (B, the non-funder, pays half rounded up if it can).
fn assert_split(a: &NodeProc, b: &NodeProc, a_total_sat: u64) {
    let b_total_sat = CAPACITY_SAT - a_total_sat;
    let b_fee = (COMMIT_FEE_SAT - COMMIT_FEE_SAT / 2).min(b_total_sat);
    let a_fee = COMMIT_FEE_SAT - b_fee;
    let ca = a.channel();
    let cb = b.channel();
    assert_eq!(msat(&ca, "our_msat"), (a_total_sat - a_fee) * 1000, "{ca}");
    assert_eq!(
        msat(&ca, "their_msat"),
        (b_total_sat - b_fee) * 1000,
        "{ca}"
    );
    assert_eq!(msat(&cb, "our_msat"), msat(&ca, "their_msat"), "{cb}");
    assert_eq!(msat(&cb, "their_msat"), msat(&ca, "our_msat"), "{cb}");
}

/// Fees of the transactions after the anchor that paid the nodes' wallets (commitment,
/// sweeps), found on the chain without the index.
fn channel_fees(chain: &LaneChain, nodes: &[&NodeProc], anchor: &str) -> u64 {
    let mut txids = std::collections::BTreeSet::new();
    for n in nodes {
        for o in n.cli(&["listfunds"])["outputs"]
            .as_array()
            .expect("outputs")
        {
            let txid = o["txid"].as_str().expect("a txid").to_owned();
            if txid == anchor {
                continue;
            }
            // A sweep's parent is the commitment; the commitment's parent is the anchor.
            for i in chain.tx(&txid)["vin"].as_array().expect("inputs") {
                let parent = i["txid"].as_str().expect("a parent");
                if parent != anchor {
                    txids.insert(parent.to_owned());
                }
            }
            txids.insert(txid);
        }
    }
    txids.iter().map(|t| chain.fee(t)).sum()
}

/// Open, pay both ways, restart the acceptor, close cooperatively: both wallets get their
/// balance less their share of the close fee, and B's output is in the UTXO set.
#[test]
fn node_channel_opens_pays_restarts_and_closes_cooperatively() {
    let started = Instant::now();
    let chain = LaneChain::start();
    let a = start_node(&chain);
    let mut b = start_node(&chain);
    let a_change = open_channel(&chain, &a, &b);
    let mut a_total = CAPACITY_SAT;
    assert_split(&a, &b, a_total);

    a.cli(&["pay", &b.id, "100000000"]);
    a_total -= 100_000;
    assert_split(&a, &b, a_total);

    // kill -9 of B; after its restart the channel goes on.
    b.kill9();
    b.restart();
    let paid = wait_for_blocking(
        "a payment after B's restart",
        Duration::from_secs(60),
        || a.try_cli(&["pay", &b.id, "20000000"]).ok(),
    );
    assert_eq!(paid["state"], "normal");
    a_total -= 20_000;
    b.cli(&["pay", &a.id, "7000000"]);
    a_total += 7_000;
    assert_split(&a, &b, a_total);

    let b_total = CAPACITY_SAT - a_total;
    let closed = a.cli(&["close", &b.id]);
    assert_eq!(closed["state"], "closed", "{closed}");
    chain.mine(1);
    // The close pays B's output; its fee is split as the commitment fee is.
    let out = wait_for_blocking("B's close output", Duration::from_secs(60), || {
        let f = b.cli(&["listfunds"]);
        f["outputs"].as_array()?.first().cloned()
    });
    let close_txid = out["txid"].as_str().expect("the close txid").to_owned();
    let close_fee = chain.fee(&close_txid);
    assert!(close_fee > 0 && close_fee < 2_000, "close fee {close_fee}");
    let b_fee = (close_fee - close_fee / 2).min(b_total);
    let a_fee = close_fee - b_fee;
    let b_expect = b_total - b_fee;
    let a_expect = a_change + a_total - a_fee;
    wait_for_blocking(
        "close outputs in both wallets",
        Duration::from_secs(60),
        || (a.funds() == a_expect && b.funds() == b_expect).then_some(()),
    );
    assert_eq!(b.channel_state(), "closed");
    assert_eq!(
        chain.utxo_sat(&close_txid, out["vout"].as_u64().expect("a vout")),
        Some(b_expect)
    );
    eprintln!(
        "node cooperative lifecycle on {}: {:.1} s; close fee {close_fee} sat",
        chain.describe(),
        started.elapsed().as_secs_f64()
    );
}

/// B closes alone; A is paid at once, B after its delay, across a kill -9 of B while its
/// claim waits: every satoshi of the channel is in a wallet or paid to miners.
#[test]
fn node_channel_closes_unilaterally_and_claims_after_restart() {
    let started = Instant::now();
    let chain = LaneChain::start();
    let a = start_node(&chain);
    let mut b = start_node(&chain);
    let a_change = open_channel(&chain, &a, &b);
    a.cli(&["pay", &b.id, "150000000"]);
    assert_split(&a, &b, CAPACITY_SAT - 150_000);
    let cb = b.channel();
    let b_msat = msat(&cb, "our_msat");
    let a_msat = msat(&cb, "their_msat");
    let anchor = cb["anchor_txid"].as_str().expect("an anchor").to_owned();

    let closed = b.cli(&["close", &a.id, "force"]);
    assert_eq!(closed["state"], "on_chain", "{closed}");
    chain.mine(1);
    wait_for_blocking("A sees the commitment", Duration::from_secs(60), || {
        (a.channel_state() == "on_chain").then_some(())
    });
    b.kill9();
    b.restart();

    let fees = wait_for_blocking("every claim confirmed", Duration::from_secs(120), || {
        chain.mine(1);
        let fees = channel_fees(&chain, &[&a, &b], &anchor);
        (a.funds() + b.funds() + fees == a_change + CAPACITY_SAT).then_some(fees)
    });
    let sweep_fees = fees - COMMIT_FEE_SAT;
    assert!(sweep_fees < 3_000, "sweep fees {sweep_fees}");
    let b_got = b.funds();
    let a_got = a.funds() - a_change;
    assert_eq!(a_got + b_got + sweep_fees, a_msat / 1000 + b_msat / 1000);
    assert!(
        b_got < b_msat / 1000 && b_got + 2_000 > b_msat / 1000,
        "B got {b_got} of {b_msat} msat"
    );
    assert!(
        a_got <= a_msat / 1000 && a_got + 2_000 > a_msat / 1000,
        "A got {a_got} of {a_msat} msat"
    );
    eprintln!(
        "node unilateral close on {}: {:.1} s; sweep fees {sweep_fees} sat",
        chain.describe(),
        started.elapsed().as_secs_f64()
    );
}
