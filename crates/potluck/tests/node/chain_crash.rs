//! Black-box: `potluck chain` killed while it writes blocks comes back with
//! an intact chain, and a node pointed at a chain of another network refuses
//! to start.

use crate::support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use chain::{Auth, BitcoindRpc, RpcConfig};
use support::channels::{chain_command, rpc_when_up, start_chain};
use support::{wait_for, wait_for_every};

/// Starts `potluck chain` on port 0 over `data`; returns it with the JSON-RPC URL it reports.
fn spawn_chain(data: &Path) -> (Child, String) {
    let mut cmd = chain_command(&["--rpc-bind", "127.0.0.1:0", "--block-interval", "0"]);
    cmd.arg("--data-dir").arg(data).stderr(Stdio::inherit());
    start_chain(cmd)
}

async fn connect(url: &str, cookie: &Path) -> BitcoindRpc {
    let mut cfg = RpcConfig::new(url, Auth::Cookie(cookie.to_owned()));
    cfg.timeout = Duration::from_secs(30);
    rpc_when_up(cfg, Some(cookie)).await
}

/// Every height up to the tip has a block whose parent is the block below.
async fn assert_connected(c: &BitcoindRpc) -> u32 {
    let height = c.get_block_count().await.unwrap();
    let mut prev = None;
    for h in 0..=height {
        let hash = c.get_block_hash(h).await.unwrap();
        let header = c.get_block_header_info(&hash).await.unwrap();
        assert_eq!(header.previous_block_hash, prev, "height {h}");
        prev = Some(hash);
    }
    height
}

#[tokio::test]
async fn chain_killed_during_block_writes_restarts_intact() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("chain");
    let cookie = data.join(".cookie");
    let (mut child, url) = spawn_chain(&data);
    let c = connect(&url, &cookie).await;
    let address = wallet::Wallet::from_seed(&[5u8; 32], bitcoin::Network::Regtest)
        .unwrap()
        .derive_address(0, 0)
        .unwrap();
    // Mine a long run and kill the process (SIGKILL) in the middle of it.
    let miner = {
        let c = c.clone();
        let address = address.clone();
        tokio::spawn(async move { c.generate_to_address(1_000, &address).await })
    };
    let blocks = data.join("blocks.dat");
    let start_len = std::fs::metadata(&blocks).unwrap().len();
    // Looks often: the kill must land while the call is still mining.
    wait_for_every(
        "blocks written",
        Duration::from_secs(60),
        Duration::from_millis(5),
        || async { std::fs::metadata(&blocks).unwrap().len() >= start_len + 20_000 },
    )
    .await;
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        miner.await.unwrap().is_err(),
        "the call died with the process"
    );
    // Whatever the kill interrupted, also leave the torn start of a record
    // (a length promising more than follows) as a power loss would.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&blocks)
        .unwrap();
    std::io::Write::write_all(&mut f, &[0xd0, 0x07, 0, 0, 9, 9, 9, 9, 1, 2, 3]).unwrap();
    drop(f);

    let (mut child, url) = spawn_chain(&data);
    let c = connect(&url, &cookie).await;
    let height = assert_connected(&c).await;
    assert!(
        height > 101,
        "blocks mined before the kill are kept ({height})"
    );
    // The chain goes on, and its file is sound after the next restart too.
    c.generate_to_address(2, &address).await.unwrap();
    c.stop().await.unwrap();
    child.wait().unwrap();
    let (mut child, url) = spawn_chain(&data);
    let c = connect(&url, &cookie).await;
    assert_eq!(assert_connected(&c).await, height + 2);
    c.stop().await.unwrap();
    child.wait().unwrap();
}

#[tokio::test]
async fn node_refuses_a_chain_of_another_network() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("chain");
    let cookie = data.join(".cookie");
    let (mut chain, url) = spawn_chain(&data);
    let c = connect(&url, &cookie).await;
    let out = Command::new(env!("CARGO_BIN_EXE_potluck"))
        .args(["node", "--network", "bitcoin", "--bitcoind-url", &url])
        .arg("--bitcoind-cookie")
        .arg(&cookie)
        .arg("--data-dir")
        .arg(dir.path().join("node"))
        .args(["--listen", "127.0.0.1:0", "--rpc-bind", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the node started: {stderr}");
    assert!(
        stderr.contains("\"regtest\"") && stderr.contains("--network is bitcoin"),
        "{stderr}"
    );
    c.stop().await.unwrap();
    chain.wait().unwrap();
}

#[tokio::test]
async fn serve_refuses_a_chain_of_another_network() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("chain");
    let cookie = data.join(".cookie");
    let (mut chain, url) = spawn_chain(&data);
    let c = connect(&url, &cookie).await;
    let mut serve = Command::new(env!("CARGO_BIN_EXE_potluck"))
        .args(["serve", "--network", "testnet", "--bitcoind-url", &url])
        .arg("--bitcoind-cookie")
        .arg(&cookie)
        .arg("--data-dir")
        .arg(dir.path().join("serve"))
        .args(["--bind", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_for(
        "potluck serve to refuse a regtest node with --network testnet",
        Duration::from_secs(60),
        || std::future::ready(serve.try_wait().unwrap()),
    )
    .await;
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut serve.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(
        stderr.contains("\"regtest\"") && stderr.contains("--network is testnet"),
        "{stderr}"
    );
    c.stop().await.unwrap();
    chain.wait().unwrap();
}
