//! Modelling a miner over the real JSON-RPC: Core's `generateblock` (exactly
//! these transactions) and `prioritisetransaction`, and the development
//! chain's fee-market mode (`setminingfeerate`, not Core), in which blocks
//! take only transactions whose ancestor package pays enough: a low-fee
//! transaction waits, a BIP125 replacement at a higher rate confirms, a
//! child pays for its parent (CPFP).

// A failed unwrap is how a test reports failure.
#![allow(clippy::unwrap_used)]

mod support;

use bitcoin::absolute::LockTime;
use bitcoin::consensus::encode::serialize_hex;
use bitcoin::transaction::Version;
use bitcoin::{Amount, Sequence, Transaction, TxIn, TxOut, Txid};
use chain::rpc::codes;
use chain::FeePolicy;
use chain::{BitcoindRpc, Chain, RpcError};
use serde_json::{json, Value};
use support::{fund, miner, output_to, start, wallet};
use wallet::{KeyPath, SpendableOutput, Wallet};

/// `coin` spent whole to `to`, paying exactly `fee`, signalling BIP125.
fn spend(w: &Wallet, coin: &SpendableOutput, to: KeyPath, fee: u64) -> Transaction {
    let mut tx = Transaction {
        version: Version::TWO,
        lock_time: LockTime::ZERO,
        input: vec![TxIn {
            previous_output: coin.outpoint,
            sequence: Sequence::ENABLE_RBF_NO_LOCKTIME,
            ..TxIn::default()
        }],
        output: vec![TxOut {
            value: coin.txout.value - Amount::from_sat(fee),
            script_pubkey: w.derive(to).unwrap().address.script_pubkey(),
        }],
    };
    w.sign(&mut tx, std::slice::from_ref(coin)).unwrap();
    tx
}

async fn mempool(c: &BitcoindRpc) -> Vec<Txid> {
    c.get_raw_mempool().await.unwrap()
}

async fn rpc_error(c: &BitcoindRpc, method: &str, params: Value) -> (i32, String) {
    match c.call::<Value>(method, params).await.unwrap_err() {
        RpcError::Rpc { code, message } => (code, message),
        other => panic!("expected an RPC error, got {other:?}"),
    }
}

/// The height alone (`getblockcount`), as the node's expiry checks ask it, is the tip's,
/// through JSON-RPC and on the development chain, before and after a block.
#[tokio::test]
async fn the_height_alone_is_the_tip_s() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    for _ in 0..2 {
        let tip = c.tip().await.unwrap().height;
        assert_eq!(Chain::height(&c).await.unwrap(), tip);
        assert_eq!(Chain::height(&node.chain).await.unwrap(), tip);
        assert_eq!(node.chain.tip().await.unwrap().height, tip);
        node.chain.mine(1, &miner().script_pubkey()).unwrap();
        assert_eq!(Chain::height(&c).await.unwrap(), tip + 1);
    }
}

#[tokio::test]
async fn generateblock_mines_exactly_the_given_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let w = wallet();
    let a = fund(&c, &w, KeyPath::receive(0), Amount::from_sat(100_000)).await;
    let b = fund(&c, &w, KeyPath::receive(1), Amount::from_sat(100_000)).await;
    let d = fund(&c, &w, KeyPath::receive(2), Amount::from_sat(100_000)).await;
    let in_pool = spend(&w, &a, KeyPath::receive(10), 500);
    let stays = spend(&w, &b, KeyPath::receive(11), 500);
    c.broadcast(in_pool.clone()).await.unwrap();
    c.broadcast(stays.clone()).await.unwrap();
    // A zero-fee transaction the mempool refuses; a block may carry it.
    let free = spend(&w, &d, KeyPath::receive(12), 0);
    assert!(c.broadcast(free.clone()).await.is_err());
    let height = c.get_block_count().await.unwrap();
    let r: Value = c
        .call(
            "generateblock",
            json!([
                miner().to_string(),
                [in_pool.compute_txid().to_string(), serialize_hex(&free)]
            ]),
        )
        .await
        .unwrap();
    let hash: bitcoin::BlockHash = r["hash"].as_str().unwrap().parse().unwrap();
    assert_eq!(r.as_object().unwrap().len(), 1, "only the hash: {r}");
    assert_eq!(c.get_best_block_hash().await.unwrap(), hash);
    assert_eq!(c.get_block_count().await.unwrap(), height + 1);
    let block = c.get_block(&hash).await.unwrap();
    let txids: Vec<Txid> = block.txdata.iter().map(|t| t.compute_txid()).collect();
    assert_eq!(
        txids[1..],
        [in_pool.compute_txid(), free.compute_txid()],
        "exactly these, in this order"
    );
    assert_eq!(mempool(&c).await, vec![stays.compute_txid()]);

    // submit=false: checked and returned, the tip does not move.
    let r: Value = c
        .call(
            "generateblock",
            json!([
                miner().to_string(),
                [stays.compute_txid().to_string()],
                false
            ]),
        )
        .await
        .unwrap();
    assert!(r["hex"].as_str().is_some_and(|h| !h.is_empty()));
    assert_eq!(c.get_best_block_hash().await.unwrap(), hash);

    // Refusals with Core's codes and texts.
    let unknown = Txid::from_raw_hash(bitcoin::hashes::Hash::all_zeros());
    assert_eq!(
        rpc_error(
            &c,
            "generateblock",
            json!([miner().to_string(), [unknown.to_string()]])
        )
        .await,
        (
            codes::RPC_INVALID_ADDRESS_OR_KEY,
            format!("Transaction {unknown} not in mempool.")
        )
    );
    assert_eq!(
        rpc_error(&c, "generateblock", json!([miner().to_string(), ["00ff"]])).await,
        (
            codes::RPC_DESERIALIZATION_ERROR,
            "Transaction decode failed for 00ff".to_owned()
        )
    );
    // A transaction whose input a block already spent.
    let (code, message) = rpc_error(
        &c,
        "generateblock",
        json!([
            miner().to_string(),
            [serialize_hex(&spend(&w, &a, KeyPath::receive(13), 900))]
        ]),
    )
    .await;
    assert_eq!(
        (code, message.as_str()),
        (
            codes::RPC_VERIFY_ERROR,
            "TestBlockValidity failed: bad-txns-inputs-missingorspent"
        )
    );
    assert_eq!(
        rpc_error(&c, "generateblock", json!(["not-an-address", []])).await,
        (
            codes::RPC_INVALID_ADDRESS_OR_KEY,
            "Error: Invalid address or descriptor".to_owned()
        )
    );
    // An empty block.
    let r: Value = c
        .call("generateblock", json!([miner().to_string(), []]))
        .await
        .unwrap();
    assert!(r["hash"].is_string());
    assert_eq!(mempool(&c).await, vec![stays.compute_txid()]);
    node.shutdown().await;
}

/// In fee-market mode a transaction below the threshold waits across
/// `generatetoaddress`; `prioritisetransaction` (a miner's out-of-band fee)
/// gets it mined; a BIP125 replacement paying more confirms; a child
/// paying for its parent pulls the parent in.
#[tokio::test]
async fn a_fee_market_keeps_low_fee_transactions_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let w = wallet();
    let coins: Vec<SpendableOutput> = {
        let mut v = Vec::new();
        for i in 0..3 {
            v.push(fund(&c, &w, KeyPath::receive(i), Amount::from_sat(200_000)).await);
        }
        v
    };
    let r: Value = c.call("setminingfeerate", json!([5])).await.unwrap();
    assert_eq!(r, json!({"mining_min_fee_sat_vb": 5.0}));
    // The chain's estimate follows the market.
    let raw: Value = c.call("estimatesmartfee", json!([2])).await.unwrap();
    assert_eq!(raw["feerate"], json!(0.00005));
    assert_eq!(
        c.estimate_fee(2).await.unwrap(),
        bitcoin::FeeRate::from_sat_per_vb_u32(5)
    );
    assert_eq!(node.chain.fee_policy(), FeePolicy::default());

    // 110 vB at 2 sat/vB: relayed, not mined.
    let low = spend(&w, &coins[0], KeyPath::receive(10), 220);
    c.broadcast(low.clone()).await.unwrap();
    c.generate_to_address(3, &miner()).await.unwrap();
    assert_eq!(mempool(&c).await, vec![low.compute_txid()]);

    // A replacement at 10 sat/vB confirms in the next block.
    let bumped = spend(&w, &coins[0], KeyPath::receive(11), 1_100);
    c.broadcast(bumped.clone()).await.unwrap();
    assert_eq!(mempool(&c).await, vec![bumped.compute_txid()]);
    c.generate_to_address(1, &miner()).await.unwrap();
    assert!(mempool(&c).await.is_empty());
    assert!(
        c.transaction(bumped.compute_txid())
            .await
            .unwrap()
            .unwrap()
            .confirmations
            > 0
    );

    // CPFP: a 1 sat/vB parent waits alone; a child paying 20 sat/vB for
    // both (its package: 2,310 sat over 220 vB = 10.5 sat/vB) pulls it in.
    let parent = spend(&w, &coins[1], KeyPath::receive(20), 110);
    c.broadcast(parent.clone()).await.unwrap();
    c.generate_to_address(1, &miner()).await.unwrap();
    assert_eq!(mempool(&c).await, vec![parent.compute_txid()]);
    let child = spend(
        &w,
        &output_to(&parent, KeyPath::receive(20), &w),
        KeyPath::receive(21),
        2_200,
    );
    c.broadcast(child.clone()).await.unwrap();
    let entry: Value = c
        .call("getmempoolentry", json!([child.compute_txid().to_string()]))
        .await
        .unwrap();
    assert_eq!(entry["fees"]["ancestor"], json!(0.0000231));
    c.generate_to_address(1, &miner()).await.unwrap();
    assert!(
        mempool(&c).await.is_empty(),
        "the child pulled its parent in"
    );
    for tx in [&parent, &child] {
        assert!(
            c.transaction(tx.compute_txid())
                .await
                .unwrap()
                .unwrap()
                .confirmations
                > 0
        );
    }

    // prioritisetransaction: a 1 sat/vB transaction with +1,000 sat of
    // modified fee (10 sat/vB) is mined; the delta shows as `modified`.
    let waiting = spend(&w, &coins[2], KeyPath::receive(30), 110);
    c.broadcast(waiting.clone()).await.unwrap();
    c.generate_to_address(1, &miner()).await.unwrap();
    assert_eq!(mempool(&c).await, vec![waiting.compute_txid()]);
    assert_eq!(
        rpc_error(
            &c,
            "prioritisetransaction",
            json!([waiting.compute_txid().to_string(), 1, 1_000])
        )
        .await,
        (
            codes::RPC_INVALID_PARAMETER,
            "Priority is no longer supported, dummy argument to prioritisetransaction must be 0."
                .to_owned()
        )
    );
    let ok: bool = c
        .call(
            "prioritisetransaction",
            json!([waiting.compute_txid().to_string(), 0, 1_000]),
        )
        .await
        .unwrap();
    assert!(ok);
    let entry: Value = c
        .call(
            "getmempoolentry",
            json!([waiting.compute_txid().to_string()]),
        )
        .await
        .unwrap();
    assert_eq!(
        (&entry["fees"]["base"], &entry["fees"]["modified"]),
        (&json!(0.0000011), &json!(0.0000111))
    );
    c.generate_to_address(1, &miner()).await.unwrap();
    assert!(mempool(&c).await.is_empty());

    // Off again: everything valid is mined.
    let r: Value = c.call("setminingfeerate", json!([0])).await.unwrap();
    assert_eq!(r, json!({"mining_min_fee_sat_vb": null}));
    assert_eq!(node.chain.mining_min_fee(), None);
    node.shutdown().await;
}
