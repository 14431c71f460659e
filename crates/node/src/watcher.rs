//! The chain watcher: scans every block once (the height is persisted), finds
//! wallet outputs and their spends, spends of channel anchors (closes,
//! commitments, revoked commitments → penalty), feeds heights and anchor
//! depths to the channels, and broadcasts queued claims once their relative
//! and absolute locks allow.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bitcoin::{Block, OutPoint, Transaction, Txid};
use chain::Chain;

use crate::manager::{lock, ExecError, Slot};
use crate::node::Node;
use crate::store::{BroadcastRow, MetaKey, OutputRow, Store, StoreError};

/// Why a watcher pass stopped (the next pass starts over from the stored height).
#[derive(Debug, thiserror::Error)]
pub(crate) enum WatchError {
    /// The chain backend failed.
    #[error("chain")]
    Chain(#[from] chain::ChainError),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A channel's actions failed (a persist).
    #[error(transparent)]
    Channel(#[from] ExecError),
}

/// Why a transaction the node follows could not be looked up (nothing is decided on it).
#[derive(Debug, thiserror::Error)]
pub(crate) enum LookupError {
    /// The chain backend failed.
    #[error("chain")]
    Chain(#[from] chain::ChainError),
    /// The record of its block could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What the watcher keeps between passes.
#[derive(Default)]
pub(crate) struct WatchState {
    /// One watcher pass at a time (the loop and tests that step it).
    pass: tokio::sync::Mutex<()>,
    /// Set by the watcher's first pass after a start.
    watched_once: std::sync::atomic::AtomicBool,
    /// The stored hash of the last block the watcher's last complete pass had scanned.
    scanned_tip: Mutex<Option<bitcoin::BlockHash>>,
    /// The height at which each queued claim or penalty was first sent (a version still
    /// unconfirmed a block later is replaced at a higher fee). Not persisted: after a
    /// restart the count starts again, which only delays the next bump by a block.
    sent_at: Mutex<HashMap<Txid, u32>>,
}

/// A transaction the node follows (an anchor, a commitment or close spending one, a
/// queued claim or its parent), in the mempool or on the best chain; `None` if neither.
/// Found without Core's `-txindex`: the scan recorded the block that holds it
/// ([`crate::store::Store::record_tx_block`]), and Core finds a confirmed transaction
/// by its block; the mempool needs no index. On a Core with the index, a transaction
/// confirmed in a block not scanned yet is found too.
///
/// # Errors
/// The chain or the store could not be asked.
pub(crate) async fn followed_transaction(
    store: &Store,
    chain: &dyn Chain,
    txid: Txid,
) -> Result<Option<chain::TxStatus>, LookupError> {
    if let Some(hash) = store.tx_block(&txid).await? {
        match chain.transaction_in_block(txid, hash).await {
            Ok(Some(status)) => return Ok(Some(status)),
            // That block left the best chain (the next pass rewinds the record): the
            // transaction may be back in the mempool or in a block of the new branch.
            Ok(None) => {}
            // A pruned block, or Core unreachable: the mempool (and `gettxout` for an
            // anchor) may still answer; if Core is down the next call says so.
            Err(e) => {
                tracing::debug!(%txid, block = %hash, error = %crate::error_report::Causes(&e), "recorded block unavailable")
            }
        }
    }
    Ok(chain.transaction(txid).await?)
}

/// The deepest reorganisation followed back block by block (two weeks of blocks); a deeper
/// one is rescanned from there.
const MAX_REORG_DEPTH: u32 = 2016;

/// How often the tip is polled.
const POLL: Duration = Duration::from_millis(250);

/// Runs until shutdown.
pub(crate) async fn run(node: Arc<Node>) {
    let mut shutdown = node.shutdown.subscribe();
    loop {
        if let Err(e) = step(&node).await {
            tracing::warn!(error = %crate::error_report::Causes(&e), "chain watcher");
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}

/// One pass: new blocks, then channel timers and pending broadcasts.
pub(crate) async fn step(node: &Node) -> Result<(), WatchError> {
    let _pass = node.watcher.pass.lock().await;
    let tip = node.chain.tip().await?;
    // The chain's tip is the block the last pass scanned last: a block's hash commits to
    // all its ancestors, so nothing was added or replaced and the store has nothing to
    // compare (an idle node made three reads per pass, four passes a second).
    let unchanged = *lock(&node.watcher.scanned_tip) == Some(tip.hash);
    if unchanged {
        timers_and_broadcasts(node, tip.height).await;
        return Ok(());
    }
    let mut scanned = node.store.meta(MetaKey::ScannedHeight).await?;
    let mut forked = false;
    if let Some(fork) = find_fork(node, scanned).await? {
        scanned = i64::from(fork);
        forked = true;
        node.manager.rewound(fork).await;
    }
    // The first pass after a start checks every live channel's anchor: a reorganisation
    // while the node was down may have taken it.
    let first_pass = !node
        .watcher
        .watched_once
        .swap(true, std::sync::atomic::Ordering::Relaxed);
    // A fresh node starts at the current tip: nothing of it can be older.
    let mut next = if scanned == 0 {
        tip.height
    } else {
        u32::try_from(scanned + 1).unwrap_or(u32::MAX)
    };
    let mut new_blocks = false;
    while next <= tip.height {
        let Some(block) = node.chain.block_at(next).await? else {
            break;
        };
        scan_block(node, next, &block).await?;
        node.store.set_block_hash(next, &block.block_hash()).await?;
        node.store
            .set_meta(MetaKey::ScannedHeight, i64::from(next))
            .await?;
        next += 1;
        new_blocks = true;
    }
    let height = next.saturating_sub(1);
    if new_blocks || scanned == 0 || forked || first_pass {
        // Claims, penalties and the fair close fee follow the chain's fee rate.
        let rate = node.wallet.fee_rate().await.to_sat_per_kwu();
        node.manager.block(height, rate).await;
    }
    if new_blocks {
        bump_stuck_sweeps(node, height).await;
    }
    timers_and_broadcasts(node, height).await;
    // Only now: a pass that failed half-way is repeated whole.
    let last = if height > 0 {
        node.store.block_hash(height).await?
    } else {
        None
    };
    *lock(&node.watcher.scanned_tip) = last;
    Ok(())
}

/// What every pass does, new blocks or not: update deadlines, expired HTLCs, due broadcasts.
async fn timers_and_broadcasts(node: &Node, height: u32) {
    let now = std::time::Instant::now();
    for slot in node.manager.channels.all() {
        node.manager.tick(&slot, height, now).await;
    }
    // Forwarding work a tick queued, or an offer that waited for a busy channel.
    node.manager.run_forwards().await;
    send_due_broadcasts(node, height).await;
}

/// Compares the stored hashes of the scanned blocks with the best chain, from the scanned
/// height down, to the last block both agree on: the fork point. Works the same for a
/// reorganisation seen live and one that happened while the node was stopped. What the
/// blocks above the fork did is undone in the store ([`crate::store::Store::rewind`]) and
/// the scan resumes after the fork; anchors' depths always come from the best chain.
///
/// # Errors
/// The chain or the store failed (the next pass tries again).
async fn find_fork(node: &Node, scanned: i64) -> Result<Option<u32>, WatchError> {
    let Ok(mut height) = u32::try_from(scanned) else {
        return Ok(None);
    };
    let mut gone_blocks = Vec::new();
    while height > 0 && gone_blocks.len() < MAX_REORG_DEPTH as usize {
        let Some(stored) = node.store.block_hash(height).await? else {
            break;
        };
        if node.chain.block_hash(height).await? == Some(stored) {
            break;
        }
        gone_blocks.push(stored);
        height -= 1;
    }
    if gone_blocks.is_empty() {
        return Ok(None);
    }
    // Transactions of the replaced blocks: outputs they spent become ours again unless the
    // new branch (or the mempool) still has them.
    let mut gone = Vec::new();
    for hash in &gone_blocks {
        match node.chain.block(*hash).await {
            Ok(block) => {
                for tx in &block.txdata {
                    let txid = tx.compute_txid();
                    if !node.chain.in_mempool(txid).await.unwrap_or(true) {
                        gone.push(txid);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(block = %hash, error = %crate::error_report::Causes(&e), "replaced block unavailable")
            }
        }
    }
    tracing::warn!(
        depth = gone_blocks.len(),
        fork = height,
        "chain reorganisation; rescanning from the fork point"
    );
    node.store.rewind(height, &gone).await?;
    node.store
        .set_meta(MetaKey::ScannedHeight, i64::from(height))
        .await?;
    Ok(Some(height))
}

/// What a block is compared against: everything the node follows on chain.
pub(crate) struct Watched<'a> {
    /// Every channel anchor, with its channel's index in `slots`.
    pub(crate) anchors: Vec<(OutPoint, usize)>,
    /// The outputs each anchor spends: (input, anchor txid, channel index).
    pub(crate) anchor_inputs: Vec<(OutPoint, Txid, usize)>,
    /// Queued broadcasts.
    pub(crate) pending: &'a [BroadcastRow],
    /// Every wallet output (spent and reserved ones too: the chain may overrule a spender).
    pub(crate) ours: HashSet<OutPoint>,
    /// The wallet's scripts → derivation path.
    pub(crate) script_path: &'a (dyn Fn(&bitcoin::ScriptBuf) -> Option<wallet::KeyPath> + Sync),
}

/// One thing a block holds for the node, in block order.
#[derive(Debug, Clone)]
pub(crate) enum Found {
    /// A transaction the node looks up later by txid: its block is recorded.
    Followed(Txid),
    /// A transaction spends these wallet outputs.
    WalletSpend(Vec<OutPoint>, Txid),
    /// A transaction that is not the anchor spends one of the anchor's inputs: it can
    /// never confirm while this block stands.
    AnchorDoubleSpent { channel: usize, txid: Txid },
    /// The transaction at this index of the block spends the channel's anchor.
    AnchorSpent { channel: usize, tx: usize },
    /// A new wallet output.
    WalletOutput(OutputRow),
    /// A queued broadcast is confirmed, or can never be (its inputs went elsewhere).
    BroadcastDone(Txid),
}

/// Scans a block at `height` against what the node follows; pure: the store, the wallet
/// and the channels apply what it found ([`scan_block`]), as LDK's `chain::Confirm` hands
/// a block's transactions to the manager and the monitors.
pub(crate) fn scan(block: &Block, height: u32, watched: &Watched<'_>) -> Vec<Found> {
    // The parents of the queued transactions (a claim's CSV counts from its parent's depth).
    let parents: HashSet<Txid> = watched
        .pending
        .iter()
        .flat_map(|b| b.tx.input.iter().map(|i| i.previous_output.txid))
        .collect();
    let mut ours = watched.ours.clone();
    let mut found = Vec::new();
    for (index, tx) in block.txdata.iter().enumerate() {
        let txid = tx.compute_txid();
        let spent: Vec<OutPoint> = tx.input.iter().map(|i| i.previous_output).collect();
        // Recorded before the channels act on it, so that a claim queued now finds its parent.
        let followed = parents.contains(&txid)
            || watched.pending.iter().any(|b| b.txid == txid)
            || watched
                .anchors
                .iter()
                .any(|(op, _)| op.txid == txid || spent.contains(op));
        if followed {
            found.push(Found::Followed(txid));
        }
        let spent_ours: Vec<OutPoint> =
            spent.iter().filter(|o| ours.contains(o)).copied().collect();
        if !spent_ours.is_empty() {
            found.push(Found::WalletSpend(spent_ours, txid));
        }
        for (input, anchor, channel) in &watched.anchor_inputs {
            if txid != *anchor && spent.contains(input) {
                found.push(Found::AnchorDoubleSpent {
                    channel: *channel,
                    txid,
                });
            }
        }
        for (op, channel) in &watched.anchors {
            if spent.contains(op) {
                found.push(Found::AnchorSpent {
                    channel: *channel,
                    tx: index,
                });
            }
        }
        for (vout, out) in tx.output.iter().enumerate() {
            if let Some(path) = (watched.script_path)(&out.script_pubkey) {
                let row = OutputRow {
                    outpoint: OutPoint {
                        txid,
                        vout: vout as u32,
                    },
                    amount_sat: out.value.to_sat(),
                    branch: path.branch,
                    index: path.index,
                    height,
                    coinbase: tx.is_coinbase(),
                };
                // A later transaction of the same block may spend it.
                ours.insert(row.outpoint);
                found.push(Found::WalletOutput(row));
            }
        }
        // A queued transaction whose inputs this one spends is confirmed, or can never be.
        for b in watched.pending {
            let conflicts =
                b.tx.input
                    .iter()
                    .any(|i| spent.contains(&i.previous_output));
            if b.txid == txid || conflicts {
                found.push(Found::BroadcastDone(b.txid));
            }
        }
    }
    found
}

/// Scans a block and applies what it holds: the store records followed transactions, the
/// wallet its outputs and their spends, the channels the spends of their anchors.
async fn scan_block(node: &Node, height: u32, block: &Block) -> Result<(), WatchError> {
    let slots = node.manager.channels.all();
    let mut anchors = Vec::new();
    let mut anchor_inputs = Vec::new();
    for (i, slot) in slots.iter().enumerate() {
        let inner = slot.lock().await;
        if let Some(op) = inner.channel.anchor_outpoint() {
            for input in &inner.anchor.inputs {
                anchor_inputs.push((*input, op.txid, i));
            }
            anchors.push((op, i));
        }
    }
    let pending = node.store.pending_broadcasts().await?;
    // Every output the wallet has (spent and reserved ones too, whose spender the chain may
    // overrule): only their spends are written. Writing every input of every transaction
    // cost a database transaction per transaction of the block, on every node, and kept
    // the block in memory for all those round trips.
    let ours = node.store.outputs(false).await?;
    let script_path = |script: &bitcoin::ScriptBuf| node.wallet.script_path(script);
    let watched = Watched {
        anchors,
        anchor_inputs,
        pending: &pending,
        ours: ours.iter().map(|o| o.outpoint).collect(),
        script_path: &script_path,
    };
    let hash = block.block_hash();
    for found in scan(block, height, &watched) {
        match found {
            Found::Followed(txid) => node.store.record_tx_block(&txid, height, &hash).await?,
            Found::WalletSpend(outputs, txid) => node.store.spend_outputs(&outputs, &txid).await?,
            Found::AnchorDoubleSpent { channel, txid } => {
                let slot = &slots[channel];
                tracing::warn!(peer = %slot.peer, channel = %slot.id, %txid, height, "a block double-spends the channel's anchor");
                slot.lock().await.anchor.conflict = Some(height);
            }
            Found::AnchorSpent { channel, tx } => {
                anchor_spent(node, &slots[channel], &block.txdata[tx], height).await?;
            }
            Found::WalletOutput(row) => {
                node.store.add_output(&row).await?;
                let (txid, vout) = (row.outpoint.txid, row.outpoint.vout);
                tracing::info!(%txid, vout, amount_sat = row.amount_sat, "wallet output confirmed");
            }
            Found::BroadcastDone(txid) => node.store.broadcast_done(&txid, height).await?,
        }
    }
    // After the channels took the block: a commitment it holds is theirs to know.
    node.manager.forwards_in_block(block).await?;
    Ok(())
}

/// A transaction in a block spends the channel's anchor: a close, a commitment of either
/// side, or a revoked commitment of the peer (answered with the penalty).
async fn anchor_spent(
    node: &Node,
    slot: &Slot,
    tx: &Transaction,
    height: u32,
) -> Result<(), WatchError> {
    let txid = tx.compute_txid();
    let mut inner = slot.lock().await;
    tracing::info!(peer = %slot.peer, channel = %slot.id, %txid, height, "anchor spent");
    // A revoked commitment's HTLCs live in the store, keyed by its number.
    let revoked = match channel::tx::commitment_number(tx) {
        Some(n) => node.store.revoked(slot.id, n).await.unwrap_or_else(|e| {
            tracing::error!(channel = %slot.id, error = %crate::error_report::Causes(&e), "cannot read the revoked commitment");
            None
        }),
        None => None,
    };
    match inner.channel.spend_seen(tx, revoked.as_ref()) {
        Ok(actions) => node.manager.run_actions(slot, &mut inner, actions).await?,
        Err(e) => {
            tracing::error!(peer = %slot.peer, channel = %slot.id, %txid, error = %crate::error_report::Causes(&e), "cannot handle the anchor spend")
        }
    }
    Ok(())
}

/// nLockTime values from here up are unix times, below are block heights (BIP65).
const LOCKTIME_THRESHOLD: u32 = 500_000_000;

/// Whether a transaction with `lock_time` may enter the block after the tip at `height`
/// (consensus `IsFinalTx` with BIP113): a height lock below that block's height, a time
/// lock below the tip's median time past (`None`: unknown, so not yet).
fn lock_time_passed(lock_time: u32, height: u32, median_time_past: Option<u32>) -> bool {
    if lock_time < LOCKTIME_THRESHOLD {
        lock_time <= height
    } else {
        median_time_past.is_some_and(|mtp| lock_time < mtp)
    }
}

/// Broadcasts the queued transactions whose locks are satisfied at the next block.
async fn send_due_broadcasts(state: &Node, height: u32) {
    let Ok(pending) = state.store.pending_broadcasts().await else {
        return;
    };
    // Asked only when a time lock waits: one more request per pass otherwise.
    let median_time = if pending.iter().any(|b| b.lock_time >= LOCKTIME_THRESHOLD) {
        match state.chain.median_time_past().await {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::debug!(error = %crate::error_report::Causes(&e), "no median time past; time-locked claims wait");
                None
            }
        }
    } else {
        None
    };
    for b in pending {
        if !lock_time_passed(b.lock_time, height, median_time) {
            continue;
        }
        if b.csv_blocks > 0 {
            let parent = b.tx.input.first().map(|i| i.previous_output.txid);
            let confs = match parent {
                Some(p) => {
                    match followed_transaction(&state.store, state.chain.as_ref(), p).await {
                        Ok(Some(s)) => s.confirmations,
                        _ => 0,
                    }
                }
                None => 0,
            };
            // BIP68: spendable in the block at conf_height + csv, i.e. when confirmations + 1 > csv.
            if confs == 0 || confs < b.csv_blocks {
                continue;
            }
        }
        match state.chain.broadcast(b.tx.clone()).await {
            Ok(_) => tracing::debug!(txid = %b.txid, "queued transaction broadcast"),
            Err(e) if e.is_already_known() => {}
            Err(e) => {
                tracing::debug!(txid = %b.txid, error = %crate::error_report::Causes(&e), "queued transaction not accepted yet");
                continue;
            }
        }
        lock(&state.watcher.sent_at).entry(b.txid).or_insert(height);
    }
}

/// Claims and penalties sent in an earlier block and still unconfirmed are replaced at a
/// higher fee (BIP125, `chain::bump`), within the budget their channel allows: a cheater's
/// delayed sweep or an HTLC refund races them, and the fee that wins is not known when
/// they are first signed.
async fn bump_stuck_sweeps(state: &Node, height: u32) {
    let Ok(pending) = state.store.pending_broadcasts().await else {
        return;
    };
    // Only what is still queued is remembered: confirmed and replaced versions go, so the
    // map never holds more than the queue.
    let due: Vec<_> = {
        let mut sent_at = lock(&state.watcher.sent_at);
        sent_at.retain(|txid, _| pending.iter().any(|b| b.txid == *txid));
        pending
            .into_iter()
            .filter(|b| sent_at.get(&b.txid).is_some_and(|h| *h < height))
            .collect()
    };
    if due.is_empty() {
        return;
    }
    let target = state.wallet.fee_rate().await;
    for b in due {
        let Some(slot) = state.manager.channels.by_id(b.channel_id) else {
            continue;
        };
        // The outputs it spends, as confirmed (a sweep's parent is on chain before it is
        // sent; the version in the mempool spends them there, so ask past the mempool).
        let mut values = Vec::with_capacity(b.tx.input.len());
        for input in &b.tx.input {
            match state.chain.confirmed_output(input.previous_output).await {
                Ok(Some(out)) => values.push(out.value),
                _ => break,
            }
        }
        if values.len() != b.tx.input.len() {
            continue;
        }
        let total: bitcoin::Amount = values.iter().copied().sum();
        let Some(old_fee) = b.tx.output.first().and_then(|o| total.checked_sub(o.value)) else {
            continue;
        };
        // Priced for the replacement's own signatures, which may be longer than these.
        let Ok(vsize) = channel::tx::resigned_vsize(&b.tx) else {
            continue;
        };
        let inner = slot.lock().await;
        let Some(fee) = chain::bump::replacement_fee(&chain::bump::Replacement {
            old_fee,
            vsize,
            target,
            incremental: bitcoin::FeeRate::from_sat_per_vb_u32(1),
            budget: inner.channel.sweep_budget(total),
        }) else {
            continue;
        };
        let bumped = match inner.channel.bump_sweep(&b.tx, &values, fee.to_sat()) {
            Ok(tx) => tx,
            // The anchor, a commitment or a close: not ours to re-sign alone.
            Err(_) => continue,
        };
        drop(inner);
        let txid = bumped.compute_txid();
        // The replacement is on disk before it is sent; the old version stops being sent
        // (if it confirms anyway, the scan marks the replacement done: same inputs).
        if let Err(e) = state
            .store
            .queue_broadcast(b.channel_id, &bumped, b.csv_blocks, b.lock_time)
            .await
        {
            tracing::error!(channel = %b.channel_id, error = %crate::error_report::Causes(&e), "cannot queue a fee bump");
            continue;
        }
        if let Err(e) = state.store.broadcast_superseded(&b.txid).await {
            tracing::error!(channel = %b.channel_id, error = %crate::error_report::Causes(&e), "cannot retire a replaced claim");
        }
        tracing::info!(channel = %b.channel_id, old = %b.txid, new = %txid, old_fee_sat = old_fee.to_sat(), fee_sat = fee.to_sat(), "claim re-signed at a higher fee");
        match state.chain.broadcast(bumped).await {
            Ok(_) => {
                lock(&state.watcher.sent_at).insert(txid, height);
            }
            Err(e) => {
                tracing::warn!(channel = %b.channel_id, %txid, error = %crate::error_report::Causes(&e), "fee bump refused")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bitcoin::{
        absolute::LockTime, transaction::Version, Amount, OutPoint, ScriptBuf, Sequence,
        Transaction, TxIn, TxOut, Witness,
    };
    use chain::{Chain as _, DevChain};

    /// A spend of `coin`, a P2WSH of `OP_TRUE` (spendable without a key), locked until `lock_time`.
    fn locked_spend(coin: OutPoint, value: Amount, lock_time: u32) -> Transaction {
        let mut witness = Witness::new();
        witness.push([0x51]);
        Transaction {
            version: Version::TWO,
            lock_time: LockTime::from_consensus(lock_time),
            input: vec![TxIn {
                previous_output: coin,
                script_sig: ScriptBuf::new(),
                sequence: Sequence::ENABLE_LOCKTIME_NO_RBF,
                witness,
            }],
            output: vec![TxOut {
                value: value - Amount::from_sat(1_000),
                script_pubkey: ScriptBuf::new_p2wsh(
                    &ScriptBuf::from_bytes(vec![0x51]).wscript_hash(),
                ),
            }],
        }
    }

    #[test]
    fn height_locks_pass_at_the_next_block_and_time_locks_below_the_median_time_past() {
        use super::lock_time_passed;
        assert!(lock_time_passed(0, 0, None));
        assert!(lock_time_passed(100, 100, None), "final in block 101");
        assert!(!lock_time_passed(101, 100, None));
        assert!(lock_time_passed(499_999_999, 499_999_999, None));
        let t = 1_700_000_000;
        assert!(!lock_time_passed(t, 800_000, None), "unknown median: wait");
        assert!(
            !lock_time_passed(t, 800_000, Some(t)),
            "BIP113: strictly below"
        );
        assert!(lock_time_passed(t, 800_000, Some(t + 1)));
        assert!(
            !lock_time_passed(500_000_000, u32::MAX, Some(1)),
            "a time is no height"
        );
    }

    /// Issue 28 finding 13: a queued claim whose nLockTime is a time (≥ 500,000,000) was
    /// never broadcast; it goes out once the chain's median time past has passed it (BIP113).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_locked_until_a_time_goes_out_once_the_median_time_past_passes_it() {
        let dir = tempfile::tempdir().unwrap();
        let chain = DevChain::open(&dir.path().join("chain")).unwrap();
        let payout = chain.faucet_script().to_owned();
        chain.mine(101, &payout).unwrap();
        let op_true = ScriptBuf::new_p2wsh(&ScriptBuf::from_bytes(vec![0x51]).wscript_hash());
        let value = Amount::from_sat(100_000);
        let coin_txid = chain.faucet(&op_true, value).unwrap();
        chain.mine(1, &payout).unwrap();
        let coin_tx = chain.transaction(coin_txid).await.unwrap().unwrap().tx;
        let vout = coin_tx
            .output
            .iter()
            .position(|o| o.script_pubkey == op_true)
            .unwrap();
        let coin = OutPoint {
            txid: coin_txid,
            vout: vout as u32,
        };

        let mut config = crate::NodeConfig::new(dir.path().join("node"));
        config.listen = "127.0.0.1:0".parse().unwrap();
        config.rpc_bind = "127.0.0.1:0".parse().unwrap();
        let node = crate::start(config, Arc::new(chain.clone())).await.unwrap();
        let mtp = chain.with_state(|s| s.median_time_past(s.height()));
        let lock = mtp + 3_600;
        let tx = locked_spend(coin, value, lock);
        let txid = tx.compute_txid();
        node.node
            .store
            .queue_broadcast(crate::store::ChannelId(1), &tx, 0, lock)
            .await
            .unwrap();
        super::step(&node.node).await.unwrap();
        assert!(
            !chain.in_mempool(txid).await.unwrap(),
            "broadcast before its time"
        );

        // Eleven blocks an hour ahead: the median of the last eleven passes the lock.
        chain
            .with_state_mut(|s| {
                for _ in 0..11 {
                    s.mine_block(&payout, lock + 60).unwrap();
                }
            })
            .unwrap();
        assert!(chain.with_state(|s| s.median_time_past(s.height())) > lock);
        super::step(&node.node).await.unwrap();
        assert!(
            chain.in_mempool(txid).await.unwrap(),
            "a claim locked until a time that has passed was not broadcast"
        );
        node.shutdown().await;
    }
}
