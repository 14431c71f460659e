//! The chain watcher: scans every block once (the height is persisted), finds
//! wallet outputs and their spends, spends of channel anchors (closes,
//! commitments, revoked commitments → penalty), feeds heights and anchor
//! depths to the channels, and broadcasts queued claims once their relative
//! and absolute locks allow.

use std::sync::Arc;
use std::time::Duration;

use bitcoin::{Block, OutPoint};

use crate::control_error::ControlError;
use crate::store::{OutputRow, StoreError};

/// Why a watcher pass stopped (the next pass starts over from the stored height).
#[derive(Debug, thiserror::Error)]
pub(crate) enum WatchError {
    /// The chain backend failed.
    #[error("chain: {0}")]
    Chain(#[from] chain::ChainError),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A channel's actions failed (a persist).
    #[error(transparent)]
    Channel(#[from] ControlError),
}
use crate::NodeState;

/// Why a transaction the node follows could not be looked up (nothing is decided on it).
#[derive(Debug, thiserror::Error)]
pub(crate) enum LookupError {
    /// The chain backend failed.
    #[error("chain: {0}")]
    Chain(#[from] chain::ChainError),
    /// The record of its block could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl NodeState {
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
        &self,
        txid: bitcoin::Txid,
    ) -> Result<Option<chain::TxStatus>, LookupError> {
        if let Some(hash) = self.store.tx_block(&txid).await? {
            match self.chain.transaction_in_block(txid, hash).await {
                Ok(Some(status)) => return Ok(Some(status)),
                // That block left the best chain (the next pass rewinds the record): the
                // transaction may be back in the mempool or in a block of the new branch.
                Ok(None) => {}
                // A pruned block, or Core unreachable: the mempool (and `gettxout` for an
                // anchor) may still answer; if Core is down the next call says so.
                Err(e) => {
                    tracing::debug!(%txid, block = %hash, error = %e, "recorded block unavailable")
                }
            }
        }
        Ok(self.chain.transaction(txid).await?)
    }
}

/// The deepest reorganisation followed back block by block (two weeks of blocks); a deeper
/// one is rescanned from there.
const MAX_REORG_DEPTH: u32 = 2016;

/// How often the tip is polled.
const POLL: Duration = Duration::from_millis(250);

/// Runs until shutdown.
pub(crate) async fn run(state: Arc<NodeState>) {
    let mut shutdown = state.shutdown.subscribe();
    loop {
        if let Err(e) = step(&state).await {
            tracing::warn!(error = %e, "chain watcher");
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}

/// One pass: new blocks, then channel timers and pending broadcasts.
pub(crate) async fn step(state: &NodeState) -> Result<(), WatchError> {
    let _pass = state.watch_pass.lock().await;
    let tip = state.chain.tip().await?;
    // The chain's tip is the block the last pass scanned last: a block's hash commits to
    // all its ancestors, so nothing was added or replaced and the store has nothing to
    // compare (an idle node made three reads per pass, four passes a second).
    let unchanged = *crate::channels::lock(&state.scanned_tip) == Some(tip.hash);
    if unchanged {
        timers_and_broadcasts(state, tip.height).await;
        return Ok(());
    }
    let mut scanned = state.store.meta("scanned_height").await?;
    let mut forked = false;
    if let Some(fork) = find_fork(state, scanned).await? {
        scanned = i64::from(fork);
        forked = true;
        for slot in state.channels.all() {
            let mut inner = slot.lock().await;
            if inner.anchor_conflict.is_some_and(|h| h > fork) {
                inner.anchor_conflict = None;
            }
        }
    }
    // The first pass after a start checks every live channel's anchor: a reorganisation
    // while the node was down may have taken it.
    let first_pass = !state
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
        let Some(block) = state.chain.block_at(next).await? else {
            break;
        };
        scan_block(state, next, &block).await?;
        state
            .store
            .set_block_hash(next, &block.block_hash())
            .await?;
        state
            .store
            .set_meta("scanned_height", i64::from(next))
            .await?;
        next += 1;
        new_blocks = true;
    }
    let height = next.saturating_sub(1);
    if new_blocks || scanned == 0 || forked || first_pass {
        // Claims, penalties and the fair close fee follow the chain's fee rate.
        let rate = state.fee_rate().await.to_sat_per_kwu();
        for slot in state.channels.all() {
            {
                let mut inner = slot.lock().await;
                inner.channel.set_fee_rate(rate);
                let _ = inner.channel.block_height(height);
                state.advance_opening(&slot, &mut inner, height).await;
                state.check_live_anchor(&slot, &mut inner, height).await;
            }
        }
    }
    if new_blocks {
        bump_stuck_sweeps(state, height).await;
    }
    timers_and_broadcasts(state, height).await;
    // Only now: a pass that failed half-way is repeated whole.
    let last = if height > 0 {
        state.store.block_hash(height).await?
    } else {
        None
    };
    *crate::channels::lock(&state.scanned_tip) = last;
    Ok(())
}

/// What every pass does, new blocks or not: update deadlines, expired HTLCs, due broadcasts.
async fn timers_and_broadcasts(state: &NodeState, height: u32) {
    for slot in state.channels.all() {
        state.enforce_update_deadline(&slot).await;
        state.time_out_htlcs(&slot, height).await;
    }
    send_due_broadcasts(state, height).await;
}

/// Compares the stored hashes of the scanned blocks with the best chain, from the scanned
/// height down, to the last block both agree on: the fork point. Works the same for a
/// reorganisation seen live and one that happened while the node was stopped. What the
/// blocks above the fork did is undone in the store ([`crate::store::Store::rewind`]) and
/// the scan resumes after the fork; anchors' depths always come from the best chain.
///
/// # Errors
/// The chain or the store failed (the next pass tries again).
async fn find_fork(state: &NodeState, scanned: i64) -> Result<Option<u32>, WatchError> {
    let Ok(mut height) = u32::try_from(scanned) else {
        return Ok(None);
    };
    let mut gone_blocks = Vec::new();
    while height > 0 && gone_blocks.len() < MAX_REORG_DEPTH as usize {
        let Some(stored) = state.store.block_hash(height).await? else {
            break;
        };
        if state.chain.block_hash(height).await? == Some(stored) {
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
        match state.chain.block(*hash).await {
            Ok(block) => {
                for tx in &block.txdata {
                    let txid = tx.compute_txid();
                    if !state.chain.in_mempool(txid).await.unwrap_or(true) {
                        gone.push(txid);
                    }
                }
            }
            Err(e) => tracing::warn!(block = %hash, error = %e, "replaced block unavailable"),
        }
    }
    tracing::warn!(
        depth = gone_blocks.len(),
        fork = height,
        "chain reorganisation; rescanning from the fork point"
    );
    state.store.rewind(height, &gone).await?;
    state
        .store
        .set_meta("scanned_height", i64::from(height))
        .await?;
    Ok(Some(height))
}

async fn scan_block(state: &NodeState, height: u32, block: &Block) -> Result<(), WatchError> {
    let mut anchor_inputs: Vec<(OutPoint, bitcoin::Txid, Arc<crate::channels::Slot>)> = Vec::new();
    let anchors: Vec<(OutPoint, Arc<crate::channels::Slot>)> = {
        let mut v = Vec::new();
        for slot in state.channels.all() {
            let inner = slot.lock().await;
            if let Some(op) = inner.channel.anchor_outpoint() {
                for input in &inner.anchor_inputs {
                    anchor_inputs.push((*input, op.txid, Arc::clone(&slot)));
                }
                drop(inner);
                v.push((op, slot));
            }
        }
        v
    };
    let pending = state.store.pending_broadcasts().await?;
    // What the node looks up later by txid (a claim's CSV counts from its parent's depth):
    // the queued transactions' parents. Anchors, their spends and the queued transactions
    // themselves are found below.
    let parents: std::collections::HashSet<bitcoin::Txid> = pending
        .iter()
        .flat_map(|b| b.tx.input.iter().map(|i| i.previous_output.txid))
        .collect();
    let hash = block.block_hash();
    // Every output the wallet has (spent and reserved ones too, whose spender the chain may
    // overrule): only their spends are written. Writing every input of every transaction
    // cost a database transaction per transaction of the block, on every node, and kept
    // the block in memory for all those round trips.
    let mut ours: std::collections::HashSet<OutPoint> = state
        .store
        .outputs(false)
        .await?
        .iter()
        .map(|o| o.outpoint)
        .collect();
    for tx in &block.txdata {
        let txid = tx.compute_txid();
        let spent: Vec<OutPoint> = tx.input.iter().map(|i| i.previous_output).collect();
        // Recorded before the channels act on it, so that a claim queued now finds its parent.
        let followed = parents.contains(&txid)
            || pending.iter().any(|b| b.txid == txid)
            || anchors
                .iter()
                .any(|(op, _)| op.txid == txid || spent.contains(op));
        if followed {
            state.store.record_tx_block(&txid, height, &hash).await?;
        }
        let spent_ours: Vec<OutPoint> =
            spent.iter().filter(|o| ours.contains(o)).copied().collect();
        if !spent_ours.is_empty() {
            state.store.spend_outputs(&spent_ours, &txid).await?;
        }
        for (input, anchor, slot) in &anchor_inputs {
            if txid != *anchor && spent.contains(input) {
                tracing::warn!(peer = %slot.peer, channel = slot.id, %txid, height, "a block double-spends the channel's anchor");
                slot.lock().await.anchor_conflict = Some(height);
            }
        }
        for (op, slot) in &anchors {
            if spent.contains(op) {
                let mut inner = slot.lock().await;
                tracing::info!(peer = %slot.peer, channel = slot.id, %txid, height, "anchor spent");
                // A revoked commitment's HTLCs live in the store, keyed by its number.
                let revoked = match channel::tx::commitment_number(tx) {
                    Some(n) => state.store.revoked(slot.id, n).await.unwrap_or_else(|e| {
                        tracing::error!(channel = slot.id, error = %e, "cannot read the revoked commitment");
                        None
                    }),
                    None => None,
                };
                match inner.channel.spend_seen(tx, revoked.as_ref()) {
                    Ok(actions) => state.run_actions(slot, &mut inner, actions).await?,
                    Err(e) => {
                        tracing::error!(peer = %slot.peer, channel = slot.id, %txid, error = %e, "cannot handle the anchor spend")
                    }
                }
            }
        }
        for (vout, out) in tx.output.iter().enumerate() {
            if let Some(path) = state.script_path(&out.script_pubkey) {
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
                state.store.add_output(&row).await?;
                // A later transaction of the same block may spend it.
                ours.insert(row.outpoint);
                tracing::info!(%txid, vout, amount_sat = row.amount_sat, "wallet output confirmed");
            }
        }
        // A queued transaction whose inputs this one spends is confirmed, or can never be.
        for b in &pending {
            if b.txid == txid
                || b.tx
                    .input
                    .iter()
                    .any(|i| spent.contains(&i.previous_output))
            {
                state.store.broadcast_done(&b.txid, height).await?;
            }
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
async fn send_due_broadcasts(state: &NodeState, height: u32) {
    let Ok(pending) = state.store.pending_broadcasts().await else {
        return;
    };
    // Asked only when a time lock waits: one more request per pass otherwise.
    let median_time = if pending.iter().any(|b| b.lock_time >= LOCKTIME_THRESHOLD) {
        match state.chain.median_time_past().await {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::debug!(error = %e, "no median time past; time-locked claims wait");
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
                Some(p) => match state.followed_transaction(p).await {
                    Ok(Some(s)) => s.confirmations,
                    _ => 0,
                },
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
                tracing::debug!(txid = %b.txid, error = %e, "queued transaction not accepted yet");
                continue;
            }
        }
        crate::channels::lock(&state.sent_at)
            .entry(b.txid)
            .or_insert(height);
    }
}

/// Claims and penalties sent in an earlier block and still unconfirmed are replaced at a
/// higher fee (BIP125, `chain::bump`), within the budget their channel allows: a cheater's
/// delayed sweep or an HTLC refund races them, and the fee that wins is not known when
/// they are first signed.
async fn bump_stuck_sweeps(state: &NodeState, height: u32) {
    let Ok(pending) = state.store.pending_broadcasts().await else {
        return;
    };
    // Only what is still queued is remembered: confirmed and replaced versions go, so the
    // map never holds more than the queue.
    let due: Vec<_> = {
        let mut sent_at = crate::channels::lock(&state.sent_at);
        sent_at.retain(|txid, _| pending.iter().any(|b| b.txid == *txid));
        pending
            .into_iter()
            .filter(|b| sent_at.get(&b.txid).is_some_and(|h| *h < height))
            .collect()
    };
    if due.is_empty() {
        return;
    }
    let target = state.fee_rate().await;
    for b in due {
        let Some(slot) = state.channels.by_id(b.channel_id) else {
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
        let inner = slot.lock().await;
        let Some(fee) = chain::bump::replacement_fee(&chain::bump::Replacement {
            old_fee,
            vsize: b.tx.vsize() as u64,
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
            tracing::error!(channel = b.channel_id, error = %e, "cannot queue a fee bump");
            continue;
        }
        if let Err(e) = state.store.broadcast_superseded(&b.txid).await {
            tracing::error!(channel = b.channel_id, error = %e, "cannot retire a replaced claim");
        }
        tracing::info!(channel = b.channel_id, old = %b.txid, new = %txid, old_fee_sat = old_fee.to_sat(), fee_sat = fee.to_sat(), "claim re-signed at a higher fee");
        match state.chain.broadcast(bumped).await {
            Ok(_) => {
                crate::channels::lock(&state.sent_at).insert(txid, height);
            }
            Err(e) => tracing::warn!(channel = b.channel_id, %txid, error = %e, "fee bump refused"),
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
        node.state
            .store
            .queue_broadcast(1, &tx, 0, lock)
            .await
            .unwrap();
        super::step(&node.state).await.unwrap();
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
        super::step(&node.state).await.unwrap();
        assert!(
            chain.in_mempool(txid).await.unwrap(),
            "a claim locked until a time that has passed was not broadcast"
        );
        node.shutdown().await;
    }
}
