//! Black-box attacks of issue 32 with a slow or lagging chain: the service (in this process) reaches `potluck chain` through a JSON-RPC proxy that delays chosen calls or plays a node that is catching up.

use crate::support;

use support::wait_for;

use std::str::FromStr as _;
use std::time::{Duration, Instant};

use bitcoin::{Address, Network};
use serde_json::{json, Value};
use support::rpc_proxy::{ChainProcess, RpcProxy};
use support::{bearer, Db, Env, InProcess};

const MINER: &str = "bcrt1qs758ursh4q9z627kt3pp5yysm78ddny6txaqgw";

fn miner() -> Address {
    Address::from_str(MINER)
        .unwrap()
        .require_network(Network::Regtest)
        .unwrap()
}

/// A service on `potluck chain` behind a proxy.
struct Rig {
    chain: ChainProcess,
    proxy: RpcProxy,
    /// The service, in this process.
    app: InProcess,
    /// Dropped last (fields drop in order), after the processes on it.
    _env: Env,
}

impl Rig {
    async fn start(db: Db, configure: impl FnOnce(&mut potluck_rounds::Config)) -> Self {
        let env = Env::new(db).await;
        let chain = ChainProcess::start(env.data_dir.join("chain-process")).await;
        let proxy = RpcProxy::start(chain.addr).await;
        let (url, cookie) = (proxy.url(), chain.cookie());
        let app = support::spawn_app_with(&env, |c| {
            c.chain = potluck_rounds::ChainSource::Bitcoind {
                url,
                auth: chain::Auth::Cookie(cookie.into()),
            };
            configure(c);
        })
        .await;
        Self {
            chain,
            proxy,
            app,
            _env: env,
        }
    }

    async fn mine(&self, n: u32) {
        self.chain
            .rpc()
            .generate_to_address(n, &miner())
            .await
            .unwrap();
    }

    /// A user with `sats` credited.
    async fn funded_user(&self, name: &str, ip: &str, sats: u64) -> String {
        let t = self.app.user(name, ip).await;
        let me = self.app.me(&t).await;
        let _: Value = self
            .chain
            .rpc()
            .call(
                "sendtoaddress",
                json!([me["address"], sats as f64 / 100_000_000.0]),
            )
            .await
            .unwrap();
        self.mine(1).await;
        wait_for("deposit credited", Duration::from_secs(30), || async {
            (self.app.me(&t).await["balance_sats"] == sats).then_some(())
        })
        .await;
        t
    }

    async fn finish(self) {
        self.app.stop().await;
    }
}

/// Finding 1: a withdrawal whose `sendrawtransaction` is slower than the
/// request time-out was answered `408` with an empty body and then
/// broadcast by the worker; a client retrying after the 408 paid twice.
/// Now the saved payment is answered (202, pending), a retry with the same
/// `Idempotency-Key` gets the same payment, and the same key with another
/// body is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_slower_than_the_time_out_is_answered_with_the_payment_and_paid_once() {
    let rig = Rig::start(Db::Sqlite, |c| c.request_timeout = Duration::from_secs(3)).await;
    let s = &rig.app;
    let t = rig.funded_user("slowpay", "10.0.90.1", 1_000_000).await;
    let bettor = rig.funded_user("slowbet", "10.0.90.2", 1_000_000).await;
    rig.proxy
        .delay("sendrawtransaction", Duration::from_secs(6));
    let auth = bearer(&t);
    let body = json!({"address": MINER, "amount_sats": 50_000});
    let keyed = [("authorization", auth.as_str()), ("idempotency-key", "w-1")];
    let started = Instant::now();
    let r = s.post("/users/me/withdrawals", &keyed, body.clone()).await;
    assert!(
        r.status == 201 || r.status == 202,
        "a saved withdrawal is answered with the payment, not {} {:?} after {:?}",
        r.status,
        r.text(),
        started.elapsed()
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let first = r.json();
    assert_eq!(first["status"], "pending", "{first}");
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "answered before the broadcast ended"
    );

    // The client retries, as HTTP allows after a time-out: the same payment.
    let again = s.post("/users/me/withdrawals", &keyed, body.clone()).await;
    assert!(
        again.status == 201 || again.status == 202,
        "{}",
        again.text()
    );
    assert_eq!(again.json()["id"], first["id"], "{}", again.text());
    assert_eq!(again.json()["txid"], first["txid"], "{}", again.text());
    // The same key with another body is refused, and pays nothing.
    let other = s
        .post(
            "/users/me/withdrawals",
            &keyed,
            json!({"address": MINER, "amount_sats": 60_000}),
        )
        .await;
    assert_eq!(other.status, 422, "{}", other.text());
    assert_eq!(other.code(), "idempotency_key_reused");

    // A bet waits on the same slow broadcast: answered with the bet, pending.
    let bettor_auth = bearer(&bettor);
    let bet = s
        .post(
            "/rounds/current/bets",
            &[
                ("authorization", bettor_auth.as_str()),
                ("idempotency-key", "b-1"),
            ],
            json!({"amount_sats": 20_000}),
        )
        .await;
    assert_eq!(bet.status, 202, "{}", bet.text());
    assert_eq!(bet.json()["status"], "pending", "{}", bet.text());
    assert!(bet.json()["bet_id"].as_i64().is_some(), "{}", bet.text());

    rig.proxy.delay("sendrawtransaction", Duration::ZERO);
    for user in [&t, &bettor] {
        wait_for("broadcast", Duration::from_secs(30), || async {
            let tx = s.transactions(user).await;
            let list = tx["transactions"].as_array().unwrap().clone();
            list.iter().all(|t| t["status"] != "pending").then_some(())
        })
        .await;
    }
    rig.mine(1).await;
    wait_for("confirmed", Duration::from_secs(30), || async {
        let tx = s.transactions(&t).await;
        let list = tx["transactions"].as_array().unwrap().clone();
        let withdrawals: Vec<&Value> = list.iter().filter(|t| t["kind"] == "withdrawal").collect();
        assert_eq!(withdrawals.len(), 1, "one withdrawal: {tx}");
        (withdrawals[0]["status"] == "confirmed").then_some(())
    })
    .await;
    let tx = s.transactions(&bettor).await;
    let bets = tx["transactions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["kind"] == "bet")
        .count();
    assert_eq!(bets, 1, "one bet: {tx}");
    rig.finish().await;
}

/// Finding 1: a time-out answered an empty `408`; every error has the
/// structured body, time-outs included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_out_has_the_structured_error_body() {
    let rig = Rig::start(Db::Sqlite, |c| c.request_timeout = Duration::from_secs(1)).await;
    rig.proxy.delay("getblockchaininfo", Duration::from_secs(3));
    let r = rig.app.get("/healthz", &[]).await;
    assert_eq!(r.status, 408, "{}", r.text());
    assert_eq!(
        r.header("content-type"),
        Some("application/json"),
        "{:?}",
        r.headers
    );
    assert_eq!(r.code(), "request_timeout", "{}", r.text());
    assert_eq!(
        r.json()["detail"]["params"]["timeout_seconds"],
        1,
        "{}",
        r.text()
    );
    rig.proxy.delay("getblockchaininfo", Duration::ZERO);
    rig.finish().await;
}

/// Finding 3: the close took SQLite's write lock and then waited for the
/// node's tip, so every write of the service (registrations, the admin's
/// config) waited behind a slow node and failed with `database is locked`
/// after 10 s. Now the tip is read before the close's transaction begins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_chain_at_the_close_holds_up_no_write() {
    let rig = Rig::start(Db::Sqlite, |c| c.default_round_duration_seconds = 1).await;
    let s = &rig.app;
    rig.proxy.delay("getblockchaininfo", Duration::from_secs(8));
    let started = Instant::now();
    let mut i = 0;
    while started.elapsed() < Duration::from_secs(24) {
        let t0 = Instant::now();
        let r = s
            .register(&format!("late{i}"), "password123", &format!("10.0.91.{i}"))
            .await;
        assert_eq!(
            r.status,
            201,
            "registration {i} after {:?}: {}",
            t0.elapsed(),
            r.text()
        );
        let c = s
            .admin_put("/admin/config", json!({"fee_rate_sat_vb": 2 + i % 2}))
            .await;
        assert_eq!(
            c.status,
            200,
            "config {i} after {:?}: {}",
            t0.elapsed(),
            c.text()
        );
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "writes {i} waited {:?} behind the chain",
            t0.elapsed()
        );
        i += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    rig.proxy.delay("getblockchaininfo", Duration::ZERO);
    rig.finish().await;
}

/// Finding 2: the tip came from `getblockchaininfo.blocks` alone, so a node
/// that was catching up (more headers than blocks, or in initial block
/// download) let a round close on a tip below blocks that already existed:
/// the draw block could be public before the close. Now no round closes
/// (and nothing is drawn) while the node is behind, and `/healthz` says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_is_catching_up_closes_no_round() {
    let rig = Rig::start(Db::Sqlite, |c| c.default_round_duration_seconds = 2).await;
    let s = &rig.app;
    rig.proxy.lag(1, false);
    let first = s.get("/rounds/current", &[]).await.json()["id"].clone();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let round = s.get(&format!("/rounds/{first}"), &[]).await.json();
    assert_eq!(
        round["status"], "open",
        "closed while the node was behind: {round}"
    );
    let h = s.get("/healthz", &[]).await;
    assert_eq!(h.status, 503, "{}", h.text());
    assert!(
        h.json()["chain"].as_str().unwrap().contains("headers"),
        "{}",
        h.text()
    );
    rig.proxy.lag(0, true);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let round = s.get(&format!("/rounds/{first}"), &[]).await.json();
    assert_eq!(
        round["status"], "open",
        "closed during initial block download: {round}"
    );
    let h = s.get("/healthz", &[]).await;
    assert!(
        h.json()["chain"]
            .as_str()
            .unwrap()
            .contains("initial block download"),
        "{}",
        h.text()
    );
    // Caught up: the overdue round moves on.
    rig.proxy.lag(0, false);
    wait_for(
        "the round closes once caught up",
        Duration::from_secs(20),
        || async {
            let round = s.get(&format!("/rounds/{first}"), &[]).await.json();
            (round["status"] == "closed").then_some(())
        },
    )
    .await;
    assert_eq!(s.get("/healthz", &[]).await.status, 200);
    rig.finish().await;
}
