//! Where the development chain must answer as Bitcoin Core 28 does, checked
//! through the same client that talks to Core: what a refusal means (-25
//! against -27), transient refusals, warm-up, fee estimates, the node checks
//! at start, package limits, restarts that keep the active chain, and the
//! RPC server's limits.

// A failed unwrap is how a test reports failure.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bitcoin::absolute::LockTime;
use bitcoin::{Address, Amount, FeeRate, Network, OutPoint, Transaction};
use chain::rpc::codes;
use chain::{
    Auth, BitcoindRpc, BroadcastOutcome, Chain, ChainError, DevChain, DevChainConfig,
    RejectCategory, RpcConfig, RpcError, RunningDevChain,
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

/// Pays `amount` from the faucet to `path`, mines it.
async fn fund(c: &BitcoindRpc, w: &Wallet, path: KeyPath, amount: Amount) -> SpendableOutput {
    let address = w.derive(path).unwrap().address;
    let txid = c.send_to_address(&address, amount).await.unwrap();
    c.generate_to_address(1, &other_address()).await.unwrap();
    let status = c.transaction(txid).await.unwrap().unwrap();
    let vout = status
        .tx
        .output
        .iter()
        .position(|o| o.script_pubkey == address.script_pubkey())
        .unwrap();
    SpendableOutput {
        outpoint: OutPoint {
            txid,
            vout: vout as u32,
        },
        txout: status.tx.output[vout].clone(),
        path,
    }
}

/// Spends `coin` whole to `to` (no change) at 2 sat/vB.
fn spend_all(w: &Wallet, coin: &SpendableOutput, to: KeyPath) -> Transaction {
    let script = w.derive(to).unwrap().address.script_pubkey();
    w.build_signed(
        std::slice::from_ref(coin),
        &[],
        Some(&script),
        FeeRate::from_sat_per_vb(2).unwrap(),
    )
    .unwrap()
    .tx
}

fn output_of(tx: &Transaction, path: KeyPath) -> SpendableOutput {
    SpendableOutput {
        outpoint: OutPoint {
            txid: tx.compute_txid(),
            vout: 0,
        },
        txout: tx.output[0].clone(),
        path,
    }
}

fn category(e: &ChainError) -> (i32, RejectCategory) {
    match e {
        ChainError::Rejected { code, category, .. } => (*code, *category),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// The double-credit case: Core answers -27 for a mined transaction only
/// while one of its outputs is unspent, and -25 `bad-txns-inputs-missingorspent`
/// once all are spent. A caller that undoes on anything but -27 pays twice.
#[tokio::test]
async fn rebroadcast_of_a_mined_fully_spent_transaction_is_inputs_spent_not_failed() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let w = wallet();
    let coin = fund(&c, &w, KeyPath::receive(0), Amount::from_sat(500_000)).await;
    let withdrawal = spend_all(&w, &coin, KeyPath::receive(1));
    let txid = c.broadcast(withdrawal.clone()).await.unwrap();
    let block = c.generate_to_address(1, &other_address()).await.unwrap()[0];

    // Its output is unspent: -27, already known.
    let e = c.broadcast(withdrawal.clone()).await.unwrap_err();
    assert_eq!(
        category(&e),
        (
            codes::RPC_VERIFY_ALREADY_IN_CHAIN,
            RejectCategory::AlreadyKnown
        )
    );

    // Its only output is spent and mined too.
    let onward = spend_all(
        &w,
        &output_of(&withdrawal, KeyPath::receive(1)),
        KeyPath::receive(2),
    );
    c.broadcast(onward).await.unwrap();
    c.generate_to_address(1, &other_address()).await.unwrap();

    let e = c.broadcast(withdrawal.clone()).await.unwrap_err();
    assert_eq!(
        category(&e),
        (codes::RPC_VERIFY_ERROR, RejectCategory::InputsSpent)
    );
    assert!(e.is_inputs_spent() && !e.is_invalid() && !e.is_already_known());
    // With a transaction index the outcome finds it mined.
    assert_eq!(
        c.broadcast_outcome(withdrawal.clone()).await.unwrap(),
        BroadcastOutcome::Accepted
    );
    // Without one (Core's default), it is not found, and still never "failed".
    node.chain.set_txindex(false);
    assert!(c.transaction(txid).await.unwrap().is_none());
    assert!(matches!(
        c.broadcast_outcome(withdrawal.clone()).await.unwrap(),
        BroadcastOutcome::Pending(ref e) if e.is_inputs_spent()
    ));
    // The block hint of a block scan finds it without the index.
    let found = c.transaction_in_block(txid, block).await.unwrap().unwrap();
    assert_eq!((found.confirmations, found.block_hash), (2, Some(block)));
    // In process, the same answers.
    let local = node.chain.clone();
    assert!(local
        .broadcast(withdrawal)
        .await
        .unwrap_err()
        .is_inputs_spent());
    node.shutdown().await;
}

/// A conflict or an invalid transaction is `Failed` only when it is in
/// neither the mempool nor a block.
#[tokio::test]
async fn invalid_and_conflicting_refusals_are_classified() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let w = wallet();
    let coin = fund(&c, &w, KeyPath::receive(0), Amount::from_sat(300_000)).await;
    let first = spend_all(&w, &coin, KeyPath::receive(1));
    let second = spend_all(&w, &coin, KeyPath::receive(2));
    c.broadcast(first).await.unwrap();
    let e = c.broadcast(second.clone()).await.unwrap_err();
    assert_eq!(category(&e).1, RejectCategory::Conflict);
    assert!(matches!(
        c.broadcast_outcome(second).await.unwrap(),
        BroadcastOutcome::Pending(_)
    ));
    // A transaction paying more than it spends can never be valid.
    let coin2 = fund(&c, &w, KeyPath::receive(3), Amount::from_sat(300_000)).await;
    let mut bad = spend_all(&w, &coin2, KeyPath::receive(4));
    bad.output[0].value = Amount::from_sat(400_000);
    let e = c.broadcast(bad.clone()).await.unwrap_err();
    assert!(e.is_invalid(), "{e:?}");
    assert!(matches!(
        c.broadcast_outcome(bad).await.unwrap(),
        BroadcastOutcome::Failed(_)
    ));
    node.shutdown().await;
}

/// `non-final` and `mempool min fee not met` are refusals for now: the same
/// transaction is accepted later.
#[tokio::test]
async fn transient_refusals_later_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let w = wallet();
    let coin = fund(&c, &w, KeyPath::receive(0), Amount::from_sat(300_000)).await;
    let height = c.get_block_count().await.unwrap();
    // Final only in block height + 2.
    let script = w
        .derive(KeyPath::receive(1))
        .unwrap()
        .address
        .script_pubkey();
    let mut built = wallet::build_transaction(
        std::slice::from_ref(&coin),
        &[],
        Some(&script),
        FeeRate::from_sat_per_vb(2).unwrap(),
    )
    .unwrap();
    built.tx.lock_time = LockTime::from_height(height + 1).unwrap();
    built.tx.input[0].sequence = bitcoin::Sequence::ENABLE_LOCKTIME_NO_RBF;
    w.sign(&mut built.tx, std::slice::from_ref(&coin)).unwrap();
    let e = c.broadcast(built.tx.clone()).await.unwrap_err();
    assert_eq!(category(&e).1, RejectCategory::Transient, "{e:?}");
    assert!(e.is_transient());
    assert!(matches!(
        c.broadcast_outcome(built.tx.clone()).await.unwrap(),
        BroadcastOutcome::Pending(_)
    ));
    c.generate_to_address(1, &other_address()).await.unwrap();
    c.broadcast(built.tx).await.unwrap();

    // A full mempool raises its floor; the floor falls again.
    let coin = fund(&c, &w, KeyPath::receive(2), Amount::from_sat(300_000)).await;
    let tx = spend_all(&w, &coin, KeyPath::receive(3));
    node.chain
        .with_state_mut(|s| s.set_mempool_min_fee(FeeRate::from_sat_per_vb(5).unwrap()))
        .unwrap();
    let e = c.broadcast(tx.clone()).await.unwrap_err();
    assert!(e.is_transient(), "{e:?}");
    assert!(e.to_string().contains("mempool min fee not met"), "{e}");
    node.chain
        .with_state_mut(|s| s.set_mempool_min_fee(FeeRate::ZERO))
        .unwrap();
    c.broadcast(tx).await.unwrap();
    node.shutdown().await;
}

/// -28 is waited out (with a warning), not an error after 0.7 s of retries.
#[tokio::test]
async fn warming_up_is_waited_out() {
    let dir = tempfile::tempdir().unwrap();
    let (node, _) = start(dir.path()).await;
    let mut cfg = RpcConfig::new(
        node.rpc_url().unwrap(),
        Auth::Cookie(node.cookie.clone().unwrap()),
    );
    cfg.retries = 0;
    let c = BitcoindRpc::new(cfg.clone()).unwrap();
    node.chain.set_warmup(Duration::from_millis(2_500));
    let t0 = std::time::Instant::now();
    assert_eq!(c.get_block_count().await.unwrap(), 101);
    assert!(t0.elapsed() >= Duration::from_secs(2));

    // A node that stays warming up past the wait: unavailable, not a rejection.
    cfg.warmup_wait = Duration::from_millis(300);
    let c = BitcoindRpc::new(cfg).unwrap();
    node.chain.set_warmup(Duration::from_secs(30));
    assert!(c.get_block_count().await.unwrap_err().is_warming_up());
    assert!(matches!(c.tip().await, Err(ChainError::Unavailable(_))));
    node.shutdown().await;
}

/// A server that reads requests and never answers, counting them.
async fn counting_silent_server() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = std::sync::Arc::new(AtomicUsize::new(0));
    let c2 = count.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let c3 = c2.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut seen = Vec::new();
                loop {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            seen.extend_from_slice(&buf[..n]);
                            while let Some(p) = seen.windows(4).position(|w| w == b"POST") {
                                c3.fetch_add(1, Ordering::SeqCst);
                                seen.drain(..p + 4);
                            }
                        }
                    }
                }
            });
        }
    });
    (addr, count)
}

/// A time-out does not say whether the node acted: reads are repeated, a
/// call that moves money is not.
#[tokio::test]
async fn only_repeatable_calls_are_retried_after_a_time_out() {
    use std::sync::atomic::Ordering;
    let (addr, count) = counting_silent_server().await;
    let mut cfg = RpcConfig::new(
        format!("http://{addr}/"),
        Auth::UserPass("u".into(), "p".into()),
    );
    cfg.timeout = Duration::from_millis(200);
    cfg.retries = 2;
    let c = BitcoindRpc::new(cfg).unwrap();
    assert!(matches!(
        c.get_block_count().await,
        Err(RpcError::Timeout(_))
    ));
    assert_eq!(count.swap(0, Ordering::SeqCst), 3);
    assert!(matches!(
        c.send_to_address(&other_address(), Amount::from_sat(10_000))
            .await,
        Err(RpcError::Timeout(_))
    ));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        count.load(Ordering::SeqCst),
        1,
        "sendtoaddress was sent again"
    );
    assert!(BitcoindRpc::is_repeatable("sendrawtransaction"));
    assert!(!BitcoindRpc::is_repeatable("generatetoaddress"));
}

#[tokio::test]
async fn fee_estimates_round_up_clamp_and_never_go_below_the_mempool_floor() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    // 1,001 sat/kvB is 250.25 sat/kwu: rounding down pays under the estimate.
    assert_eq!(
        chain::rpc::client::fee_rate_from_sat_per_kvb(1_001),
        FeeRate::from_sat_per_kwu(251)
    );
    // Targets outside Core's 1…1008 are clamped, not an error.
    let floor = chain::FeePolicy::DEFAULT_FLOOR;
    assert_eq!(c.estimate_fee(0).await.unwrap(), floor);
    assert_eq!(c.estimate_fee(5_000).await.unwrap(), floor);
    // No estimate, and the mempool's minimum above the policy's fallback:
    // the mempool's minimum (a lower rate would not even be accepted).
    node.chain.set_fee_estimates(false);
    let raw: serde_json::Value = c
        .call("estimatesmartfee", serde_json::json!([6]))
        .await
        .unwrap();
    assert!(raw.get("feerate").is_none());
    node.chain
        .with_state_mut(|s| s.set_mempool_min_fee(FeeRate::from_sat_per_kwu(750)))
        .unwrap();
    assert_eq!(
        c.estimate_fee(6).await.unwrap(),
        FeeRate::from_sat_per_kwu(750)
    );
    node.shutdown().await;
}

#[tokio::test]
async fn the_node_is_checked_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let ok = c.check_node(Network::Regtest, Some(0)).await.unwrap();
    assert_eq!(
        (ok.chain.as_str(), ok.prune_height, ok.txindex),
        ("regtest", None, true)
    );
    for wrong in [Network::Bitcoin, Network::Testnet, Network::Signet] {
        let e = c.check_node(wrong, None).await.unwrap_err();
        assert!(
            matches!(&e, RpcError::Unsuitable(m) if m.contains("regtest")),
            "{e:?}"
        );
    }
    node.chain.set_txindex(false);
    assert!(!c.check_node(Network::Regtest, None).await.unwrap().txindex);
    node.shutdown().await;
}

/// Core's limit of 25 unconfirmed ancestors: the 26th in a chain waits for a block.
#[tokio::test]
async fn long_unconfirmed_chains_hit_the_ancestor_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let w = wallet();
    let mut coin = fund(&c, &w, KeyPath::receive(0), Amount::from_sat(1_000_000)).await;
    for i in 1..=25 {
        let tx = spend_all(&w, &coin, KeyPath::receive(i));
        c.broadcast(tx.clone()).await.unwrap();
        coin = output_of(&tx, KeyPath::receive(i));
    }
    let tx = spend_all(&w, &coin, KeyPath::receive(26));
    let e = c.broadcast(tx.clone()).await.unwrap_err();
    assert_eq!(category(&e).1, RejectCategory::Transient);
    assert!(e.to_string().contains("too-long-mempool-chain"), "{e}");
    c.generate_to_address(1, &other_address()).await.unwrap();
    c.broadcast(tx).await.unwrap();
    node.shutdown().await;
}

/// Two branches of equal height: a restart keeps the one that was active.
#[tokio::test]
async fn restart_keeps_the_active_branch() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let old = c.generate_to_address(1, &other_address()).await.unwrap()[0];
    c.invalidate_block(&old).await.unwrap();
    let new = c
        .generate_to_address(1, &wallet().derive_address(0, 0).unwrap())
        .await
        .unwrap()[0];
    c.reconsider_block(&old).await.unwrap();
    // Equal height: the current tip stays, as on Core.
    assert_eq!(c.get_best_block_hash().await.unwrap(), new);
    node.shutdown().await;
    let (node, c) = start(dir.path()).await;
    assert_eq!(c.get_best_block_hash().await.unwrap(), new);
    node.shutdown().await;
}

#[tokio::test]
async fn the_rpc_server_checks_credentials_before_reading_and_bounds_batches() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let addr = node.rpc_addr.unwrap();
    // No credentials, a 100 MB body announced and never sent: 401 at once.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n{")
        .await
        .unwrap();
    let mut buf = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut buf))
        .await
        .expect("the server waited for the body of an unauthenticated request")
        .unwrap();
    assert_eq!(&buf[9..12], b"401");
    // A batch above the bound is refused whole.
    let batch: Vec<serde_json::Value> = (0..1_001)
        .map(|i| serde_json::json!({"method": "getblockcount", "id": i}))
        .collect();
    let e = c
        .call::<serde_json::Value>("x", serde_json::json!([]))
        .await
        .unwrap_err();
    assert!(matches!(
        e,
        RpcError::Rpc {
            code: codes::RPC_METHOD_NOT_FOUND,
            ..
        }
    ));
    let cookie = std::fs::read_to_string(node.cookie.clone().unwrap()).unwrap();
    let (status, _) = raw_post(
        addr,
        cookie.trim(),
        &serde_json::Value::Array(batch).to_string(),
    )
    .await;
    assert_eq!(status, 400);
    // generatetoaddress is capped.
    let e = c
        .call::<serde_json::Value>(
            "generatetoaddress",
            serde_json::json!([1_000_000, other_address().to_string()]),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            RpcError::Rpc {
                code: codes::RPC_INVALID_PARAMETER,
                ..
            }
        ),
        "{e:?}"
    );
    node.shutdown().await;
}

async fn raw_post(addr: std::net::SocketAddr, auth: &str, body: &str) -> (u16, String) {
    use base64::Engine as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let token = base64::engine::general_purpose::STANDARD.encode(auth);
    let req = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    (text[9..12].parse().unwrap(), text)
}

/// A corrupt `mempool.dat` is discarded; a garbage tail of `blocks.dat` is cut.
#[tokio::test]
async fn damaged_files_do_not_keep_the_chain_from_starting() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    c.generate_to_address(3, &other_address()).await.unwrap();
    let tip = c.get_best_block_hash().await.unwrap();
    node.shutdown().await;
    // A record with a plausible length and contents that do not decode
    // (the old reader refused to start on it).
    std::fs::write(
        dir.path().join("mempool.dat"),
        [5u8, 0, 0, 0, 1, 2, 3, 4, 5],
    )
    .unwrap();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.path().join("blocks.dat"))
        .unwrap();
    std::io::Write::write_all(
        &mut f,
        &[
            0x10, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
        ],
    )
    .unwrap();
    drop(f);
    let (node, c) = start(dir.path()).await;
    assert_eq!(c.get_best_block_hash().await.unwrap(), tip);
    c.generate_to_address(1, &other_address()).await.unwrap();
    node.shutdown().await;
    let (node, c) = start(dir.path()).await;
    assert_eq!(c.get_block_count().await.unwrap(), 105);
    node.shutdown().await;
}

/// `n - s` for a 32-byte big-endian `s` (secp256k1's group order `n`).
fn negate_s(s: &[u8; 32]) -> [u8; 32] {
    const N: [u8; 32] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xfe, 0xba, 0xae, 0xdc, 0xe6, 0xaf, 0x48, 0xa0, 0x3b, 0xbf, 0xd2, 0x5e, 0x8c, 0xd0, 0x36,
        0x41, 0x41,
    ];
    let mut out = [0u8; 32];
    let mut borrow = 0i16;
    for i in (0..32).rev() {
        let mut d = i16::from(N[i]) - i16::from(s[i]) - borrow;
        borrow = if d < 0 {
            d += 256;
            1
        } else {
            0
        };
        out[i] = d as u8;
    }
    out
}

/// Policy flags libbitcoinconsensus does not take: a high-S signature is
/// valid by consensus but refused by Core's mempool (LOW_S).
#[tokio::test]
async fn policy_flags_refuse_high_s_signatures() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let w = wallet();
    let coin = fund(&c, &w, KeyPath::receive(0), Amount::from_sat(300_000)).await;
    let mut tx = spend_all(&w, &coin, KeyPath::receive(1));
    let items = tx.input[0].witness.to_vec();
    let sig = bitcoin::ecdsa::Signature::from_slice(&items[0]).unwrap();
    let compact = sig.signature.serialize_compact();
    let mut high = compact;
    let s: [u8; 32] = compact[32..].try_into().unwrap();
    high[32..].copy_from_slice(&negate_s(&s));
    let high_sig = bitcoin::secp256k1::ecdsa::Signature::from_compact(&high).unwrap();
    let mut witness = bitcoin::Witness::new();
    witness.push(
        bitcoin::ecdsa::Signature {
            signature: high_sig,
            sighash_type: bitcoin::EcdsaSighashType::All,
        }
        .to_vec(),
    );
    witness.push(&items[1]);
    tx.input[0].witness = witness;
    let e = c.broadcast(tx.clone()).await.unwrap_err();
    assert_eq!(category(&e).1, RejectCategory::Invalid, "{e:?}");
    assert!(
        e.to_string()
            .contains("mempool-script-verify-flag-failed (Non-canonical signature: S value is unnecessarily high)"),
        "{e}"
    );
    // Consensus accepts it: a block carrying it connects.
    let mut block = node.chain.with_state(|s| {
        chain::dev::state::assemble_block(
            s.tip_hash(),
            s.height() + 1,
            s.median_time_past(s.height()) + 1,
            &other_address().script_pubkey(),
            chain::dev::state::subsidy(s.height() + 1),
            vec![tx],
        )
    });
    chain::dev::state::grind(&mut block.header);
    node.chain.submit_block(block).unwrap();
    node.shutdown().await;
}

/// Core relays only standard output scripts; since Core 30 any number of
/// push-only OP_RETURN outputs of any size the weight limit allows.
#[tokio::test]
async fn non_standard_outputs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let w = wallet();
    let change = w
        .derive(KeyPath::receive(9))
        .unwrap()
        .address
        .script_pubkey();
    let data = |n: usize| {
        let mut b = vec![0x6a, 0x4c, n as u8];
        b.extend(std::iter::repeat_n(7u8, n));
        bitcoin::ScriptBuf::from_bytes(b)
    };
    // OP_RETURN OP_1 OP_ADD: not push-only, so not a data carrier.
    let not_data = bitcoin::ScriptBuf::from_bytes(vec![0x6a, 0x51, 0x93]);
    let cases: [(Vec<bitcoin::ScriptBuf>, &str); 4] = [
        (vec![data(80)], ""),
        (vec![data(250)], ""),
        (vec![data(10), data(200)], ""),
        (vec![not_data], "scriptpubkey"),
    ];
    for (i, (scripts, expected)) in cases.iter().enumerate() {
        let coin = fund(
            &c,
            &w,
            KeyPath::receive(i as u32),
            Amount::from_sat(100_000),
        )
        .await;
        let outs: Vec<bitcoin::TxOut> = scripts
            .iter()
            .map(|s| bitcoin::TxOut {
                value: Amount::ZERO,
                script_pubkey: s.clone(),
            })
            .collect();
        let mut built = wallet::build_transaction(
            std::slice::from_ref(&coin),
            &[],
            Some(&change),
            FeeRate::from_sat_per_vb(2).unwrap(),
        )
        .unwrap();
        built.tx.output.extend(outs);
        w.sign(&mut built.tx, std::slice::from_ref(&coin)).unwrap();
        let r = c.broadcast(built.tx).await;
        if expected.is_empty() {
            r.unwrap();
        } else {
            let e = r.unwrap_err();
            assert!(e.to_string().ends_with(expected), "{e}");
            assert!(e.is_invalid());
        }
    }
    // A script that is no standard type at all.
    let coin = fund(&c, &w, KeyPath::receive(5), Amount::from_sat(100_000)).await;
    let odd = bitcoin::TxOut {
        value: Amount::from_sat(50_000),
        script_pubkey: bitcoin::ScriptBuf::from_bytes(vec![0x51, 0x51, 0x93]),
    };
    let built = w
        .build_signed(
            std::slice::from_ref(&coin),
            &[odd],
            Some(&change),
            FeeRate::from_sat_per_vb(2).unwrap(),
        )
        .unwrap();
    let e = c.broadcast(built.tx).await.unwrap_err();
    assert!(e.to_string().ends_with("scriptpubkey"), "{e}");
    node.shutdown().await;
}

/// Core 28's replacement rules: a replacement must pay for what it evicts
/// plus its own relay, add no new unconfirmed input, and not spend what it
/// replaces; descendants of the replaced go with it.
#[tokio::test]
async fn replacements_follow_core_rules() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let w = wallet();
    let coin = fund(&c, &w, KeyPath::receive(0), Amount::from_sat(500_000)).await;
    let other = fund(&c, &w, KeyPath::receive(5), Amount::from_sat(500_000)).await;
    let parent = spend_all(&w, &coin, KeyPath::receive(1));
    c.broadcast(parent.clone()).await.unwrap();
    let child = spend_all(
        &w,
        &output_of(&parent, KeyPath::receive(1)),
        KeyPath::receive(2),
    );
    c.broadcast(child.clone()).await.unwrap();
    let script = |i| {
        w.derive(KeyPath::receive(i))
            .unwrap()
            .address
            .script_pubkey()
    };
    let at = |coins: &[SpendableOutput], to: u32, rate: u64| {
        w.build_signed(
            coins,
            &[],
            Some(&script(to)),
            FeeRate::from_sat_per_vb(rate).unwrap(),
        )
        .unwrap()
        .tx
    };
    // Higher rate than the parent, but less in total than parent + child.
    let e = c
        .broadcast(at(std::slice::from_ref(&coin), 3, 3))
        .await
        .unwrap_err();
    assert!(e.is_conflict(), "{e:?}");
    assert!(
        e.to_string().contains("less fees than conflicting txs")
            || e.to_string().contains("not enough additional fees"),
        "{e}"
    );
    // Spending what it would replace: refused.
    let unconfirmed = output_of(&child, KeyPath::receive(2));
    let e = c
        .broadcast(at(&[coin.clone(), unconfirmed], 3, 40))
        .await
        .unwrap_err();
    assert!(e.is_conflict(), "{e:?}");
    assert!(
        e.to_string().contains("bad-txns-spends-conflicting-tx"),
        "{e}"
    );
    // A new unconfirmed input (an unrelated faucet payment): refused.
    let to_us = w.derive(KeyPath::receive(7)).unwrap().address;
    let fresh_txid = c
        .send_to_address(&to_us, Amount::from_sat(100_000))
        .await
        .unwrap();
    let fresh_tx = c.transaction(fresh_txid).await.unwrap().unwrap().tx;
    let vout = fresh_tx
        .output
        .iter()
        .position(|o| o.script_pubkey == to_us.script_pubkey())
        .unwrap();
    let fresh = SpendableOutput {
        outpoint: OutPoint {
            txid: fresh_txid,
            vout: vout as u32,
        },
        txout: fresh_tx.output[vout].clone(),
        path: KeyPath::receive(7),
    };
    let e = c
        .broadcast(at(&[coin.clone(), fresh], 3, 40))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("replacement-adds-unconfirmed"),
        "{e}"
    );
    // Enough: the parent and its child leave the mempool together.
    let replacement = at(&[coin.clone(), other], 3, 20);
    c.broadcast(replacement.clone()).await.unwrap();
    assert!(!c.in_mempool(parent.compute_txid()).await.unwrap());
    assert!(!c.in_mempool(child.compute_txid()).await.unwrap());
    let info: serde_json::Value = c
        .call("getmempoolinfo", serde_json::json!([]))
        .await
        .unwrap();
    assert_eq!(info["fullrbf"], true);
    assert_eq!(info["size"], 2, "the replacement and the faucet payment");
    node.shutdown().await;
}
