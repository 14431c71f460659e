//! The background worker: the chain watcher (blocks, deposits, confirmations, reorganisations) and the rounds engine (open → closing → drawing → paying_out → closed), each step a durable transition.
//!
//! Every step reads the state from the database, does one thing and writes
//! the result with a guarded update, so a step can be repeated after a crash
//! or run by two processes at once without moving money twice. The draw
//! itself is the pure [`crate::domain::draw`] module.

use std::collections::{HashMap, HashSet};
use std::str::FromStr as _;
use std::sync::Arc;
#[cfg(feature = "test-hooks")]
use std::sync::OnceLock;
use std::time::Duration;

use bitcoin::{BlockHash, ScriptBuf, Transaction};
use chain::{BroadcastOutcome, Chain, ChainError};
use wallet::Wallet;

use crate::domain::draw::{self, DrawBet};
use crate::domain::round::{RoundStatus, TransferKind, TransferStatus};
use crate::domain::settings::ServiceConfig;
use crate::domain::spend;
use crate::domain::time::unix_now;
use crate::service::current::CurrentRound;
use crate::service::stream::StreamHub;
use crate::store::chain::Deposit;
use crate::store::ledger::{LedgerError, TransferRow};
use crate::store::rounds::{BetRow, DrawColumns, RoundRow};
use crate::store::{Store, StoreError};

/// Environment variable of the crash test hook: when it names a step, the
/// process kills itself with SIGKILL right there (builds with the
/// `test-hooks` feature only; see docs/rounds-engine.md for the step names).
pub const CRASH_HOOK_ENV: &str = "POTLUCK_TEST_CRASH_AT";

/// Kills the process with SIGKILL when [`CRASH_HOOK_ENV`] names `step`.
#[cfg(feature = "test-hooks")]
pub fn crash_point(step: &str) {
    static TARGET: OnceLock<Option<String>> = OnceLock::new();
    let target =
        TARGET.get_or_init(|| std::env::var(CRASH_HOOK_ENV).ok().filter(|s| !s.is_empty()));
    if target.as_deref() == Some(step) {
        tracing::warn!(step, "test crash hook: SIGKILL");
        let pid = std::process::id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid])
            .status();
        // `kill` should not return; if it is missing, die anyway.
        std::process::abort();
    }
}

/// Without the `test-hooks` feature a crash point compiles to nothing: the
/// release binary cannot be made to kill itself by an environment variable.
#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
pub fn crash_point(_step: &str) {}

/// What failed in a background step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The database.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The ledger refused a step.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The chain.
    #[error(transparent)]
    Chain(#[from] ChainError),
    /// Building the payout failed.
    #[error("payout: {0}")]
    Spend(#[from] spend::SpendFailure),
    /// Stored data does not make sense.
    #[error("corrupt: {0}")]
    Corrupt(String),
}

/// What a broadcast answer means for the ledger.
#[derive(Debug)]
enum Broadcast {
    /// The node took it, or already has it in its mempool or a block:
    /// record it as broadcast.
    Accepted,
    /// Refused as invalid, and in neither the mempool nor a block: undo it
    /// (bets, withdrawals) or wait for the admin (payouts).
    Refused {
        /// Core's RPC code, for the log.
        code: i32,
        /// Core's reason.
        reason: String,
    },
    /// Not settled: the node could not be asked, refused it for now
    /// (`non-final`, `mempool min fee not met`, `too-long-mempool-chain` …),
    /// or answered "inputs missing or spent" / "conflict", which is also
    /// what Core says of a transaction that was mined and whose outputs are
    /// all spent. Leave it signed: the worker retries, and the block scan
    /// records it once it sees it confirmed. Never undone on this.
    Pending(ChainError),
}

impl Broadcast {
    /// The one place where chain answers are classified, by what they mean
    /// (`chain::RejectCategory`), never by the bare code: undoing on
    /// anything but -27 credited a mined, fully spent withdrawal back.
    async fn send(chain: &dyn Chain, tx: bitcoin::Transaction) -> Self {
        match chain.broadcast_outcome(tx).await {
            Ok(BroadcastOutcome::Accepted) => Broadcast::Accepted,
            Ok(BroadcastOutcome::Failed(ChainError::Rejected { code, reason, .. })) => {
                Broadcast::Refused { code, reason }
            }
            Ok(BroadcastOutcome::Pending(e) | BroadcastOutcome::Failed(e)) | Err(e) => {
                Broadcast::Pending(e)
            }
            Ok(other) => Broadcast::Pending(ChainError::Unavailable(format!(
                "unexpected broadcast outcome {other:?}"
            ))),
        }
    }
}

/// Blocks processed per sync, so one sync stays short after a long outage.
const MAX_BLOCKS_PER_SYNC: i64 = 500;
/// How old a `signed` bet or withdrawal must be before the worker finishes
/// its broadcast (younger ones are still being broadcast by their request).
const RECOVER_AFTER_SECS: i64 = 3;

/// The chain watcher and the rounds engine.
pub struct Engine {
    store: Store,
    chain: Arc<dyn Chain>,
    wallet: Arc<Wallet>,
    hub: StreamHub,
    rounds: Arc<CurrentRound>,
    /// One sync/tick at a time in this process.
    lock: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

fn txid_of(raw: &str) -> Result<Transaction, EngineError> {
    let bytes = hex::decode(raw).map_err(|e| EngineError::Corrupt(format!("raw tx: {e}")))?;
    bitcoin::consensus::deserialize(&bytes)
        .map_err(|e| EngineError::Corrupt(format!("raw tx: {e}")))
}

impl Engine {
    /// A worker over these parts.
    pub fn new(
        store: Store,
        chain: Arc<dyn Chain>,
        wallet: Arc<Wallet>,
        hub: StreamHub,
        rounds: Arc<CurrentRound>,
    ) -> Self {
        Self {
            store,
            chain,
            wallet,
            hub,
            rounds,
            lock: tokio::sync::Mutex::new(()),
        }
    }

    /// The chain.
    pub fn chain(&self) -> &Arc<dyn Chain> {
        &self.chain
    }

    /// The wallet.
    pub fn wallet(&self) -> &Arc<Wallet> {
        &self.wallet
    }

    /// The last processed block's height: the anti-fee-sniping `nLockTime`.
    async fn tip_height(&self) -> Result<Option<u32>, EngineError> {
        let tip = self.store.synced_tip().await?;
        Ok(tip.and_then(|(h, _)| u32::try_from(h).ok()))
    }

    /// Publishes a stream notification and drops the cached round, so the
    /// refetch that follows sees the change.
    pub async fn notify(&self) {
        self.rounds.invalidate();
        self.hub.publish();
    }

    /// Runs until `stop` resolves: a sync and engine steps on every new tip
    /// and at least every `interval`.
    pub async fn run(self: Arc<Self>, interval: Duration) {
        let mut tips = self.chain.tips();
        loop {
            if let Err(e) = self.run_once().await {
                tracing::warn!(error = %e, "engine step failed; retrying");
            }
            // A stream that ended disables its branch; the timer goes on.
            tokio::select! {
                Some(_) = tips.next() => {}
                () = tokio::time::sleep(interval) => {}
            }
        }
    }

    /// One chain sync followed by engine steps until nothing moves.
    ///
    /// # Errors
    /// The first failure; the next call retries.
    pub async fn run_once(&self) -> Result<(), EngineError> {
        let _guard = self.lock.lock().await;
        let mut changed = self.sync().await?;
        changed |= self.recover_signed().await?;
        for _ in 0..16 {
            if !self.tick(unix_now()).await? {
                break;
            }
            changed = true;
        }
        if changed {
            self.notify().await;
        }
        Ok(())
    }

    /// Follows the chain from the last processed block: unwinds blocks that
    /// left the active chain, then processes new blocks. Returns whether
    /// anything changed.
    ///
    /// # Errors
    /// Chain or database failures.
    pub async fn sync(&self) -> Result<bool, EngineError> {
        let tip = self.chain.tip().await?;
        let Some((synced, _)) = self.store.synced_tip().await? else {
            self.store
                .record_start_block(i64::from(tip.height), &tip.hash.to_string())
                .await?;
            return Ok(true);
        };
        let mut fork = synced;
        loop {
            let ours = self.store.synced_hash(fork).await?;
            let theirs = match u32::try_from(fork) {
                Ok(h) => self.chain.block_hash(h).await?,
                Err(_) => None,
            };
            if ours.is_none() || ours == theirs.map(|h| h.to_string()) || fork <= 0 {
                break;
            }
            fork -= 1;
        }
        let mut changed = false;
        if fork < synced {
            let n = self.store.unwind_above(fork).await?;
            tracing::warn!(fork, old_tip = synced, unconfirmed = n, "reorganisation");
            changed = true;
        }
        let top = i64::from(tip.height).min(fork + MAX_BLOCKS_PER_SYNC);
        if top > fork {
            let scripts: HashMap<ScriptBuf, i64> = self
                .store
                .user_addresses()
                .await?
                .into_iter()
                .filter_map(|(id, a)| {
                    bitcoin::Address::from_str(&a)
                        .ok()
                        .map(|a| (a.assume_checked().script_pubkey(), id))
                })
                .collect();
            for height in fork + 1..=top {
                let Some(block) = self.chain.block_at(height as u32).await? else {
                    break;
                };
                let hash = block.block_hash().to_string();
                let unconfirmed: HashSet<String> =
                    self.store.unconfirmed_txids().await?.into_iter().collect();
                let mut ours = Vec::new();
                let mut deposits = Vec::new();
                for tx in &block.txdata {
                    let txid = tx.compute_txid().to_string();
                    if unconfirmed.contains(&txid) {
                        ours.push(txid.clone());
                    }
                    for (vout, o) in tx.output.iter().enumerate() {
                        if let Some(user) = scripts.get(&o.script_pubkey) {
                            deposits.push(Deposit {
                                txid: txid.clone(),
                                vout: vout as i64,
                                amount_sats: o.value.to_sat() as i64,
                                user_id: *user,
                                coinbase: tx.is_coinbase(),
                            });
                        }
                    }
                }
                let (d, c) = self
                    .store
                    .connect_block(height, &hash, &ours, &deposits)
                    .await?;
                if d > 0 || c > 0 {
                    tracing::info!(height, deposits = d, confirmed = c, "block processed");
                }
                changed = true;
            }
        }
        if changed {
            // Transactions of the dropped blocks may not be in the node's
            // mempool any more: offer them again, after a reorganisation and
            // with every new block, since one whose anti-fee-sniping
            // nLockTime is the height of a dropped block is refused
            // (`non-final`) until the chain is back at that height.
            for t in self.store.unconfirmed_broadcasts().await? {
                if let Some(raw) = &t.raw_tx {
                    if let Ok(tx) = txid_of(raw) {
                        if let Err(e) = self.chain.broadcast(tx).await {
                            tracing::debug!(txid = %t.txid, error = %e, "re-broadcast after reorg");
                        }
                    }
                }
            }
        }
        Ok(changed)
    }

    /// Broadcasts a signed bet or withdrawal; on refusal undoes it.
    /// Returns whether it is now broadcast.
    ///
    /// # Errors
    /// Database failures; a chain that cannot be reached leaves it signed.
    pub async fn broadcast_transfer(&self, t: &TransferRow) -> Result<bool, EngineError> {
        let raw = t
            .raw_tx
            .as_deref()
            .ok_or_else(|| EngineError::Corrupt(format!("transfer {} has no tx", t.id)))?;
        let tx = txid_of(raw)?;
        match Broadcast::send(self.chain.as_ref(), tx).await {
            Broadcast::Accepted => {
                crash_point(match t.kind {
                    TransferKind::Bet => "bet_broadcast",
                    TransferKind::Withdrawal => "withdrawal_broadcast",
                    TransferKind::Payout => "payout_broadcast",
                    TransferKind::Deposit => "deposit_broadcast",
                });
                self.store.mark_broadcast(t.id).await?;
                Ok(true)
            }
            Broadcast::Refused { code, reason } => {
                tracing::warn!(transfer = t.id, code, %reason, "broadcast refused as invalid and found nowhere; undoing");
                self.store.fail_transfer(t.id).await?;
                Ok(false)
            }
            Broadcast::Pending(e) => {
                tracing::info!(transfer = t.id, error = %e, "broadcast not settled; stays signed, retried");
                Err(e.into())
            }
        }
    }

    async fn recover_signed(&self) -> Result<bool, EngineError> {
        let mut changed = false;
        let cutoff = unix_now() - RECOVER_AFTER_SECS;
        for t in self.store.signed_transfers().await? {
            if t.kind == TransferKind::Payout || t.created_at > cutoff {
                continue;
            }
            tracing::info!(transfer = t.id, kind = %t.kind, "finishing a signed transfer");
            match self.broadcast_transfer(&t).await {
                Ok(_) => changed = true,
                // Not settled (unreachable, refused for now, inputs spent by
                // what may be this very transaction): the next pass retries;
                // the other transfers and the rounds go on meanwhile.
                Err(EngineError::Chain(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(changed)
    }

    /// One engine step on the oldest unfinished round that can move.
    /// Returns whether something moved.
    ///
    /// # Errors
    /// Database, chain or wallet failures.
    pub async fn tick(&self, now: i64) -> Result<bool, EngineError> {
        let config = self.store.config().await?;
        if config.paused {
            return Ok(false);
        }
        for round in self.store.unfinished_rounds().await? {
            if self.step(&round, now, &config).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn step(
        &self,
        round: &RoundRow,
        now: i64,
        config: &ServiceConfig,
    ) -> Result<bool, EngineError> {
        match round.status {
            RoundStatus::Open if now < round.closes_at => Ok(false),
            RoundStatus::Open => {
                // The chain's own tip, not only what the watcher processed:
                // the draw block must not exist yet when the bets are fixed,
                // or a last-second bettor could grind against its hash.
                // It is read while the round's row is held (see close_round).
                let synced = self.store.synced_tip().await?.map_or(0, |t| t.0);
                let chain = self.chain.clone();
                let read_tip = async move {
                    match chain.tip().await {
                        Ok(t) => Some(synced.max(i64::from(t.height))),
                        Err(e) => {
                            tracing::warn!(error = %e, "chain tip unavailable; the round stays open");
                            None
                        }
                    }
                };
                let moved = self
                    .store
                    .close_round(round.id, read_tip, |bets| {
                        hex::encode(draw::bets_commitment(&draw_bets(bets)))
                    })
                    .await?;
                if moved {
                    tracing::info!(round = round.id, "round closing");
                    if round.pot_sats > 0 {
                        crash_point("round_closing");
                    }
                }
                Ok(moved)
            }
            RoundStatus::Closing => {
                let bets = self.store.round_bets(round.id).await?;
                if bets.is_empty() {
                    let moved = self
                        .store
                        .finish_round(round.id, RoundStatus::Closing, now)
                        .await?;
                    if moved {
                        tracing::info!(round = round.id, "empty round closed");
                    }
                    return Ok(moved);
                }
                Ok(self
                    .store
                    .move_round(round.id, RoundStatus::Closing, RoundStatus::Drawing)
                    .await?)
            }
            RoundStatus::Drawing => self.draw_and_pay(round, config).await,
            RoundStatus::PayingOut => self.finish_payout(round).await,
            RoundStatus::Closed => Ok(false),
        }
    }

    async fn draw_and_pay(
        &self,
        round: &RoundRow,
        config: &ServiceConfig,
    ) -> Result<bool, EngineError> {
        let detail = self
            .store
            .round_detail(round.id)
            .await?
            .ok_or_else(|| EngineError::Corrupt(format!("round {} vanished", round.id)))?;
        let close_tip = detail
            .draw
            .tip_height_at_close
            .ok_or_else(|| EngineError::Corrupt(format!("round {} has no close tip", round.id)))?;
        let draw_height = close_tip + 1;
        // The first block seen at the draw height fixes the draw (see the docs).
        let Some(block_hash) = self.store.synced_hash(draw_height).await? else {
            return Ok(false);
        };
        let bets = draw_bets(&detail.bets);
        let d = draw::compute_draw(round.id, &block_hash, &bets)
            .map_err(|e| EngineError::Corrupt(e.to_string()))?;
        // The bets drawn must be exactly those committed to at close: a bet
        // added, removed or changed since would make the published proof
        // false, so nothing is paid.
        let recomputed = hex::encode(d.commitment);
        if detail.draw.bets_commitment.as_deref() != Some(recomputed.as_str()) {
            tracing::error!(
                round = round.id,
                stored = detail.draw.bets_commitment.as_deref().unwrap_or(""),
                %recomputed,
                "bets commitment mismatch; the round is not drawn"
            );
            return Err(EngineError::Corrupt(format!(
                "round {}: recomputed bets commitment {recomputed} differs from the one stored at close",
                round.id
            )));
        }
        let winner = &detail.bets[d.winner_index];
        let single = draw::single_player(&bets);
        let commission = draw::commission(d.pot_sats, single) as i64;
        let winner_row = self
            .store
            .user_by_id(winner.user_id)
            .await?
            .ok_or_else(|| EngineError::Corrupt(format!("user {} vanished", winner.user_id)))?;
        let (_, winner_script) = spend::user_key(&self.wallet, winner_row.derivation_index)?;
        let fee_script = spend::script_of(&config.fee_address, self.wallet.network())?;
        let pot = self.store.pot_outputs(round.id).await?;
        let signed = spend::payout(
            &self.wallet,
            round.id,
            &pot,
            &fee_script,
            commission,
            &winner_script,
            winner.user_id,
            config.fee_rate_sat_vb,
            self.tip_height().await?,
        )?;
        let columns = DrawColumns {
            tip_height_at_close: Some(close_tip),
            bets_commitment: Some(hex::encode(d.commitment)),
            block_height: Some(draw_height),
            block_hash: Some(block_hash.clone()),
            seed: Some(hex::encode(d.seed)),
            ticket: Some(d.ticket as i64),
            winner_bet_id: Some(winner.id),
        };
        match self
            .store
            .begin_payout(round.id, &columns, &signed.intent)
            .await
        {
            Ok(_) => {}
            Err(LedgerError::WrongStatus { .. }) | Err(LedgerError::PayoutExists(_)) => {
                return Ok(false)
            }
            Err(e) => return Err(e.into()),
        }
        tracing::info!(round = round.id, block = %block_hash, ticket = d.ticket, winner = %winner.username, "round drawn");
        crash_point("payout_signed");
        self.notify().await;
        self.finish_payout(round).await?;
        Ok(true)
    }

    async fn finish_payout(&self, round: &RoundRow) -> Result<bool, EngineError> {
        let Some(detail) = self.store.round_detail(round.id).await? else {
            return Ok(false);
        };
        let Some(payout) = detail.payout else {
            return Err(EngineError::Corrupt(format!(
                "round {} paying out without a payout",
                round.id
            )));
        };
        match payout.status {
            TransferStatus::Broadcast => Ok(self
                .store
                .finish_round(round.id, RoundStatus::PayingOut, unix_now())
                .await?),
            TransferStatus::Signed => {
                let raw = payout
                    .raw_tx
                    .as_deref()
                    .ok_or_else(|| EngineError::Corrupt("payout without tx".into()))?;
                let tx = txid_of(raw)?;
                match Broadcast::send(self.chain.as_ref(), tx).await {
                    Broadcast::Accepted => {
                        crash_point("payout_broadcast");
                        let moved = self
                            .store
                            .finish_round(round.id, RoundStatus::PayingOut, unix_now())
                            .await?;
                        tracing::info!(round = round.id, txid = %payout.txid, "payout broadcast; round closed");
                        Ok(moved)
                    }
                    Broadcast::Refused { code, reason } => {
                        tracing::error!(round = round.id, code, %reason, "payout broadcast refused: payout_failed");
                        Ok(self
                            .store
                            .payout_failed(payout.id, round.id, &format!("{code}: {reason}"))
                            .await?)
                    }
                    Broadcast::Pending(e) => {
                        // Stays signed; the next tick tries again.
                        tracing::warn!(round = round.id, txid = %payout.txid, error = %e, "payout broadcast not settled; retried");
                        Ok(false)
                    }
                }
            }
            // Waits for POST /admin/rounds/{id}/retry-payout. (A payout is
            // never `seen` or `failed`; those belong to deposits and to
            // bets and withdrawals.)
            TransferStatus::BroadcastFailed | TransferStatus::Seen | TransferStatus::Failed => {
                Ok(false)
            }
        }
    }

    /// The admin retry after `payout_failed`: rebuilds the payout from the
    /// same pot outputs at the current fee rate and broadcasts it. Returns
    /// the payout after the attempt, or `None` when no payout waits for a retry.
    ///
    /// # Errors
    /// Database, wallet or chain failures.
    pub async fn retry_payout(&self, round_id: i64) -> Result<Option<TransferRow>, EngineError> {
        let _guard = self.lock.lock().await;
        let Some(detail) = self.store.round_detail(round_id).await? else {
            return Ok(None);
        };
        let Some(payout) = detail.payout.clone() else {
            return Ok(None);
        };
        if payout.status != TransferStatus::BroadcastFailed
            || detail.round.status != RoundStatus::PayingOut
        {
            return Ok(None);
        }
        let config = self.store.config().await?;
        let winner_id = payout
            .user_id
            .ok_or_else(|| EngineError::Corrupt("payout without winner".into()))?;
        let winner = self
            .store
            .user_by_id(winner_id)
            .await?
            .ok_or_else(|| EngineError::Corrupt(format!("user {winner_id} vanished")))?;
        let (_, winner_script) = spend::user_key(&self.wallet, winner.derivation_index)?;
        let fee_script = spend::script_of(&config.fee_address, self.wallet.network())?;
        // The pot outputs are marked spent by the failed payout; rebuild from them.
        let pot: Vec<_> = self.store.pot_outputs_spent_by(&payout.txid).await?;
        let bets = draw_bets(&detail.bets);
        let single = draw::single_player(&bets);
        let commission = draw::commission(detail.round.pot_sats as u64, single) as i64;
        let signed = spend::payout(
            &self.wallet,
            round_id,
            &pot,
            &fee_script,
            commission,
            &winner_script,
            winner_id,
            config.fee_rate_sat_vb,
            self.tip_height().await?,
        )?;
        self.store
            .replace_failed_payout(
                payout.id,
                round_id,
                &payout.txid,
                &signed.intent.txid,
                &signed.intent.raw_tx,
                signed.intent.fee_sats,
                signed.intent.amount_sats,
                signed.change.map(|c| i64::from(c.0)),
            )
            .await?;
        let round = detail.round.clone();
        self.finish_payout(&round).await?;
        self.notify().await;
        Ok(self.store.transfer(payout.id).await?)
    }
}

/// Bets as the draw sees them.
pub fn draw_bets(bets: &[BetRow]) -> Vec<DrawBet> {
    bets.iter()
        .map(|b| DrawBet {
            bet_id: b.id,
            username: b.username.clone(),
            amount_sats: u64::try_from(b.amount_sats).unwrap_or(0),
            txid: b.txid.clone(),
        })
        .collect()
}

/// Parses a stored block hash.
///
/// # Errors
/// [`EngineError::Corrupt`].
pub fn parse_block_hash(s: &str) -> Result<BlockHash, EngineError> {
    BlockHash::from_str(s).map_err(|e| EngineError::Corrupt(format!("block hash {s}: {e}")))
}

// Only without `test-hooks`: with it the hook would kill the test (and the
// module would be empty, its import unused).
#[cfg(all(test, not(feature = "test-hooks")))]
mod tests {
    use super::*;

    /// A release build must not carry the SIGKILL hook: with the variable
    /// set, a crash point outside `test-hooks` builds does nothing.
    #[test]
    fn crash_points_do_nothing_without_the_test_hooks_feature() {
        std::env::set_var(CRASH_HOOK_ENV, "bet_signed");
        crash_point("bet_signed");
        std::env::remove_var(CRASH_HOOK_ENV);
    }
}
