//! The development chain's state: the block tree, the active chain, the UTXO
//! set with undo data, a transaction index and the mempool. Synchronous and
//! free of IO; [`super::DevChain`] wraps it with persistence and a lock.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bitcoin::block::{Header, Version as BlockVersion};
use bitcoin::blockdata::constants::genesis_block;
use bitcoin::hashes::Hash as _;
use bitcoin::pow::CompactTarget;
use bitcoin::script::Builder;
use bitcoin::transaction::Version;
use bitcoin::{
    absolute::LockTime, Amount, Block, BlockHash, FeeRate, Network, OutPoint, Script, ScriptBuf,
    Sequence, Transaction, TxIn, TxMerkleNode, TxOut, Txid, Witness,
};

use super::validation::{
    check_policy_scripts, check_standard, check_transaction, check_tx_inputs, is_final,
    sequence_locks_ok, verify_scripts, verify_scripts_policy, BlockContext, Coin, TxReject,
};

/// Regtest's proof-of-work limit, used for every block (no retargeting on regtest).
pub const REGTEST_BITS: u32 = 0x207f_ffff;
/// Regtest halves the subsidy every 150 blocks.
const HALVING_INTERVAL: u32 = 150;
/// Default minimum relay fee rate (`-minrelaytxfee`): 100 sat/kvB = 0.1
/// sat/vB = 25 sat/kWU exactly, as Bitcoin Core since version 30 (it was
/// 1 sat/vB before). `FeeRate::fee_vb` rounds up, as Core's
/// `CFeeRate::GetFee`: 110 vB pay at least 11 sat, 111 vB 12 sat.
pub const DEFAULT_MIN_RELAY_FEE: FeeRate = FeeRate::from_sat_per_kwu(25);
/// Default `-incrementalrelayfee`: 100 sat/kvB, as Bitcoin Core since
/// version 30 — what a replacement must add for its own size, and how far
/// above an evicted transaction's rate a full mempool's floor rises.
pub const DEFAULT_INCREMENTAL_RELAY_FEE: FeeRate = FeeRate::from_sat_per_kwu(25);
/// Core's `-limitancestorcount` / `-limitdescendantcount`: a transaction
/// and its in-mempool ancestors (or descendants) number at most 25.
pub const MAX_PACKAGE_COUNT: usize = 25;
/// Core's `-limitancestorsize` / `-limitdescendantsize`: 101 kvB.
pub const MAX_PACKAGE_VSIZE: u64 = 101_000;
/// Core's `-maxmempool` default: 300 MB (counted here in virtual bytes of
/// transactions, a lower bound of Core's memory usage figure).
pub const DEFAULT_MAX_MEMPOOL_VBYTES: u64 = 300_000_000;

/// A block refused by consensus checks, with Core's reject reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BlockReject(pub String);

/// A block the state knows, on the active chain or not.
#[derive(Debug, Clone)]
pub struct BlockEntry {
    /// The block.
    pub block: Arc<Block>,
    /// Its height.
    pub height: u32,
    /// Arrival order (first seen wins among equal-height tips).
    seq: u64,
    /// Whether it has been fully validated once (scripts included).
    validated: bool,
}

/// A transaction waiting in the mempool.
#[derive(Debug, Clone)]
pub struct MempoolEntry {
    /// The transaction.
    pub tx: Transaction,
    /// inputs − outputs.
    pub fee: Amount,
    /// Virtual size.
    pub vsize: u64,
    /// UNIX time of arrival.
    pub time: u64,
    /// Tip height at arrival.
    pub height: u32,
    seq: u64,
}

/// What acceptance to the mempool measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The txid.
    pub txid: Txid,
    /// Fee paid.
    pub fee: Amount,
    /// Virtual size.
    pub vsize: u64,
}

/// Core's `FormatMoney`: BTC with 8 decimals, trailing zeros trimmed down
/// to 2 (`0.0000001`, `1.00`), as its reject texts print amounts.
pub fn format_money(amount: Amount) -> String {
    let sat = amount.to_sat();
    let mut s = format!("{}.{:08}", sat / 100_000_000, sat % 100_000_000);
    while s.ends_with('0') && s.len() - s.find('.').map_or(0, |d| d + 1) > 2 {
        s.pop();
    }
    s
}

/// Block subsidy at `height` under regtest's halving schedule.
pub fn subsidy(height: u32) -> Amount {
    let halvings = height / HALVING_INTERVAL;
    if halvings >= 64 {
        return Amount::ZERO;
    }
    Amount::from_sat((50 * 100_000_000) >> halvings)
}

/// The full state of the development chain.
#[derive(Debug, Clone)]
pub struct ChainState {
    index: HashMap<BlockHash, BlockEntry>,
    active: Vec<BlockHash>,
    invalid: HashSet<BlockHash>,
    utxo: HashMap<OutPoint, Coin>,
    undo: HashMap<BlockHash, Vec<(OutPoint, Coin)>>,
    tx_index: HashMap<Txid, (BlockHash, usize)>,
    mempool: HashMap<Txid, MempoolEntry>,
    spent_by: HashMap<OutPoint, Txid>,
    seq: u64,
    min_relay: FeeRate,
    incremental_relay: FeeRate,
    /// Raised above `min_relay` when the mempool is full (Core's rolling
    /// minimum, without the decay).
    mempool_min: FeeRate,
    max_mempool_vbytes: u64,
    mempool_vbytes: u64,
    /// Wins ties among equal-height tips (the tip persisted before a restart).
    preferred_tip: Option<BlockHash>,
    /// Core 28's `-mempoolfullrbf` (on by default): conflicts are replaced
    /// when the newcomer pays more, whether or not they signal BIP125.
    full_rbf: bool,
    /// `prioritisetransaction` deltas (sat) by txid, kept until the
    /// transaction is mined, as Core's `mapDeltas`.
    fee_deltas: HashMap<Txid, i64>,
    /// The fee-market mode's threshold: blocks take only transactions
    /// whose ancestor package pays at least this (Core's `-blockmintxfee`);
    /// `None` takes every valid transaction.
    block_min_fee: Option<FeeRate>,
}

impl Default for ChainState {
    fn default() -> Self {
        Self::new()
    }
}

impl ChainState {
    /// A chain holding only the regtest genesis block.
    pub fn new() -> Self {
        let genesis = genesis_block(Network::Regtest);
        let hash = genesis.block_hash();
        let mut index = HashMap::new();
        index.insert(
            hash,
            BlockEntry {
                block: Arc::new(genesis),
                height: 0,
                seq: 0,
                validated: true,
            },
        );
        Self {
            index,
            active: vec![hash],
            invalid: HashSet::new(),
            utxo: HashMap::new(),
            undo: HashMap::new(),
            tx_index: HashMap::new(),
            mempool: HashMap::new(),
            spent_by: HashMap::new(),
            seq: 1,
            min_relay: DEFAULT_MIN_RELAY_FEE,
            incremental_relay: DEFAULT_INCREMENTAL_RELAY_FEE,
            mempool_min: FeeRate::ZERO,
            max_mempool_vbytes: DEFAULT_MAX_MEMPOOL_VBYTES,
            mempool_vbytes: 0,
            preferred_tip: None,
            full_rbf: true,
            fee_deltas: HashMap::new(),
            block_min_fee: None,
        }
    }

    /// Switches replacement off (first seen wins, `txn-mempool-conflict`)
    /// or on (Core 28's default full RBF).
    pub fn set_full_rbf(&mut self, on: bool) {
        self.full_rbf = on;
    }

    /// Whether conflicting transactions may replace mempool ones.
    pub fn full_rbf(&self) -> bool {
        self.full_rbf
    }

    /// Activates the best chain, preferring `tip` among tips of equal work:
    /// a restart keeps the active chain it had (arrival order alone would
    /// pick the first-seen branch).
    pub fn activate_preferring(&mut self, tip: Option<BlockHash>, now: u64) {
        self.preferred_tip = tip;
        self.activate_best_chain(now);
        self.preferred_tip = None;
    }

    /// The fee rate a transaction needs now: the minimum relay fee, or more
    /// while the mempool is full (`getmempoolinfo.mempoolminfee`).
    pub fn mempool_min_fee(&self) -> FeeRate {
        self.min_relay.max(self.mempool_min)
    }

    /// Sets the mempool's floor above the relay minimum, as a full mempool
    /// does on Core (tests use it to provoke `mempool min fee not met`).
    pub fn set_mempool_min_fee(&mut self, rate: FeeRate) {
        self.mempool_min = rate;
    }

    /// Caps the mempool at `vbytes` of transactions (Core's `-maxmempool`).
    pub fn set_max_mempool_vbytes(&mut self, vbytes: u64) {
        self.max_mempool_vbytes = vbytes;
    }

    /// Total virtual size of the mempool's transactions.
    pub fn mempool_vbytes(&self) -> u64 {
        self.mempool_vbytes
    }

    /// Minimum relay fee rate.
    pub fn min_relay_fee(&self) -> FeeRate {
        self.min_relay
    }

    /// Sets the minimum relay fee rate (Core's `-minrelaytxfee`).
    pub fn set_min_relay_fee(&mut self, rate: FeeRate) {
        self.min_relay = rate;
    }

    /// Core's `-incrementalrelayfee`.
    pub fn incremental_relay_fee(&self) -> FeeRate {
        self.incremental_relay
    }

    /// `prioritisetransaction`: adds `delta_sat` to the fee that mining (and
    /// the fee-market threshold) counts for `txid`, whether or not it is in
    /// the mempool yet; deltas add up and are dropped once it is mined.
    pub fn prioritise(&mut self, txid: Txid, delta_sat: i64) {
        let d = self.fee_deltas.entry(txid).or_insert(0);
        *d = d.saturating_add(delta_sat);
        if *d == 0 {
            self.fee_deltas.remove(&txid);
        }
    }

    /// The `prioritisetransaction` delta of `txid` (0 if none).
    pub fn fee_delta(&self, txid: &Txid) -> i64 {
        self.fee_deltas.get(txid).copied().unwrap_or(0)
    }

    /// A mempool entry's fee plus its delta (Core's "modified fee"), in sat;
    /// may be negative.
    pub fn modified_fee_sat(&self, txid: &Txid, entry: &MempoolEntry) -> i64 {
        i64::try_from(entry.fee.to_sat())
            .unwrap_or(i64::MAX)
            .saturating_add(self.fee_delta(txid))
    }

    /// Switches the fee-market mode on (`Some(threshold)`: blocks take only
    /// transactions whose ancestor package, at modified fees, pays at
    /// least `threshold`) or off (`None`: every valid transaction).
    pub fn set_block_min_fee(&mut self, threshold: Option<FeeRate>) {
        self.block_min_fee = threshold;
    }

    /// The fee-market threshold, if on.
    pub fn block_min_fee(&self) -> Option<FeeRate> {
        self.block_min_fee
    }

    /// The mempool transactions a block takes in fee-market mode, by
    /// ancestor score as Core's `BlockAssembler`: repeatedly the
    /// transaction whose package (itself and its not yet chosen in-mempool
    /// ancestors) has the highest modified fee rate, with its package,
    /// while that rate reaches `threshold`. So a child paying for its
    /// parent (CPFP) pulls the parent in.
    fn select_by_ancestor_score(&self, threshold: FeeRate) -> HashSet<Txid> {
        let mut chosen: HashSet<Txid> = HashSet::new();
        loop {
            let mut best: Option<(i64, u64, u64, Vec<Txid>)> = None;
            for entry in self.mempool_entries() {
                let txid = entry.tx.compute_txid();
                if chosen.contains(&txid) {
                    continue;
                }
                let mut package: Vec<Txid> = self
                    .mempool_ancestors(&txid, false)
                    .into_iter()
                    .filter(|a| !chosen.contains(a))
                    .collect();
                package.push(txid);
                let (fee, vsize) = package
                    .iter()
                    .filter_map(|t| self.mempool.get(t).map(|e| (t, e)))
                    .fold((0i64, 0u64), |(f, v), (t, e)| {
                        (f.saturating_add(self.modified_fee_sat(t, e)), v + e.vsize)
                    });
                // fee / vsize > best_fee / best_vsize, compared without
                // division; the earlier arrival wins ties.
                let better = best.as_ref().is_none_or(|(bf, bv, _, _)| {
                    i128::from(fee) * i128::from(*bv) > i128::from(*bf) * i128::from(vsize)
                });
                if better {
                    best = Some((fee, vsize, entry.seq, package));
                }
            }
            let Some((fee, vsize, _, package)) = best else {
                break;
            };
            let needed = threshold
                .fee_vb(vsize)
                .unwrap_or(Amount::MAX_MONEY)
                .to_sat();
            // A negative modified fee (a negative delta) never reaches it.
            if u64::try_from(fee).map_or(true, |f| f < needed) {
                break;
            }
            chosen.extend(package);
        }
        chosen
    }

    /// Height of the active tip.
    pub fn height(&self) -> u32 {
        (self.active.len() - 1) as u32
    }

    /// Hash of the active tip.
    pub fn tip_hash(&self) -> BlockHash {
        self.active[self.active.len() - 1]
    }

    /// Hash of the active block at `height`.
    pub fn hash_at(&self, height: u32) -> Option<BlockHash> {
        self.active.get(height as usize).copied()
    }

    /// A known block (active or not).
    pub fn entry(&self, hash: &BlockHash) -> Option<&BlockEntry> {
        self.index.get(hash)
    }

    /// Whether `hash` is on the active chain.
    pub fn is_active(&self, hash: &BlockHash) -> bool {
        self.index
            .get(hash)
            .is_some_and(|e| self.hash_at(e.height) == Some(*hash))
    }

    /// Blocks marked invalid (by `invalidateblock` or failed validation).
    pub fn invalid(&self) -> &HashSet<BlockHash> {
        &self.invalid
    }

    /// Median time past of the active block at `height` (BIP113).
    pub fn median_time_past(&self, height: u32) -> u32 {
        let start = height.saturating_sub(10);
        let mut times: Vec<u32> = (start..=height)
            .filter_map(|h| self.hash_at(h))
            .filter_map(|h| self.index.get(&h))
            .map(|e| e.block.header.time)
            .collect();
        times.sort_unstable();
        times.get(times.len() / 2).copied().unwrap_or(0)
    }

    /// The context of the next block on the active tip.
    pub fn next_context(&self) -> BlockContext {
        BlockContext {
            height: self.height() + 1,
            prev_median_time: self.median_time_past(self.height()),
        }
    }

    /// Confirmed unspent output.
    pub fn utxo(&self, outpoint: &OutPoint) -> Option<&Coin> {
        self.utxo.get(outpoint)
    }

    /// Every confirmed unspent output paying `script` (for the faucet).
    pub fn utxos_for(&self, script: &Script) -> Vec<(OutPoint, Coin)> {
        self.utxo
            .iter()
            .filter(|(_, c)| c.txout.script_pubkey.as_script() == script)
            .map(|(o, c)| (*o, c.clone()))
            .collect()
    }

    /// The mempool transaction spending `outpoint`, if any.
    pub fn mempool_spender(&self, outpoint: &OutPoint) -> Option<Txid> {
        self.spent_by.get(outpoint).copied()
    }

    /// A coin as the mempool sees it: confirmed and not spent in the mempool,
    /// or created by a mempool transaction and not yet spent.
    pub fn mempool_coin(&self, outpoint: &OutPoint) -> Option<Coin> {
        if self.spent_by.contains_key(outpoint) {
            return None;
        }
        if let Some(c) = self.utxo.get(outpoint) {
            return Some(c.clone());
        }
        let entry = self.mempool.get(&outpoint.txid)?;
        let txout = entry.tx.output.get(outpoint.vout as usize)?.clone();
        Some(Coin {
            txout,
            height: self.height() + 1,
            coinbase: false,
        })
    }

    /// Number of mempool transactions.
    pub fn mempool_len(&self) -> usize {
        self.mempool.len()
    }

    /// Mempool entries in arrival order.
    pub fn mempool_entries(&self) -> Vec<&MempoolEntry> {
        let mut v: Vec<&MempoolEntry> = self.mempool.values().collect();
        v.sort_by_key(|e| e.seq);
        v
    }

    /// A mempool entry.
    pub fn mempool_entry(&self, txid: &Txid) -> Option<&MempoolEntry> {
        self.mempool.get(txid)
    }

    /// Mempool transactions `txid` spends from, directly (`direct`) or transitively.
    pub fn mempool_ancestors(&self, txid: &Txid, direct: bool) -> Vec<Txid> {
        self.walk_mempool(txid, direct, |s, id| {
            s.mempool.get(id).map_or_else(Vec::new, |e| {
                e.tx.input
                    .iter()
                    .map(|i| i.previous_output.txid)
                    .filter(|t| s.mempool.contains_key(t))
                    .collect()
            })
        })
    }

    /// Mempool transactions spending `txid`'s outputs, directly or transitively.
    pub fn mempool_descendants(&self, txid: &Txid, direct: bool) -> Vec<Txid> {
        self.walk_mempool(txid, direct, |s, id| {
            s.mempool.get(id).map_or_else(Vec::new, |e| {
                (0..e.tx.output.len() as u32)
                    .filter_map(|vout| s.spent_by.get(&OutPoint { txid: *id, vout }).copied())
                    .collect()
            })
        })
    }

    fn walk_mempool(
        &self,
        start: &Txid,
        direct: bool,
        next: impl Fn(&Self, &Txid) -> Vec<Txid>,
    ) -> Vec<Txid> {
        let mut seen: Vec<Txid> = Vec::new();
        let mut visited: HashSet<Txid> = HashSet::new();
        let mut stack = next(self, start);
        while let Some(id) = stack.pop() {
            if !visited.insert(id) {
                continue;
            }
            seen.push(id);
            if !direct {
                stack.extend(next(self, &id));
            }
        }
        seen
    }

    /// Where a confirmed transaction is: block hash and position.
    pub fn tx_location(&self, txid: &Txid) -> Option<(BlockHash, usize)> {
        self.tx_index.get(txid).copied()
    }

    /// Checks `tx` against consensus and relay policy for the next block and,
    /// unless `test_only`, adds it to the mempool.
    ///
    /// Replacement policy: Core 28's full RBF. A transaction that spends an
    /// output already spent by mempool transactions replaces them (and their
    /// descendants) when it pays a higher fee rate than each of them, at
    /// least their total fee plus the incremental relay fee (0.1 sat/vB) of
    /// its own size, adds no new
    /// unconfirmed input, spends none of them, and evicts at most 100
    /// transactions; otherwise Core's refusal. With full RBF off, first seen
    /// wins (`txn-mempool-conflict`).
    ///
    /// # Errors
    /// Core's reject reason and code kind.
    pub fn accept_to_mempool(
        &mut self,
        tx: &Transaction,
        now: u64,
        max_fee_rate: Option<FeeRate>,
        test_only: bool,
    ) -> Result<Accepted, TxReject> {
        check_transaction(tx)?;
        if tx.is_coinbase() {
            return Err(TxReject::rejected("coinbase"));
        }
        check_standard(tx)?;
        let ctx = self.next_context();
        if !is_final(tx, ctx) {
            return Err(TxReject::rejected("non-final"));
        }
        let txid = tx.compute_txid();
        if self.mempool.contains_key(&txid) {
            return Err(TxReject::rejected("txn-already-in-mempool"));
        }
        let conflicts: HashSet<Txid> = tx
            .input
            .iter()
            .filter_map(|i| self.spent_by.get(&i.previous_output).copied())
            .collect();
        if !conflicts.is_empty() && !self.full_rbf {
            return Err(TxReject::rejected("txn-mempool-conflict"));
        }
        let mut coins = Vec::with_capacity(tx.input.len());
        for input in &tx.input {
            let coin = if self.spent_by.contains_key(&input.previous_output) {
                // Spent by a conflict this transaction may replace.
                self.coin_before_mempool_spend(&input.previous_output)
            } else {
                self.mempool_coin(&input.previous_output)
            };
            match coin {
                Some(c) => coins.push(c),
                None => {
                    // Core's PreChecks: a transaction with an output still in
                    // the UTXO set is known; otherwise its inputs are missing
                    // or spent, whether or not it was ever mined (Core keeps
                    // no record of confirmed transactions here).
                    return Err(if self.has_unspent_output(tx) {
                        TxReject::rejected("txn-already-known")
                    } else {
                        TxReject::error("bad-txns-inputs-missingorspent")
                    });
                }
            }
        }
        let coin_refs: Vec<&Coin> = coins.iter().collect();
        let fee = check_tx_inputs(tx, &coin_refs, ctx.height)?;
        if !sequence_locks_ok(tx, &coin_refs, ctx, |h| {
            self.median_time_past(h.saturating_sub(1))
        }) {
            return Err(TxReject::rejected("non-BIP68-final"));
        }
        let vsize = tx.vsize() as u64;
        let min_fee = self.min_relay.fee_vb(vsize).unwrap_or(Amount::MAX_MONEY);
        if fee < min_fee {
            return Err(TxReject::rejected(format!(
                "min relay fee not met, {} < {}",
                fee.to_sat(),
                min_fee.to_sat()
            )));
        }
        let pool_fee = self.mempool_min.fee_vb(vsize).unwrap_or(Amount::MAX_MONEY);
        if fee < pool_fee {
            return Err(TxReject::rejected(format!(
                "mempool min fee not met, {} < {}",
                fee.to_sat(),
                pool_fee.to_sat()
            )));
        }
        let evicted = if conflicts.is_empty() {
            Vec::new()
        } else {
            self.check_replacement(tx, &txid, fee, vsize, &conflicts)?
        };
        self.check_package_limits(tx, vsize)?;
        if let Some(max) = max_fee_rate {
            if max > FeeRate::ZERO && fee > max.fee_vb(vsize).unwrap_or(Amount::MAX_MONEY) {
                return Err(TxReject::error("max-fee-exceeded"));
            }
        }
        check_policy_scripts(tx, &coin_refs)?;
        verify_scripts_policy(tx, &coin_refs)?;
        let accepted = Accepted { txid, fee, vsize };
        if !test_only {
            for id in evicted {
                self.remove_with_descendants(id);
            }
            for input in &tx.input {
                self.spent_by.insert(input.previous_output, txid);
            }
            let seq = self.next_seq();
            let height = self.height();
            self.mempool.insert(
                txid,
                MempoolEntry {
                    tx: tx.clone(),
                    fee,
                    vsize,
                    time: now,
                    height,
                    seq,
                },
            );
            self.mempool_vbytes += vsize;
            self.trim_mempool();
            if !self.mempool.contains_key(&txid) {
                return Err(TxReject::rejected("mempool full"));
            }
        }
        Ok(accepted)
    }

    /// A coin as it was before a mempool transaction spent it.
    fn coin_before_mempool_spend(&self, outpoint: &OutPoint) -> Option<Coin> {
        if let Some(c) = self.utxo.get(outpoint) {
            return Some(c.clone());
        }
        let entry = self.mempool.get(&outpoint.txid)?;
        let txout = entry.tx.output.get(outpoint.vout as usize)?.clone();
        Some(Coin {
            txout,
            height: self.height() + 1,
            coinbase: false,
        })
    }

    /// Core 28's replacement rules (`MemPoolAccept::ReplacementChecks`);
    /// returns the direct conflicts to evict (with their descendants).
    fn check_replacement(
        &self,
        tx: &Transaction,
        txid: &Txid,
        fee: Amount,
        vsize: u64,
        conflicts: &HashSet<Txid>,
    ) -> Result<Vec<Txid>, TxReject> {
        /// Core's `MAX_REPLACEMENT_CANDIDATES`.
        const MAX_REPLACEMENTS: usize = 100;
        let mut all: HashSet<Txid> = conflicts.clone();
        for c in conflicts {
            all.extend(self.mempool_descendants(c, false));
        }
        if all.len() > MAX_REPLACEMENTS {
            return Err(TxReject::rejected(format!(
                "too many potential replacements, rejecting replacement {txid}; too many potential replacements ({} > {MAX_REPLACEMENTS})",
                all.len()
            )));
        }
        if let Some(i) = tx
            .input
            .iter()
            .find(|i| all.contains(&i.previous_output.txid))
        {
            return Err(TxReject::rejected(format!(
                "bad-txns-spends-conflicting-tx, {txid} spends conflicting transaction {}",
                i.previous_output.txid
            )));
        }
        let conflict_parents: HashSet<Txid> = conflicts
            .iter()
            .filter_map(|c| self.mempool.get(c))
            .flat_map(|e| e.tx.input.iter().map(|i| i.previous_output.txid))
            .collect();
        if let Some(j) = tx.input.iter().position(|i| {
            self.mempool.contains_key(&i.previous_output.txid)
                && !conflict_parents.contains(&i.previous_output.txid)
        }) {
            return Err(TxReject::rejected(format!(
                "replacement-adds-unconfirmed, replacement {txid} adds unconfirmed input, idx {j}"
            )));
        }
        // Core compares `CFeeRate(fee, vsize)`: whole sat/kvB, truncated,
        // and prints them as `CFeeRate::ToString` does.
        let rate = |fee: Amount, vsize: u64| fee.to_sat() * 1000 / vsize.max(1);
        let shown = |kvb: u64| format!("{}.{:08} BTC/kvB", kvb / 100_000_000, kvb % 100_000_000);
        for c in conflicts {
            let Some(e) = self.mempool.get(c) else {
                continue;
            };
            if rate(fee, vsize) <= rate(e.fee, e.vsize) {
                return Err(TxReject::rejected(format!(
                    "insufficient fee, rejecting replacement {txid}; new feerate {} <= old feerate {}",
                    shown(rate(fee, vsize)),
                    shown(rate(e.fee, e.vsize))
                )));
            }
        }
        let replaced: Amount = all
            .iter()
            .filter_map(|t| self.mempool.get(t))
            .map(|e| e.fee)
            .sum();
        if fee < replaced {
            return Err(TxReject::rejected(format!(
                "insufficient fee, rejecting replacement {txid}, less fees than conflicting txs; {} < {}",
                format_money(fee),
                format_money(replaced)
            )));
        }
        // Core's `-incrementalrelayfee` on the replacement's own size.
        let needed = self
            .incremental_relay
            .fee_vb(vsize)
            .unwrap_or(Amount::MAX_MONEY);
        if fee - replaced < needed {
            return Err(TxReject::rejected(format!(
                "insufficient fee, rejecting replacement {txid}, not enough additional fees to relay; {} < {}",
                format_money(fee - replaced),
                format_money(needed)
            )));
        }
        Ok(conflicts.iter().copied().collect())
    }

    /// Whether an output of `tx` is in the confirmed UTXO set (Core's test
    /// for "already in chain": only while an output is unspent).
    pub fn has_unspent_output(&self, tx: &Transaction) -> bool {
        let txid = tx.compute_txid();
        (0..tx.output.len() as u32).any(|vout| self.utxo.contains_key(&OutPoint { txid, vout }))
    }

    /// Core's ancestor and descendant limits (25 transactions, 101 kvB) for
    /// a new transaction `tx` of `vsize` whose parents are in the mempool.
    fn check_package_limits(&self, tx: &Transaction, vsize: u64) -> Result<(), TxReject> {
        let mut ancestors: HashSet<Txid> = HashSet::new();
        let mut stack: Vec<Txid> = tx
            .input
            .iter()
            .map(|i| i.previous_output.txid)
            .filter(|t| self.mempool.contains_key(t))
            .collect();
        while let Some(id) = stack.pop() {
            if !ancestors.insert(id) {
                continue;
            }
            // Stop walking as soon as the limit is exceeded: the walk is
            // bounded by the limit, not by the mempool.
            if ancestors.len() + 1 > MAX_PACKAGE_COUNT {
                return Err(TxReject::rejected(format!(
                    "too-long-mempool-chain, too many unconfirmed ancestors [limit: {MAX_PACKAGE_COUNT}]"
                )));
            }
            if let Some(e) = self.mempool.get(&id) {
                stack.extend(
                    e.tx.input
                        .iter()
                        .map(|i| i.previous_output.txid)
                        .filter(|t| self.mempool.contains_key(t)),
                );
            }
        }
        let ancestor_vsize: u64 = vsize
            + ancestors
                .iter()
                .filter_map(|t| self.mempool.get(t))
                .map(|e| e.vsize)
                .sum::<u64>();
        if ancestor_vsize > MAX_PACKAGE_VSIZE {
            return Err(TxReject::rejected(format!(
                "too-long-mempool-chain, exceeds ancestor size limit [limit: {MAX_PACKAGE_VSIZE}]"
            )));
        }
        for a in &ancestors {
            let descendants = self.mempool_descendants(a, false);
            if descendants.len() + 2 > MAX_PACKAGE_COUNT {
                return Err(TxReject::rejected(format!(
                    "too-long-mempool-chain, too many descendants for tx {a} [limit: {MAX_PACKAGE_COUNT}]"
                )));
            }
            let size: u64 = self.mempool.get(a).map_or(0, |e| e.vsize)
                + vsize
                + descendants
                    .iter()
                    .filter_map(|t| self.mempool.get(t))
                    .map(|e| e.vsize)
                    .sum::<u64>();
            if size > MAX_PACKAGE_VSIZE {
                return Err(TxReject::rejected(format!(
                    "too-long-mempool-chain, exceeds descendant size limit for tx {a} [limit: {MAX_PACKAGE_VSIZE}]"
                )));
            }
        }
        Ok(())
    }

    /// Evicts the lowest fee-rate transactions (with their descendants)
    /// while the mempool is over its cap, and raises the mempool's minimum
    /// fee to just above the evicted rate, as Core does.
    fn trim_mempool(&mut self) {
        while self.mempool_vbytes > self.max_mempool_vbytes {
            let worst = self
                .mempool
                .iter()
                .min_by(|(ta, a), (tb, b)| {
                    // fee_a / vsize_a < fee_b / vsize_b, without division.
                    (u128::from(a.fee.to_sat()) * u128::from(b.vsize))
                        .cmp(&(u128::from(b.fee.to_sat()) * u128::from(a.vsize)))
                        .then_with(|| b.seq.cmp(&a.seq))
                        .then_with(|| ta.cmp(tb))
                })
                .map(|(t, e)| (*t, e.fee, e.vsize));
            let Some((txid, fee, vsize)) = worst else {
                return;
            };
            let evicted = FeeRate::from_sat_per_kwu(
                (fee.to_sat() * 1000 / (vsize.max(1) * 4))
                    + self.incremental_relay.to_sat_per_kwu(),
            );
            self.mempool_min = self.mempool_min.max(evicted);
            self.remove_with_descendants(txid);
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Removes `txid` and every mempool transaction that spends its outputs.
    fn remove_with_descendants(&mut self, txid: Txid) {
        let mut stack = vec![txid];
        while let Some(id) = stack.pop() {
            let Some(entry) = self.mempool.remove(&id) else {
                continue;
            };
            self.mempool_vbytes = self.mempool_vbytes.saturating_sub(entry.vsize);
            for input in &entry.tx.input {
                if self.spent_by.get(&input.previous_output) == Some(&id) {
                    self.spent_by.remove(&input.previous_output);
                }
            }
            for vout in 0..entry.tx.output.len() as u32 {
                if let Some(child) = self.spent_by.get(&OutPoint { txid: id, vout }) {
                    stack.push(*child);
                }
            }
        }
    }

    /// Builds a block template on the active tip: mempool transactions in
    /// arrival order that are valid in the next block, and a coinbase paying
    /// `payout` the subsidy plus fees, with the BIP141 witness commitment.
    ///
    /// In fee-market mode ([`ChainState::set_block_min_fee`]) only the
    /// transactions `ChainState::select_by_ancestor_score` picks are
    /// considered (still in arrival order, so parents come first).
    pub fn block_template(&self, payout: &Script, time: u32) -> Block {
        let ctx = self.next_context();
        let mut created: HashMap<OutPoint, Coin> = HashMap::new();
        let mut spent: HashSet<OutPoint> = HashSet::new();
        let mut txs = Vec::new();
        let mut fees = Amount::ZERO;
        let mut weight = 4_000u64; // room for header and coinbase
        let chosen = self
            .block_min_fee
            .map(|threshold| self.select_by_ancestor_score(threshold));
        for entry in self.mempool_entries() {
            let tx = &entry.tx;
            if chosen
                .as_ref()
                .is_some_and(|c| !c.contains(&tx.compute_txid()))
            {
                continue;
            }
            if weight + tx.weight().to_wu() > super::validation::MAX_BLOCK_WEIGHT {
                continue;
            }
            if !is_final(tx, ctx) {
                continue;
            }
            let mut coins = Vec::with_capacity(tx.input.len());
            let mut missing = false;
            for i in &tx.input {
                if spent.contains(&i.previous_output) {
                    missing = true;
                    break;
                }
                match self
                    .utxo
                    .get(&i.previous_output)
                    .or_else(|| created.get(&i.previous_output))
                {
                    Some(c) => coins.push(c.clone()),
                    None => {
                        missing = true;
                        break;
                    }
                }
            }
            if missing {
                continue;
            }
            let refs: Vec<&Coin> = coins.iter().collect();
            let Ok(fee) = check_tx_inputs(tx, &refs, ctx.height) else {
                continue;
            };
            if !sequence_locks_ok(tx, &refs, ctx, |h| {
                self.median_time_past(h.saturating_sub(1))
            }) {
                continue;
            }
            let txid = tx.compute_txid();
            for i in &tx.input {
                spent.insert(i.previous_output);
            }
            for (vout, o) in tx.output.iter().enumerate() {
                created.insert(
                    OutPoint {
                        txid,
                        vout: vout as u32,
                    },
                    Coin {
                        txout: o.clone(),
                        height: ctx.height,
                        coinbase: false,
                    },
                );
            }
            fees += fee;
            weight += tx.weight().to_wu();
            txs.push(tx.clone());
        }
        assemble_block(
            self.tip_hash(),
            ctx.height,
            time,
            payout,
            subsidy(ctx.height) + fees,
            txs,
        )
    }

    /// Validates `block` fully and connects it on the active tip.
    ///
    /// # Errors
    /// Core's block reject reason; the state is unchanged on error.
    pub fn connect_block(&mut self, block: Block, check_scripts: bool) -> Result<(), BlockReject> {
        let hash = block.block_hash();
        if self.is_active(&hash) {
            return Err(BlockReject("duplicate".into()));
        }
        if block.header.prev_blockhash != self.tip_hash() {
            return Err(BlockReject("bad-prevblk".into()));
        }
        let height = self.height() + 1;
        let seq = self.index.get(&hash).map(|e| e.seq);
        let validated = self.index.get(&hash).is_some_and(|e| e.validated);
        let undo = self.apply_block(&block, height, check_scripts && !validated)?;
        let seq = match seq {
            Some(s) => s,
            None => self.next_seq(),
        };
        for (pos, tx) in block.txdata.iter().enumerate() {
            let txid = tx.compute_txid();
            self.tx_index.insert(txid, (hash, pos));
            // Core clears a prioritisation once the transaction is mined.
            self.fee_deltas.remove(&txid);
            if self.mempool.contains_key(&txid) {
                // Included: drop it from the mempool, keep its descendants.
                if let Some(e) = self.mempool.remove(&txid) {
                    self.mempool_vbytes = self.mempool_vbytes.saturating_sub(e.vsize);
                    for i in &e.tx.input {
                        self.spent_by.remove(&i.previous_output);
                    }
                }
            }
        }
        // Mempool transactions that conflict with the block are now invalid.
        for tx in block.txdata.iter().skip(1) {
            for i in &tx.input {
                if let Some(other) = self.spent_by.get(&i.previous_output).copied() {
                    self.remove_with_descendants(other);
                }
            }
        }
        self.undo.insert(hash, undo);
        self.index.insert(
            hash,
            BlockEntry {
                block: Arc::new(block),
                height,
                seq,
                validated: true,
            },
        );
        self.active.push(hash);
        Ok(())
    }

    /// Checks `block` against the UTXO set and applies it, returning the undo
    /// data; rolls back and fails on the first invalid transaction.
    fn apply_block(
        &mut self,
        block: &Block,
        height: u32,
        check_scripts: bool,
    ) -> Result<Vec<(OutPoint, Coin)>, BlockReject> {
        let header = &block.header;
        if header.bits != CompactTarget::from_consensus(REGTEST_BITS) {
            return Err(BlockReject("bad-diffbits".into()));
        }
        if header.validate_pow(header.target()).is_err() {
            return Err(BlockReject("high-hash".into()));
        }
        let prev_mtp = self.median_time_past(self.height());
        if header.time <= prev_mtp {
            return Err(BlockReject("time-too-old".into()));
        }
        let Some(coinbase) = block.txdata.first().filter(|t| t.is_coinbase()) else {
            return Err(BlockReject("bad-cb-missing".into()));
        };
        if block.txdata.iter().skip(1).any(|t| t.is_coinbase()) {
            return Err(BlockReject("bad-cb-multiple".into()));
        }
        if !block.check_merkle_root() {
            return Err(BlockReject("bad-txnmrklroot".into()));
        }
        if !block.check_witness_commitment() {
            return Err(BlockReject("bad-witness-merkle-match".into()));
        }
        if block.weight().to_wu() > super::validation::MAX_BLOCK_WEIGHT {
            return Err(BlockReject("bad-blk-weight".into()));
        }
        // BIP34 as Core checks it: the script starts with `CScript() << height`
        // (OP_1..OP_16 for small heights, which rust-bitcoin's parser refuses).
        // `is_coinbase` above guarantees exactly one input.
        let expected = Builder::new().push_int(i64::from(height)).into_script();
        if !coinbase.input[0]
            .script_sig
            .as_bytes()
            .starts_with(expected.as_bytes())
        {
            return Err(BlockReject("bad-cb-height".into()));
        }
        let ctx = BlockContext {
            height,
            prev_median_time: prev_mtp,
        };
        let mut undo: Vec<(OutPoint, Coin)> = Vec::new();
        let mut added: Vec<OutPoint> = Vec::new();
        let result = self.apply_txs(block, ctx, check_scripts, &mut undo, &mut added);
        match result {
            Ok(fees) => {
                let paid: Amount = coinbase.output.iter().map(|o| o.value).sum();
                if paid > subsidy(height) + fees {
                    self.rollback(undo, added);
                    return Err(BlockReject("bad-cb-amount".into()));
                }
                Ok(undo)
            }
            Err(e) => {
                self.rollback(undo, added);
                Err(e)
            }
        }
    }

    fn apply_txs(
        &mut self,
        block: &Block,
        ctx: BlockContext,
        check_scripts: bool,
        undo: &mut Vec<(OutPoint, Coin)>,
        added: &mut Vec<OutPoint>,
    ) -> Result<Amount, BlockReject> {
        let mut fees = Amount::ZERO;
        let reject = |r: TxReject| BlockReject(r.reason);
        for tx in &block.txdata {
            check_transaction(tx).map_err(reject)?;
            let txid = tx.compute_txid();
            if !tx.is_coinbase() {
                if !is_final(tx, ctx) {
                    return Err(BlockReject("bad-txns-nonfinal".into()));
                }
                let mut coins = Vec::with_capacity(tx.input.len());
                for i in &tx.input {
                    let Some(c) = self.utxo.remove(&i.previous_output) else {
                        return Err(BlockReject("bad-txns-inputs-missingorspent".into()));
                    };
                    undo.push((i.previous_output, c.clone()));
                    coins.push(c);
                }
                let refs: Vec<&Coin> = coins.iter().collect();
                fees += check_tx_inputs(tx, &refs, ctx.height).map_err(reject)?;
                if !sequence_locks_ok(tx, &refs, ctx, |h| {
                    self.median_time_past(h.saturating_sub(1))
                }) {
                    return Err(BlockReject("bad-txns-nonfinal".into()));
                }
                if check_scripts {
                    verify_scripts(tx, &refs).map_err(reject)?;
                }
            }
            for (vout, o) in tx.output.iter().enumerate() {
                if o.script_pubkey.is_op_return() {
                    continue; // provably unspendable: never enters the UTXO set
                }
                let op = OutPoint {
                    txid,
                    vout: vout as u32,
                };
                if self.utxo.contains_key(&op) {
                    return Err(BlockReject("bad-txns-BIP30".into()));
                }
                self.utxo.insert(
                    op,
                    Coin {
                        txout: o.clone(),
                        height: ctx.height,
                        coinbase: tx.is_coinbase(),
                    },
                );
                added.push(op);
            }
        }
        Ok(fees)
    }

    /// Reverts a partly applied block. Outputs the block created are removed
    /// even when a later transaction of the block spent them (they are then
    /// in the undo list too, and must not come back).
    fn rollback(&mut self, undo: Vec<(OutPoint, Coin)>, added: Vec<OutPoint>) {
        let created: HashSet<OutPoint> = added.into_iter().collect();
        for op in &created {
            self.utxo.remove(op);
        }
        for (op, coin) in undo {
            if !created.contains(&op) {
                self.utxo.insert(op, coin);
            }
        }
    }

    /// Disconnects the active tip (never genesis) and returns its block.
    pub fn disconnect_tip(&mut self) -> Option<Arc<Block>> {
        if self.active.len() <= 1 {
            return None;
        }
        let hash = self.active.pop()?;
        let entry = self.index.get(&hash)?.clone();
        let mut block_txids = HashSet::with_capacity(entry.block.txdata.len());
        for tx in &entry.block.txdata {
            let txid = tx.compute_txid();
            for vout in 0..tx.output.len() as u32 {
                self.utxo.remove(&OutPoint { txid, vout });
            }
            self.tx_index.remove(&txid);
            block_txids.insert(txid);
        }
        // Coins spent inside the block that the block itself created were
        // never in the UTXO set before it: only older coins come back.
        for (op, coin) in self.undo.remove(&hash).unwrap_or_default() {
            if !block_txids.contains(&op.txid) {
                self.utxo.insert(op, coin);
            }
        }
        Some(entry.block)
    }

    /// Adds a block to the tree without connecting it (used when loading).
    ///
    /// # Errors
    /// If its parent is unknown.
    pub fn insert_known(&mut self, block: Block) -> Result<(), BlockReject> {
        let hash = block.block_hash();
        if self.index.contains_key(&hash) {
            return Ok(());
        }
        let Some(parent) = self.index.get(&block.header.prev_blockhash) else {
            return Err(BlockReject("prev-blk-not-found".into()));
        };
        let height = parent.height + 1;
        let seq = self.next_seq();
        // Blocks on disk were fully validated when first accepted.
        self.index.insert(
            hash,
            BlockEntry {
                block: Arc::new(block),
                height,
                seq,
                validated: true,
            },
        );
        Ok(())
    }

    /// Marks blocks invalid without reorganising (used when loading).
    pub fn mark_invalid(&mut self, hashes: impl IntoIterator<Item = BlockHash>) {
        self.invalid.extend(hashes);
    }

    fn children(&self) -> HashMap<BlockHash, Vec<BlockHash>> {
        let mut map: HashMap<BlockHash, Vec<BlockHash>> = HashMap::new();
        for (h, e) in &self.index {
            if e.height > 0 {
                map.entry(e.block.header.prev_blockhash)
                    .or_default()
                    .push(*h);
            }
        }
        map
    }

    fn descendants(&self, hash: BlockHash) -> Vec<BlockHash> {
        let children = self.children();
        let mut out = vec![hash];
        let mut i = 0;
        while i < out.len() {
            if let Some(c) = children.get(&out[i]) {
                out.extend(c.iter().copied());
            }
            i += 1;
        }
        out
    }

    /// `invalidateblock`: marks `hash` and its descendants invalid and moves
    /// to the best remaining chain. Returns the disconnected transactions'
    /// fate through the mempool (re-accepted where still valid).
    ///
    /// # Errors
    /// Unknown block, or genesis.
    pub fn invalidate(&mut self, hash: BlockHash, now: u64) -> Result<(), BlockReject> {
        let Some(entry) = self.index.get(&hash) else {
            return Err(BlockReject("Block not found".into()));
        };
        if entry.height == 0 {
            return Err(BlockReject("cannot invalidate genesis".into()));
        }
        let bad = self.descendants(hash);
        self.invalid.extend(bad);
        self.activate_best_chain(now);
        Ok(())
    }

    /// `reconsiderblock`: clears the invalid mark of `hash`, its ancestors and
    /// descendants, and moves to the best chain.
    ///
    /// # Errors
    /// Unknown block.
    pub fn reconsider(&mut self, hash: BlockHash, now: u64) -> Result<(), BlockReject> {
        if !self.index.contains_key(&hash) {
            return Err(BlockReject("Block not found".into()));
        }
        for h in self.descendants(hash) {
            self.invalid.remove(&h);
        }
        let mut cur = hash;
        while let Some(e) = self.index.get(&cur) {
            self.invalid.remove(&cur);
            if e.height == 0 {
                break;
            }
            cur = e.block.header.prev_blockhash;
        }
        self.activate_best_chain(now);
        Ok(())
    }

    /// Moves the active chain to the most-work valid tip (all regtest blocks
    /// have equal work, so the highest; the current tip wins ties, then the
    /// first seen), re-adding disconnected transactions to the mempool.
    pub fn activate_best_chain(&mut self, now: u64) {
        loop {
            let current = self.tip_hash();
            let best = self
                .index
                .iter()
                .filter(|(h, _)| !self.invalid.contains(*h))
                .max_by(|(ha, a), (hb, b)| {
                    a.height
                        .cmp(&b.height)
                        .then_with(|| (**ha == current).cmp(&(**hb == current)))
                        .then_with(|| {
                            (Some(**ha) == self.preferred_tip)
                                .cmp(&(Some(**hb) == self.preferred_tip))
                        })
                        .then_with(|| b.seq.cmp(&a.seq))
                })
                .map(|(h, _)| *h);
            let Some(best) = best else { return };
            if best == current {
                // The tip may itself be invalid: disconnect down to a valid block.
                if !self.invalid.contains(&current) {
                    return;
                }
            }
            // Path from best back to the active chain.
            let mut branch = Vec::new();
            let mut cur = best;
            while !self.is_active(&cur) {
                branch.push(cur);
                match self.index.get(&cur) {
                    Some(e) => cur = e.block.header.prev_blockhash,
                    None => return,
                }
            }
            let fork_height = self.index.get(&cur).map_or(0, |e| e.height);
            let mut disconnected = Vec::new();
            while self.height() > fork_height {
                if let Some(b) = self.disconnect_tip() {
                    disconnected.push(b);
                }
            }
            let old_mempool: Vec<Transaction> = self
                .mempool_entries()
                .into_iter()
                .map(|e| e.tx.clone())
                .collect();
            self.mempool.clear();
            self.spent_by.clear();
            self.mempool_vbytes = 0;
            let mut failed = false;
            for h in branch.iter().rev() {
                let Some(block) = self.index.get(h).map(|e| (*e.block).clone()) else {
                    break;
                };
                if self.connect_block(block, true).is_err() {
                    let bad = self.descendants(*h);
                    self.invalid.extend(bad);
                    failed = true;
                    break;
                }
            }
            // Disconnected transactions go back first (oldest block first), then the old mempool.
            for block in disconnected.iter().rev() {
                for tx in block.txdata.iter().skip(1) {
                    let _ = self.accept_to_mempool(tx, now, None, false);
                }
            }
            for tx in old_mempool {
                let _ = self.accept_to_mempool(&tx, now, None, false);
            }
            if !failed {
                return;
            }
        }
    }

    /// A block on the tip holding exactly `txs`, in that order (Core's
    /// `generateblock`): fees from the UTXO set and outputs of earlier
    /// transactions of the block, checked by consensus only (not relay
    /// policy), not yet connected.
    ///
    /// # Errors
    /// Core's block reject reason (`bad-txns-inputs-missingorspent`,
    /// `bad-txns-in-belowout` …), found here or when the block is checked.
    pub fn block_of(
        &self,
        payout: &Script,
        time: u32,
        txs: Vec<Transaction>,
    ) -> Result<Block, BlockReject> {
        let ctx = self.next_context();
        let mut created: HashMap<OutPoint, Coin> = HashMap::new();
        let mut spent: HashSet<OutPoint> = HashSet::new();
        let mut fees = Amount::ZERO;
        for tx in &txs {
            let mut coins = Vec::with_capacity(tx.input.len());
            for i in &tx.input {
                let coin = (!spent.contains(&i.previous_output))
                    .then(|| {
                        self.utxo
                            .get(&i.previous_output)
                            .or_else(|| created.get(&i.previous_output))
                    })
                    .flatten()
                    .ok_or_else(|| BlockReject("bad-txns-inputs-missingorspent".into()))?;
                coins.push(coin.clone());
            }
            let refs: Vec<&Coin> = coins.iter().collect();
            fees += check_tx_inputs(tx, &refs, ctx.height).map_err(|r| BlockReject(r.reason))?;
            let txid = tx.compute_txid();
            spent.extend(tx.input.iter().map(|i| i.previous_output));
            for (vout, o) in tx.output.iter().enumerate() {
                created.insert(
                    OutPoint {
                        txid,
                        vout: vout as u32,
                    },
                    Coin {
                        txout: o.clone(),
                        height: ctx.height,
                        coinbase: false,
                    },
                );
            }
        }
        let time = time.max(self.median_time_past(self.height()) + 1);
        let mut block = assemble_block(
            self.tip_hash(),
            ctx.height,
            time,
            payout,
            subsidy(ctx.height) + fees,
            txs,
        );
        grind(&mut block.header);
        Ok(block)
    }

    /// Mines a block with [`ChainState::block_template`] at `time` (raised to
    /// median time past + 1 if needed) and connects it.
    pub fn mine_block(&mut self, payout: &Script, time: u32) -> Result<Arc<Block>, BlockReject> {
        let time = time.max(self.median_time_past(self.height()) + 1);
        let mut block = self.block_template(payout, time);
        grind(&mut block.header);
        let hash = block.block_hash();
        // Template transactions were script-checked on mempool entry (the
        // role of Core's script cache), so they are not verified twice.
        self.connect_block(block, false)?;
        self.index
            .get(&hash)
            .map(|e| e.block.clone())
            .ok_or_else(|| BlockReject("lost".into()))
    }
}

/// Assembles a block: coinbase (BIP34 height, witness reserved value, payout,
/// witness commitment), then `txs`; header with regtest bits, not yet ground.
pub fn assemble_block(
    prev: BlockHash,
    height: u32,
    time: u32,
    payout: &Script,
    coinbase_value: Amount,
    txs: Vec<Transaction>,
) -> Block {
    let mut witness = Witness::new();
    witness.push([0u8; 32]);
    let coinbase = Transaction {
        version: Version::TWO,
        lock_time: LockTime::ZERO,
        input: vec![TxIn {
            previous_output: OutPoint::null(),
            // BIP34 height, plus OP_0 so the script is at least 2 bytes (bad-cb-length).
            script_sig: Builder::new()
                .push_int(i64::from(height))
                .push_int(0)
                .into_script(),
            sequence: Sequence::MAX,
            witness,
        }],
        output: vec![TxOut {
            value: coinbase_value,
            script_pubkey: payout.to_owned(),
        }],
    };
    let mut txdata = Vec::with_capacity(txs.len() + 1);
    txdata.push(coinbase);
    txdata.extend(txs);
    let mut block = Block {
        header: Header {
            version: BlockVersion::from_consensus(0x2000_0000),
            prev_blockhash: prev,
            merkle_root: TxMerkleNode::all_zeros(),
            time,
            bits: CompactTarget::from_consensus(REGTEST_BITS),
            nonce: 0,
        },
        txdata,
    };
    if let Some(root) = block.witness_root() {
        let commitment = Block::compute_witness_commitment(&root, &[0u8; 32]);
        let mut script = vec![0x6a, 0x24, 0xaa, 0x21, 0xa9, 0xed];
        script.extend_from_slice(commitment.as_byte_array());
        block.txdata[0].output.push(TxOut {
            value: Amount::ZERO,
            script_pubkey: ScriptBuf::from_bytes(script),
        });
    }
    if let Some(root) = block.compute_merkle_root() {
        block.header.merkle_root = root;
    }
    block
}

/// Finds a nonce that meets the header's target (about two tries on regtest).
pub fn grind(header: &mut Header) {
    let target = header.target();
    while header.validate_pow(target).is_err() {
        header.nonce = header.nonce.wrapping_add(1);
        if header.nonce == 0 {
            header.time += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::secp256k1::{Secp256k1, SecretKey};
    use bitcoin::CompressedPublicKey;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Mine(u8),
        Pay(u8),
        Invalidate(u8),
        ReconsiderLast,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u8..4).prop_map(Op::Mine),
            any::<u8>().prop_map(Op::Pay),
            (0u8..5).prop_map(Op::Invalidate),
            Just(Op::ReconsiderLast),
        ]
    }

    struct Harness {
        state: ChainState,
        key: SecretKey,
        script: ScriptBuf,
        time: u32,
        invalidated: Vec<BlockHash>,
    }

    impl Harness {
        fn new() -> Self {
            let secp = Secp256k1::new();
            let key = SecretKey::from_slice(&[7u8; 32]).unwrap();
            let script =
                ScriptBuf::new_p2wpkh(&CompressedPublicKey(key.public_key(&secp)).wpubkey_hash());
            let mut h = Self {
                state: ChainState::new(),
                key,
                script,
                time: 1_700_000_000,
                invalidated: Vec::new(),
            };
            h.mine(101);
            h
        }

        fn mine(&mut self, n: u32) {
            for _ in 0..n {
                self.time += 600;
                self.state
                    .mine_block(&self.script.clone(), self.time)
                    .unwrap();
            }
        }

        /// Spends the `pick`-th spendable coin of ours to ourselves.
        fn pay(&mut self, pick: u8) {
            let next = self.state.height() + 1;
            let mut coins: Vec<(OutPoint, Coin)> = self
                .state
                .utxos_for(&self.script)
                .into_iter()
                .filter(|(op, c)| {
                    self.state.mempool_spender(op).is_none()
                        && (!c.coinbase || next - c.height >= 100)
                        && c.txout.value > Amount::from_sat(10_000)
                })
                .collect();
            if coins.is_empty() {
                return;
            }
            coins.sort_by_key(|(op, _)| *op);
            let (outpoint, coin) = coins[pick as usize % coins.len()].clone();
            let input = wallet::SpendableOutput {
                outpoint,
                txout: coin.txout.clone(),
                path: wallet::KeyPath::receive(0),
            };
            let half = TxOut {
                value: coin.txout.value / 2,
                script_pubkey: self.script.clone(),
            };
            let mut built = wallet::build_transaction(
                &[input],
                &[half],
                Some(&self.script),
                FeeRate::from_sat_per_vb(2).unwrap(),
            )
            .unwrap();
            wallet::sign_p2wpkh_input(
                &Secp256k1::new(),
                &mut built.tx,
                0,
                coin.txout.value,
                &self.key,
            )
            .unwrap();
            self.state
                .accept_to_mempool(&built.tx, u64::from(self.time), None, false)
                .unwrap();
        }

        fn apply(&mut self, op: &Op) {
            match op {
                Op::Mine(n) => self.mine(u32::from(*n)),
                Op::Pay(pick) => self.pay(*pick),
                Op::Invalidate(depth) => {
                    let height = self.state.height().saturating_sub(u32::from(*depth)).max(1);
                    let hash = self.state.hash_at(height).unwrap();
                    self.state.invalidate(hash, u64::from(self.time)).unwrap();
                    self.invalidated.push(hash);
                }
                Op::ReconsiderLast => {
                    if let Some(hash) = self.invalidated.pop() {
                        self.state.reconsider(hash, u64::from(self.time)).unwrap();
                    }
                }
            }
        }

        /// The UTXO set, index and mempool agree with a replay of the active chain.
        fn check(&self) {
            let mut replay = ChainState::new();
            for h in 1..=self.state.height() {
                let hash = self.state.hash_at(h).unwrap();
                let block = (*self.state.entry(&hash).unwrap().block).clone();
                replay.connect_block(block, true).unwrap();
            }
            let extra: Vec<_> = self
                .state
                .utxo
                .iter()
                .filter(|(k, v)| replay.utxo.get(*k) != Some(*v))
                .collect();
            let missing: Vec<_> = replay
                .utxo
                .iter()
                .filter(|(k, v)| self.state.utxo.get(*k) != Some(*v))
                .collect();
            assert!(
                extra.is_empty() && missing.is_empty(),
                "utxo differs from a replay: extra {extra:?}, missing {missing:?}"
            );
            assert_eq!(replay.tx_index, self.state.tx_index);
            // Every mempool input is spendable and claimed exactly once.
            let mut claimed = HashSet::new();
            for e in self.state.mempool_entries() {
                let txid = e.tx.compute_txid();
                for i in &e.tx.input {
                    assert!(claimed.insert(i.previous_output), "double spend in mempool");
                    assert_eq!(self.state.spent_by.get(&i.previous_output), Some(&txid));
                    let confirmed = self.state.utxo.contains_key(&i.previous_output);
                    let parent = self.state.mempool.contains_key(&i.previous_output.txid);
                    assert!(confirmed || parent, "mempool input missing");
                    assert!(
                        self.state.tx_location(&txid).is_none(),
                        "confirmed tx in mempool"
                    );
                }
            }
            assert_eq!(claimed.len(), self.state.spent_by.len());
            // Supply: no more than the subsidies of the active chain.
            let supply: Amount = self.state.utxo.values().map(|c| c.txout.value).sum();
            let max: Amount = (1..=self.state.height()).map(subsidy).sum();
            assert!(supply <= max);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Random mining, payments and reorgs keep the state equal to a replay.
        #[test]
        fn state_survives_random_reorgs(ops in prop::collection::vec(op(), 1..25)) {
            let mut h = Harness::new();
            for op in &ops {
                h.apply(op);
                h.check();
            }
        }
    }

    /// Our coins the mempool would let us spend now: confirmed mature ones
    /// and outputs of mempool transactions, none already spent.
    fn spendable(h: &Harness) -> Vec<(OutPoint, TxOut)> {
        let next = h.state.height() + 1;
        let mut v: Vec<(OutPoint, TxOut)> = h
            .state
            .utxos_for(&h.script)
            .into_iter()
            .filter(|(op, c)| {
                h.state.mempool_spender(op).is_none() && (!c.coinbase || next - c.height >= 100)
            })
            .map(|(op, c)| (op, c.txout))
            .collect();
        for e in h.state.mempool_entries() {
            let txid = e.tx.compute_txid();
            for (vout, o) in e.tx.output.iter().enumerate() {
                let op = OutPoint {
                    txid,
                    vout: vout as u32,
                };
                if o.script_pubkey == h.script && h.state.mempool_spender(&op).is_none() {
                    v.push((op, o.clone()));
                }
            }
        }
        v.sort_by_key(|(op, _)| *op);
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]

        /// Random spends (of confirmed coins and of unconfirmed outputs, into
        /// one to four outputs, at random fee rates) through the mempool:
        /// every transaction built has outputs, and no mempool entry ever
        /// exceeds Core's ancestor or descendant limits.
        #[test]
        fn random_spends_respect_package_limits_and_build_non_empty_txs(
            ops in prop::collection::vec((any::<u16>(), 1usize..5, 1u64..30, 0u8..12), 1..120)
        ) {
            let mut h = Harness::new();
            for (pick, outputs, rate, mine) in ops {
                if mine == 0 {
                    h.mine(1);
                    continue;
                }
                let coins = spendable(&h);
                if coins.is_empty() {
                    continue;
                }
                // Mostly extend the newest unconfirmed chain, to reach the limits.
                let newest = h.state.mempool_entries().last().map(|e| e.tx.compute_txid());
                let (outpoint, txout) = match coins.iter().find(|(op, _)| Some(op.txid) == newest) {
                    Some(c) if pick % 5 != 0 => c.clone(),
                    _ => coins[pick as usize % coins.len()].clone(),
                };
                let share = txout.value / (outputs as u64 + 1);
                let payments: Vec<TxOut> = (0..outputs)
                    .map(|_| TxOut { value: share, script_pubkey: h.script.clone() })
                    .filter(|o| o.value >= wallet::dust_threshold(&o.script_pubkey))
                    .collect();
                let input = wallet::SpendableOutput {
                    outpoint,
                    txout: txout.clone(),
                    path: wallet::KeyPath::receive(0),
                };
                let rate = FeeRate::from_sat_per_vb(rate).unwrap();
                let built = match wallet::build_transaction(&[input], &payments, Some(&h.script), rate) {
                    Ok(b) => b,
                    Err(wallet::BuildError::InsufficientFunds { .. } | wallet::BuildError::NothingLeft { .. }) => continue,
                    Err(e) => return Err(TestCaseError::fail(format!("build: {e}"))),
                };
                prop_assert!(!built.tx.output.is_empty(), "built a transaction without outputs");
                let mut tx = built.tx;
                wallet::sign_p2wpkh_input(&Secp256k1::new(), &mut tx, 0, txout.value, &h.key).unwrap();
                match h.state.accept_to_mempool(&tx, u64::from(h.time), None, false) {
                    Ok(_) => {}
                    Err(e) => prop_assert!(
                        e.reason.starts_with("too-long-mempool-chain"),
                        "unexpected refusal {}", e.reason
                    ),
                }
                for e in h.state.mempool_entries() {
                    let txid = e.tx.compute_txid();
                    let size = |ids: &[Txid]| -> u64 {
                        e.vsize + ids.iter().filter_map(|t| h.state.mempool_entry(t)).map(|x| x.vsize).sum::<u64>()
                    };
                    let anc = h.state.mempool_ancestors(&txid, false);
                    let desc = h.state.mempool_descendants(&txid, false);
                    prop_assert!(anc.len() < MAX_PACKAGE_COUNT, "{} ancestors", anc.len());
                    prop_assert!(desc.len() < MAX_PACKAGE_COUNT, "{} descendants", desc.len());
                    prop_assert!(size(&anc) <= MAX_PACKAGE_VSIZE);
                    prop_assert!(size(&desc) <= MAX_PACKAGE_VSIZE);
                }
            }
            h.check();
        }
    }

    /// Found by `state_survives_random_reorgs`: a block holding a parent and
    /// its child, disconnected, used to bring the parent's spent output back.
    #[test]
    fn regression_disconnect_of_block_with_in_block_spend() {
        let mut h = Harness::new();
        let ops = [
            Op::Pay(50),
            Op::Mine(2),
            Op::Pay(0),
            Op::Pay(0),
            Op::Invalidate(1),
            Op::Mine(1),
            Op::Mine(1),
            Op::Invalidate(1),
        ];
        for op in &ops {
            h.apply(op);
            h.check();
        }
        assert_eq!(h.state.height(), 101);
    }

    #[test]
    fn mempool_conflicting_with_a_block_is_evicted_with_descendants() {
        let mut h = Harness::new();
        h.pay(0);
        let parent = h.state.mempool_entries()[0].tx.clone();
        // A child of the mempool transaction, spending its first output.
        let parent_out = OutPoint {
            txid: parent.compute_txid(),
            vout: 0,
        };
        let child_in = wallet::SpendableOutput {
            outpoint: parent_out,
            txout: parent.output[0].clone(),
            path: wallet::KeyPath::receive(0),
        };
        let mut child = wallet::build_transaction(
            &[child_in],
            &[],
            Some(&h.script),
            FeeRate::from_sat_per_vb(2).unwrap(),
        )
        .unwrap()
        .tx;
        wallet::sign_p2wpkh_input(
            &Secp256k1::new(),
            &mut child,
            0,
            parent.output[0].value,
            &h.key,
        )
        .unwrap();
        h.state.accept_to_mempool(&child, 0, None, false).unwrap();
        assert_eq!(
            h.state.mempool_descendants(&parent.compute_txid(), false),
            vec![child.compute_txid()]
        );
        assert_eq!(h.state.mempool_entries().len(), 2);
        // A block that spends the parent's input differently.
        let coin = h
            .state
            .utxo(&parent.input[0].previous_output)
            .unwrap()
            .clone();
        let input = wallet::SpendableOutput {
            outpoint: parent.input[0].previous_output,
            txout: coin.txout.clone(),
            path: wallet::KeyPath::receive(0),
        };
        let mut rival = wallet::build_transaction(
            &[input],
            &[],
            Some(&h.script),
            FeeRate::from_sat_per_vb(9).unwrap(),
        )
        .unwrap()
        .tx;
        wallet::sign_p2wpkh_input(&Secp256k1::new(), &mut rival, 0, coin.txout.value, &h.key)
            .unwrap();
        let height = h.state.height() + 1;
        let fee = coin.txout.value - rival.output[0].value;
        let mut block = assemble_block(
            h.state.tip_hash(),
            height,
            h.time + 600,
            &h.script,
            subsidy(height) + fee,
            vec![rival],
        );
        grind(&mut block.header);
        h.state.connect_block(block, true).unwrap();
        assert!(h.state.mempool_entries().is_empty());
        h.check();
    }
}
