//! Script rules libbitcoinconsensus 25.1 does not enforce, over the real
//! JSON-RPC (`sendrawtransaction` through the client that talks to Core):
//! Core 28's policy flags NULLFAIL, MINIMALIF and CLEANSTACK, and taproot
//! spends (key path, control block, tapscript signatures), which must be
//! verified by consensus in blocks too.

// A failed unwrap is how a test reports failure.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bitcoin::absolute::LockTime;
use bitcoin::hashes::Hash as _;
use bitcoin::opcodes::all::*;
use bitcoin::script::{Builder, PushBytesBuf};
use bitcoin::secp256k1::{Keypair, Message, Secp256k1, SecretKey};
use bitcoin::sighash::{EcdsaSighashType, Prevouts, SighashCache, TapSighashType};
use bitcoin::taproot::{LeafVersion, TapLeafHash, TaprootBuilder};
use bitcoin::transaction::Version;
use bitcoin::{
    Address, Amount, Network, OutPoint, ScriptBuf, Sequence, Transaction, TxIn, TxOut, Witness,
};
use chain::{
    Auth, BitcoindRpc, Chain, DevChain, DevChainConfig, RpcConfig, RpcError, RunningDevChain,
};

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

fn key(n: u8) -> SecretKey {
    SecretKey::from_slice(&[n; 32]).unwrap()
}

fn sink() -> ScriptBuf {
    let pk = bitcoin::CompressedPublicKey(key(99).public_key(&Secp256k1::new()));
    ScriptBuf::new_p2wpkh(&pk.wpubkey_hash())
}

/// Pays each address 100,000 sat from the faucet and mines them.
async fn fund(c: &BitcoindRpc, addresses: &[Address]) -> Vec<(OutPoint, TxOut)> {
    let mut txids = Vec::new();
    for a in addresses {
        txids.push(
            c.send_to_address(a, Amount::from_sat(100_000))
                .await
                .unwrap(),
        );
    }
    let to = Address::from_script(&sink(), Network::Regtest).unwrap();
    c.generate_to_address(1, &to).await.unwrap();
    let mut out = Vec::new();
    for (a, txid) in addresses.iter().zip(txids) {
        let tx = c.transaction(txid).await.unwrap().unwrap().tx;
        let vout = tx
            .output
            .iter()
            .position(|o| o.script_pubkey == a.script_pubkey())
            .unwrap();
        out.push((OutPoint::new(txid, vout as u32), tx.output[vout].clone()));
    }
    out
}

/// One input, one output to the sink, 1,000 sat of fee.
fn spend(coin: &(OutPoint, TxOut)) -> Transaction {
    Transaction {
        version: Version::TWO,
        lock_time: LockTime::ZERO,
        input: vec![TxIn {
            previous_output: coin.0,
            sequence: Sequence::MAX,
            ..TxIn::default()
        }],
        output: vec![TxOut {
            value: coin.1.value - Amount::from_sat(1_000),
            script_pubkey: sink(),
        }],
    }
}

/// Core's reject reason of `tx`: `sendrawtransaction`'s message without its
/// debug part, which must name input 0 of `tx` (every case here has one input).
async fn refusal(c: &BitcoindRpc, tx: &Transaction) -> String {
    match c.send_raw_transaction(tx).await {
        Err(RpcError::Rpc { code, message }) => {
            assert_eq!(code, -26, "{message}");
            let debug = format!(
                ", input 0 of {} (wtxid {}), spending {}",
                tx.compute_txid(),
                tx.compute_wtxid(),
                tx.input[0].previous_output
            );
            message
                .strip_suffix(&debug)
                .unwrap_or_else(|| panic!("{message} does not end with {debug}"))
                .to_owned()
        }
        other => panic!("expected a -26 refusal, got {other:?}"),
    }
}

/// Mines `txs` in a block built by hand (past the mempool's policy).
fn mine_directly(node: &RunningDevChain, txs: Vec<Transaction>) -> Result<(), String> {
    let mut block = node.chain.with_state(|s| {
        chain::dev::state::assemble_block(
            s.tip_hash(),
            s.height() + 1,
            s.median_time_past(s.height()) + 1,
            &sink(),
            chain::dev::state::subsidy(s.height() + 1),
            txs,
        )
    });
    chain::dev::state::grind(&mut block.header);
    node.chain.submit_block(block).map_err(|e| e.to_string())
}

fn ecdsa_sig(msg: [u8; 32], sk: &SecretKey) -> Vec<u8> {
    let secp = Secp256k1::new();
    bitcoin::ecdsa::Signature {
        signature: secp.sign_ecdsa(&Message::from_digest(msg), sk),
        sighash_type: EcdsaSighashType::All,
    }
    .to_vec()
}

fn p2wsh_sighash(tx: &Transaction, ws: &ScriptBuf, value: Amount) -> [u8; 32] {
    SighashCache::new(tx)
        .p2wsh_signature_hash(0, ws, value, EcdsaSighashType::All)
        .unwrap()
        .to_byte_array()
}

fn witness(items: &[&[u8]]) -> Witness {
    let mut w = Witness::new();
    for i in items {
        w.push(i);
    }
    w
}

const NULLFAIL: &str =
    "mempool-script-verify-flag-failed (Signature must be zero for failed CHECK(MULTI)SIG operation)";
const MINIMALIF: &str = "mempool-script-verify-flag-failed (OP_IF/NOTIF argument must be minimal)";
const CLEANSTACK: &str =
    "mempool-script-verify-flag-failed (Stack size must be exactly one after execution)";

/// NULLFAIL: a failed CHECKSIG or CHECKMULTISIG whose result the script
/// tolerates is valid by consensus, but Core's mempool wants its signatures
/// empty. A valid signature at a non-final CHECKSIG is checked and passes.
#[tokio::test]
async fn nullfail_refuses_failed_signature_checks_with_signatures() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let secp = Secp256k1::new();
    let pk = key(1).public_key(&secp);
    let pk2 = key(2).public_key(&secp);
    let not_sig = Builder::new()
        .push_slice(pk.serialize())
        .push_opcode(OP_CHECKSIG)
        .push_opcode(OP_NOT)
        .into_script();
    let not_multisig = Builder::new()
        .push_int(1)
        .push_slice(pk.serialize())
        .push_slice(pk2.serialize())
        .push_int(2)
        .push_opcode(OP_CHECKMULTISIG)
        .push_opcode(OP_NOT)
        .into_script();
    let sig_equal_one = Builder::new()
        .push_slice(pk.serialize())
        .push_opcode(OP_CHECKSIG)
        .push_int(1)
        .push_opcode(OP_EQUAL)
        .into_script();
    let scripts = [&not_sig, &not_sig, &not_sig, &not_multisig, &sig_equal_one];
    let addresses: Vec<Address> = scripts
        .iter()
        .map(|s| Address::p2wsh(s, Network::Regtest))
        .collect();
    let coins = fund(&c, &addresses).await;
    let wrong = ecdsa_sig([7; 32], &key(1));

    // A wrong (but well-encoded) signature at CHECKSIG NOT.
    let mut bad = spend(&coins[0]);
    bad.input[0].witness = witness(&[&wrong, not_sig.as_bytes()]);
    assert_eq!(refusal(&c, &bad).await, NULLFAIL);
    // testmempoolaccept says the same.
    let r = c
        .test_mempool_accept(std::slice::from_ref(&bad))
        .await
        .unwrap();
    assert!(!r[0].allowed);
    // It is consensus-valid: a block carrying it connects.
    mine_directly(&node, vec![bad]).unwrap();

    // The same script with an empty signature is standard.
    let mut empty = spend(&coins[1]);
    empty.input[0].witness = witness(&[&[], not_sig.as_bytes()]);
    c.send_raw_transaction(&empty).await.unwrap();

    // CHECKMULTISIG: one wrong signature for 1-of-2, result negated.
    let mut bad_multi = spend(&coins[3]);
    bad_multi.input[0].witness = witness(&[&[], &wrong, not_multisig.as_bytes()]);
    assert_eq!(refusal(&c, &bad_multi).await, NULLFAIL);

    // A correct signature at a CHECKSIG that is not the last operation is
    // verified (right sighash) and accepted.
    let mut good = spend(&coins[4]);
    let sig = ecdsa_sig(
        p2wsh_sighash(&good, &sig_equal_one, coins[4].1.value),
        &key(1),
    );
    good.input[0].witness = witness(&[&sig, sig_equal_one.as_bytes()]);
    c.send_raw_transaction(&good).await.unwrap();
    // And the correct signature where the script wants a failure fails consensus.
    let mut valid_but_not = spend(&coins[2]);
    let sig = ecdsa_sig(
        p2wsh_sighash(&valid_but_not, &not_sig, coins[2].1.value),
        &key(1),
    );
    valid_but_not.input[0].witness = witness(&[&sig, not_sig.as_bytes()]);
    assert!(refusal(&c, &valid_but_not)
        .await
        .starts_with("mempool-script-verify-flag-failed"));
    node.shutdown().await;
}

/// MINIMALIF: the argument of OP_IF/OP_NOTIF in segwit v0 must be empty or 0x01.
#[tokio::test]
async fn minimalif_refuses_non_minimal_if_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let if_script = Builder::new()
        .push_opcode(OP_IF)
        .push_int(1)
        .push_opcode(OP_ELSE)
        .push_int(1)
        .push_opcode(OP_ENDIF)
        .into_script();
    let addresses = vec![Address::p2wsh(&if_script, Network::Regtest); 4];
    let coins = fund(&c, &addresses).await;
    let spend_with = |coin, arg: &[u8]| {
        let mut tx = spend(coin);
        tx.input[0].witness = witness(&[arg, if_script.as_bytes()]);
        tx
    };
    let two = spend_with(&coins[0], &[2]);
    assert_eq!(refusal(&c, &two).await, MINIMALIF);
    let zero_byte = spend_with(&coins[1], &[0]);
    assert_eq!(refusal(&c, &zero_byte).await, MINIMALIF);
    // Consensus takes it.
    mine_directly(&node, vec![two]).unwrap();
    // The minimal forms are standard.
    c.send_raw_transaction(&spend_with(&coins[2], &[1]))
        .await
        .unwrap();
    c.send_raw_transaction(&spend_with(&coins[3], &[]))
        .await
        .unwrap();
    node.shutdown().await;
}

/// CLEANSTACK: a P2SH spend must leave exactly one element.
#[tokio::test]
async fn cleanstack_refuses_leftover_stack_items_in_p2sh() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let redeem = ScriptBuf::from_bytes(vec![OP_PUSHNUM_1.to_u8()]);
    let addresses = vec![Address::p2sh(&redeem, Network::Regtest).unwrap(); 3];
    let coins = fund(&c, &addresses).await;
    let redeem_push = PushBytesBuf::try_from(redeem.to_bytes()).unwrap();
    let mut dirty = spend(&coins[0]);
    dirty.input[0].script_sig = Builder::new()
        .push_slice([0xaa])
        .push_slice(&redeem_push)
        .into_script();
    assert_eq!(refusal(&c, &dirty).await, CLEANSTACK);
    mine_directly(&node, vec![dirty]).unwrap();
    let mut clean = spend(&coins[1]);
    clean.input[0].script_sig = Builder::new().push_slice(&redeem_push).into_script();
    c.send_raw_transaction(&clean).await.unwrap();
    node.shutdown().await;
}

fn schnorr(msg: [u8; 32], kp: &Keypair) -> Vec<u8> {
    Secp256k1::new()
        .sign_schnorr_no_aux_rand(&Message::from_digest(msg), kp)
        .as_ref()
        .to_vec()
}

/// Key-path taproot spends: a valid signature is accepted and mined; a bad
/// one is refused by the mempool and makes a block invalid.
#[tokio::test]
async fn taproot_key_path_signatures_are_verified() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let secp = Secp256k1::new();
    let kp = Keypair::from_secret_key(&secp, &key(5));
    let (internal, _) = kp.x_only_public_key();
    let address = Address::p2tr(&secp, internal, None, Network::Regtest);
    let coins = fund(&c, &[address.clone(), address.clone(), address]).await;
    let tweaked = {
        use bitcoin::key::TapTweak as _;
        kp.tap_tweak(&secp, None).to_keypair()
    };
    let sign = |tx: &Transaction, coin: &(OutPoint, TxOut)| {
        let h = SighashCache::new(tx)
            .taproot_key_spend_signature_hash(
                0,
                &Prevouts::All(std::slice::from_ref(&coin.1)),
                TapSighashType::Default,
            )
            .unwrap();
        schnorr(h.to_byte_array(), &tweaked)
    };

    let mut good = spend(&coins[0]);
    let sig = sign(&good, &coins[0]);
    good.input[0].witness = witness(&[&sig]);
    let txid = c.send_raw_transaction(&good).await.unwrap();

    let mut forged = spend(&coins[1]);
    let mut sig = sign(&forged, &coins[1]);
    sig[10] ^= 1;
    forged.input[0].witness = witness(&[&sig]);
    assert_eq!(
        refusal(&c, &forged).await,
        "mempool-script-verify-flag-failed (Invalid Schnorr signature)"
    );
    // A signature by the untweaked internal key is not the output key's.
    let mut internal_sig = spend(&coins[2]);
    let h = SighashCache::new(&internal_sig)
        .taproot_key_spend_signature_hash(
            0,
            &Prevouts::All(std::slice::from_ref(&coins[2].1)),
            TapSighashType::Default,
        )
        .unwrap();
    internal_sig.input[0].witness = witness(&[&schnorr(h.to_byte_array(), &kp)]);
    assert_eq!(
        refusal(&c, &internal_sig).await,
        "mempool-script-verify-flag-failed (Invalid Schnorr signature)"
    );
    // Consensus: a block with the forged spend does not connect.
    let err = mine_directly(&node, vec![forged]).unwrap_err();
    assert!(err.contains("Invalid Schnorr signature"), "{err}");

    let to = Address::from_script(&sink(), Network::Regtest).unwrap();
    c.generate_to_address(1, &to).await.unwrap();
    let status = c.transaction(txid).await.unwrap().unwrap();
    assert_eq!(status.confirmations, 1);
    node.shutdown().await;
}

/// Script-path taproot spends: the control block must commit to the script
/// and the tapscript's signatures are checked.
#[tokio::test]
async fn taproot_script_path_commitment_and_signatures_are_verified() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let secp = Secp256k1::new();
    let internal = Keypair::from_secret_key(&secp, &key(6))
        .x_only_public_key()
        .0;
    let leaf_kp = Keypair::from_secret_key(&secp, &key(7));
    let leaf_key = leaf_kp.x_only_public_key().0;
    let leaf = Builder::new()
        .push_slice(leaf_key.serialize())
        .push_opcode(OP_CHECKSIG)
        .into_script();
    let other_leaf = Builder::new().push_int(1).into_script();
    let info = TaprootBuilder::new()
        .add_leaf(1, leaf.clone())
        .unwrap()
        .add_leaf(1, other_leaf)
        .unwrap()
        .finalize(&secp, internal)
        .unwrap();
    let address = Address::p2tr_tweaked(info.output_key(), Network::Regtest);
    let coins = fund(&c, &vec![address; 4]).await;
    let control = info
        .control_block(&(leaf.clone(), LeafVersion::TapScript))
        .unwrap()
        .serialize();
    let leaf_hash = TapLeafHash::from_script(&leaf, LeafVersion::TapScript);
    let sign = |tx: &Transaction, coin: &(OutPoint, TxOut)| {
        let h = SighashCache::new(tx)
            .taproot_script_spend_signature_hash(
                0,
                &Prevouts::All(std::slice::from_ref(&coin.1)),
                leaf_hash,
                TapSighashType::Default,
            )
            .unwrap();
        schnorr(h.to_byte_array(), &leaf_kp)
    };

    let mut good = spend(&coins[0]);
    let sig = sign(&good, &coins[0]);
    good.input[0].witness = witness(&[&sig, leaf.as_bytes(), &control]);
    c.send_raw_transaction(&good).await.unwrap();

    // The control block's parity bit flipped: no longer the output key's commitment.
    let mut wrong_control = spend(&coins[1]);
    let sig = sign(&wrong_control, &coins[1]);
    let mut bad_control = control.clone();
    bad_control[0] ^= 1;
    wrong_control.input[0].witness = witness(&[&sig, leaf.as_bytes(), &bad_control]);
    assert_eq!(
        refusal(&c, &wrong_control).await,
        "mempool-script-verify-flag-failed (Witness program hash mismatch)"
    );
    // A script the tree does not hold, with the real control block.
    let mut other_script = spend(&coins[2]);
    let always = Builder::new()
        .push_int(1)
        .push_int(1)
        .push_opcode(OP_EQUAL)
        .into_script();
    other_script.input[0].witness = witness(&[always.as_bytes(), &control]);
    assert_eq!(
        refusal(&c, &other_script).await,
        "mempool-script-verify-flag-failed (Witness program hash mismatch)"
    );
    // The right leaf with a forged signature.
    let mut forged = spend(&coins[3]);
    let mut sig = sign(&forged, &coins[3]);
    sig[0] ^= 1;
    forged.input[0].witness = witness(&[&sig, leaf.as_bytes(), &control]);
    assert_eq!(
        refusal(&c, &forged).await,
        "mempool-script-verify-flag-failed (Invalid Schnorr signature)"
    );
    let err = mine_directly(&node, vec![wrong_control]).unwrap_err();
    assert!(err.contains("Witness program hash mismatch"), "{err}");
    node.shutdown().await;
}

/// CLEANSTACK on a bare script (1-of-1 multisig, a standard output): an
/// extra item under the signature is refused by policy, mined by consensus.
#[tokio::test]
async fn cleanstack_refuses_leftover_stack_items_in_bare_multisig() {
    let dir = tempfile::tempdir().unwrap();
    let (node, c) = start(dir.path()).await;
    let secp = Secp256k1::new();
    let pk = key(8).public_key(&secp);
    let bare = Builder::new()
        .push_int(1)
        .push_slice(pk.serialize())
        .push_int(1)
        .push_opcode(OP_CHECKMULTISIG)
        .into_script();
    // Fund a wallet key, then pay two bare outputs from it.
    let w = wallet::Wallet::from_seed(&[12u8; 32], Network::Regtest).unwrap();
    let path = wallet::KeyPath::receive(0);
    let funded = fund(&c, &[w.derive(path).unwrap().address]).await;
    let coin = wallet::SpendableOutput {
        outpoint: funded[0].0,
        txout: funded[0].1.clone(),
        path,
    };
    let out = |v| TxOut {
        value: Amount::from_sat(v),
        script_pubkey: bare.clone(),
    };
    let payer = w
        .build_signed(
            &[coin],
            &[out(30_000), out(30_000)],
            Some(&sink()),
            bitcoin::FeeRate::from_sat_per_vb(2).unwrap(),
        )
        .unwrap()
        .tx;
    c.send_raw_transaction(&payer).await.unwrap();
    let to = Address::from_script(&sink(), Network::Regtest).unwrap();
    c.generate_to_address(1, &to).await.unwrap();
    let txid = payer.compute_txid();
    let sign = |tx: &Transaction| {
        let h = SighashCache::new(tx)
            .legacy_signature_hash(0, &bare, EcdsaSighashType::All.to_u32())
            .unwrap();
        PushBytesBuf::try_from(ecdsa_sig(h.to_byte_array(), &key(8))).unwrap()
    };
    let mut dirty = spend(&(OutPoint::new(txid, 0), out(30_000)));
    let sig = sign(&dirty);
    dirty.input[0].script_sig = Builder::new()
        .push_slice([0xaa])
        .push_opcode(OP_PUSHBYTES_0)
        .push_slice(&sig)
        .into_script();
    assert_eq!(refusal(&c, &dirty).await, CLEANSTACK);
    mine_directly(&node, vec![dirty]).unwrap();
    let mut clean = spend(&(OutPoint::new(txid, 1), out(30_000)));
    let sig = sign(&clean);
    clean.input[0].script_sig = Builder::new()
        .push_opcode(OP_PUSHBYTES_0)
        .push_slice(&sig)
        .into_script();
    c.send_raw_transaction(&clean).await.unwrap();
    node.shutdown().await;
}
