//! Black-box: the double credit of a re-broadcast withdrawal. Bitcoin Core
//! answers -25 `bad-txns-inputs-missingorspent` (not -27) to a transaction
//! that was mined and whose outputs are all spent; a service that undoes a
//! transfer on any refusal but -27 credits the withdrawal back and pays it
//! twice. Here a withdrawal is broadcast, the service is killed before it
//! records that, the withdrawal is mined deep behind 500 blocks (beyond one
//! sync pass) and fully spent, and the service restarts and re-broadcasts it.

// The test kills the service at a crash point, compiled in only with
// `--features potluck/test-hooks` (as `scripts/test.sh` builds).
#![cfg(feature = "test-hooks")]

use crate::support;

use support::wait_for;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bitcoin::{Amount, FeeRate, Network, OutPoint, Transaction, Txid};
use chain::{Auth, BitcoindRpc, ChainError, RpcConfig};
use serde_json::json;
use support::{Db, Env, Server};
use wallet::{KeyPath, SpendableOutput, Wallet};

async fn serve(env: &Env, rpc_bind: &str, envs: &[(&str, &str)]) -> Server {
    env.start_dev_chain(rpc_bind, &[], envs).await
}

/// `potluck chain` on the service's own chain directory, while the service is down.
fn chain_process(env: &Env, rpc_bind: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_potluck"))
        .args([
            "chain",
            "--rpc-bind",
            rpc_bind,
            "--block-interval",
            "0",
            "--data-dir",
        ])
        .arg(env.data_dir.join("chain"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

async fn rpc_up(env: &Env, rpc_bind: &str) -> BitcoindRpc {
    let cookie = env.data_dir.join("chain").join(".cookie");
    let mut cfg = RpcConfig::new(format!("http://{rpc_bind}/"), Auth::Cookie(cookie.clone()));
    cfg.timeout = Duration::from_secs(60);
    support::channels::rpc_when_up(cfg, Some(&cookie)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebroadcast_of_a_confirmed_fully_spent_withdrawal_credits_nothing_back() {
    let env = Env::new(Db::Sqlite).await;
    // The first start takes any port and reports it; every later process
    // (serve again, the standalone chain) reuses that address for the same chain.
    let server = serve(&env, "127.0.0.1:0", &[]).await;
    let rpc_bind = server
        .rpc_addr
        .expect("serve reports its chain RPC address")
        .to_string();
    let token = server.user("vera", "10.0.14.1").await;
    server.deposit(&token, 100_000).await;
    assert_eq!(server.me(&token).await["balance_sats"], 100_000);
    server.stop().await;

    // Withdraw everything (the leftover is below what change would cost, so
    // the withdrawal has one output), and die right after the broadcast.
    let ours = Wallet::from_seed(&[14u8; 32], Network::Regtest).unwrap();
    let to = ours.derive(KeyPath::receive(0)).unwrap();
    let mut server = serve(
        &env,
        &rpc_bind,
        &[("POTLUCK_TEST_CRASH_AT", "withdrawal_broadcast")],
    )
    .await;
    let header = format!("Bearer {token}");
    let addr = server.addr;
    let body = json!({"address": to.address.to_string(), "amount_sats": 99_700});
    // The process dies under the request: the client task panics, expectedly.
    let _ = tokio::spawn(async move {
        support::request(
            addr,
            "POST",
            "/users/me/withdrawals",
            &[("authorization", header.as_str())],
            Some(body.to_string().into_bytes()),
        )
        .await
    })
    .await;
    let status = tokio::time::timeout(Duration::from_secs(60), server.child.wait())
        .await
        .expect("the crash hook fired")
        .unwrap();
    assert!(!status.success());

    let (txid, height) =
        mine_and_spend_it_behind_the_service(&env, &rpc_bind, &ours, &to.address).await;

    // The service comes back (after its recovery delay for signed
    // transfers has passed) and finishes its signed withdrawal.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let server = serve(&env, &rpc_bind, &[]).await;
    wait_for("condition", Duration::from_secs(120), || async {
        let l = server.admin_get("/admin/ledger").await.json();
        (l["synced_height"].as_u64() == Some(u64::from(height))).then_some(())
    })
    .await;
    // Let the engine run a few more passes over its signed transfers.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let txs = server.transactions(&token).await;
    let w = txs["transactions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["kind"] == "withdrawal")
        .unwrap()
        .clone();
    assert_eq!(w["txid"], txid.to_string());
    assert!(
        server.log().contains("finishing a signed transfer"),
        "the service did not re-broadcast: {}",
        server.log()
    );
    assert_ne!(
        w["status"], "failed",
        "the mined withdrawal was undone: {w}"
    );
    let after = server.me(&token).await;
    assert_eq!(
        (
            after["balance_sats"].as_i64(),
            after["pending_balance_sats"].as_i64()
        ),
        (Some(0), Some(0)),
        "the withdrawal was credited back: {after}"
    );
    let l = server.admin_get("/admin/ledger").await.json();
    assert_eq!(l["withdrawn_sats"], 99_700, "{l}");
    assert_eq!(
        Amount::from_sat(100_000 - 99_700).to_sat(),
        l["miner_fees_sats"].as_u64().unwrap(),
        "{l}"
    );
    server.stop().await;
}

/// With the service down, the withdrawal is taken out of the chain's saved mempool, buried behind more blocks than one sync pass reads, mined and its output spent (Core now answers -25 to it); its txid and the chain's height.
async fn mine_and_spend_it_behind_the_service(
    env: &Env,
    rpc_bind: &str,
    ours: &Wallet,
    to: &bitcoin::Address,
) -> (Txid, u32) {
    // The withdrawal is in the chain's saved mempool: take it out, bury it
    // behind more blocks than one sync pass reads, mine it, spend its output.
    let mut chain = chain_process(env, rpc_bind);
    let c = rpc_up(env, rpc_bind).await;
    let mempool = c.get_raw_mempool().await.unwrap();
    assert_eq!(mempool.len(), 1, "{mempool:?}");
    let withdrawal: Transaction = c.get_raw_transaction(&mempool[0]).await.unwrap().unwrap();
    assert_eq!(withdrawal.output.len(), 1, "no change output");
    assert_eq!(withdrawal.output[0].script_pubkey, to.script_pubkey());
    c.stop().await.unwrap();
    chain.wait().unwrap();
    std::fs::remove_file(env.data_dir.join("chain").join("mempool.dat")).unwrap();
    let mut chain = chain_process(env, rpc_bind);
    let c = rpc_up(env, rpc_bind).await;
    let elsewhere = Wallet::from_seed(&[15u8; 32], Network::Regtest)
        .unwrap()
        .derive_address(0, 0)
        .unwrap();
    c.generate_to_address(501, &elsewhere).await.unwrap();
    let txid: Txid = c.send_raw_transaction(&withdrawal).await.unwrap();
    c.generate_to_address(1, &elsewhere).await.unwrap();
    let coin = SpendableOutput {
        outpoint: OutPoint { txid, vout: 0 },
        txout: withdrawal.output[0].clone(),
        path: KeyPath::receive(0),
    };
    let onward = ours
        .build_signed(
            &[coin],
            &[],
            Some(&elsewhere.script_pubkey()),
            FeeRate::from_sat_per_vb(2).unwrap(),
        )
        .unwrap();
    c.send_raw_transaction(&onward.tx).await.unwrap();
    c.generate_to_address(1, &elsewhere).await.unwrap();
    // What Core answers now: -25, inputs missing or spent.
    let e = chain::Chain::broadcast(&c, withdrawal.clone())
        .await
        .unwrap_err();
    assert!(matches!(e, ChainError::Rejected { code: -25, .. }), "{e:?}");
    let height = c.get_block_count().await.unwrap();
    c.stop().await.unwrap();
    chain.wait().unwrap();
    (txid, height)
}
