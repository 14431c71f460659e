//! Black-box tests of `potluck chain`: the real binary, driven over JSON-RPC.

use crate::support;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use chain::{Auth, BitcoindRpc, RpcConfig, RpcError};
use support::channels::{chain_command, rpc_when_up, start_chain};
use support::{wait_for, wait_for_blocking};

/// Starts `potluck chain` (on the RPC address of `args` / `envs`, port 0)
/// and returns it with the JSON-RPC URL it reports.
fn spawn(args: &[&str], envs: &[(&str, &str)]) -> (Child, String) {
    let mut cmd = chain_command(args);
    cmd.stderr(Stdio::inherit());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    start_chain(cmd)
}

/// A client of the chain at `url` once it answers.
async fn connect(url: &str, auth: Auth, cookie: Option<&Path>) -> BitcoindRpc {
    let mut cfg = RpcConfig::new(url, auth);
    cfg.timeout = Duration::from_secs(10);
    rpc_when_up(cfg, cookie).await
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    wait_for_blocking("potluck chain to exit", within, || {
        child.try_wait().unwrap()
    })
}

#[tokio::test]
async fn chain_serves_rpc_with_cookie_stops_and_keeps_its_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("chain");
    let args = [
        "--rpc-bind",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
        "--block-interval",
        "0",
    ];
    let (mut child, url) = spawn(&args, &[]);
    let cookie = data.join(".cookie");
    let c = connect(&url, Auth::Cookie(cookie.clone()), Some(&cookie)).await;
    assert!(std::fs::read_to_string(&cookie)
        .unwrap()
        .starts_with("__cookie__:"));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&cookie).unwrap().permissions().mode();
        assert_eq!(
            mode & 0o777,
            0o600,
            "the cookie is readable by its owner only"
        );
    }

    // A fresh chain starts with a mature faucet coinbase.
    assert_eq!(c.get_block_count().await.unwrap(), 101);
    let info = c.get_blockchain_info().await.unwrap();
    assert_eq!(info.chain, "regtest");
    let w = wallet::Wallet::from_seed(&[5u8; 32], bitcoin::Network::Regtest).unwrap();
    let address = w.derive_address(0, 0).unwrap();
    let txid = c
        .send_to_address(&address, bitcoin::Amount::from_sat(50_000))
        .await
        .unwrap();
    assert_eq!(c.get_raw_mempool().await.unwrap(), vec![txid]);
    let hashes = c.generate_to_address(2, &address).await.unwrap();
    assert_eq!(c.get_best_block_hash().await.unwrap(), hashes[1]);

    assert_eq!(c.stop().await.unwrap(), "Bitcoin Core stopping");
    assert!(wait_exit(&mut child, Duration::from_secs(20)).success());
    assert!(!cookie.exists(), "the cookie is removed on shutdown");

    let (mut child, url) = spawn(&args, &[]);
    let c = connect(&url, Auth::Cookie(cookie.clone()), Some(&cookie)).await;
    assert_eq!(c.get_block_count().await.unwrap(), 103);
    assert_eq!(c.get_best_block_hash().await.unwrap(), hashes[1]);
    let raw = c.get_raw_transaction(&txid).await.unwrap().unwrap();
    assert_eq!(raw.compute_txid(), txid);
    c.stop().await.unwrap();
    assert!(wait_exit(&mut child, Duration::from_secs(20)).success());
}

#[tokio::test]
async fn chain_takes_flags_from_env_and_mines_on_an_interval() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("c");
    let envs = [
        ("POTLUCK_RPC_BIND", "127.0.0.1:0"),
        ("POTLUCK_DATA_DIR", data.to_str().unwrap()),
        ("POTLUCK_RPC_USER", "alice"),
        ("POTLUCK_RPC_PASSWORD", "s3cret"),
        ("POTLUCK_BLOCK_INTERVAL", "1"),
        ("POTLUCK_MINING_MIN_FEE_SAT_VB", "2.5"),
    ];
    let (mut child, url) = spawn(&[], &envs);
    let c = connect(&url, Auth::UserPass("alice".into(), "s3cret".into()), None).await;
    assert!(
        !data.join(".cookie").exists(),
        "no cookie with user/password"
    );
    // Fee-market mode from the environment: the chain estimates its threshold.
    let fee: serde_json::Value = c
        .call("estimatesmartfee", serde_json::json!([2]))
        .await
        .unwrap();
    assert_eq!(fee["feerate"], serde_json::json!(0.000025));
    let start = c.get_block_count().await.unwrap();
    wait_for("interval blocks", Duration::from_secs(20), || async {
        c.get_block_count().await.unwrap() >= start + 2
    })
    .await;
    let wrong = BitcoindRpc::new(RpcConfig::new(
        &url,
        Auth::UserPass("alice".into(), "nope".into()),
    ))
    .unwrap();
    assert_eq!(
        wrong.get_block_count().await.unwrap_err(),
        RpcError::Auth(401)
    );
    c.stop().await.unwrap();
    assert!(wait_exit(&mut child, Duration::from_secs(20)).success());
}
