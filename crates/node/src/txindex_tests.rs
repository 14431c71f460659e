//! The node on a chain without the transaction index (Bitcoin Core's default), in
//! process: the development chain is told to refuse `getrawtransaction` for mined
//! transactions, and the node must not need it, across a restart too (issue 31).

use std::collections::BTreeSet;

use bitcoin::Txid;
use chain::Chain as _;
use serde_json::{json, Value};

use crate::harness::{create_network, eventually, Network};

const CAPACITY_SAT: u64 = 500_000;
/// `ChannelConfig::default().commitment_fee_sat`.
const COMMIT_FEE_SAT: u64 = 10_000;

/// The settings the process tests ran the binary with on regtest.
fn regtest(config: &mut crate::NodeConfig) {
    config.channel.min_depth = 1;
}

/// Two nodes on a chain without the index, with a live channel of [`CAPACITY_SAT`] from
/// node 0 to node 1; returns node 0's wallet total after the anchor confirmed (its change).
async fn live_without_txindex() -> (Network, u64) {
    let net = create_network(2, regtest).await;
    net.chain.set_txindex(false);
    net.open_channel(0, 1, CAPACITY_SAT).await;
    net.mine(1).await;
    let change = net.funds_sat(0).await;
    assert!(change > 0 && change < 100_000, "A's change {change}");
    (net, change)
}

/// Inputs less outputs of `txid`, read with the index on for the test's own bookkeeping.
async fn fee_sat(net: &Network, txid: Txid) -> u64 {
    let tx = |t| async move {
        net.chain
            .transaction(t)
            .await
            .expect("chain")
            .expect("a known transaction")
            .tx
    };
    let spent = tx(txid).await;
    let mut input = 0;
    for i in &spent.input {
        let parent = tx(i.previous_output.txid).await;
        input += parent.output[i.previous_output.vout as usize]
            .value
            .to_sat();
    }
    let output: u64 = spent.output.iter().map(|o| o.value.to_sat()).sum();
    input - output
}

/// Fees of the transactions after the anchor that paid the nodes' wallets (the
/// commitment and the sweeps).
async fn channel_fees(net: &Network, anchor: Txid) -> u64 {
    net.chain.set_txindex(true);
    let mut txids = BTreeSet::new();
    for i in 0..net.nodes.len() {
        let funds = net.rpc(i, "listfunds", json!([])).await.expect("listfunds");
        for o in funds["outputs"].as_array().expect("outputs") {
            let txid: Txid = o["txid"].as_str().expect("txid").parse().expect("txid");
            if txid == anchor {
                continue;
            }
            let tx = net
                .chain
                .transaction(txid)
                .await
                .expect("chain")
                .expect("tx");
            // A sweep's parent is the commitment; the commitment's parent is the anchor.
            for input in &tx.tx.input {
                if input.previous_output.txid != anchor {
                    txids.insert(input.previous_output.txid);
                }
            }
            txids.insert(txid);
        }
    }
    let mut fees = 0;
    for txid in txids {
        fees += fee_sat(net, txid).await;
    }
    net.chain.set_txindex(false);
    fees
}

fn msat(ch: &Value, field: &str) -> u64 {
    ch[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {ch}"))
}

/// Replaces the process test `unilateral_close_claims_without_txindex`: B closes alone
/// with an HTLC whose R it knows; the delayed claims (their parent's depth) are found
/// without the index, also after B restarts, and each side gets its balance to the satoshi
/// less its own sweep fees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unilateral_close_claims_the_delayed_output_and_an_htlc_without_txindex() {
    let (mut net, a_change) = live_without_txindex().await;
    let (a_id, b_id) = (net.id(0).to_string(), net.id(1).to_string());
    net.rpc(0, "pay", json!([b_id, 100_000_000]))
        .await
        .expect("pay");
    let r = [4u8; 32];
    let r_hash = {
        use bitcoin::hashes::Hash as _;
        hex::encode(wire::Sha256::hash(&r).to_byte_array())
    };
    let expiry = net.chain.height() + 50;
    net.rpc(0, "newhtlc", json!([b_id, 60_000_000, r_hash, expiry]))
        .await
        .expect("newhtlc");
    let cb = net.channel_json(1, &net.id(0)).await;
    let b_msat = msat(&cb, "our_msat");
    let a_msat = msat(&cb, "their_msat");
    let anchor: Txid = cb["anchor_txid"]
        .as_str()
        .expect("anchor")
        .parse()
        .expect("txid");

    let err = net
        .rpc(1, "close", json!([a_id, "now"]))
        .await
        .expect_err("not forced");
    assert!(err.1.contains("force"), "{err:?}");
    let closed = net
        .rpc(1, "close", json!([a_id, "force"]))
        .await
        .expect("force close");
    assert_eq!(closed["state"], "on_chain", "{closed}");
    net.mine(1).await;
    net.rpc(1, "fulfillhtlc", json!([a_id, hex::encode(r)]))
        .await
        .expect("fulfillhtlc");
    eventually!(
        net,
        "A sees the commitment",
        net.channel_json(0, &net.id(1)).await["state"] == "on_chain"
    );
    // B's commitment spent the anchor: A's own can never confirm.
    let err = net
        .rpc(0, "close", json!([b_id, "force"]))
        .await
        .expect_err("A's commitment cannot replace B's");
    assert!(err.0 == -105 && err.1.contains("OnChain"), "{err:?}");
    // The queued claims survive a restart while they wait for their delay.
    net.restart(1).await;

    // B's own output and the HTLC wait for the delay (6 blocks); A's output is paid at once.
    let mut fees = 0;
    eventually!(net, "every claim confirmed", {
        net.mine(1).await;
        fees = channel_fees(&net, anchor).await;
        net.funds_sat(0).await + net.funds_sat(1).await + fees == a_change + CAPACITY_SAT
    });
    let sweep_fees = fees - COMMIT_FEE_SAT;
    assert!(sweep_fees < 3_000, "sweep fees {sweep_fees}");
    let b_got = net.funds_sat(1).await;
    let a_got = net.funds_sat(0).await - a_change;
    assert_eq!(
        a_got + b_got + sweep_fees,
        a_msat / 1000 + b_msat / 1000 + 60_000
    );
    assert!(b_got > b_msat / 1000 + 60_000 - 2_000, "B got {b_got}");
    assert!(b_got < b_msat / 1000 + 60_000, "B got {b_got}");
    assert!(
        a_got > a_msat / 1000 - 1_000 && a_got <= a_msat / 1000,
        "A got {a_got}"
    );
}

/// Replaces the process test `revoked_commitment_is_swept_by_the_penalty_without_txindex`:
/// a scripted peer pays the node twice and, while the node is down, broadcasts the
/// commitment the second payment revoked. Back up on a chain without the index, the node
/// takes every output of it with the penalty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_commitment_is_swept_by_the_penalty_after_a_restart_without_txindex() {
    let mut net = create_network(1, regtest).await;
    net.chain.set_txindex(false);
    let mut peer = net.scripted_peer(0, 90).await;
    peer.open_live(&net, 1_000_000).await;
    peer.pay(100_000_000).await.expect("pay");
    let revoked = peer.channel.signed_commitment().expect("signed");
    peer.pay(50_000_000).await.expect("pay");
    peer.hang_up();
    // The node is down when the peer cheats; it must still catch it when it comes back.
    net.chain
        .send_raw(&revoked, None)
        .expect("the revoked commitment");
    let payout = net.chain.faucet_script().to_owned();
    net.chain.mine(1, &payout).expect("mine");
    net.restart(0).await;
    let revoked_txid = revoked.compute_txid();
    let revoked_total: u64 = revoked.output.iter().map(|o| o.value.to_sat()).sum();
    let mut penalty = None;
    eventually!(net, "the penalty in the node's wallet", {
        net.mine(1).await;
        net.chain.set_txindex(true);
        let funds = net.rpc(0, "listfunds", json!([])).await.expect("listfunds");
        for o in funds["outputs"].as_array().expect("outputs") {
            let txid: Txid = o["txid"].as_str().expect("txid").parse().expect("txid");
            let tx = net
                .chain
                .transaction(txid)
                .await
                .expect("chain")
                .expect("tx")
                .tx;
            if tx
                .input
                .iter()
                .any(|i| i.previous_output.txid == revoked_txid)
            {
                penalty = Some(tx);
            }
        }
        net.chain.set_txindex(false);
        penalty.is_some()
    });
    let penalty = penalty.expect("found above");
    let spent = penalty
        .input
        .iter()
        .filter(|i| i.previous_output.txid == revoked_txid)
        .count();
    assert_eq!(
        spent,
        revoked.output.len(),
        "the penalty takes every output"
    );
    net.chain.set_txindex(true);
    let fee = fee_sat(&net, penalty.compute_txid()).await;
    net.chain.set_txindex(false);
    assert!(fee < 2_000, "penalty fee {fee}");
    assert_eq!(net.funds_sat(0).await, revoked_total - fee);
    assert_eq!(
        net.channel_json(0, &peer.node_id).await["state"],
        "on_chain"
    );
}

/// The fair close fee on the development chain: 253 sat/kw × the signed two-output
/// close's 676 weight units.
const CLOSE_FEE_SAT: u64 = 172;

/// Both nodes agree: node 0 owns `a_total_sat` and node 1 the rest, the commitment fee
/// split per the rules (the non-funder pays half, rounded up, if it can).
async fn assert_split(net: &Network, a_total_sat: u64) {
    let b_total_sat = CAPACITY_SAT - a_total_sat;
    let b_fee = (COMMIT_FEE_SAT - COMMIT_FEE_SAT / 2).min(b_total_sat);
    let a_fee = COMMIT_FEE_SAT - b_fee;
    let ca = net.channel_json(0, &net.id(1)).await;
    let cb = net.channel_json(1, &net.id(0)).await;
    assert_eq!(msat(&ca, "our_msat"), (a_total_sat - a_fee) * 1000, "{ca}");
    assert_eq!(msat(&ca, "our_fee_msat"), a_fee * 1000, "{ca}");
    assert_eq!(
        msat(&ca, "their_msat"),
        (b_total_sat - b_fee) * 1000,
        "{ca}"
    );
    assert_eq!(msat(&ca, "their_fee_msat"), b_fee * 1000, "{ca}");
    assert_eq!(msat(&cb, "our_msat"), msat(&ca, "their_msat"), "{cb}");
    assert_eq!(msat(&cb, "their_msat"), msat(&ca, "our_msat"), "{cb}");
    assert_eq!(ca["htlcs"].as_array().map(Vec::len), Some(0), "{ca}");
    assert_eq!(cb["htlcs"].as_array().map(Vec::len), Some(0), "{cb}");
}

fn r_hash(r: &[u8; 32]) -> String {
    use bitcoin::hashes::Hash as _;
    hex::encode(wire::Sha256::hash(r).to_byte_array())
}

/// Whether neither node's channel holds an HTLC.
async fn no_htlcs(net: &Network) -> bool {
    let empty = |ch: Value| ch["htlcs"].as_array().is_some_and(Vec::is_empty);
    empty(net.channel_json(0, &net.id(1)).await) && empty(net.channel_json(1, &net.id(0)).await)
}

/// An HTLC from A that B fulfills, one B fails after a wrong R was refused, and one that
/// times out; returns A's total after them (the first one paid).
async fn three_htlcs(net: &Network, mut a_total: u64) -> u64 {
    let (a_id, b_id) = (net.id(0).to_string(), net.id(1).to_string());
    // An HTLC whose R B knows: B fulfills it.
    let height = net.chain.height();
    let r1 = [1u8; 32];
    net.rpc(
        0,
        "newhtlc",
        json!([b_id, 50_000_000, r_hash(&r1), height + 20]),
    )
    .await
    .expect("newhtlc");
    assert_eq!(net.info(1).await["pending_htlcs"], 1);
    net.rpc(1, "fulfillhtlc", json!([a_id, hex::encode(r1)]))
        .await
        .expect("fulfillhtlc");
    a_total -= 50_000;
    eventually!(net, "the fulfil seen by A", no_htlcs(net).await);
    assert_split(net, a_total).await;

    // A wrong R is refused; B cannot route it: the HTLC goes back to A.
    let r2 = [2u8; 32];
    net.rpc(
        0,
        "newhtlc",
        json!([b_id, 20_000_000, r_hash(&r2), height + 20]),
    )
    .await
    .expect("newhtlc");
    let err = net
        .rpc(1, "fulfillhtlc", json!([a_id, hex::encode([9u8; 32])]))
        .await
        .expect_err("a wrong R");
    assert!(err.1.contains("no HTLC"), "{err:?}");
    net.rpc(1, "failhtlc", json!([a_id, r_hash(&r2)]))
        .await
        .expect("failhtlc");
    eventually!(net, "the routefail seen by A", no_htlcs(net).await);
    assert_split(net, a_total).await;

    // An HTLC that times out: A removes it once the chain passes its expiry (B needs its
    // claim delay, 6 blocks, plus its margin, 6, before it).
    let r3 = [3u8; 32];
    let expiry = net.chain.height() + 13;
    net.rpc(0, "newhtlc", json!([b_id, 30_000_000, r_hash(&r3), expiry]))
        .await
        .expect("newhtlc");
    net.mine(13).await;
    eventually!(net, "the timed-out HTLC removed", no_htlcs(net).await);
    assert_split(net, a_total).await;

    a_total
}

/// Replaces the process test `open_pay_htlcs_close_without_txindex`: the lifecycle on a
/// chain without the index, B restarted with no record of the anchor's block (as a
/// release that needed the index left it): payments both ways, an HTLC fulfilled, one
/// failed, one timed out, and a cooperative close, every balance to the satoshi.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_pay_htlcs_close_without_txindex() {
    let (mut net, a_change) = live_without_txindex().await;
    let (a_id, b_id) = (net.id(0).to_string(), net.id(1).to_string());
    let mut a_total = CAPACITY_SAT;
    assert_split(&net, a_total).await;
    let info = net.info(0).await;
    assert_eq!(info["open_channels"], 1);
    assert_eq!(info["open_channel_balance_msat"], a_total * 1000);

    // B finds its unspent anchor again after a restart without the block it was in.
    let anchor: Txid = net.channel_json(0, &net.id(1)).await["anchor_txid"]
        .as_str()
        .expect("anchor")
        .parse()
        .expect("txid");
    assert!(net.nodes[1]
        .store
        .tx_block(&anchor)
        .await
        .expect("store")
        .is_some());
    net.nodes[1]
        .store
        .forget_tx_block(&anchor)
        .await
        .expect("store");
    net.restart(1).await;
    net.connect(0, 1).await;
    net.mine(1).await;
    let paid = net
        .rpc(0, "pay", json!([b_id, 100_000_000]))
        .await
        .expect("a payment after B's restart");
    assert_eq!(paid["state"], "normal");
    a_total -= 100_000;
    assert_split(&net, a_total).await;

    a_total = three_htlcs(&net, a_total).await;

    // B pays back: the acceptor proposes too.
    net.rpc(1, "pay", json!([a_id, 7_000_000]))
        .await
        .expect("pay");
    a_total += 7_000;
    assert_split(&net, a_total).await;

    // Cooperative close: each wallet gets its share less its part of the close fee.
    let b_total = CAPACITY_SAT - a_total;
    let closed = net.rpc(0, "close", json!([b_id])).await.expect("close");
    assert_eq!(closed["state"], "closed", "{closed}");
    net.mine(1).await;
    let b_fee = (CLOSE_FEE_SAT - CLOSE_FEE_SAT / 2).min(b_total);
    let a_fee = CLOSE_FEE_SAT - b_fee;
    eventually!(
        net,
        "the close outputs in both wallets",
        net.funds_sat(0).await == a_change + a_total - a_fee
            && net.funds_sat(1).await == b_total - b_fee
    );
}
