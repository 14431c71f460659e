//! The chain watcher: scans every block once (the height is persisted), finds
//! wallet outputs and their spends, spends of channel anchors (closes,
//! commitments, revoked commitments → penalty), feeds heights and anchor
//! depths to the channels, and broadcasts queued claims once their relative
//! and absolute locks allow.

use std::sync::Arc;
use std::time::Duration;

use bitcoin::{Block, OutPoint};
use channel::State;

use crate::store::OutputRow;
use crate::NodeState;

/// How far back a reorganisation is rescanned.
const REORG_DEPTH: i64 = 6;

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
pub(crate) async fn step(state: &NodeState) -> Result<(), String> {
    let mut last = state.watch_pass.lock().await;
    let tip = state.chain.tip().await.map_err(|e| e.to_string())?;
    let mut scanned = state
        .store
        .meta("scanned_height")
        .await
        .map_err(|e| e.to_string())?;
    // A reorganisation replaced the last block we scanned: scan the new branch from a few
    // blocks back (scanning is idempotent). Deeper reorganisations are not handled.
    if let Some((height, hash)) = *last {
        let now = state
            .chain
            .block_hash(height)
            .await
            .map_err(|e| e.to_string())?;
        if now != Some(hash) {
            let from = i64::from(height.min(tip.height))
                .saturating_sub(REORG_DEPTH)
                .max(1);
            tracing::warn!(
                height,
                rescan_from = from + 1,
                "chain reorganisation; rescanning"
            );
            scanned = from;
            state
                .store
                .set_meta("scanned_height", scanned)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    // A fresh node starts at the current tip: nothing of it can be older.
    let mut next = if scanned == 0 {
        tip.height
    } else {
        u32::try_from(scanned + 1).unwrap_or(u32::MAX)
    };
    let mut new_blocks = false;
    while next <= tip.height {
        let Some(block) = state
            .chain
            .block_at(next)
            .await
            .map_err(|e| e.to_string())?
        else {
            break;
        };
        scan_block(state, next, &block).await?;
        *last = Some((next, block.block_hash()));
        state
            .store
            .set_meta("scanned_height", i64::from(next))
            .await
            .map_err(|e| e.to_string())?;
        next += 1;
        new_blocks = true;
    }
    let height = next.saturating_sub(1);
    if new_blocks || scanned == 0 {
        for slot in state.channels.all() {
            {
                let mut inner = slot.lock().await;
                let _ = inner.channel.block_height(height);
                if inner.channel.state() == State::OpenWaitComplete {
                    let depth = state.anchor_depth(&inner.channel).await;
                    let actions = inner.channel.anchor_depth(depth);
                    if !actions.is_empty() {
                        let _ = state.run_actions(&slot, &mut inner, actions).await;
                    }
                }
            }
        }
    }
    for slot in state.channels.all() {
        state.time_out_htlcs(&slot, height).await;
    }
    send_due_broadcasts(state, height).await;
    Ok(())
}

async fn scan_block(state: &NodeState, height: u32, block: &Block) -> Result<(), String> {
    let anchors: Vec<(OutPoint, Arc<crate::channels::Slot>)> = {
        let mut v = Vec::new();
        for slot in state.channels.all() {
            let op = slot.lock().await.channel.anchor_outpoint();
            if let Some(op) = op {
                v.push((op, slot));
            }
        }
        v
    };
    let pending = state
        .store
        .pending_broadcasts()
        .await
        .map_err(|e| e.to_string())?;
    for tx in &block.txdata {
        let txid = tx.compute_txid();
        let spent: Vec<OutPoint> = tx.input.iter().map(|i| i.previous_output).collect();
        state
            .store
            .spend_outputs(&spent, &txid)
            .await
            .map_err(|e| e.to_string())?;
        for (op, slot) in &anchors {
            if spent.contains(op) {
                let mut inner = slot.lock().await;
                tracing::info!(peer = %slot.peer, channel = slot.id, %txid, height, "anchor spent");
                match inner.channel.spend_seen(tx) {
                    Ok(actions) => state.run_actions(slot, &mut inner, actions).await?,
                    Err(e) => {
                        tracing::warn!(channel = slot.id, error = %e, "cannot handle the anchor spend")
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
                state
                    .store
                    .add_output(&row)
                    .await
                    .map_err(|e| e.to_string())?;
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
                state
                    .store
                    .broadcast_done(&b.txid)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(())
}

/// Broadcasts the queued transactions whose locks are satisfied at the next block.
async fn send_due_broadcasts(state: &NodeState, height: u32) {
    let Ok(pending) = state.store.pending_broadcasts().await else {
        return;
    };
    for b in pending {
        // nLockTime below 500,000,000 is a height; a transaction for the next block may carry height.
        if b.lock_time >= 500_000_000 || b.lock_time > height {
            continue;
        }
        if b.csv_blocks > 0 {
            let parent = b.tx.input.first().map(|i| i.previous_output.txid);
            let confs = match parent {
                Some(p) => match state.chain.transaction(p).await {
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
            Err(e) => {
                tracing::debug!(txid = %b.txid, error = %e, "queued transaction not accepted yet")
            }
        }
    }
}
