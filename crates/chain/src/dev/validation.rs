//! Consensus and relay checks of the development chain, as pure functions over
//! a view of the spent coins: Bitcoin Core's rules and reject strings.

use bitcoin::consensus::encode::serialize;
use bitcoin::{Amount, OutPoint, Transaction, TxOut};

use crate::dev::script::{Checked, ScriptError, TxChecker};

/// `SCRIPT_VERIFY_P2SH` in libbitcoinconsensus.
const VERIFY_P2SH: u32 = 1 << 0;
/// `SCRIPT_VERIFY_DERSIG`.
const VERIFY_DERSIG: u32 = 1 << 2;
/// `SCRIPT_VERIFY_NULLDUMMY`.
const VERIFY_NULLDUMMY: u32 = 1 << 4;
/// `SCRIPT_VERIFY_CHECKLOCKTIMEVERIFY` (BIP65).
const VERIFY_CHECKLOCKTIMEVERIFY: u32 = 1 << 9;
/// `SCRIPT_VERIFY_CHECKSEQUENCEVERIFY` (BIP112).
const VERIFY_CHECKSEQUENCEVERIFY: u32 = 1 << 10;
/// `SCRIPT_VERIFY_WITNESS` (BIP141/143).
const VERIFY_WITNESS: u32 = 1 << 11;

/// Every soft fork up to segwit: regtest activates them all from height 1.
/// libbitcoinconsensus 25.1 as wrapped by rust-bitcoin 0.32 has no
/// spent-outputs argument, so taproot is verified by [`crate::dev::script`].
pub const SCRIPT_FLAGS: u32 = VERIFY_P2SH
    | VERIFY_DERSIG
    | VERIFY_NULLDUMMY
    | VERIFY_CHECKLOCKTIMEVERIFY
    | VERIFY_CHECKSEQUENCEVERIFY
    | VERIFY_WITNESS;

/// Blocks a coinbase output must wait before it is spent.
pub const COINBASE_MATURITY: u32 = 100;
/// Largest block weight (BIP141).
pub const MAX_BLOCK_WEIGHT: u64 = 4_000_000;
/// Largest standard transaction weight (Bitcoin Core policy).
pub const MAX_STANDARD_TX_WEIGHT: u64 = 400_000;
/// Smallest standard non-witness size (Bitcoin Core policy, CVE-2017-12842).
pub const MIN_STANDARD_TX_NONWITNESS_SIZE: usize = 65;
/// Core's `MAX_STANDARD_TX_SIGOPS_COST`.
pub const MAX_STANDARD_TX_SIGOPS_COST: usize = 16_000;
/// Core's `MAX_OP_RETURN_RELAY` (`-datacarriersize` default) since Core 30:
/// 100,000 bytes of OP_RETURN scripts in all outputs together
/// (`MAX_STANDARD_TX_WEIGHT / WITNESS_SCALE_FACTOR`; before 30: one output of
/// at most 83 bytes).
pub const MAX_OP_RETURN_RELAY: usize = 100_000;
/// Locktime values below this are block heights, above are UNIX times.
const LOCKTIME_THRESHOLD: u32 = 500_000_000;

/// Which Bitcoin Core RPC error code a rejection maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectKind {
    /// `RPC_VERIFY_REJECTED` (-26): invalid or against policy.
    Rejected,
    /// `RPC_VERIFY_ERROR` (-25): missing or spent inputs, and other general failures.
    Error,
    /// `RPC_VERIFY_ALREADY_IN_CHAIN` (-27).
    AlreadyInChain,
}

impl RejectKind {
    /// The Bitcoin Core RPC error code.
    pub fn code(self) -> i32 {
        match self {
            RejectKind::Rejected => crate::rpc::codes::RPC_VERIFY_REJECTED,
            RejectKind::Error => crate::rpc::codes::RPC_VERIFY_ERROR,
            RejectKind::AlreadyInChain => crate::rpc::codes::RPC_VERIFY_ALREADY_IN_CHAIN,
        }
    }
}

/// A transaction rejected, with Bitcoin Core's reject reason string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct TxReject {
    /// Which RPC code the reason maps to.
    pub kind: RejectKind,
    /// Core's refusal as `sendrawtransaction` words it: the reject reason
    /// (e.g. `bad-txns-inputs-missingorspent`), then any debug part after
    /// `", "` (`min relay fee not met, 0 < 11`); see [`TxReject::reject_reason`].
    pub reason: String,
}

impl TxReject {
    /// Core's reject reason alone (`GetRejectReason`: `testmempoolaccept`'s
    /// `reject-reason`): [`TxReject::reason`] up to its debug part, which
    /// follows the first `", "` outside parentheses (`min relay fee not
    /// met` of `min relay fee not met, 0 < 11`).
    pub fn reject_reason(&self) -> &str {
        let mut depth = 0i32;
        for (i, c) in self.reason.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 && self.reason[i + 1..].starts_with(' ') => {
                    return &self.reason[..i];
                }
                _ => {}
            }
        }
        &self.reason
    }

    pub(crate) fn rejected(reason: impl Into<String>) -> Self {
        Self {
            kind: RejectKind::Rejected,
            reason: reason.into(),
        }
    }
    pub(crate) fn error(reason: impl Into<String>) -> Self {
        Self {
            kind: RejectKind::Error,
            reason: reason.into(),
        }
    }
}

/// A spendable output with where it was created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coin {
    /// Value and script.
    pub txout: TxOut,
    /// Height of the block that created it (tip + 1 for mempool outputs).
    pub height: u32,
    /// Whether it is a coinbase output (subject to maturity).
    pub coinbase: bool,
}

/// Where a transaction is being checked: the block it would be in.
#[derive(Debug, Clone, Copy)]
pub struct BlockContext {
    /// Height of the block that would include the transaction.
    pub height: u32,
    /// Median time past of the block before it (BIP113).
    pub prev_median_time: u32,
}

/// Context-free checks (Core's `CheckTransaction`).
///
/// # Errors
/// The Core reject reason.
pub fn check_transaction(tx: &Transaction) -> Result<(), TxReject> {
    if tx.input.is_empty() {
        return Err(TxReject::rejected("bad-txns-vin-empty"));
    }
    if tx.output.is_empty() {
        return Err(TxReject::rejected("bad-txns-vout-empty"));
    }
    if tx.base_size() * 4 > MAX_BLOCK_WEIGHT as usize {
        return Err(TxReject::rejected("bad-txns-oversize"));
    }
    let mut total = Amount::ZERO;
    for o in &tx.output {
        if o.value > Amount::MAX_MONEY {
            return Err(TxReject::rejected("bad-txns-vout-toolarge"));
        }
        total = match total.checked_add(o.value) {
            Some(t) if t <= Amount::MAX_MONEY => t,
            _ => return Err(TxReject::rejected("bad-txns-txouttotal-toolarge")),
        };
    }
    let mut seen = std::collections::HashSet::with_capacity(tx.input.len());
    for i in &tx.input {
        if !seen.insert(i.previous_output) {
            return Err(TxReject::rejected("bad-txns-inputs-duplicate"));
        }
    }
    if tx.is_coinbase() {
        let len = tx.input[0].script_sig.len();
        if !(2..=100).contains(&len) {
            return Err(TxReject::rejected("bad-cb-length"));
        }
    } else if tx
        .input
        .iter()
        .any(|i| i.previous_output == OutPoint::null())
    {
        return Err(TxReject::rejected("bad-txns-prevout-null"));
    }
    Ok(())
}

/// Whether `tx` is final in a block at `ctx` (Core's `IsFinalTx` with BIP113).
pub fn is_final(tx: &Transaction, ctx: BlockContext) -> bool {
    let lock = tx.lock_time.to_consensus_u32();
    if lock == 0 {
        return true;
    }
    let cutoff = if lock < LOCKTIME_THRESHOLD {
        ctx.height
    } else {
        ctx.prev_median_time
    };
    if lock < cutoff {
        return true;
    }
    tx.input.iter().all(|i| i.sequence.0 == u32::MAX)
}

/// BIP68 relative locks of `tx`'s inputs, checked against `ctx`.
///
/// `coins[i]` is the coin input `i` spends; `median_time_before(h)` gives the
/// median time past of the block at height `h - 1` (the coin's "time").
pub fn sequence_locks_ok(
    tx: &Transaction,
    coins: &[&Coin],
    ctx: BlockContext,
    median_time_before: impl Fn(u32) -> u32,
) -> bool {
    // BIP68 applies only to version 2 and later.
    if tx.version.0 < 2 {
        return true;
    }
    let mut min_height: i64 = -1;
    let mut min_time: i64 = -1;
    for (input, coin) in tx.input.iter().zip(coins) {
        let seq = input.sequence.0;
        if seq & (1 << 31) != 0 {
            continue; // disable flag
        }
        let value = i64::from(seq & 0xffff);
        if seq & (1 << 22) != 0 {
            let coin_time = i64::from(median_time_before(coin.height));
            min_time = min_time.max(coin_time + (value << 9) - 1);
        } else {
            min_height = min_height.max(i64::from(coin.height) + value - 1);
        }
    }
    min_height < i64::from(ctx.height) && min_time < i64::from(ctx.prev_median_time)
}

/// Checks inputs against the coins they spend (maturity, value) and returns the fee.
///
/// # Errors
/// Core's reject reasons for immature coinbase spends and value overflows.
pub fn check_tx_inputs(
    tx: &Transaction,
    coins: &[&Coin],
    spend_height: u32,
) -> Result<Amount, TxReject> {
    let mut value_in = Amount::ZERO;
    for coin in coins {
        if coin.coinbase {
            let depth = spend_height.saturating_sub(coin.height);
            if depth < COINBASE_MATURITY {
                return Err(TxReject::rejected(format!(
                    "bad-txns-premature-spend-of-coinbase, tried to spend coinbase at depth {depth}"
                )));
            }
        }
        value_in = value_in
            .checked_add(coin.txout.value)
            .filter(|v| *v <= Amount::MAX_MONEY)
            .ok_or_else(|| TxReject::rejected("bad-txns-inputvalues-outofrange"))?;
    }
    let value_out: Amount = tx.output.iter().map(|o| o.value).sum();
    if value_in < value_out {
        return Err(TxReject::rejected(format!(
            "bad-txns-in-belowout, value in ({}) < value out ({})",
            value_in.to_btc(),
            value_out.to_btc()
        )));
    }
    Ok(value_in - value_out)
}

/// Where a script is verified, which decides Core's reject prefix: since
/// Core 30 every script failure of an unconfirmed transaction is
/// `mempool-script-verify-flag-failed (…)` (consensus or policy alike;
/// before it, `mandatory-script-verify-flag-failed` and
/// `non-mandatory-script-verify-flag`), and one in a block is
/// `block-script-verify-flag-failed (…)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScriptContext {
    Mempool,
    Block,
}

impl ScriptContext {
    /// Core's refusal of input `index` of `tx`: the reason, then (Core's
    /// debug message, part of `sendrawtransaction`'s text and of
    /// `testmempoolaccept`'s `reject-details`) the input and what it spends.
    fn reject(self, what: impl std::fmt::Display, tx: &Transaction, index: usize) -> TxReject {
        let prefix = match self {
            Self::Mempool => "mempool-script-verify-flag-failed",
            Self::Block => "block-script-verify-flag-failed",
        };
        let spending = tx
            .input
            .get(index)
            .map(|i| i.previous_output.to_string())
            .unwrap_or_default();
        TxReject::rejected(format!(
            "{prefix} ({what}), input {index} of {} (wtxid {}), spending {spending}",
            tx.compute_txid(),
            tx.compute_wtxid()
        ))
    }
}

/// Verifies every input's script by consensus, for a block:
/// libbitcoinconsensus (Core 25.1, consensus flags) for everything it
/// knows, and our own check of taproot spends, which that version cannot
/// verify.
///
/// # Errors
/// `block-script-verify-flag-failed (…)` naming the input, or for taproot
/// with Core's script error text.
pub fn verify_scripts(tx: &Transaction, coins: &[&Coin]) -> Result<(), TxReject> {
    verify_consensus(tx, coins, ScriptContext::Block)?;
    if coins.iter().any(|c| c.txout.script_pubkey.is_p2tr()) {
        let mut checker = TxChecker::new(tx, prevouts(coins), false);
        check_taproot_inputs(&mut checker, tx, coins, ScriptContext::Block)?;
    }
    Ok(())
}

/// [`verify_scripts`] with Core's policy script flags on, for the mempool:
/// after consensus passed, NULLFAIL, MINIMALIF and CLEANSTACK on legacy and
/// segwit v0 inputs, and the taproot upgrade flags (OP_SUCCESSx, unknown
/// leaf versions and key types), by [`crate::dev::script`]. P2WPKH inputs
/// are not interpreted: consensus already implies those flags for them.
///
/// # Errors
/// `mempool-script-verify-flag-failed (…)`, for consensus failures naming
/// the input, for policy ones with Core's script error text.
pub fn verify_scripts_policy(tx: &Transaction, coins: &[&Coin]) -> Result<(), TxReject> {
    verify_consensus(tx, coins, ScriptContext::Mempool)?;
    if coins.iter().all(|c| c.txout.script_pubkey.is_p2wpkh()) {
        return Ok(());
    }
    let mut checker = TxChecker::new(tx, prevouts(coins), true);
    check_taproot_inputs(&mut checker, tx, coins, ScriptContext::Mempool)?;
    for (index, coin) in coins.iter().enumerate() {
        let spk = &coin.txout.script_pubkey;
        if spk.is_p2wpkh() || spk.is_p2tr() {
            continue;
        }
        match checker.check_policy(index) {
            Ok(Checked::Passed) => {}
            Ok(Checked::Unmodelled(what)) => {
                tracing::debug!(input = index, what, "policy flags not checked");
            }
            // Consensus passed: what the interpreter finds is policy. Only
            // the flags it exists for may refuse; anything else would be a
            // disagreement with libbitcoinconsensus, so it lets it through.
            Err(e @ (ScriptError::NullFail | ScriptError::MinimalIf | ScriptError::CleanStack)) => {
                return Err(ScriptContext::Mempool.reject(e.text(), tx, index));
            }
            Err(e) => {
                tracing::warn!(
                    input = index,
                    error = e.text(),
                    "policy interpreter disagrees with consensus"
                );
            }
        }
    }
    Ok(())
}

fn prevouts(coins: &[&Coin]) -> Vec<TxOut> {
    coins.iter().map(|c| c.txout.clone()).collect()
}

fn check_taproot_inputs(
    checker: &mut TxChecker<'_>,
    tx: &Transaction,
    coins: &[&Coin],
    context: ScriptContext,
) -> Result<(), TxReject> {
    for (index, coin) in coins.iter().enumerate() {
        if !coin.txout.script_pubkey.is_p2tr() {
            continue;
        }
        match checker.check_taproot(index) {
            Ok(Checked::Passed) => {}
            Ok(Checked::Unmodelled(what)) => {
                tracing::debug!(input = index, what, "tapscript not verified");
            }
            // Policy-only errors arise only with the policy flags on, i.e.
            // in the mempool; Core 30 words both kinds alike there.
            Err(e) => return Err(context.reject(e.text(), tx, index)),
        }
    }
    Ok(())
}

/// libbitcoinconsensus on every input (taproot outputs are anyone-can-spend to it).
fn verify_consensus(
    tx: &Transaction,
    coins: &[&Coin],
    context: ScriptContext,
) -> Result<(), TxReject> {
    let bytes = serialize(tx);
    for (index, coin) in coins.iter().enumerate() {
        bitcoin::consensus::validation::verify_script_with_flags(
            &coin.txout.script_pubkey,
            index,
            coin.txout.value,
            &bytes,
            SCRIPT_FLAGS,
        )
        .map_err(|e| context.reject(e, tx, index))?;
    }
    Ok(())
}

/// Relay policy checks that do not need the inputs (a subset of Core's `IsStandardTx`).
///
/// # Errors
/// Core's reject reasons: `version`, `tx-size`, `tx-size-small`, `scriptsig-not-pushonly`, `dust`.
pub fn check_standard(tx: &Transaction) -> Result<(), TxReject> {
    if !(1..=3).contains(&tx.version.0) {
        return Err(TxReject::rejected("version"));
    }
    if tx.weight().to_wu() > MAX_STANDARD_TX_WEIGHT {
        return Err(TxReject::rejected("tx-size"));
    }
    if tx.base_size() < MIN_STANDARD_TX_NONWITNESS_SIZE {
        return Err(TxReject::rejected("tx-size-small"));
    }
    if tx.input.iter().any(|i| !i.script_sig.is_push_only()) {
        return Err(TxReject::rejected("scriptsig-not-pushonly"));
    }
    let mut data_bytes_left = MAX_OP_RETURN_RELAY;
    for o in &tx.output {
        let script = &o.script_pubkey;
        if script.is_op_return() {
            // Core's TxoutType::NULL_DATA: OP_RETURN then pushes only. Since
            // Core 30 any number of them, their scripts together within
            // `-datacarriersize` (which the weight limit reaches first).
            let pushes_only = bitcoin::Script::from_bytes(&script.as_bytes()[1..]).is_push_only();
            if !pushes_only {
                return Err(TxReject::rejected("scriptpubkey"));
            }
            data_bytes_left = data_bytes_left
                .checked_sub(script.len())
                .ok_or_else(|| TxReject::rejected("datacarrier"))?;
            continue;
        }
        let standard = script.is_p2pkh()
            || script.is_p2sh()
            || script.is_witness_program()
            || script.is_p2pk()
            || is_standard_bare_multisig(script);
        if !standard {
            return Err(TxReject::rejected("scriptpubkey"));
        }
        if o.value < script.minimal_non_dust() {
            return Err(TxReject::rejected("dust"));
        }
    }
    Ok(())
}

/// Bare multisig Core relays: 1 to 3 keys (`-permitbaremultisig`, on by default).
fn is_standard_bare_multisig(script: &bitcoin::Script) -> bool {
    use bitcoin::opcodes::all::OP_CHECKMULTISIG;
    let b = script.as_bytes();
    if b.len() < 3 || b[b.len() - 1] != OP_CHECKMULTISIG.to_u8() {
        return false;
    }
    let small = |op: u8| (0x51..=0x60).contains(&op).then(|| op - 0x50);
    match (small(b[0]), small(b[b.len() - 2])) {
        (Some(m), Some(n)) => (1..=3).contains(&n) && (1..=n).contains(&m),
        _ => false,
    }
}

/// Core's policy script flags that libbitcoinconsensus does not take,
/// checked on the witness and scriptSig data: LOW_S (every DER signature
/// has S in the lower half) and WITNESS_PUBKEYTYPE (keys in segwit v0 are
/// compressed), plus the sigop cost limit.
///
/// # Errors
/// `mempool-script-verify-flag-failed (…)` with Core's script error text,
/// or `bad-txns-too-many-sigops`.
pub fn check_policy_scripts(tx: &Transaction, coins: &[&Coin]) -> Result<(), TxReject> {
    for (index, (input, coin)) in tx.input.iter().zip(coins).enumerate() {
        let non_mandatory = |what: &str| ScriptContext::Mempool.reject(what, tx, index);
        let spk = &coin.txout.script_pubkey;
        let witness: Vec<&[u8]> = input.witness.iter().collect();
        // In P2WSH the last witness item is the script. (P2SH-wrapped
        // segwit is checked by its signatures only; see docs/chain.md.)
        let (items, script): (&[&[u8]], Option<&[u8]>) = match witness.split_last() {
            Some((last, rest)) if spk.is_p2wsh() => (rest, Some(*last)),
            _ => (&witness[..], None),
        };
        if spk.is_p2wpkh() {
            if let Some(key) = witness.get(1) {
                if key.len() != 33 {
                    return Err(non_mandatory("Using non-compressed keys in segwit"));
                }
            }
        }
        if let Some(script) = script {
            for ins in bitcoin::Script::from_bytes(script).instructions().flatten() {
                if let bitcoin::script::Instruction::PushBytes(p) = ins {
                    if p.len() == 65 && p.as_bytes()[0] == 0x04 {
                        return Err(non_mandatory("Using non-compressed keys in segwit"));
                    }
                }
            }
        }
        let script_sig_pushes = input
            .script_sig
            .instructions()
            .flatten()
            .filter_map(|i| match i {
                bitcoin::script::Instruction::PushBytes(p) => Some(p.as_bytes()),
                _ => None,
            });
        for item in items.iter().copied().chain(script_sig_pushes) {
            if is_high_s_signature(item) {
                return Err(non_mandatory(
                    "Non-canonical signature: S value is unnecessarily high",
                ));
            }
        }
    }
    // Inputs are few in almost every transaction: a linear search beats
    // building a map; a map above that keeps large ones linear overall.
    let cost = if tx.input.len() <= 16 {
        tx.total_sigop_cost(|op| {
            tx.input
                .iter()
                .position(|i| i.previous_output == *op)
                .map(|k| coins[k].txout.clone())
        })
    } else {
        let spent: std::collections::HashMap<OutPoint, &TxOut> = tx
            .input
            .iter()
            .zip(coins)
            .map(|(i, c)| (i.previous_output, &c.txout))
            .collect();
        tx.total_sigop_cost(|op| spent.get(op).map(|o| (*o).clone()))
    };
    if cost > MAX_STANDARD_TX_SIGOPS_COST {
        return Err(TxReject::rejected("bad-txns-too-many-sigops"));
    }
    Ok(())
}

/// Whether `item` is a strict-DER ECDSA signature plus sighash byte whose S
/// is in the upper half of the order (BIP146 LOW_S).
fn is_high_s_signature(item: &[u8]) -> bool {
    if !(9..=73).contains(&item.len()) || item[0] != 0x30 {
        return false;
    }
    let Ok(sig) = bitcoin::secp256k1::ecdsa::Signature::from_der(&item[..item.len() - 1]) else {
        return false;
    };
    let mut low = sig;
    low.normalize_s();
    low != sig
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::absolute::LockTime;
    use bitcoin::transaction::Version;
    use bitcoin::{ScriptBuf, Sequence, TxIn, Witness};

    fn tx(version: i32, lock: u32, seq: u32) -> Transaction {
        Transaction {
            version: Version(version),
            lock_time: LockTime::from_consensus(lock),
            input: vec![TxIn {
                previous_output: OutPoint::new(bitcoin::Txid::from_byte_array([1; 32]), 0),
                script_sig: ScriptBuf::new(),
                sequence: Sequence(seq),
                witness: Witness::new(),
            }],
            output: vec![TxOut {
                value: Amount::from_sat(1000),
                script_pubkey: ScriptBuf::new(),
            }],
        }
    }
    use bitcoin::hashes::Hash as _;

    #[test]
    fn finality_follows_core() {
        let ctx = BlockContext {
            height: 100,
            prev_median_time: 1_600_000_000,
        };
        assert!(is_final(&tx(2, 99, 0), ctx));
        assert!(!is_final(&tx(2, 100, 0), ctx));
        assert!(is_final(&tx(2, 100, u32::MAX), ctx));
        assert!(is_final(&tx(2, 1_599_999_999, 0), ctx));
        assert!(!is_final(&tx(2, 1_600_000_000, 0), ctx));
    }

    #[test]
    fn bip68_height_and_time_locks() {
        let coin = Coin {
            txout: TxOut::NULL,
            height: 50,
            coinbase: false,
        };
        let ctx = BlockContext {
            height: 60,
            prev_median_time: 10_000,
        };
        // 10 blocks relative: coin at 50 spendable in block 60.
        assert!(sequence_locks_ok(&tx(2, 0, 10), &[&coin], ctx, |_| 0));
        assert!(!sequence_locks_ok(&tx(2, 0, 11), &[&coin], ctx, |_| 0));
        // Version 1 and the disable flag ignore the lock.
        assert!(sequence_locks_ok(&tx(1, 0, 11), &[&coin], ctx, |_| 0));
        assert!(sequence_locks_ok(
            &tx(2, 0, (1 << 31) | 11),
            &[&coin],
            ctx,
            |_| 0
        ));
        // Time lock of 2 units (1024 s) from a coin time of 8_000.
        let t = (1 << 22) | 2;
        assert!(sequence_locks_ok(&tx(2, 0, t), &[&coin], ctx, |_| 8_000));
        assert!(!sequence_locks_ok(&tx(2, 0, t), &[&coin], ctx, |_| 9_000));
    }

    #[test]
    fn immature_coinbase_and_overspend() {
        let coin = Coin {
            txout: TxOut {
                value: Amount::from_sat(500),
                script_pubkey: ScriptBuf::new(),
            },
            height: 10,
            coinbase: true,
        };
        let err = check_tx_inputs(&tx(2, 0, 0), &[&coin], 109).unwrap_err();
        assert!(
            err.reason
                .starts_with("bad-txns-premature-spend-of-coinbase"),
            "{err}"
        );
        let err = check_tx_inputs(&tx(2, 0, 0), &[&coin], 110).unwrap_err();
        assert!(err.reason.starts_with("bad-txns-in-belowout"), "{err}");
    }
}
