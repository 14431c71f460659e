//! The chaos tests' traffic and end checks: clients that bet and withdraw
//! at random while the service is killed under them, blocks that keep
//! coming, and the checks that no round was paid twice once all is quiet.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use chain::BitcoindRpc;
use serde_json::{json, Value};
use tokio::task::JoinSet;

use super::rig::{regtest_address, MINER};
use super::{wait_for, Env};

/// How long a chaos test runs: `POTLUCK_CHAOS_SECS` seconds (scripts/chaos.sh
/// runs minutes), 20 by default.
pub fn run_time() -> Duration {
    let secs: u64 = std::env::var("POTLUCK_CHAOS_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    Duration::from_secs(secs)
}

/// One client for each token in `tokens`, each sending up to 40 bets and
/// withdrawals (one in four, to [`MINER`]) of random amounts to `addr`;
/// a client stops at the first request that fails (the service killed).
pub fn spawn_clients(addr: SocketAddr, tokens: &[String]) -> JoinSet<()> {
    let mut clients = JoinSet::new();
    for t in tokens {
        let t = t.clone();
        clients.spawn(async move {
            for _ in 0..40 {
                let amount = 2_000 + rand::random::<i64>().rem_euclid(8_000);
                let (path, body) = if rand::random::<u8>() % 4 == 0 {
                    (
                        "/users/me/withdrawals",
                        json!({"address": MINER, "amount_sats": amount}),
                    )
                } else {
                    ("/rounds/current/bets", json!({"amount_sats": amount}))
                };
                if try_request(addr, "POST", path, &t, body).await.is_none() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
    }
    clients
}

/// One client request that tolerates a dead server (the chaos test kills it
/// under the clients): the status, or `None` when the connection failed.
async fn try_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    body: Value,
) -> Option<u16> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let body = body.to_string();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(req.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.ok()?;
        let head = std::str::from_utf8(raw.get(..12)?).ok()?;
        head.split(' ').nth(1)?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .ok()
        .flatten()
}

/// Mines a block every 300 ms for a random 0.5 to 3 s, so that rounds draw
/// and payments confirm under the traffic; a failed block (the chain
/// killed) is skipped.
pub async fn mine_for_a_while(rpc: &BitcoindRpc) {
    let run = Duration::from_millis(500 + u64::from(rand::random::<u16>() % 2_500));
    let until = Instant::now() + run;
    while Instant::now() < until {
        // The chain may be down for a moment: the next block comes anyway.
        rpc.generate_to_address(1, &regtest_address(MINER))
            .await
            .ok();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Mines until no round is left between open and closed (exactly one
/// open, never more).
pub async fn wait_until_quiet(env: &Env, rpc: &BitcoindRpc) {
    wait_for("condition", Duration::from_secs(120), || async {
        rpc.generate_to_address(1, &regtest_address(MINER))
            .await
            .unwrap();
        let pool = env.pool().await;
        // One snapshot: the open round may close between two separate
        // queries, so "none busy" and "exactly one open" are read together.
        // Bets placed in the open round are still in their owners' outputs
        // but no longer in their balances: the books compare balances with
        // outputs only once that round has closed and paid (a check that ran
        // while the last client's bets sat in the open round failed by their
        // sum, 40,653 sat, twice this session).
        let (busy, open, open_bets): (i64, i64, i64) = sqlx::query_as(
            "SELECT \
               (SELECT COUNT(*) FROM rounds WHERE status NOT IN ('open', 'closed', 'payout_failed')), \
               (SELECT COUNT(*) FROM rounds WHERE status = 'open'), \
               (SELECT COUNT(*) FROM bets WHERE status = 'placed' \
                  AND round_id IN (SELECT id FROM rounds WHERE status = 'open'))",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        pool.close().await;
        assert!(open <= 1, "{open} rounds open at once");
        tokio::time::sleep(Duration::from_millis(300)).await;
        (busy == 0 && open == 1 && open_bets == 0).then_some(())
    })
    .await;
}

/// No round has two payouts in `pool`'s books.
pub async fn assert_no_round_paid_twice(pool: &sqlx::AnyPool) {
    let twice: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM (SELECT round_id FROM transfers WHERE kind = 'payout' \
         GROUP BY round_id HAVING COUNT(*) > 1) t",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(twice, 0, "a round was paid twice");
}
