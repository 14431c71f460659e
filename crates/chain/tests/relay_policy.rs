//! The development chain relays as Bitcoin Core 30 does: from 0.1 sat/vB
//! (`-minrelaytxfee` and `-incrementalrelayfee` 100 sat/kvB, the fee of a
//! size rounded up as Core's `CFeeRate::GetFee`), with Core 30's reject texts.

// A failed unwrap is how a test reports failure.
#![allow(clippy::unwrap_used)]

mod support;

use bitcoin::absolute::LockTime;
use bitcoin::transaction::Version;
use bitcoin::{Amount, Sequence, Transaction, TxIn, TxOut};
use chain::rpc::codes;
use chain::RejectCategory;
use chain::{Chain, ChainError};
use serde_json::{json, Value};
use support::{fund, miner, start, wallet};
use wallet::{KeyPath, SpendableOutput, Wallet};

/// `coin` spent whole to `to`, paying exactly `fee`, signalling BIP125.
fn spend_with_fee(w: &Wallet, coin: &SpendableOutput, to: u32, fee: u64) -> Transaction {
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
            script_pubkey: w.derive_address(0, to).unwrap().script_pubkey(),
        }],
    };
    w.sign(&mut tx, std::slice::from_ref(coin)).unwrap();
    tx
}

fn reason(e: ChainError) -> (i32, String) {
    match e {
        ChainError::Rejected { code, reason, .. } => (code, reason),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Core's `FormatMoney`: BTC with 8 decimals, trailing zeros trimmed down to 2.
fn format_money(sat: u64) -> String {
    let mut s = format!("{}.{:08}", sat / 100_000_000, sat % 100_000_000);
    while s.ends_with('0') && s.len() - s.find('.').unwrap() > 3 {
        s.pop();
    }
    s
}

/// Core's `CFeeRate(100).GetFee(vsize)`: 100 sat per 1,000 vB, rounded up.
fn tenth_sat_fee(vsize: usize) -> u64 {
    (100 * vsize as u64).div_ceil(1_000)
}

#[tokio::test]
async fn relay_starts_at_a_tenth_of_a_sat_per_vbyte() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let info: Value = c.call("getmempoolinfo", json!([])).await.unwrap();
    for field in ["mempoolminfee", "minrelaytxfee", "incrementalrelayfee"] {
        assert_eq!(info[field], json!(0.000001), "{field}");
    }
    let net: Value = c.call("getnetworkinfo", json!([])).await.unwrap();
    assert_eq!(
        (&net["relayfee"], &net["incrementalfee"]),
        (&json!(0.000001), &json!(0.000001))
    );
    let w = wallet();
    let coin = fund(&c, &w, KeyPath::receive(0), Amount::from_sat(100_000)).await;
    // One P2WPKH in, one out: 110 vB, so 11 sat is exactly 0.1 sat/vB.
    let probe = spend_with_fee(&w, &coin, 1, 0);
    let needed = tenth_sat_fee(probe.vsize());
    let short = spend_with_fee(&w, &coin, 1, needed - 1);
    let (code, text) = reason(c.broadcast(short.clone()).await.unwrap_err());
    assert_eq!(code, codes::RPC_VERIFY_REJECTED);
    assert_eq!(
        text,
        format!("min relay fee not met, {} < {needed}", needed - 1)
    );
    // testmempoolaccept: Core's reason alone, and with its debug part.
    let r: Value = c
        .call(
            "testmempoolaccept",
            json!([[bitcoin::consensus::encode::serialize_hex(&short)]]),
        )
        .await
        .unwrap();
    assert_eq!(r[0]["reject-reason"], json!("min relay fee not met"));
    assert_eq!(
        r[0]["reject-details"],
        json!(format!("min relay fee not met, {} < {needed}", needed - 1))
    );
    let enough = spend_with_fee(&w, &coin, 1, needed);
    c.broadcast(enough.clone()).await.unwrap();
    // A replacement must add the incremental relay fee (0.1 sat/vB of its
    // own size) on top of what it replaces: one sat less is refused, with
    // Core's amounts.
    let replacement_short = spend_with_fee(&w, &coin, 2, 2 * needed - 1);
    let (code, text) = reason(c.broadcast(replacement_short).await.unwrap_err());
    assert_eq!(code, codes::RPC_VERIFY_REJECTED);
    let txid = spend_with_fee(&w, &coin, 2, 2 * needed - 1).compute_txid();
    assert_eq!(
        text,
        format!(
            "insufficient fee, rejecting replacement {txid}, not enough additional fees to relay; {} < {}",
            format_money(needed - 1),
            format_money(needed)
        )
    );
    let replacement = spend_with_fee(&w, &coin, 2, 2 * needed);
    c.broadcast(replacement.clone()).await.unwrap();
    assert!(!c.in_mempool(enough.compute_txid()).await.unwrap());
    assert!(c.in_mempool(replacement.compute_txid()).await.unwrap());
    // And it is mined.
    c.generate_to_address(1, &miner()).await.unwrap();
    assert!(!c.in_mempool(replacement.compute_txid()).await.unwrap());
    node.shutdown().await;
}

/// Core 30 reports every script failure of an unconfirmed transaction as
/// `mempool-script-verify-flag-failed (…)`, consensus or policy alike.
#[tokio::test]
async fn script_failures_use_core_30_texts() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let w = wallet();
    let coin = fund(&c, &w, KeyPath::receive(0), Amount::from_sat(100_000)).await;
    let mut tx = spend_with_fee(&w, &coin, 1, 500);
    // Signed for another amount: the signature fails by consensus.
    tx.output[0].value -= Amount::from_sat(1);
    let e = c.broadcast(tx.clone()).await.unwrap_err();
    assert_eq!(e.reject_category(), Some(RejectCategory::Invalid));
    let (code, text) = reason(e);
    assert_eq!(code, codes::RPC_VERIFY_REJECTED);
    assert!(
        text.starts_with("mempool-script-verify-flag-failed ("),
        "{text}"
    );
    // Core's debug part names the input and what it spends.
    let suffix = format!(
        "), input 0 of {} (wtxid {}), spending {}",
        tx.compute_txid(),
        tx.compute_wtxid(),
        coin.outpoint
    );
    assert!(text.ends_with(&suffix), "{text}");
    let r = c.test_mempool_accept(&[tx]).await.unwrap();
    assert_eq!(
        r[0].reject_reason.as_deref(),
        Some(&text[..text.len() - suffix.len() + 1])
    );
    node.shutdown().await;
}
