//! End to end on the development chain: every kind of transaction the state
//! machine produces (anchor, commitment, cooperative close, delayed claims,
//! HTLC claims with R and after expiry, penalty) is broadcast through the
//! chain's real JSON-RPC and mined, in the order the scenario produced it.
//!
//! The scenarios run against the in-memory harness (tests/support), whose
//! anchor spends a real faucet coin; every transaction the harness "mined"
//! is then replayed on a `DevChain` over `sendrawtransaction`, mining blocks
//! until its relative and absolute locks allow it, and must confirm.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

mod support;

use bitcoin::consensus::encode::serialize_hex;
use bitcoin::{Address, Network, OutPoint, Transaction, Txid};
use chain::{Auth, BitcoindRpc, DevChain, DevChainConfig, RpcConfig};
use channel::{ChannelConfig, State};
use secp256k1::{PublicKey, Secp256k1};
use serde_json::{json, Value};
use support::{Pair, A, ANCHOR_SAT, B};
use wire::{Locktime, Preimage};

struct Dev {
    rpc: BitcoindRpc,
    burn: String,
    _running: chain::RunningDevChain,
    _dir: tempfile::TempDir,
}

impl Dev {
    async fn start() -> Dev {
        let dir = tempfile::tempdir().unwrap();
        let running = DevChain::start(DevChainConfig {
            data_dir: dir.path().join("chain"),
            block_interval: None,
            rpc_bind: Some("127.0.0.1:0".parse().unwrap()),
            rpc_auth: Some(("u".into(), "p".into())),
        })
        .await
        .unwrap();
        let url = running.rpc_url().unwrap();
        let rpc =
            BitcoindRpc::new(RpcConfig::new(url, Auth::UserPass("u".into(), "p".into()))).unwrap();
        let burn = address(&channel::tx::p2wpkh(&support::final_pubkey(77)));
        Dev {
            rpc,
            burn,
            _running: running,
            _dir: dir,
        }
    }

    async fn call(&self, method: &str, params: Value) -> Result<Value, String> {
        self.rpc
            .call::<Value>(method, params)
            .await
            .map_err(|e| e.to_string())
    }

    async fn mine(&self, n: u32) {
        self.call("generatetoaddress", json!([n, self.burn]))
            .await
            .unwrap();
    }

    async fn height(&self) -> u32 {
        self.call("getblockcount", json!([]))
            .await
            .unwrap()
            .as_u64()
            .unwrap() as u32
    }

    /// A confirmed coin of anchor + 1,000 sat paying the harness's wallet key.
    async fn funding_coin(&self) -> OutPoint {
        let key = PublicKey::from_secret_key(&Secp256k1::new(), &support::wallet_key());
        let script = channel::tx::p2wpkh(&key);
        let sat = ANCHOR_SAT + 1_000;
        let txid = self
            .call("sendtoaddress", json!([address(&script), sat as f64 / 1e8]))
            .await
            .unwrap();
        let txid: Txid = txid.as_str().unwrap().parse().unwrap();
        self.mine(1).await;
        let tx = self
            .call("getrawtransaction", json!([txid.to_string(), true]))
            .await
            .unwrap();
        let vout = tx["vout"]
            .as_array()
            .unwrap()
            .iter()
            .position(|o| (o["value"].as_f64().unwrap() * 1e8).round() as u64 == sat)
            .unwrap();
        OutPoint {
            txid,
            vout: vout as u32,
        }
    }

    /// Broadcasts `tx` (mining blocks while its locks are not yet satisfied), mines it, and
    /// checks that it confirmed.
    async fn replay(&self, tx: &Transaction, what: &str) {
        let hex = serialize_hex(tx);
        let mut tries = 0;
        loop {
            match self.call("sendrawtransaction", json!([hex])).await {
                Ok(_) => break,
                Err(e) if e.contains("non-final") || e.contains("non-BIP68-final") => {
                    tries += 1;
                    assert!(tries < 300, "{what} never became final: {e}");
                    self.mine(1).await;
                }
                Err(e) => panic!("{what} rejected by the development chain: {e}\n{tx:#?}"),
            }
        }
        self.mine(1).await;
        let status = self
            .call(
                "getrawtransaction",
                json!([tx.compute_txid().to_string(), true]),
            )
            .await
            .unwrap();
        assert!(
            status["confirmations"].as_u64().unwrap_or(0) >= 1,
            "{what} not confirmed: {status}"
        );
    }

    /// Replays what the harness mined since `from`, labelling each transaction by its kind.
    async fn replay_all(&self, p: &Pair, from: usize, kinds: &mut Vec<String>) -> usize {
        for tx in &p.chain.mined[from..] {
            let what = kind(p, tx);
            self.replay(tx, &what).await;
            kinds.push(what);
        }
        p.chain.mined.len()
    }
}

fn address(script: &bitcoin::Script) -> String {
    Address::from_script(script, Network::Regtest)
        .unwrap()
        .to_string()
}

/// What a mined transaction is, from its shape (for messages and the coverage check).
fn kind(p: &Pair, tx: &Transaction) -> String {
    let anchor = p.a.ch.anchor_outpoint();
    let spends_anchor = tx.input.iter().any(|i| Some(i.previous_output) == anchor);
    if spends_anchor {
        if channel::tx::commitment_number(tx).is_some() {
            return "commitment".into();
        }
        return "close".into();
    }
    if anchor.is_some_and(|a| a.txid == tx.compute_txid()) {
        return "anchor".into();
    }
    if tx.input.len() > 1 {
        return "penalty".into();
    }
    let w = &tx.input[0].witness;
    // Sweeps: P2WPKH (2 items), script paths (signature, secret, script).
    match w.len() {
        2 => "sweep_p2wpkh".into(),
        3 => {
            let secret = w.nth(1).map(<[u8]>::len).unwrap_or(0);
            if secret == 32 {
                "htlc_claim_with_r".into()
            } else if tx.lock_time.to_consensus_u32() > 0 {
                "htlc_refund_after_expiry".into()
            } else {
                "delayed_claim".into()
            }
        }
        _ => "other".into(),
    }
}

fn r(n: u8) -> Preimage {
    Preimage([n; 32])
}

fn pair_on(dev_height: u32, config: ChannelConfig) -> Pair {
    let mut p = Pair::new(true, config);
    // The harness's heights follow the real chain, so absolute expiries mean the same on both.
    p.chain.height = dev_height;
    p
}

#[tokio::test(flavor = "current_thread")]
async fn every_transaction_kind_is_mined_on_the_development_chain() {
    let dev = Dev::start().await;
    let mut kinds = Vec::new();

    // 1. Anchor, payments, HTLCs, cooperative close.
    let coin = dev.funding_coin().await;
    let mut p = pair_on(dev.height().await, ChannelConfig::default());
    p.open_with(Some(coin));
    p.pay(A, 1_000_000_000);
    p.close(B);
    assert_eq!(p.a.ch.state(), State::Closed);
    dev.replay_all(&p, 0, &mut kinds).await;

    // 2. A unilateral close with HTLCs both ways: A's delayed claim, B's direct output,
    //    B claims A's HTLC with R, A claims B's HTLC with R after the delay.
    let coin = dev.funding_coin().await;
    let cfg = ChannelConfig {
        delay: Locktime::Blocks(5),
        ..Default::default()
    };
    let mut p = pair_on(dev.height().await, cfg.clone());
    p.open_with(Some(coin));
    p.pay(A, 2_000_000_000);
    let expiry = p.chain.height + 40;
    p.add_htlc(A, 500_000_000, r(5).hash(), Locktime::Blocks(expiry));
    p.add_htlc(B, 300_000_000, r(6).hash(), Locktime::Blocks(expiry));
    p.a.act(|ch| ch.force_close());
    p.mine_broadcasts();
    p.b.act(|ch| ch.fulfill_htlc(r(5), p.now));
    p.mine_broadcasts();
    p.a.act(|ch| ch.fulfill_htlc(r(6), p.now));
    p.mine_broadcasts();
    let later = std::mem::take(&mut p.a.later);
    p.advance(5);
    for (tx, _, lock) in later {
        // The refund of A's HTLC lost the race to B's claim with R; everything else is minable.
        if lock == 0 {
            p.chain.mine(&tx).unwrap();
        }
    }
    dev.replay_all(&p, 0, &mut kinds).await;

    // 3. Their unilateral close: we sweep our direct output and refund our HTLC after expiry.
    let coin = dev.funding_coin().await;
    let mut p = pair_on(dev.height().await, cfg.clone());
    p.open_with(Some(coin));
    p.pay(A, 2_000_000_000);
    // The receiver needs its claim delay (5) plus the margin (6) before the expiry.
    let expiry = p.chain.height + 12;
    p.add_htlc(A, 700_000_000, r(8).hash(), Locktime::Blocks(expiry));
    p.b.act(|ch| ch.force_close());
    p.mine_broadcasts();
    let later = std::mem::take(&mut p.a.later);
    p.advance(12);
    for (tx, _, _) in later {
        p.chain.mine(&tx).unwrap();
    }
    dev.replay_all(&p, 0, &mut kinds).await;

    // 4. A revoked commitment: the penalty takes every output.
    let coin = dev.funding_coin().await;
    let mut p = pair_on(dev.height().await, cfg.clone());
    p.open_with(Some(coin));
    p.pay(A, 4_000_000_000);
    let h = p.chain.height;
    p.add_htlc(A, 100_000_000, r(1).hash(), Locktime::Blocks(h + 30));
    let old = p.a.ch.signed_commitment().unwrap();
    p.pay(A, 1_000_000_000);
    p.chain.mine(&old).unwrap();
    p.b.spend_seen(&old);
    let penalty = p.b.broadcast.pop().unwrap();
    assert_eq!(penalty.input.len(), old.output.len());
    p.chain.mine(&penalty).unwrap();
    dev.replay_all(&p, 0, &mut kinds).await;

    eprintln!("mined on the development chain: {kinds:?}");
    for want in [
        "anchor",
        "close",
        "commitment",
        "delayed_claim",
        "sweep_p2wpkh",
        "htlc_claim_with_r",
        "htlc_refund_after_expiry",
        "penalty",
    ] {
        assert!(
            kinds.iter().any(|k| k == want),
            "no {want} was mined: {kinds:?}"
        );
    }
}

#[test]
fn a_channel_snapshot_round_trips_through_json() {
    // The node persists channels as serde JSON: every field must come back, mid-update too.
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.a.act(|ch| {
        ch.add_htlc(
            100_000_000,
            r(3).hash(),
            Locktime::Blocks(p.chain.height + 160),
            p.now,
        )
    });
    p.deliver_one(true);
    p.deliver_one(false);
    for ch in [&p.a.ch, &p.b.ch] {
        let json = serde_json::to_string(ch).unwrap();
        let back: channel::Channel = serde_json::from_str(&json).unwrap();
        assert_eq!(&back, ch);
    }
    assert_eq!(p.a.ch.state(), State::WaitComplete);
    p.run();
    p.assert_agree();
}
