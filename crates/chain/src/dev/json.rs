//! Bitcoin Core's JSON shapes for blocks, headers, transactions and scripts,
//! as the development chain's RPC server prints them.

use bitcoin::consensus::encode::serialize_hex;
use std::collections::HashMap;

use bitcoin::{Amount, Block, Network, Script, Transaction, Txid};
use serde_json::{json, Map, Value};

use super::state::{BlockEntry, ChainState};

/// Regtest's difficulty (target 0x207fffff) as Core prints it.
pub const REGTEST_DIFFICULTY: f64 = 4.656_542_373_906_925e-10;

/// An amount as Core prints it: BTC as a JSON number.
pub fn btc(amount: Amount) -> Value {
    json!(amount.to_btc())
}

/// The Core version `getnetworkinfo` reports: 30.0, whose relay policy the
/// development chain follows (`docs/chain.md`).
pub const CORE_VERSION: u32 = 300_000;

/// The service bits `getnetworkinfo` reports, as a regtest Core 30 node's:
/// NODE_NETWORK (1), NODE_WITNESS (8), NODE_NETWORK_LIMITED (1024) and
/// NODE_P2P_V2 (2048).
pub const LOCAL_SERVICES: u64 = 1 | 8 | 1024 | 2048;

/// Core's `chainwork` for a regtest block at `height` (each block is 2 units of work).
pub fn chainwork(height: u32) -> String {
    format!("{:064x}", (u128::from(height) + 1) * 2)
}

/// Core's script type names.
pub fn script_type(script: &Script) -> &'static str {
    if script.is_p2wpkh() {
        "witness_v0_keyhash"
    } else if script.is_p2wsh() {
        "witness_v0_scripthash"
    } else if script.is_p2tr() {
        "witness_v1_taproot"
    } else if script.is_p2pkh() {
        "pubkeyhash"
    } else if script.is_p2sh() {
        "scripthash"
    } else if script.is_op_return() {
        "nulldata"
    } else if script.is_p2pk() {
        "pubkey"
    } else if script.is_witness_program() {
        "witness_unknown"
    } else {
        "nonstandard"
    }
}

/// `scriptPubKey` object: `{asm, hex, address?, type}`.
pub fn script_pubkey(script: &Script) -> Value {
    let mut m = Map::new();
    m.insert("asm".into(), json!(script.to_asm_string()));
    m.insert("hex".into(), json!(hex::encode(script.as_bytes())));
    if let Ok(a) = bitcoin::Address::from_script(script, Network::Regtest) {
        m.insert("address".into(), json!(a.to_string()));
    }
    m.insert("type".into(), json!(script_type(script)));
    Value::Object(m)
}

/// The decoded transaction object of `getrawtransaction` verbose and `getblock` 2.
pub fn transaction(tx: &Transaction) -> Map<String, Value> {
    let vin: Vec<Value> = tx
        .input
        .iter()
        .map(|i| {
            let mut m = Map::new();
            if tx.is_coinbase() {
                m.insert("coinbase".into(), json!(hex::encode(i.script_sig.as_bytes())));
            } else {
                m.insert("txid".into(), json!(i.previous_output.txid.to_string()));
                m.insert("vout".into(), json!(i.previous_output.vout));
                m.insert(
                    "scriptSig".into(),
                    json!({"asm": i.script_sig.to_asm_string(), "hex": hex::encode(i.script_sig.as_bytes())}),
                );
            }
            if !i.witness.is_empty() {
                let w: Vec<String> = i.witness.iter().map(hex::encode).collect();
                m.insert("txinwitness".into(), json!(w));
            }
            m.insert("sequence".into(), json!(i.sequence.0));
            Value::Object(m)
        })
        .collect();
    let vout: Vec<Value> = tx
        .output
        .iter()
        .enumerate()
        .map(|(n, o)| json!({"value": btc(o.value), "n": n, "scriptPubKey": script_pubkey(&o.script_pubkey)}))
        .collect();
    let mut m = Map::new();
    m.insert("txid".into(), json!(tx.compute_txid().to_string()));
    m.insert("hash".into(), json!(tx.compute_wtxid().to_string()));
    m.insert("version".into(), json!(tx.version.0));
    m.insert("size".into(), json!(tx.total_size()));
    m.insert("vsize".into(), json!(tx.vsize()));
    m.insert("weight".into(), json!(tx.weight().to_wu()));
    m.insert("locktime".into(), json!(tx.lock_time.to_consensus_u32()));
    m.insert("vin".into(), json!(vin));
    m.insert("vout".into(), json!(vout));
    m
}

/// `getblockheader` verbose object (also the head of `getblock`).
pub fn header(state: &ChainState, entry: &BlockEntry) -> Map<String, Value> {
    let b = &entry.block;
    let hash = b.block_hash();
    let active = state.is_active(&hash);
    let mut m = Map::new();
    m.insert("hash".into(), json!(hash.to_string()));
    let confirmations: i64 = if active {
        i64::from(state.height()) - i64::from(entry.height) + 1
    } else {
        -1
    };
    m.insert("confirmations".into(), json!(confirmations));
    m.insert("height".into(), json!(entry.height));
    m.insert("version".into(), json!(b.header.version.to_consensus()));
    m.insert(
        "versionHex".into(),
        json!(format!("{:08x}", b.header.version.to_consensus())),
    );
    m.insert("merkleroot".into(), json!(b.header.merkle_root.to_string()));
    m.insert("time".into(), json!(b.header.time));
    let mtp = if active {
        state.median_time_past(entry.height)
    } else {
        b.header.time
    };
    m.insert("mediantime".into(), json!(mtp));
    m.insert("nonce".into(), json!(b.header.nonce));
    m.insert(
        "bits".into(),
        json!(format!("{:08x}", b.header.bits.to_consensus())),
    );
    m.insert("difficulty".into(), json!(REGTEST_DIFFICULTY));
    m.insert("chainwork".into(), json!(chainwork(entry.height)));
    m.insert("nTx".into(), json!(b.txdata.len()));
    if entry.height > 0 {
        m.insert(
            "previousblockhash".into(),
            json!(b.header.prev_blockhash.to_string()),
        );
    }
    if active {
        if let Some(next) = state.hash_at(entry.height + 1) {
            m.insert("nextblockhash".into(), json!(next.to_string()));
        }
    }
    m
}

/// `getblock` at verbosity 1 (txids) or 2 (decoded transactions with fees).
pub fn block(state: &ChainState, entry: &BlockEntry, verbosity: u8) -> Value {
    let b: &Block = &entry.block;
    let mut m = header(state, entry);
    m.insert(
        "strippedsize".into(),
        json!((b.weight().to_wu() as usize - b.total_size()) / 3),
    );
    m.insert("size".into(), json!(b.total_size()));
    m.insert("weight".into(), json!(b.weight().to_wu()));
    let txs: Vec<Value> = if verbosity >= 2 {
        // Fees need the spent outputs: earlier transactions of this block or
        // the transaction index. Core omits `fee` when undo data is missing.
        let by_txid: HashMap<Txid, &Transaction> =
            b.txdata.iter().map(|t| (t.compute_txid(), t)).collect();
        b.txdata
            .iter()
            .map(|tx| {
                let mut t = transaction(tx);
                if !tx.is_coinbase() {
                    if let Some(fee) = fee_of(state, &by_txid, tx) {
                        t.insert("fee".into(), btc(fee));
                    }
                }
                t.insert("hex".into(), json!(serialize_hex(tx)));
                Value::Object(t)
            })
            .collect()
    } else {
        b.txdata
            .iter()
            .map(|tx| json!(tx.compute_txid().to_string()))
            .collect()
    };
    m.insert("tx".into(), json!(txs));
    Value::Object(m)
}

fn fee_of(
    state: &ChainState,
    in_block: &HashMap<Txid, &Transaction>,
    tx: &Transaction,
) -> Option<Amount> {
    let mut value_in = Amount::ZERO;
    for i in &tx.input {
        let prev = &i.previous_output;
        let out = if let Some(t) = in_block.get(&prev.txid) {
            t.output.get(prev.vout as usize)?.value
        } else {
            let (h, pos) = state.tx_location(&prev.txid)?;
            state
                .entry(&h)?
                .block
                .txdata
                .get(pos)?
                .output
                .get(prev.vout as usize)?
                .value
        };
        value_in += out;
    }
    let out: Amount = tx.output.iter().map(|o| o.value).sum();
    value_in.checked_sub(out)
}
