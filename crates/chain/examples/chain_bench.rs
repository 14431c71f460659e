//! Figures of issues 4 and 14: block validation throughput of the development
//! chain (1,000 one-input P2WPKH spends; 200 two-of-two P2WSH spends) and
//! mempool acceptance of the same spends with Core's policy checks on
//! (LOW_S, WITNESS_PUBKEYTYPE, sigops, standardness, package limits, and the
//! interpreter's NULLFAIL/MINIMALIF/CLEANSTACK on the P2WSH ones), next
//! to raw secp256k1 ECDSA verification on one core, in the same run; and RPC
//! round trips over loopback.
//!
//! Run: `cargo run --release -p potluck-chain --example chain_bench`

use std::time::{Duration, Instant};

use bitcoin::blockdata::opcodes::all::OP_CHECKMULTISIG;
use bitcoin::hashes::Hash as _;
use bitcoin::script::Builder;
use bitcoin::secp256k1::{ecdsa, Message, PublicKey, Secp256k1};
use bitcoin::sighash::{EcdsaSighashType, SighashCache};
use bitcoin::transaction::Version;
use bitcoin::{
    absolute::LockTime, Amount, Block, Network, OutPoint, ScriptBuf, Sequence, Transaction, TxIn,
    TxOut, Witness,
};
use chain::dev::state::{assemble_block, grind, subsidy, ChainState};
use chain::{Auth, BitcoindRpc, DevChain, DevChainConfig, RpcConfig};
use wallet::{KeyPath, Wallet};

const P2WPKH_TXS: usize = 1_000;
const P2WSH_TXS: usize = 200;
const SPEND_FEE: u64 = 500;

fn fan_out(coinbase: &Transaction, script: &ScriptBuf, n: usize) -> Transaction {
    let total = coinbase.output[0].value - Amount::from_sat(200_000);
    let each = Amount::from_sat(total.to_sat() / n as u64);
    Transaction {
        version: Version::TWO,
        lock_time: LockTime::ZERO,
        input: vec![TxIn {
            previous_output: OutPoint {
                txid: coinbase.compute_txid(),
                vout: 0,
            },
            sequence: Sequence::MAX,
            ..TxIn::default()
        }],
        output: (0..n)
            .map(|_| TxOut {
                value: each,
                script_pubkey: script.clone(),
            })
            .collect(),
    }
}

fn one_input_spend(outpoint: OutPoint, value: Amount, to: &ScriptBuf) -> Transaction {
    Transaction {
        version: Version::TWO,
        lock_time: LockTime::ZERO,
        input: vec![TxIn {
            previous_output: outpoint,
            sequence: Sequence::MAX,
            ..TxIn::default()
        }],
        output: vec![TxOut {
            value: value - Amount::from_sat(SPEND_FEE),
            script_pubkey: to.clone(),
        }],
    }
}

fn block_on_tip(state: &ChainState, txs: Vec<Transaction>, payout: &bitcoin::Script) -> Block {
    let height = state.height() + 1;
    let fees = Amount::from_sat(SPEND_FEE * txs.len() as u64);
    let time = state.median_time_past(state.height()) + 1;
    let mut block = assemble_block(
        state.tip_hash(),
        height,
        time,
        payout,
        subsidy(height) + fees,
        txs,
    );
    grind(&mut block.header);
    block
}

/// Time to accept every transaction of `txs` to the mempool of a fresh copy
/// of `base` (policy and consensus script checks included).
fn time_mempool(base: &ChainState, txs: &[Transaction]) -> Duration {
    let mut st = base.clone();
    let t0 = Instant::now();
    for tx in txs {
        st.accept_to_mempool(tx, 0, None, false)
            .expect("benchmark transaction is standard");
    }
    t0.elapsed()
}

/// Time to validate and connect `block` (scripts included) on a fresh copy of `base`.
fn time_connect(base: &ChainState, block: &Block) -> Duration {
    let mut st = base.clone();
    let b = block.clone();
    let t0 = Instant::now();
    st.connect_block(b, true).expect("benchmark block is valid");
    t0.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mut config = DevChainConfig::new(dir.path());
    config.rpc_bind = Some("127.0.0.1:0".parse()?);
    let node = DevChain::start(config).await?;
    let dev = node.chain.clone();
    let secp = Secp256k1::new();
    let w = Wallet::from_seed(&[11u8; 32], Network::Regtest)?;
    let k = w.derive(KeyPath::receive(0))?;
    let k2 = w.derive(KeyPath::receive(1))?;
    let p2wpkh = k.address.script_pubkey();
    let multisig = Builder::new()
        .push_int(2)
        .push_slice(k.public_key.to_bytes())
        .push_slice(k2.public_key.to_bytes())
        .push_int(2)
        .push_opcode(OP_CHECKMULTISIG)
        .into_script();
    let p2wsh = ScriptBuf::new_p2wsh(&multisig.wscript_hash());

    // Two coinbases to our key, matured, then fanned out into the outputs to spend.
    let cb = dev.mine(2, &p2wpkh)?;
    dev.mine(100, dev.faucet_script())?;
    let coinbases: Vec<Transaction> = cb
        .iter()
        .map(|h| dev.with_state(|s| s.entry(h).map(|e| e.block.txdata[0].clone())))
        .collect::<Option<_>>()
        .ok_or("coinbase")?;
    let mut fan1 = fan_out(&coinbases[0], &p2wpkh, P2WPKH_TXS);
    let mut fan2 = fan_out(&coinbases[1], &p2wsh, P2WSH_TXS);
    wallet::sign_p2wpkh_input(
        &secp,
        &mut fan1,
        0,
        coinbases[0].output[0].value,
        &k.secret_key,
    )?;
    wallet::sign_p2wpkh_input(
        &secp,
        &mut fan2,
        0,
        coinbases[1].output[0].value,
        &k.secret_key,
    )?;
    dev.send_raw(&fan1, None)?;
    dev.send_raw(&fan2, None)?;
    dev.mine(1, dev.faucet_script())?;

    // 1,000 one-input P2WPKH spends; keep (msg, sig, key) for the raw baseline.
    let mut raw_checks: Vec<(Message, ecdsa::Signature, PublicKey)> = Vec::new();
    let txid1 = fan1.compute_txid();
    let txs1: Vec<Transaction> = fan1
        .output
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let mut tx = one_input_spend(
                OutPoint {
                    txid: txid1,
                    vout: i as u32,
                },
                o.value,
                &p2wpkh,
            );
            wallet::sign_p2wpkh_input(&secp, &mut tx, 0, o.value, &k.secret_key)?;
            let sighash = SighashCache::new(&tx).p2wpkh_signature_hash(
                0,
                &p2wpkh,
                o.value,
                EcdsaSighashType::All,
            )?;
            let sig = bitcoin::ecdsa::Signature::from_slice(&tx.input[0].witness.to_vec()[0])?;
            raw_checks.push((
                Message::from_digest(sighash.to_byte_array()),
                sig.signature,
                k.public_key.0,
            ));
            Ok(tx)
        })
        .collect::<Result<_, Box<dyn std::error::Error>>>()?;
    // 200 two-of-two P2WSH spends.
    let txid2 = fan2.compute_txid();
    let txs2: Vec<Transaction> = fan2
        .output
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let mut tx = one_input_spend(
                OutPoint {
                    txid: txid2,
                    vout: i as u32,
                },
                o.value,
                &p2wpkh,
            );
            let sighash = SighashCache::new(&tx).p2wsh_signature_hash(
                0,
                &multisig,
                o.value,
                EcdsaSighashType::All,
            )?;
            let msg = Message::from_digest(sighash.to_byte_array());
            let mut witness = Witness::new();
            witness.push([]);
            for key in [&k.secret_key, &k2.secret_key] {
                let sig = bitcoin::ecdsa::Signature {
                    signature: secp.sign_ecdsa_low_r(&msg, key),
                    sighash_type: EcdsaSighashType::All,
                };
                witness.push(sig.to_vec());
            }
            witness.push(multisig.as_bytes());
            tx.input[0].witness = witness;
            Ok(tx)
        })
        .collect::<Result<_, Box<dyn std::error::Error>>>()?;

    let base = dev.with_state(|s| s.clone());
    let block1 = block_on_tip(&base, txs1, dev.faucet_script());
    let block2 = block_on_tip(&base, txs2, dev.faucet_script());

    // Rounds interleave the baseline and the two blocks so that load from
    // other processes on the machine hits all three alike; medians are reported.
    let verifier = Secp256k1::verification_only();
    let rounds = 31;
    let mempool_txs: Vec<Transaction> = block1.txdata[1..].to_vec();
    let mempool_txs2: Vec<Transaction> = block2.txdata[1..].to_vec();
    let (mut raw_t, mut t1s, mut t2s, mut tms) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut tms2 = Vec::new();
    for _ in 0..rounds {
        let t0 = Instant::now();
        for (m, s, p) in &raw_checks {
            verifier.verify_ecdsa(m, s, p)?;
        }
        raw_t.push(t0.elapsed());
        t1s.push(time_connect(&base, &block1));
        t2s.push(time_connect(&base, &block2));
        tms.push(time_mempool(&base, &mempool_txs));
        tms2.push(time_mempool(&base, &mempool_txs2));
    }
    let mempool2_inputs_s = mempool_txs2.len() as f64 / median(tms2).as_secs_f64();
    let mempool_inputs_s = mempool_txs.len() as f64 / median(tms).as_secs_f64();
    let raw_per_s = raw_checks.len() as f64 / median(raw_t).as_secs_f64();
    let p2wpkh_inputs_s = P2WPKH_TXS as f64 / median(t1s).as_secs_f64();
    let p2wsh_inputs_s = P2WSH_TXS as f64 / median(t2s).as_secs_f64();
    let p2wsh_sigs_s = 2.0 * p2wsh_inputs_s;

    // RPC round trips over loopback, on the block of 1,000 transactions.
    dev.submit_block(block1.clone())?;
    let url = node.rpc_url().ok_or("no rpc")?;
    let client = BitcoindRpc::new(RpcConfig::new(
        url,
        Auth::Cookie(node.cookie.clone().ok_or("no cookie")?),
    ))?;
    client.get_block_count().await?; // open the keep-alive connection
    let n_count = 2_000;
    let t0 = Instant::now();
    for _ in 0..n_count {
        client.get_block_count().await?;
    }
    let count_s = n_count as f64 / t0.elapsed().as_secs_f64();
    let hash = block1.block_hash();
    let n_block = 30;
    let t0 = Instant::now();
    let mut bytes = 0usize;
    for _ in 0..n_block {
        bytes = client.get_block_verbose(&hash, 2).await?.to_string().len();
    }
    let block_s = n_block as f64 / t0.elapsed().as_secs_f64();

    println!("| measurement | per second | ratio to raw secp256k1 verify |");
    println!("|---|---|---|");
    println!("| raw secp256k1 ECDSA verify (baseline, 1 core) | {raw_per_s:.0} sig/s | 1.00 |");
    println!(
        "| block of {P2WPKH_TXS} one-input P2WPKH spends | {p2wpkh_inputs_s:.0} inputs/s | {:.2} |",
        p2wpkh_inputs_s / raw_per_s
    );
    println!(
        "| mempool acceptance of the {P2WPKH_TXS} P2WPKH spends, policy flags on | {mempool_inputs_s:.0} inputs/s | {:.2} |",
        mempool_inputs_s / raw_per_s
    );
    println!("| block of {P2WSH_TXS} 2-of-2 P2WSH spends | {p2wsh_inputs_s:.0} inputs/s ({p2wsh_sigs_s:.0} sig/s) | {:.2} (per signature) |", p2wsh_sigs_s / raw_per_s);
    println!(
        "| mempool acceptance of the {P2WSH_TXS} P2WSH spends, policy flags on | {mempool2_inputs_s:.0} inputs/s ({:.0} sig/s) | {:.2} (per signature) |",
        2.0 * mempool2_inputs_s,
        2.0 * mempool2_inputs_s / raw_per_s
    );
    println!("| RPC getblockcount (loopback, keep-alive) | {count_s:.0} calls/s | |");
    println!(
        "| RPC getblock verbosity 2 of the 1,000-tx block ({} kB) | {block_s:.1} calls/s | |",
        bytes / 1000
    );
    node.shutdown().await;
    Ok(())
}
