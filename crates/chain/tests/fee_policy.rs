//! Every fee estimate goes through the chain's `FeePolicy`: a node without
//! an estimate (a fresh Bitcoin Core answers "Insufficient data") gives the
//! policy's fallback, never the 0.1 sat/vB `mempoolminfee` of Core 30.

// A failed unwrap is how a test reports failure.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bitcoin::FeeRate;
use chain::{
    Auth, BitcoindRpc, Chain, DevChain, DevChainConfig, FeePolicy, RpcConfig, RunningDevChain,
};
use serde_json::{json, Value};

async fn start(dir: &std::path::Path) -> (RunningDevChain, BitcoindRpc) {
    let mut config = DevChainConfig::new(dir);
    config.rpc_bind = Some("127.0.0.1:0".parse().unwrap());
    let running = DevChain::start(config).await.unwrap();
    let mut rpc = RpcConfig::new(
        running.rpc_url().unwrap(),
        Auth::Cookie(running.cookie.clone().unwrap()),
    );
    rpc.timeout = Duration::from_secs(20);
    (running, BitcoindRpc::new(rpc).unwrap())
}

/// Issue 28 finding 5: a fresh Core 30 has no estimate and a `mempoolminfee`
/// of 0.000001 BTC/kvB; the anchor went out at 0.1 sat/vB (16 sat for 153 vB).
#[tokio::test]
async fn a_node_without_estimates_gives_the_fallback_not_the_mempool_floor() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    node.chain.set_fee_estimates(false);
    node.chain
        .with_state_mut(|s| s.set_min_relay_fee(FeeRate::from_sat_per_kwu(25)))
        .unwrap();
    let raw: Value = c.call("estimatesmartfee", json!([6])).await.unwrap();
    assert_eq!(
        raw,
        json!({"errors": ["Insufficient data or no feerate found"], "blocks": 0})
    );
    let info: Value = c.call("getmempoolinfo", json!([])).await.unwrap();
    assert_eq!(info["mempoolminfee"], json!(0.000001));
    // The documented fallback, 2 sat/vB.
    assert_eq!(
        c.estimate_fee(6).await.unwrap(),
        FeeRate::from_sat_per_vb_u32(2)
    );
    // In process the same.
    assert_eq!(
        node.chain.estimate_fee(6).await.unwrap(),
        FeeRate::from_sat_per_vb_u32(2)
    );
    node.shutdown().await;
}

/// An estimate below the floor is raised to it; a configured policy is
/// applied by both implementations, its ceiling included.
#[tokio::test]
async fn estimates_are_held_to_a_configured_policy() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = DevChainConfig::new(dir.path());
    config.rpc_bind = Some("127.0.0.1:0".parse().unwrap());
    let node = DevChain::start(config).await.unwrap();
    let policy = FeePolicy::new(
        FeeRate::from_sat_per_vb_u32(3),
        FeeRate::from_sat_per_vb_u32(20),
        FeeRate::from_sat_per_vb_u32(5),
    )
    .unwrap();
    let mut rpc = RpcConfig::new(
        node.rpc_url().unwrap(),
        Auth::Cookie(node.cookie.clone().unwrap()),
    );
    rpc.fee_policy = policy;
    let c = BitcoindRpc::new(rpc).unwrap();
    node.chain.set_fee_policy(policy);
    assert_eq!(c.fee_policy(), policy);
    assert_eq!(node.chain.fee_policy(), policy);
    // The chain estimates its relay floor: below ours.
    for chain in [&c as &dyn Chain, &node.chain] {
        assert_eq!(
            chain.estimate_fee(2).await.unwrap(),
            FeeRate::from_sat_per_vb_u32(3)
        );
    }
    // A full mempool's minimum above the ceiling: the ceiling.
    node.chain
        .with_state_mut(|s| s.set_mempool_min_fee(FeeRate::from_sat_per_vb_u32(80)))
        .unwrap();
    for chain in [&c as &dyn Chain, &node.chain] {
        assert_eq!(
            chain.estimate_fee(2).await.unwrap(),
            FeeRate::from_sat_per_vb_u32(20)
        );
    }
    node.shutdown().await;
}
