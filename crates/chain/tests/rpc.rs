//! The development chain driven over real HTTP JSON-RPC with `BitcoindRpc`:
//! Core's error codes for each rejection, reorgs in the tip stream, a wallet
//! spend mined end to end, and restarts.

// A failed unwrap is how a test reports failure.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bitcoin::absolute::LockTime;
use bitcoin::blockdata::opcodes::all::{OP_CHECKSIG, OP_CLTV, OP_CSV, OP_DROP};
use bitcoin::hashes::Hash as _;
use bitcoin::script::Builder;
use bitcoin::secp256k1::Message;
use bitcoin::sighash::{EcdsaSighashType, SighashCache};
use bitcoin::transaction::Version;
use bitcoin::{
    Address, Amount, FeeRate, Network, OutPoint, ScriptBuf, Sequence, Transaction, TxIn, TxOut,
    Witness,
};
use chain::rpc::codes;
use chain::{
    Auth, BitcoindRpc, Chain, ChainError, DevChain, DevChainConfig, RpcConfig, RpcError,
    RunningDevChain, TipEvent,
};
use wallet::{KeyPath, SpendableOutput, Wallet};

async fn start(dir: &std::path::Path) -> (RunningDevChain, BitcoindRpc) {
    let mut config = DevChainConfig::new(dir);
    config.rpc_bind = Some("127.0.0.1:0".parse().unwrap());
    let running = DevChain::start(config).await.unwrap();
    let mut rpc = RpcConfig::new(
        running.rpc_url().unwrap(),
        Auth::Cookie(running.cookie.clone().unwrap()),
    );
    rpc.tip_poll = Duration::from_millis(20);
    rpc.timeout = Duration::from_secs(20);
    let client = BitcoindRpc::new(rpc).unwrap();
    (running, client)
}

fn wallet() -> Wallet {
    Wallet::from_seed(&[9u8; 32], Network::Regtest).unwrap()
}

fn other_address() -> Address {
    Wallet::from_seed(&[3u8; 32], Network::Regtest)
        .unwrap()
        .derive_address(0, 0)
        .unwrap()
}

/// Pays `amount` to `script` from the faucet, mines it, returns the outpoint and output.
async fn fund_script(c: &BitcoindRpc, script: &ScriptBuf, amount: Amount) -> (OutPoint, TxOut) {
    let address = Address::from_script(script, Network::Regtest).unwrap();
    let txid = c.send_to_address(&address, amount).await.unwrap();
    c.generate_to_address(1, &other_address()).await.unwrap();
    let status = c.transaction(txid).await.unwrap().unwrap();
    assert_eq!(status.confirmations, 1);
    let vout = status
        .tx
        .output
        .iter()
        .position(|o| &o.script_pubkey == script)
        .unwrap();
    (
        OutPoint {
            txid,
            vout: vout as u32,
        },
        status.tx.output[vout].clone(),
    )
}

async fn fund(c: &BitcoindRpc, w: &Wallet, path: KeyPath, amount: Amount) -> SpendableOutput {
    let script = w.derive(path).unwrap().address.script_pubkey();
    let (outpoint, txout) = fund_script(c, &script, amount).await;
    SpendableOutput {
        outpoint,
        txout,
        path,
    }
}

fn rejected(err: ChainError) -> (i32, String) {
    match err {
        ChainError::Rejected { code, reason, .. } => (code, reason),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[tokio::test]
async fn wallet_spend_is_mined_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let w = wallet();
    let coin = fund(&c, &w, KeyPath::receive(0), Amount::from_sat(1_000_000)).await;
    assert_eq!(
        c.unspent_output(coin.outpoint)
            .await
            .unwrap()
            .unwrap()
            .value,
        Amount::from_sat(1_000_000)
    );

    let to = w.derive_address(0, 1).unwrap().script_pubkey();
    let change = w.derive_address(1, 0).unwrap().script_pubkey();
    let pay = TxOut {
        value: Amount::from_sat(300_000),
        script_pubkey: to.clone(),
    };
    let rate = FeeRate::from_sat_per_vb(3).unwrap();
    let built = w
        .build_signed(std::slice::from_ref(&coin), &[pay], Some(&change), rate)
        .unwrap();
    let txid = c.broadcast(built.tx.clone()).await.unwrap();
    assert_eq!(txid, built.tx.compute_txid());
    assert!(c.in_mempool(txid).await.unwrap());
    assert!(c.get_raw_mempool().await.unwrap().contains(&txid));
    // Broadcasting again is harmless, as with Core.
    assert_eq!(c.broadcast(built.tx.clone()).await.unwrap(), txid);
    // The spent output is gone from gettxout (mempool spends count).
    assert!(c.unspent_output(coin.outpoint).await.unwrap().is_none());

    let hashes = c.generate_to_address(1, &other_address()).await.unwrap();
    assert!(!c.in_mempool(txid).await.unwrap());
    let status = c.transaction(txid).await.unwrap().unwrap();
    assert_eq!(status.confirmations, 1);
    assert_eq!(status.block_hash, Some(hashes[0]));
    let out = c
        .unspent_output(OutPoint { txid, vout: 0 })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (out.value, out.confirmations, out.script_pubkey),
        (Amount::from_sat(300_000), 1, to)
    );

    // getblock verbosity 2 reports the fee the wallet computed.
    let block = c.get_block_verbose(&hashes[0], 2).await.unwrap();
    let tx = block["tx"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["txid"] == txid.to_string())
        .unwrap();
    let fee_sat = (tx["fee"].as_f64().unwrap() * 1e8).round() as u64;
    assert_eq!(fee_sat, built.fee.to_sat());
    assert_eq!(tx["vin"][0]["txinwitness"].as_array().unwrap().len(), 2);
    assert_eq!(tx["vout"][0]["scriptPubKey"]["type"], "witness_v0_keyhash");
    // The decoded block matches the header count and the raw block.
    let raw = c.get_block(&hashes[0]).await.unwrap();
    assert_eq!(raw.txdata.len() as u64, block["nTx"].as_u64().unwrap());
    assert!(raw.check_witness_commitment());
    node.shutdown().await;
}

#[tokio::test]
async fn bad_signature_is_rejected_with_26() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let w = wallet();
    let coin = fund(&c, &w, KeyPath::receive(0), Amount::from_sat(500_000)).await;
    let to = w.derive_address(0, 1).unwrap().script_pubkey();
    let rate = FeeRate::from_sat_per_vb(2).unwrap();
    let mut built = w
        .build_signed(std::slice::from_ref(&coin), &[], Some(&to), rate)
        .unwrap();
    let mut items = built.tx.input[0].witness.to_vec();
    items[0][10] ^= 0x01; // inside R of the DER signature
    built.tx.input[0].witness = Witness::from_slice(&items);
    let (code, reason) = rejected(c.broadcast(built.tx.clone()).await.unwrap_err());
    assert_eq!(code, codes::RPC_VERIFY_REJECTED);
    assert!(
        reason.starts_with("mempool-script-verify-flag-failed"),
        "{reason}"
    );
    // testmempoolaccept says the same without broadcasting.
    let r = c.test_mempool_accept(&[built.tx]).await.unwrap();
    assert!(!r[0].allowed);
    assert!(r[0]
        .reject_reason
        .as_deref()
        .unwrap()
        .starts_with("mempool-script-verify-flag-failed"));
    node.shutdown().await;
}

#[tokio::test]
async fn immature_coinbase_spend_is_rejected_until_100_deep() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let w = wallet();
    let address = w.derive_address(0, 5).unwrap();
    let hash = c.generate_to_address(1, &address).await.unwrap()[0];
    let block = c.get_block(&hash).await.unwrap();
    let coinbase = &block.txdata[0];
    let coin = SpendableOutput {
        outpoint: OutPoint {
            txid: coinbase.compute_txid(),
            vout: 0,
        },
        txout: coinbase.output[0].clone(),
        path: KeyPath::receive(5),
    };
    let to = w.derive_address(0, 6).unwrap().script_pubkey();
    let rate = FeeRate::from_sat_per_vb(1).unwrap();
    let built = w
        .build_signed(std::slice::from_ref(&coin), &[], Some(&to), rate)
        .unwrap();
    let (code, reason) = rejected(c.broadcast(built.tx.clone()).await.unwrap_err());
    assert_eq!(code, codes::RPC_VERIFY_REJECTED);
    assert_eq!(
        reason,
        "bad-txns-premature-spend-of-coinbase, tried to spend coinbase at depth 1"
    );
    // 98 more blocks: depth 99 in the next block, still immature.
    c.generate_to_address(98, &other_address()).await.unwrap();
    let (_, reason) = rejected(c.broadcast(built.tx.clone()).await.unwrap_err());
    assert!(reason.ends_with("depth 99"), "{reason}");
    c.generate_to_address(1, &other_address()).await.unwrap();
    c.broadcast(built.tx).await.unwrap();
    node.shutdown().await;
}

#[tokio::test]
async fn double_spends_are_replaced_only_by_better_fees() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let w = wallet();
    let coin = fund(&c, &w, KeyPath::receive(0), Amount::from_sat(200_000)).await;
    let a = w.derive_address(0, 1).unwrap().script_pubkey();
    let b = w.derive_address(0, 2).unwrap().script_pubkey();
    let sweep = |to: &ScriptBuf, rate: u64| {
        w.build_signed(
            std::slice::from_ref(&coin),
            &[],
            Some(to),
            FeeRate::from_sat_per_vb(rate).unwrap(),
        )
        .unwrap()
    };
    let first = sweep(&a, 2);
    // Same fee rate: Core 28 (full RBF) refuses to replace.
    let same = sweep(&b, 2);
    // Much more: replaces the first.
    let better = sweep(&b, 50);
    c.broadcast(first.tx.clone()).await.unwrap();
    let (code, reason) = rejected(c.broadcast(same.tx.clone()).await.unwrap_err());
    assert_eq!(code, codes::RPC_VERIFY_REJECTED);
    assert!(
        reason.starts_with("insufficient fee, rejecting replacement"),
        "{reason}"
    );
    c.broadcast(better.tx.clone()).await.unwrap();
    assert!(!c.in_mempool(first.tx.compute_txid()).await.unwrap());
    assert!(c.in_mempool(better.tx.compute_txid()).await.unwrap());
    // With full RBF off, first seen wins whatever the fee.
    node.chain
        .with_state_mut(|s| s.set_full_rbf(false))
        .unwrap();
    let (code, reason) = rejected(c.broadcast(sweep(&a, 90).tx).await.unwrap_err());
    assert_eq!(
        (code, reason.as_str()),
        (codes::RPC_VERIFY_REJECTED, "txn-mempool-conflict")
    );
    c.generate_to_address(1, &other_address()).await.unwrap();
    let (code, reason) = rejected(c.broadcast(first.tx).await.unwrap_err());
    assert_eq!(
        (code, reason.as_str()),
        (codes::RPC_VERIFY_ERROR, "bad-txns-inputs-missingorspent")
    );
    // The confirmed one again: already in chain.
    let (code, _) = rejected(c.broadcast(better.tx).await.unwrap_err());
    assert_eq!(code, codes::RPC_VERIFY_ALREADY_IN_CHAIN);
    node.shutdown().await;
}

#[tokio::test]
async fn zero_fee_is_rejected_with_min_relay_fee() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let w = wallet();
    let coin = fund(&c, &w, KeyPath::receive(0), Amount::from_sat(100_000)).await;
    let mut tx = Transaction {
        version: Version::TWO,
        lock_time: LockTime::ZERO,
        input: vec![TxIn {
            previous_output: coin.outpoint,
            ..TxIn::default()
        }],
        output: vec![TxOut {
            value: coin.txout.value,
            script_pubkey: w.derive_address(0, 1).unwrap().script_pubkey(),
        }],
    };
    w.sign(&mut tx, std::slice::from_ref(&coin)).unwrap();
    let (code, reason) = rejected(c.broadcast(tx.clone()).await.unwrap_err());
    assert_eq!(code, codes::RPC_VERIFY_REJECTED);
    // Core 30's 0.1 sat/vB, rounded up as `CFeeRate::GetFee`.
    assert_eq!(
        reason,
        format!("min relay fee not met, 0 < {}", tx.vsize().div_ceil(10))
    );
    node.shutdown().await;
}

/// Signs input 0 of `tx` spending a P2WSH `script` of `value` with `key`.
fn sign_p2wsh(
    tx: &mut Transaction,
    script: &ScriptBuf,
    value: Amount,
    key: &bitcoin::secp256k1::SecretKey,
) {
    let secp = bitcoin::secp256k1::Secp256k1::new();
    let sighash = SighashCache::new(&*tx)
        .p2wsh_signature_hash(0, script, value, EcdsaSighashType::All)
        .unwrap();
    let sig = bitcoin::ecdsa::Signature {
        signature: secp.sign_ecdsa(&Message::from_digest(sighash.to_byte_array()), key),
        sighash_type: EcdsaSighashType::All,
    };
    let mut witness = Witness::new();
    witness.push(sig.to_vec());
    witness.push(script.as_bytes());
    tx.input[0].witness = witness;
}

fn spend_to(
    outpoint: OutPoint,
    value: Amount,
    to: ScriptBuf,
    sequence: u32,
    lock: u32,
) -> Transaction {
    Transaction {
        version: Version::TWO,
        lock_time: LockTime::from_consensus(lock),
        input: vec![TxIn {
            previous_output: outpoint,
            sequence: Sequence(sequence),
            ..TxIn::default()
        }],
        output: vec![TxOut {
            value: value - Amount::from_sat(1_000),
            script_pubkey: to,
        }],
    }
}

#[tokio::test]
async fn premature_csv_spend_is_rejected_until_the_delay() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let w = wallet();
    let key = w.derive(KeyPath::receive(7)).unwrap();
    let script = Builder::new()
        .push_int(10)
        .push_opcode(OP_CSV)
        .push_opcode(OP_DROP)
        .push_slice(key.public_key.to_bytes())
        .push_opcode(OP_CHECKSIG)
        .into_script();
    let (outpoint, txout) = fund_script(
        &c,
        &ScriptBuf::new_p2wsh(&script.wscript_hash()),
        Amount::from_sat(50_000),
    )
    .await;
    let to = w.derive_address(0, 1).unwrap().script_pubkey();
    let mut tx = spend_to(outpoint, txout.value, to, 10, 0);
    sign_p2wsh(&mut tx, &script, txout.value, &key.secret_key);
    // Confirmed at depth 1; 10 blocks are needed.
    let (code, reason) = rejected(c.broadcast(tx.clone()).await.unwrap_err());
    assert_eq!(
        (code, reason.as_str()),
        (codes::RPC_VERIFY_REJECTED, "non-BIP68-final")
    );
    c.generate_to_address(8, &other_address()).await.unwrap();
    let (_, reason) = rejected(c.broadcast(tx.clone()).await.unwrap_err());
    assert_eq!(reason, "non-BIP68-final");
    c.generate_to_address(1, &other_address()).await.unwrap();
    let txid = c.broadcast(tx).await.unwrap();
    c.generate_to_address(1, &other_address()).await.unwrap();
    assert_eq!(c.transaction(txid).await.unwrap().unwrap().confirmations, 1);
    node.shutdown().await;
}

#[tokio::test]
async fn premature_cltv_spend_is_rejected_until_the_height() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let w = wallet();
    let key = w.derive(KeyPath::receive(8)).unwrap();
    let expiry = c.get_block_count().await.unwrap() + 6;
    let script = Builder::new()
        .push_int(i64::from(expiry))
        .push_opcode(OP_CLTV)
        .push_opcode(OP_DROP)
        .push_slice(key.public_key.to_bytes())
        .push_opcode(OP_CHECKSIG)
        .into_script();
    let (outpoint, txout) = fund_script(
        &c,
        &ScriptBuf::new_p2wsh(&script.wscript_hash()),
        Amount::from_sat(50_000),
    )
    .await;
    let to = w.derive_address(0, 1).unwrap().script_pubkey();
    // nLockTime at the expiry: the transaction itself is not final yet.
    let mut tx = spend_to(outpoint, txout.value, to.clone(), 0xffff_fffe, expiry);
    sign_p2wsh(&mut tx, &script, txout.value, &key.secret_key);
    let (code, reason) = rejected(c.broadcast(tx.clone()).await.unwrap_err());
    assert_eq!(
        (code, reason.as_str()),
        (codes::RPC_VERIFY_REJECTED, "non-final")
    );
    // nLockTime below the script's: final, but OP_CHECKLOCKTIMEVERIFY fails.
    let mut early = spend_to(outpoint, txout.value, to, 0xffff_fffe, expiry - 6);
    sign_p2wsh(&mut early, &script, txout.value, &key.secret_key);
    let (code, reason) = rejected(c.broadcast(early).await.unwrap_err());
    assert_eq!(code, codes::RPC_VERIFY_REJECTED);
    assert!(
        reason.starts_with("mempool-script-verify-flag-failed"),
        "{reason}"
    );
    // Once the tip reaches the expiry the next block may include it.
    let tip = c.get_block_count().await.unwrap();
    c.generate_to_address(expiry - tip, &other_address())
        .await
        .unwrap();
    let txid = c.broadcast(tx).await.unwrap();
    c.generate_to_address(1, &other_address()).await.unwrap();
    assert_eq!(c.transaction(txid).await.unwrap().unwrap().confirmations, 1);
    node.shutdown().await;
}

async fn next_event(s: &mut chain::TipStream) -> TipEvent {
    tokio::time::timeout(Duration::from_secs(10), s.next())
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn invalidateblock_reorg_is_reported_with_fork_point() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let mut tips = c.tips();
    let start = tips.start().await.unwrap();
    let hashes = c.generate_to_address(3, &other_address()).await.unwrap();
    for (i, h) in hashes.iter().enumerate() {
        match next_event(&mut tips).await {
            TipEvent::Connected(t) => {
                assert_eq!((t.height, t.hash), (start.height + 1 + i as u32, *h))
            }
            other => panic!("{other:?}"),
        }
    }
    // A transaction mined in the block that goes away returns to the mempool.
    let txid = c
        .send_to_address(&other_address(), Amount::from_sat(10_000))
        .await
        .unwrap();
    let mined = c.generate_to_address(1, &other_address()).await.unwrap()[0];
    assert!(matches!(next_event(&mut tips).await, TipEvent::Connected(t) if t.hash == mined));

    c.invalidate_block(&hashes[1]).await.unwrap();
    assert_eq!(c.get_block_count().await.unwrap(), start.height + 1);
    match next_event(&mut tips).await {
        TipEvent::Reorg {
            fork_point,
            old_tip,
        } => {
            assert_eq!(fork_point.height, start.height + 1);
            assert_eq!(fork_point.hash, hashes[0]);
            assert_eq!(old_tip.hash, mined);
        }
        other => panic!("{other:?}"),
    }
    assert!(c.in_mempool(txid).await.unwrap());
    let header = c.get_block_header_info(&hashes[2]).await.unwrap();
    assert_eq!(header.confirmations, -1);
    // The new branch arrives as Connected events above the fork point.
    let new = c.generate_to_address(2, &other_address()).await.unwrap();
    for (i, h) in new.iter().enumerate() {
        match next_event(&mut tips).await {
            TipEvent::Connected(t) => {
                assert_eq!((t.height, t.hash), (start.height + 2 + i as u32, *h))
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(c.transaction(txid).await.unwrap().unwrap().confirmations, 2);
    // reconsiderblock does not switch: the old branch is longer (4 vs 3 above start)? It is: switch back.
    c.reconsider_block(&hashes[1]).await.unwrap();
    assert_eq!(c.get_best_block_hash().await.unwrap(), mined);
    match next_event(&mut tips).await {
        TipEvent::Reorg { fork_point, .. } => assert_eq!(fork_point.hash, hashes[0]),
        other => panic!("{other:?}"),
    }
    node.shutdown().await;
}

#[tokio::test]
async fn restart_keeps_chain_mempool_and_invalid_marks() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let hashes = c.generate_to_address(5, &other_address()).await.unwrap();
    c.invalidate_block(&hashes[4]).await.unwrap();
    let txid = c
        .send_to_address(&other_address(), Amount::from_sat(20_000))
        .await
        .unwrap();
    let before = c.get_blockchain_info().await.unwrap();
    node.shutdown().await;

    let (node, c) = start(dir.path()).await;
    let after = c.get_blockchain_info().await.unwrap();
    assert_eq!(
        (after.blocks, after.best_block_hash),
        (before.blocks, before.best_block_hash)
    );
    assert_eq!(after.best_block_hash, hashes[3]);
    assert!(c.in_mempool(txid).await.unwrap());
    assert_eq!(
        c.get_block_header_info(&hashes[4])
            .await
            .unwrap()
            .confirmations,
        -1
    );
    // The chain goes on from where it was.
    c.generate_to_address(1, &other_address()).await.unwrap();
    assert_eq!(c.transaction(txid).await.unwrap().unwrap().confirmations, 1);
    node.shutdown().await;
}

#[tokio::test]
async fn client_errors_are_typed() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let err = c.get_block_hash(1_000_000).await.unwrap_err();
    assert!(
        matches!(
            err,
            RpcError::Rpc {
                code: codes::RPC_INVALID_PARAMETER,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(c.block_hash(1_000_000).await.unwrap(), None);
    let err = c
        .call::<serde_json::Value>("nosuchmethod", serde_json::json!([]))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        RpcError::Rpc {
            code: codes::RPC_METHOD_NOT_FOUND,
            message: "Method not found".into()
        }
    );
    let missing = "00".repeat(32).parse().unwrap();
    let err = c.get_block(&missing).await.unwrap_err();
    assert!(matches!(
        err,
        RpcError::Rpc {
            code: codes::RPC_INVALID_ADDRESS_OR_KEY,
            ..
        }
    ));
    let err = c
        .call::<String>("sendrawtransaction", serde_json::json!(["zz"]))
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        RpcError::Rpc {
            code: codes::RPC_DESERIALIZATION_ERROR,
            ..
        }
    ));
    // The chain's estimate, held to the default policy's 1 sat/vB floor.
    assert_eq!(
        c.estimate_fee(6).await.unwrap(),
        FeeRate::from_sat_per_vb(1).unwrap()
    );

    let bad = BitcoindRpc::new(RpcConfig::new(
        node.rpc_url().unwrap(),
        Auth::UserPass("__cookie__".into(), "wrong".into()),
    ))
    .unwrap();
    assert_eq!(
        bad.get_block_count().await.unwrap_err(),
        RpcError::Auth(401)
    );

    // Nothing listens: retried (the request never left), then a connect error.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = RpcConfig::new(
        format!("http://127.0.0.1:{port}/"),
        Auth::UserPass("u".into(), "p".into()),
    );
    cfg.retries = 2;
    let gone = BitcoindRpc::new(cfg).unwrap();
    let t0 = std::time::Instant::now();
    assert!(matches!(
        gone.get_block_count().await.unwrap_err(),
        RpcError::Connect(_)
    ));
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "two back-offs of 100 and 200 ms"
    );
    assert!(matches!(
        BitcoindRpc::new(RpcConfig::new(
            "ftp://x/",
            Auth::UserPass("u".into(), "p".into())
        )),
        Err(RpcError::Config(_))
    ));
    node.shutdown().await;
}

#[tokio::test]
async fn in_process_chain_matches_rpc_view() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let local = node.chain.clone();
    let mut tips = local.tips();
    let start = tips.start().await.unwrap();
    assert_eq!(start, c.tip().await.unwrap());
    c.generate_to_address(1, &other_address()).await.unwrap();
    let TipEvent::Connected(t) = next_event(&mut tips).await else {
        panic!()
    };
    assert_eq!(t, c.tip().await.unwrap());
    let block = local.block(t.hash).await.unwrap();
    assert_eq!(block, c.block(t.hash).await.unwrap());
    assert_eq!(local.block_at(t.height).await.unwrap(), Some(block));
    node.shutdown().await;
}

#[tokio::test]
async fn silent_server_times_out() {
    // Accepts connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            open.push(sock);
        }
    });
    let mut cfg = RpcConfig::new(
        format!("http://{addr}/"),
        Auth::UserPass("u".into(), "p".into()),
    );
    cfg.timeout = Duration::from_millis(200);
    cfg.retries = 1;
    let c = BitcoindRpc::new(cfg).unwrap();
    let t0 = std::time::Instant::now();
    assert_eq!(
        c.get_block_count().await.unwrap_err(),
        RpcError::Timeout(Duration::from_millis(200))
    );
    // One retry after 100 ms: two time-outs and a back-off.
    assert!(t0.elapsed() >= Duration::from_millis(500));
    hold.abort();
}

#[tokio::test]
async fn unconfirmed_chains_relay_and_confirm_together() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    // The second faucet payment spends the first one's unconfirmed change.
    let a = c
        .send_to_address(&other_address(), Amount::from_sat(30_000))
        .await
        .unwrap();
    let b = c
        .send_to_address(&other_address(), Amount::from_sat(40_000))
        .await
        .unwrap();
    let entry: serde_json::Value = c
        .call("getmempoolentry", serde_json::json!([b.to_string()]))
        .await
        .unwrap();
    assert_eq!(entry["depends"], serde_json::json!([a.to_string()]));
    let verbose: serde_json::Value = c
        .call("getrawmempool", serde_json::json!([true]))
        .await
        .unwrap();
    assert_eq!(verbose.as_object().unwrap().len(), 2);
    let hash = c.generate_to_address(1, &other_address()).await.unwrap()[0];
    let block = c.get_block(&hash).await.unwrap();
    let txids: Vec<_> = block.txdata.iter().map(|t| t.compute_txid()).collect();
    assert_eq!(&txids[1..], &[a, b]);
    assert!(c.get_raw_mempool().await.unwrap().is_empty());
    node.shutdown().await;
}

/// One raw HTTP exchange: status code and JSON body.
async fn raw_post(addr: std::net::SocketAddr, auth: &str, body: &str) -> (u16, serde_json::Value) {
    use base64::Engine as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let token = base64::engine::general_purpose::STANDARD.encode(auth);
    let req = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {token}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    let status: u16 = text[9..12].parse().unwrap();
    let json = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (
        status,
        serde_json::from_str(json).unwrap_or(serde_json::Value::Null),
    )
}

#[tokio::test]
async fn http_behaviour_matches_core() {
    let dir = tempfile::tempdir().unwrap();
    let (node, _c) = start(dir.path()).await;
    let addr = node.rpc_addr.unwrap();
    let auth = std::fs::read_to_string(node.cookie.as_ref().unwrap()).unwrap();

    // JSON-RPC 1.0: errors are HTTP 500, an unknown method 404.
    let (status, body) = raw_post(
        addr,
        &auth,
        r#"{"id":7,"method":"getblockhash","params":[1000000]}"#,
    )
    .await;
    assert_eq!(status, 500);
    assert_eq!(body["error"]["code"], -8);
    assert_eq!(body["error"]["message"], "Block height out of range");
    assert_eq!(
        (body["id"].clone(), body["result"].clone()),
        (serde_json::json!(7), serde_json::Value::Null)
    );
    let (status, body) = raw_post(addr, &auth, r#"{"id":1,"method":"nosuch"}"#).await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (404, serde_json::json!(-32601))
    );
    let (status, body) = raw_post(addr, &auth, "{not json").await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (500, serde_json::json!(-32700))
    );

    // JSON-RPC 2.0: HTTP 200, no `result` member on errors.
    let (status, body) = raw_post(
        addr,
        &auth,
        r#"{"jsonrpc":"2.0","id":"a","method":"getblockhash","params":[1000000]}"#,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["error"]["code"], -8);
    assert!(body.get("result").is_none());

    // Named parameters and batches.
    let (status, body) = raw_post(
        addr,
        &auth,
        r#"{"id":1,"method":"getblockhash","params":{"height":0}}"#,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        body["result"],
        "0f9188f13cb7b2c71f2a335e3a4fc328bf5beb436012afca590b1a11466e2206"
    );
    let (status, body) = raw_post(
        addr,
        &auth,
        r#"[{"id":1,"method":"getblockcount"},{"id":2,"method":"nosuch"}]"#,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body[0]["result"], 101);
    assert_eq!(body[1]["error"]["code"], -32601);

    // Wrong type of a parameter: -3, as Core.
    let (_, body) = raw_post(
        addr,
        &auth,
        r#"{"id":1,"method":"getblockhash","params":["zero"]}"#,
    )
    .await;
    assert_eq!(body["error"]["code"], -3);
    // Bad credentials: 401 without a body.
    let (status, body) = raw_post(addr, "__cookie__:nope", r#"{"method":"getblockcount"}"#).await;
    assert_eq!((status, body), (401, serde_json::Value::Null));
    node.shutdown().await;
}

#[tokio::test]
async fn absurd_fee_is_refused_unless_maxfeerate_is_zero() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let w = wallet();
    let coin = fund(&c, &w, KeyPath::receive(0), Amount::from_sat(2_000_000)).await;
    let pay = TxOut {
        value: Amount::from_sat(1_000),
        script_pubkey: other_address().script_pubkey(),
    };
    // No change: 1,999,000 sat of fee on 110 vB, above 0.10 BTC/kvB.
    let built = w
        .build_signed(
            std::slice::from_ref(&coin),
            &[pay],
            None,
            FeeRate::from_sat_per_vb(1).unwrap(),
        )
        .unwrap();
    let (code, reason) = rejected(c.broadcast(built.tx.clone()).await.unwrap_err());
    assert_eq!(code, codes::RPC_VERIFY_ERROR);
    assert_eq!(
        reason,
        "Fee exceeds maximum configured by user (e.g. -maxtxfee, maxfeerate)"
    );
    // In process, the same guard.
    let local = node.chain.clone();
    assert!(matches!(
        local.broadcast(built.tx.clone()).await,
        Err(ChainError::Rejected { code: -25, .. })
    ));
    let hex = bitcoin::consensus::encode::serialize_hex(&built.tx);
    let txid: bitcoin::Txid = c
        .call("sendrawtransaction", serde_json::json!([hex, 0]))
        .await
        .unwrap();
    assert_eq!(txid, built.tx.compute_txid());
    node.shutdown().await;
}
