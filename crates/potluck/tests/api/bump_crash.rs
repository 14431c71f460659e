//! Black-box: `potluck serve` killed (SIGKILL) between writing a fee bump's intent and broadcasting it; the restarted service sends the written replacement, and the ledger follows the version that confirms, once.

// The crash point is compiled in only with `--features potluck/test-hooks`.
#![cfg(feature = "test-hooks")]

use crate::support;

use support::wait_for;

use std::time::Duration;

use chain::{Auth, BitcoindRpc, RpcConfig};
use serde_json::json;
use sqlx::Row as _;
use support::{Db, Env, Server};

async fn serve(env: &Env, rpc_bind: &str, envs: &[(&str, &str)]) -> Server {
    env.start_dev_chain(rpc_bind, &["--bump-after-blocks", "2"], envs)
        .await
}

async fn rpc(env: &Env, rpc_bind: &str) -> BitcoindRpc {
    let cookie = env.data_dir.join("chain").join(".cookie");
    let mut cfg = RpcConfig::new(format!("http://{rpc_bind}/"), Auth::Cookie(cookie));
    cfg.retries = 0;
    BitcoindRpc::new(cfg).unwrap()
}

/// `(id, status, fee_sats, bump_of, block_height)` of every withdrawal version, oldest first.
async fn versions(env: &Env) -> Vec<(i64, String, i64, Option<i64>, Option<i64>)> {
    let pool = env.pool().await;
    let rows = sqlx::query(
        "SELECT id, status, fee_sats, bump_of, block_height FROM transfers \
         WHERE kind = 'withdrawal' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    rows.iter()
        .map(|r| {
            (
                r.get::<i64, _>("id"),
                r.get::<String, _>("status"),
                r.get::<i64, _>("fee_sats"),
                r.get::<Option<i64>, _>("bump_of"),
                r.get::<Option<i64>, _>("block_height"),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bump_killed_between_its_intent_and_its_broadcast_is_finished_after_restart() {
    let env = Env::new(Db::Sqlite).await;
    let mut server = serve(
        &env,
        "127.0.0.1:0",
        &[("POTLUCK_TEST_CRASH_AT", "bump_signed")],
    )
    .await;
    let rpc_bind = server.rpc_addr.expect("chain RPC address").to_string();
    let token = server.user("kim", "10.0.31.1").await;
    server.deposit(&token, 200_000).await;
    let c = rpc(&env, &rpc_bind).await;
    let _: serde_json::Value = c.call("setminingfeerate", json!([20])).await.unwrap();
    let to = wallet::Wallet::from_seed(&[31u8; 32], bitcoin::Network::Regtest)
        .unwrap()
        .derive_address(0, 0)
        .unwrap();
    let r = server.withdraw(&token, &to.to_string(), 50_000).await;
    assert_eq!(r.status, 201, "{}", r.text());
    // Left behind by the market for two blocks: the bumper writes the
    // replacement and the process dies before sending it.
    wait_for(
        "the bumper saw the withdrawal waiting",
        Duration::from_secs(60),
        || async {
            let pool = env.pool().await;
            let stamped: Option<i64> =
                sqlx::query_scalar("SELECT sent_height FROM transfers WHERE kind = 'withdrawal'")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            pool.close().await;
            stamped.map(|_| ())
        },
    )
    .await;
    c.generate_to_address(1, &to).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.generate_to_address(1, &to).await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(60), server.child.wait())
        .await
        .expect("the crash hook fired")
        .unwrap();
    assert!(!status.success());
    let v = versions(&env).await;
    assert_eq!(v.len(), 2, "{v:?}");
    assert_eq!((v[0].1.as_str(), v[1].1.as_str()), ("superseded", "signed"));
    assert_eq!(v[1].3, Some(v[0].0));
    let (old_fee, new_fee) = (v[0].2, v[1].2);
    assert!(new_fee > old_fee);

    // Back up (the chain's fee market is off after its restart: any block
    // takes what the mempool holds): the written replacement goes out and
    // replaces the old version, which the chain's saved mempool kept.
    let server = serve(&env, &rpc_bind, &[]).await;
    wait_for(
        "the replacement was broadcast",
        Duration::from_secs(60),
        || async {
            let v = versions(&env).await;
            (v.len() == 2 && v[1].1 == "broadcast").then_some(())
        },
    )
    .await;
    let c = rpc(&env, &rpc_bind).await;
    c.generate_to_address(1, &to).await.unwrap();
    wait_for(
        "the replacement confirmed",
        Duration::from_secs(60),
        || async { versions(&env).await[1].4.map(|_| ()) },
    )
    .await;
    let me = server.me(&token).await;
    assert_eq!(
        me["balance_sats"].as_i64(),
        Some(200_000 - 50_000 - new_fee),
        "{me}"
    );
    let l = server.balanced_ledger().await;
    assert_eq!(l["withdrawn_sats"].as_i64(), Some(50_000), "{l}");
    let v = versions(&env).await;
    assert_eq!(
        (v[0].1.as_str(), v[1].1.as_str()),
        ("superseded", "broadcast"),
        "{v:?}"
    );
    server.stop().await;
}
