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

use bitcoin::hashes::{sha256, Hash as _};
use bitcoin::{BlockHash, ScriptBuf, Transaction, Txid};
use chain::{BroadcastOutcome, Chain, ChainError};
use wallet::Wallet;

use crate::domain::draw::{self, DrawBet};
use crate::domain::phase::{Anchor, Bet, DrawBlock, DrawResult, RoundPhase};
use crate::domain::round::{RoundStatus, TransferKind, TransferStatus};
use crate::domain::settings::ServiceConfig;
use crate::domain::spend;
use crate::domain::time::unix_now;
use crate::domain::transfer::Transfer;
use crate::service::current::CurrentRound;
use crate::service::stream::StreamHub;
use crate::store::chain::Deposit;
use crate::store::ledger::{LedgerError, TransferRow};
use crate::store::rounds::{PayoutReplacement, RoundRow};
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
    #[error("payout")]
    Spend(#[from] spend::SpendFailure),
    /// Stored data does not make sense.
    #[error("corrupt: {0}")]
    Corrupt(String),
    /// A stored transaction does not decode.
    #[error("corrupt: raw tx")]
    RawTx(#[source] RawTxError),
    /// A payout retry could not build the payout (say, the fee rate is
    /// still above what the pot can pay).
    #[error("{0}")]
    Unbuildable(String),
    /// A payout retry found a pot output missing whose bet may still
    /// confirm: the node neither has it nor refused it for good.
    #[error("{0}")]
    PotUnsettled(String),
}

/// Why stored transaction bytes do not decode.
#[derive(Debug, thiserror::Error)]
pub enum RawTxError {
    /// Not hex.
    #[error(transparent)]
    Hex(#[from] hex::FromHexError),
    /// Not a transaction.
    #[error(transparent)]
    Decode(#[from] bitcoin::consensus::encode::Error),
}

/// What a broadcast answer means for the ledger.
#[derive(Debug)]
pub(crate) enum Broadcast {
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
    pub(crate) async fn send(chain: &dyn Chain, tx: bitcoin::Transaction) -> Self {
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

/// What one [`Engine::tick`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TickOutcome {
    /// A round moved a step: another tick may move more.
    Moved,
    /// No round could move now (waiting for a time, a block or the node).
    Idle,
    /// The service is paused: no round moves until it resumes.
    Paused,
}

/// Blocks processed per sync, so one sync stays short after a long outage.
const MAX_BLOCKS_PER_SYNC: i64 = 500;
/// Blocks between two re-broadcasts of our unconfirmed transactions.
const REBROADCAST_EVERY_BLOCKS: i64 = 3;
/// Blocks in which a transfer's broadcast failed before it is set aside.
const SET_ASIDE_AFTER_BLOCKS: i64 = 6;
/// How old a `signed` bet or withdrawal must be before the worker finishes
/// its broadcast (younger ones are still being broadcast by their request).
const RECOVER_AFTER_SECS: i64 = 3;

/// Where the last re-broadcast pass ran.
#[derive(Debug)]
struct Offered {
    /// The synced tip's hash: a new block or a reorganisation changes it.
    hash: BlockHash,
    /// Synced height of the last pass whose failures were counted.
    counted_at: i64,
}

/// The chain watcher and the rounds engine.
pub struct Engine {
    store: Store,
    chain: Arc<dyn Chain>,
    wallet: Arc<Wallet>,
    hub: StreamHub,
    rounds: Arc<CurrentRound>,
    /// One sync/tick at a time in this process.
    lock: tokio::sync::Mutex<()>,
    /// The tip of the last re-broadcast pass (`None`: not yet).
    last_rebroadcast: tokio::sync::Mutex<Option<Offered>>,
    /// Scripts of derived keys (users', pots'), so a payment does not
    /// derive them again: a derivation is three EC multiplications, as much
    /// as the signature itself. Public data only; signing derives the
    /// private key as before.
    scripts: std::sync::Mutex<HashMap<wallet::KeyPath, ScriptBuf>>,
    /// When and how far stuck withdrawals and payouts are bumped.
    bump: crate::domain::bump::BumpPolicy,
}

/// Entries of [`Engine`]'s script cache before it starts over (a few MiB).
const SCRIPT_CACHE_MAX: usize = 65_536;

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

pub(crate) fn txid_of(raw: &str) -> Result<Transaction, EngineError> {
    let bytes = hex::decode(raw).map_err(|e| EngineError::RawTx(e.into()))?;
    bitcoin::consensus::deserialize(&bytes).map_err(|e| EngineError::RawTx(e.into()))
}

/// When an accepted broadcast's mark (`signed` → `broadcast`) must be on
/// disk. It is bookkeeping, not a guarantee: a lost mark leaves the transfer
/// `signed`, which the worker broadcasts again (harmless) and marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Return once the mark is committed (the worker's own re-broadcasts).
    Committed,
    /// Queue it with the next group commit and return: a payment answered
    /// as broadcast does not wait for a second commit
    /// ([`crate::store::Store::mark_broadcast_soon`]).
    Soon,
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
            last_rebroadcast: tokio::sync::Mutex::new(None),
            scripts: std::sync::Mutex::new(HashMap::new()),
            bump: crate::domain::bump::BumpPolicy::default(),
        }
    }

    /// This worker bumping stuck withdrawals and payouts by `policy`.
    pub fn with_bump_policy(mut self, policy: crate::domain::bump::BumpPolicy) -> Self {
        self.bump = policy;
        self
    }

    /// The fee-bump policy.
    pub fn bump_policy(&self) -> crate::domain::bump::BumpPolicy {
        self.bump
    }

    /// The store (the fee bumper's SQL).
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// Holds this process's one sync/tick at a time (an admin's bump by hand).
    pub(crate) async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.lock.lock().await
    }

    /// The chain.
    pub fn chain(&self) -> &Arc<dyn Chain> {
        &self.chain
    }

    /// The wallet.
    pub fn wallet(&self) -> &Arc<Wallet> {
        &self.wallet
    }

    /// The script of the key at `path`, from the cache or derived by `derive`.
    fn cached_script(
        &self,
        path: wallet::KeyPath,
        derive: impl FnOnce() -> Result<(wallet::KeyPath, ScriptBuf), spend::SpendFailure>,
    ) -> Result<(wallet::KeyPath, ScriptBuf), spend::SpendFailure> {
        let cached = self
            .scripts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&path)
            .cloned();
        if let Some(script) = cached {
            return Ok((path, script));
        }
        let (path, script) = derive()?;
        let mut scripts = self.scripts.lock().unwrap_or_else(|p| p.into_inner());
        if scripts.len() >= SCRIPT_CACHE_MAX {
            scripts.clear();
        }
        scripts.insert(path, script.clone());
        Ok((path, script))
    }

    /// The key path and script of the user with `derivation_index`
    /// ([`spend::user_key`], cached).
    ///
    /// # Errors
    /// As [`spend::user_key`].
    pub fn user_script(
        &self,
        derivation_index: i64,
    ) -> Result<(wallet::KeyPath, ScriptBuf), spend::SpendFailure> {
        let path = spend::user_key_path(derivation_index)?;
        self.cached_script(path, || spend::user_key(&self.wallet, derivation_index))
    }

    /// The pot script of round `round_id` ([`spend::pot_key`], cached).
    ///
    /// # Errors
    /// As [`spend::pot_key`].
    pub fn pot_script(&self, round_id: i64) -> Result<ScriptBuf, spend::SpendFailure> {
        let path = spend::pot_key_path(round_id)?;
        Ok(self
            .cached_script(path, || spend::pot_key(&self.wallet, round_id))?
            .1)
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
                tracing::warn!(error = %crate::service::error_chain(&e), "engine step failed; retrying");
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
        changed |= self.rebroadcast().await?;
        changed |= self.bump_stuck().await?;
        changed |= self.reverse_vanished_deposits().await?;
        for _ in 0..16 {
            if self.tick(unix_now()).await? != TickOutcome::Moved {
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
                .record_start_block(i64::from(tip.height), tip.hash)
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
            if ours.is_none() || ours == theirs || fork <= 0 {
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
                let unconfirmed: HashSet<Txid> =
                    self.store.unconfirmed_txids().await?.into_iter().collect();
                let mut ours = Vec::new();
                let mut deposits = Vec::new();
                for tx in &block.txdata {
                    let txid = tx.compute_txid();
                    if unconfirmed.contains(&txid) {
                        ours.push(txid);
                    }
                    for (vout, o) in tx.output.iter().enumerate() {
                        if let Some(user) = scripts.get(&o.script_pubkey) {
                            deposits.push(Deposit {
                                txid,
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
                    .connect_block(height, block.block_hash(), &ours, &deposits)
                    .await?;
                if d > 0 || c > 0 {
                    tracing::info!(height, deposits = d, confirmed = c, "block processed");
                }
                changed = true;
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
        self.broadcast_signed(t.id, t.kind, &t.txid()?, tx, Mark::Committed)
            .await
    }

    /// [`Engine::broadcast_transfer`] of transfer `id` (of `kind`, whose
    /// transaction `txid` is `tx`), with the transaction at hand; `mark`
    /// says whether an accepted broadcast returns after its mark is
    /// committed or at once.
    ///
    /// # Errors
    /// As [`Engine::broadcast_transfer`].
    pub async fn broadcast_signed(
        &self,
        id: i64,
        kind: TransferKind,
        txid: &Txid,
        tx: Transaction,
        mark: Mark,
    ) -> Result<bool, EngineError> {
        match Broadcast::send(self.chain.as_ref(), tx).await {
            Broadcast::Accepted => {
                crash_point(match kind {
                    TransferKind::Bet => "bet_broadcast",
                    TransferKind::Withdrawal => "withdrawal_broadcast",
                    TransferKind::Payout => "payout_broadcast",
                    TransferKind::Deposit => "deposit_broadcast",
                });
                match mark {
                    Mark::Committed => self.store.mark_broadcast(id).await?,
                    Mark::Soon => self.store.mark_broadcast_soon(id),
                }
                Ok(true)
            }
            Broadcast::Refused { code, reason } => {
                tracing::warn!(transfer = id, code, %reason, "broadcast refused as invalid and found nowhere; undoing");
                // Released inputs are offered to the user again: only those
                // that really are unspent on the chain.
                let lost = self.lost_inputs(txid).await?;
                self.store.fail_transfer_keeping(id, &lost).await?;
                Ok(false)
            }
            Broadcast::Pending(e) => {
                tracing::info!(transfer = id, error = %e, "broadcast not settled; stays signed, retried");
                if e.is_inputs_spent() {
                    // Never undone on this (it may be this very transaction,
                    // mined); only a confirmed input that is spent while our
                    // transaction is nowhere is named, for the operator.
                    self.lost_inputs(txid).await?;
                }
                Err(e.into())
            }
        }
    }

    /// Inputs of our transaction `txid` that are no longer unspent on the
    /// chain (mempool included): spent by a transaction we do not know,
    /// which is logged and audited. A chain that cannot be asked counts
    /// nothing as lost.
    async fn lost_inputs(
        &self,
        txid: &Txid,
    ) -> Result<Vec<crate::domain::money::Coin>, EngineError> {
        let mut lost = Vec::new();
        for o in self.store.outputs_spent_by(txid).await? {
            let outpoint = outpoint_of(&o)?;
            match self.chain.unspent_output(outpoint).await {
                Ok(Some(_)) | Err(_) => {}
                // Unconfirmed outputs of ours may just not be relayed yet.
                Ok(None) if o.block_height.is_none() => {}
                Ok(None) => {
                    tracing::error!(txid = %o.txid, vout = o.vout, spender = %txid,
                        "a tracked output is spent by a transaction the service does not know");
                    self.store
                        .audit_unknown_spend(&o.txid, o.vout, o.amount_sats)
                        .await?;
                    lost.push(o);
                }
            }
        }
        Ok(lost)
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
                // One transfer's failure never stops the worker: the others
                // and the rounds go on; one that keeps failing is set aside.
                Err(e) => changed |= self.failed_attempt(&t, &e).await?,
            }
        }
        Ok(changed)
    }

    /// Re-offers our unconfirmed transactions (bets, withdrawals, payouts)
    /// to the node, the one place that does so. It runs whenever the synced
    /// tip moved (a new block or a reorganisation) and once at start: a node
    /// that restarted without its mempool, or evicted them, gets them again,
    /// and one whose anti-fee-sniping nLockTime is the height of a dropped
    /// block, refused as `non-final` until the chain is back at that height,
    /// is offered again with every block. Only every
    /// [`REBROADCAST_EVERY_BLOCKS`] blocks is an unsettled answer counted as
    /// a failed attempt (see [`Engine::failed_attempt`]), so a transfer is
    /// set aside after the same number of blocks however often it is offered.
    async fn rebroadcast(&self) -> Result<bool, EngineError> {
        let Some((height, hash)) = self.store.synced_tip().await? else {
            return Ok(false);
        };
        let counted = {
            let mut last = self.last_rebroadcast.lock().await;
            let counted = match &*last {
                Some(l) if l.hash == hash => return Ok(false),
                Some(l) => {
                    height < l.counted_at || height >= l.counted_at + REBROADCAST_EVERY_BLOCKS
                }
                None => true,
            };
            let counted_at = match (&*last, counted) {
                (Some(l), false) => l.counted_at,
                _ => height,
            };
            *last = Some(Offered { hash, counted_at });
            counted
        };
        let mut changed = false;
        for t in self.store.unconfirmed_broadcasts().await? {
            let tx = match t.raw_tx.as_deref().map(txid_of) {
                Some(Ok(tx)) => tx,
                Some(Err(e)) => {
                    changed |= self.failed_attempt(&t, &e).await?;
                    continue;
                }
                None => continue,
            };
            let failure = match Broadcast::send(self.chain.as_ref(), tx).await {
                Broadcast::Accepted => {
                    tracing::debug!(transfer = t.id, txid = %t.txid, "re-broadcast");
                    continue;
                }
                Broadcast::Refused { code, reason } => {
                    EngineError::Chain(ChainError::rejected(code, reason))
                }
                Broadcast::Pending(e) => EngineError::Chain(e),
            };
            if counted {
                changed |= self.failed_attempt(&t, &failure).await?;
            } else {
                tracing::debug!(transfer = t.id, txid = %t.txid, error = %failure, "re-broadcast not settled");
            }
        }
        Ok(changed)
    }

    /// Deposits reorganised out whose transaction the node has in neither
    /// its mempool nor its chain, seen so in [`SET_ASIDE_AFTER_BLOCKS`]
    /// different blocks, are reversed for good (see
    /// [`Store::reverse_deposit`]): never offered again, and what the user
    /// spent out of one becomes a debt.
    async fn reverse_vanished_deposits(&self) -> Result<bool, EngineError> {
        let deposits = self.store.unconfirmed_deposits().await?;
        if deposits.is_empty() {
            return Ok(false);
        }
        let height = self.store.synced_tip().await?.map_or(0, |t| t.0);
        let mut changed = false;
        for d in deposits {
            let Ok(txid) = d.txid() else {
                continue;
            };
            match self.chain.transaction(txid).await {
                Ok(None) => {}
                // Known (mempool or chain), or the node cannot be asked.
                Ok(Some(_)) | Err(_) => continue,
            }
            if self.store.count_broadcast_attempt(d.id, height).await? < SET_ASIDE_AFTER_BLOCKS {
                continue;
            }
            if let Some(debt) = self.store.reverse_deposit(d.id).await? {
                tracing::error!(transfer = d.id, txid = %d.txid, user = ?d.user_id, amount_sats = d.amount_sats,
                    debt_sats = debt, "deposit reorganised out for good: reversed");
                changed = true;
            }
        }
        Ok(changed)
    }

    /// Books a broadcast attempt of `t` that did not settle. A chain that
    /// cannot be reached is nobody's fault and is not counted; a transfer
    /// whose stored bytes do not decode is set aside at once; any other
    /// failure seen in [`SET_ASIDE_AFTER_BLOCKS`] different blocks sets it
    /// aside (a payout becomes payout_failed), with an error log and an
    /// audit entry. Returns whether something changed.
    async fn failed_attempt(&self, t: &TransferRow, e: &EngineError) -> Result<bool, EngineError> {
        match e {
            EngineError::Chain(ChainError::Unavailable(_)) => return Ok(false),
            EngineError::Chain(_) => {
                let height = self.store.synced_tip().await?.map_or(0, |t| t.0);
                let attempts = self.store.count_broadcast_attempt(t.id, height).await?;
                if attempts < SET_ASIDE_AFTER_BLOCKS {
                    tracing::info!(transfer = t.id, attempts, error = %e, "broadcast not settled; retried");
                    return Ok(false);
                }
            }
            _ => {}
        }
        let reason = crate::service::error_chain(e);
        if t.kind == TransferKind::Payout && t.status == TransferStatus::Signed {
            if let Some(round_id) = t.round_id {
                tracing::error!(transfer = t.id, round = round_id, %reason, "payout keeps failing: payout_failed");
                return Ok(self.store.payout_failed(t.id, round_id, &reason).await?);
            }
        }
        tracing::error!(transfer = t.id, kind = %t.kind, txid = %t.txid, %reason, "transfer keeps failing; set aside for the operator");
        Ok(self.store.set_transfer_aside(t.id, &reason).await?)
    }

    /// One engine step on the oldest unfinished round that can move.
    ///
    /// # Errors
    /// Database, chain or wallet failures.
    pub async fn tick(&self, now: i64) -> Result<TickOutcome, EngineError> {
        let config = self.store.config().await?;
        if config.paused {
            return Ok(TickOutcome::Paused);
        }
        for round in self.store.unfinished_rounds().await? {
            match self.step(&round, now, &config).await {
                Ok(true) => return Ok(TickOutcome::Moved),
                Ok(false) => {}
                // One round's failure does not hold up the rounds after it.
                Err(e) => {
                    tracing::warn!(round = round.id, error = %crate::service::error_chain(&e), "round step failed; retried")
                }
            }
        }
        Ok(TickOutcome::Idle)
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
                // or a last-second bettor could grind against its hash. It
                // is read now, after closes_at (no bet is accepted after
                // it), and before the close's transaction begins: a
                // transaction waiting on a slow node held SQLite's write
                // lock and failed every other write of the service.
                // A node that is behind (more headers than blocks, or in
                // initial block download) reports a tip below blocks that
                // already exist: the draw block could be public before the
                // close. Nothing closes until it has caught up.
                let synced = self.store.synced_tip().await?.map_or(0, |t| t.0);
                let (tip_height, tip_hash) = match self.chain.sync_state().await {
                    Ok(state) => match behind(&state) {
                        // The hash is recorded too: the draw block must be
                        // its child (checked at the draw).
                        None if synced > i64::from(state.tip.height) => {
                            (synced, self.store.synced_hash(synced).await?)
                        }
                        None => (i64::from(state.tip.height), Some(state.tip.hash)),
                        Some(why) => {
                            tracing::debug!(round = round.id, %why, "the node is behind; the round stays open");
                            return Ok(false);
                        }
                    },
                    Err(e) => {
                        tracing::warn!(error = %e, "chain tip unavailable; the round stays open");
                        return Ok(false);
                    }
                };
                let moved = self
                    .store
                    .close_round(round.id, tip_height, tip_hash, |bets| {
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
            RoundStatus::Drawing => {
                // Checked again at the draw: a node that fell behind since
                // the close may hold a draw block the network is replacing.
                let tip = match self.chain.sync_state().await {
                    Ok(state) => {
                        if let Some(why) = behind(&state) {
                            tracing::debug!(round = round.id, %why, "the node is behind; the draw waits");
                            return Ok(false);
                        }
                        state.tip
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "chain unavailable; the draw waits");
                        return Ok(false);
                    }
                };
                self.draw_and_pay(round, config, tip).await
            }
            RoundStatus::PayingOut => self.finish_payout(round).await,
            RoundStatus::Closed | RoundStatus::PayoutFailed => Ok(false),
        }
    }

    async fn draw_and_pay(
        &self,
        round: &RoundRow,
        config: &ServiceConfig,
        tip: chain::Tip,
    ) -> Result<bool, EngineError> {
        let proof = self
            .store
            .round_proof(round.id)
            .await?
            .ok_or_else(|| EngineError::Corrupt(format!("round {} vanished", round.id)))?;
        let anchor =
            *proof.round.phase.anchor().ok_or_else(|| {
                EngineError::Corrupt(format!("round {} has no close tip", round.id))
            })?;
        let draw_height = anchor.tip_height + 1;
        // The first block seen at the draw height fixes the draw (see the
        // docs): the watcher stores it on the round as it processes it; a
        // round closed while that block was being processed (another
        // process's sync) takes the block stored at the height.
        let block_hash = match self
            .checked_draw_block(round.id, &proof.round.phase, &anchor, tip)
            .await?
        {
            Ok(hash) => hash,
            Err(moved) => return Ok(moved),
        };
        let bets = draw_bets(&proof.bets);
        let d = match draw::compute_draw(round.id, &block_hash, &bets) {
            Ok(d) => d,
            Err(e) => {
                return self
                    .give_up_draw(round.id, None, &format!("draw: {e}"))
                    .await
            }
        };
        // The bets drawn must be exactly those committed to at close: a bet
        // added, removed or changed since would make the published proof
        // false, so nothing is paid; the round waits for the operator as
        // payout_failed and the next round opens.
        let recomputed = sha256::Hash::from_byte_array(d.commitment);
        if anchor.bets_commitment != recomputed {
            tracing::error!(
                round = round.id,
                stored = %anchor.bets_commitment,
                %recomputed,
                "bets commitment mismatch; the round is not drawn"
            );
            let reason = format!(
                "bets commitment mismatch: recomputed {recomputed} differs from the one stored at close"
            );
            return self.give_up_draw(round.id, None, &reason).await;
        }
        let winner = &proof.bets[d.winner_index];
        let result = DrawResult {
            block: DrawBlock {
                height: draw_height,
                hash: block_hash,
            },
            seed: sha256::Hash::from_byte_array(d.seed),
            ticket: d.ticket as i64,
            winner_bet_id: winner.id,
        };
        let single = draw::single_player(&bets);
        let commission = draw::commission(d.pot_sats, single) as i64;
        let pot = self.store.pot_outputs(round.id).await?;
        let signed = match self
            .build_payout(round.id, &pot, commission, winner.user_id, config)
            .await?
        {
            Ok(signed) => signed,
            Err(reason) => return self.give_up_draw(round.id, Some(&result), &reason).await,
        };
        match self
            .store
            .begin_payout(round.id, &result, &signed.intent)
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

    /// The block a drawing round (in `phase`, closed at `anchor`) is drawn
    /// from, once it is known and a child of the tip read at the close
    /// (`Ok(hash)`); otherwise whether the round moved (`Err(true)`:
    /// anchored again after a reorganisation replaced that tip;
    /// `Err(false)`: wait).
    async fn checked_draw_block(
        &self,
        round_id: i64,
        phase: &RoundPhase,
        anchor: &Anchor,
        tip: chain::Tip,
    ) -> Result<Result<BlockHash, bool>, EngineError> {
        let close_tip = anchor.tip_height;
        let draw_height = close_tip + 1;
        let close_hash = anchor.tip_hash;
        let block_hash = match phase.block() {
            Some(b) => b.hash,
            None => match self.store.synced_hash(draw_height).await? {
                Some(h) => h,
                None => {
                    // No draw block yet: the close-time tip may already be
                    // gone (a branch without a block at the draw height yet).
                    let processed = self.store.synced_hash(close_tip).await?;
                    return match (close_hash, processed) {
                        (Some(x), Some(now)) if now != x => {
                            let reason = format!("the tip {x} read at the close at height {close_tip} was replaced by {now}");
                            Ok(Err(self.anchor_again(round_id, x, tip, &reason).await?))
                        }
                        _ => Ok(Err(false)),
                    };
                }
            },
        };
        if let Some(x) = close_hash {
            // Provably mined after the close: the draw block is a child of
            // the tip read at the close, as the chain itself says.
            let parent = match self.chain.block(block_hash).await {
                Ok(b) => b.header.prev_blockhash,
                Err(e) => {
                    tracing::warn!(round = round_id, error = %e, "draw block unavailable; the draw waits");
                    return Ok(Err(false));
                }
            };
            if parent != x {
                let reason = format!(
                    "the block {block_hash} at the draw height {draw_height} is not a child of the tip {x} read at the close (its parent is {parent})"
                );
                return Ok(Err(self.anchor_again(round_id, x, tip, &reason).await?));
            }
        }
        Ok(Ok(block_hash))
    }

    /// A reorganisation replaced the tip read at the close of `round_id`
    /// (`old_hash`): a block on the new branch may have been mined before
    /// the close, so none of them is drawn from. The draw is anchored at
    /// the node's tip now (in sync, read after the bets were fixed), and the
    /// draw block is the first block above it (docs/rounds-engine.md).
    async fn anchor_again(
        &self,
        round_id: i64,
        old_hash: BlockHash,
        tip: chain::Tip,
        reason: &str,
    ) -> Result<bool, EngineError> {
        let moved = self
            .store
            .anchor_draw_again(
                round_id,
                old_hash,
                (i64::from(tip.height), tip.hash),
                reason,
            )
            .await?;
        if moved {
            tracing::warn!(round = round_id, %reason, height = tip.height, tip = %tip.hash, "draw anchored again at the node's tip");
            self.notify().await;
        }
        Ok(moved)
    }

    /// Builds and signs the payout of `pot`; `Ok(Err(reason))` when it
    /// cannot be built (fee above the pot, unusable fee address, winner
    /// without a key): the round then becomes payout_failed instead of
    /// holding up the rounds after it.
    async fn build_payout(
        &self,
        round_id: i64,
        pot: &[crate::domain::money::Coin],
        commission: i64,
        winner_id: i64,
        config: &ServiceConfig,
    ) -> Result<Result<spend::Signed, String>, EngineError> {
        let Some(winner) = self.store.user_by_id(winner_id).await? else {
            return Ok(Err(format!("winner {winner_id} does not exist")));
        };
        let tip_height = self.tip_height().await?;
        let built = spend::user_key(&self.wallet, winner.derivation_index).and_then(
            |(_, winner_script)| {
                let fee_script = spend::script_of(&config.fee_address, self.wallet.network())?;
                spend::payout(
                    &self.wallet,
                    &spend::PayoutRequest {
                        round_id,
                        pot,
                        fee_script: &fee_script,
                        commission_sats: commission,
                        winner_script: &winner_script,
                        winner_user_id: winner_id,
                        fee_rate_sat_vb: config.fee_rate_sat_vb,
                        tip_height,
                    },
                )
            },
        );
        Ok(built.map_err(|e| format!("the payout cannot be built: {e}")))
    }

    /// drawing → payout_failed with an error log and an audit entry; the
    /// next round opens in the same transaction.
    async fn give_up_draw(
        &self,
        round_id: i64,
        draw: Option<&DrawResult>,
        reason: &str,
    ) -> Result<bool, EngineError> {
        tracing::error!(round = round_id, %reason, "payout_failed: the round waits for an admin retry");
        let moved = self
            .store
            .payout_unbuildable(round_id, draw, reason)
            .await?;
        if moved {
            self.notify().await;
        }
        Ok(moved)
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
                        // Stays signed; the next tick tries again, and one
                        // that keeps failing becomes payout_failed.
                        tracing::warn!(round = round.id, txid = %payout.txid, error = %e, "payout broadcast not settled; retried");
                        self.failed_attempt(&payout, &EngineError::Chain(e)).await
                    }
                }
            }
            // Waits for POST /admin/rounds/{id}/retry-payout. (A payout is
            // never `seen` or `failed`; those belong to deposits and to
            // bets and withdrawals.)
            // A round left paying_out with a refused payout by an older
            // version: park it as payout_failed so the next round opens.
            TransferStatus::BroadcastFailed => {
                Ok(self.store.park_failed_payout(round.id, unix_now()).await?)
            }
            TransferStatus::Seen
            | TransferStatus::Failed
            | TransferStatus::Reversed
            | TransferStatus::Superseded => Ok(false),
        }
    }

    /// The admin retry of a `payout_failed` round. A refused payout is
    /// rebuilt at the current config from the pot outputs it spent that
    /// still exist (an output whose bet was double-spent or evicted for good
    /// is dropped and its value recorded as a ledger correction), then
    /// broadcast; a round whose payout could not be built is drawn again
    /// from its stored draw block. Returns the payout after the attempt, or
    /// `None` when the round does not wait for a retry.
    ///
    /// # Errors
    /// [`EngineError::Unbuildable`] when the payout still cannot be built;
    /// database, wallet or chain failures.
    pub async fn retry_payout(&self, round_id: i64) -> Result<Option<Transfer>, EngineError> {
        let _guard = self.lock.lock().await;
        let Some(detail) = self.store.round_detail(round_id).await? else {
            return Ok(None);
        };
        if detail.round.status != RoundStatus::PayoutFailed {
            return Ok(None);
        }
        let config = self.store.config().await?;
        let Some(payout) = detail.payout.clone() else {
            // Nothing was written: draw again (same block) and pay.
            if !self.store.redraw_failed_round(round_id).await? {
                return Ok(None);
            }
            let mut round = detail.round.clone();
            round.status = RoundStatus::Drawing;
            let tip = self.chain.tip().await?;
            self.draw_and_pay(&round, &config, tip).await?;
            self.notify().await;
            let after = self.store.round_detail(round_id).await?;
            return match after.and_then(|d| d.payout) {
                Some(t) => Ok(Some(t.decode()?)),
                None => Err(EngineError::Unbuildable(format!(
                    "round {round_id}: the payout still cannot be built at the current config"
                ))),
            };
        };
        if payout.status != TransferStatus::BroadcastFailed {
            return Ok(None);
        }
        let winner_id = payout
            .user_id
            .ok_or_else(|| EngineError::Corrupt("payout without winner".into()))?;
        // The pot outputs are marked spent by the failed payout; rebuild from
        // those that still exist on the chain.
        let mut pot = Vec::new();
        let mut dropped = Vec::new();
        for o in self.store.pot_outputs_spent_by(&payout.txid()?).await? {
            if self.output_exists(&o).await? {
                pot.push(o);
            } else {
                dropped.push(o);
            }
        }
        let bets = draw_bets(&detail.bets);
        let single = draw::single_player(&bets);
        let left: i64 = pot.iter().map(|o| o.amount_sats).sum();
        let commission = draw::commission(u64::try_from(left).unwrap_or(0), single) as i64;
        let signed = match self
            .build_payout(round_id, &pot, commission, winner_id, &config)
            .await?
        {
            Ok(s) => s,
            Err(reason) => return Err(EngineError::Unbuildable(reason)),
        };
        for o in &dropped {
            tracing::error!(round = round_id, txid = %o.txid, vout = o.vout, amount_sats = o.amount_sats,
                "pot output no longer exists; the payout is rebuilt without it (ledger correction)");
        }
        self.store
            .replace_failed_payout(&PayoutReplacement {
                transfer_id: payout.id,
                round_id,
                old_txid: payout.txid()?,
                txid: signed.intent.txid,
                raw_tx: &signed.intent.raw_tx,
                fee_sats: signed.intent.fee_sats,
                winner_sats: signed.intent.amount_sats,
                winner_vout: signed.change.map(|c| i64::from(c.0)),
                commission_sats: signed.intent.commission_sats,
                dropped: &dropped,
            })
            .await?;
        let mut round = detail.round.clone();
        round.status = RoundStatus::PayingOut;
        self.finish_payout(&round).await?;
        self.notify().await;
        Ok(self
            .store
            .transfer(payout.id)
            .await?
            .map(|t| t.decode())
            .transpose()?)
    }

    /// Whether an output we hold still exists: unspent on the chain (mempool
    /// included). A missing one whose transaction we signed is offered to the
    /// node again first (it may only have been evicted); one that is spent by
    /// a transaction we do not know is logged and audited.
    ///
    /// # Errors
    /// [`EngineError::PotUnsettled`] when the output is missing but its
    /// transaction may still confirm: the node did not settle the re-offer
    /// (inputs missing, `non-final`, mempool full …) and the worker has not
    /// set it aside. Dropping it then left the pot output, once its bet
    /// confirmed (say, after its deposit came back), on the chain and out
    /// of the books.
    async fn output_exists(&self, o: &crate::domain::money::Coin) -> Result<bool, EngineError> {
        let outpoint = outpoint_of(o)?;
        if self.chain.unspent_output(outpoint).await?.is_some() {
            return Ok(true);
        }
        if let Some(t) = self.store.transfer_by_txid(&o.txid).await? {
            if let Some(raw) = t.raw_tx.as_deref() {
                match Broadcast::send(self.chain.as_ref(), txid_of(raw)?).await {
                    Broadcast::Accepted => {
                        if self.chain.unspent_output(outpoint).await?.is_some() {
                            return Ok(true);
                        }
                    }
                    // Invalid and found nowhere: it can never confirm.
                    Broadcast::Refused { .. } => {}
                    Broadcast::Pending(ChainError::Unavailable(e)) => {
                        return Err(ChainError::Unavailable(e).into())
                    }
                    // Mined (so spent by someone else, see below), or given
                    // up on by the worker (its deposit was reversed, or it
                    // failed in 6 blocks) and never offered again.
                    Broadcast::Pending(_)
                        if t.block_height.is_some()
                            || self.store.is_set_aside(t.id).await?
                            || self.chain.transaction(outpoint.txid).await?.is_some() => {}
                    Broadcast::Pending(e) => {
                        return Err(EngineError::PotUnsettled(format!(
                            "pot output {}:{} is not on the chain and its transaction may still confirm \
                             (the node answered: {e}); retry once it confirms, or once the service \
                             sets it aside after failing in {SET_ASIDE_AFTER_BLOCKS} blocks",
                            o.txid, o.vout
                        )))
                    }
                }
            }
        }
        if self.chain.transaction(outpoint.txid).await?.is_some() {
            // Its transaction exists, the output does not: someone else spent it.
            tracing::error!(txid = %o.txid, vout = o.vout, "a tracked output is spent by a transaction the service does not know");
            self.store
                .audit_unknown_spend(&o.txid, o.vout, o.amount_sats)
                .await?;
        }
        Ok(false)
    }
}

fn outpoint_of(o: &crate::domain::money::Coin) -> Result<bitcoin::OutPoint, EngineError> {
    let vout = u32::try_from(o.vout)
        .map_err(|_| EngineError::Corrupt(format!("vout {} of {}", o.vout, o.txid)))?;
    Ok(bitcoin::OutPoint { txid: o.txid, vout })
}

/// Why the node is not to be trusted with a close or a draw yet, if it is
/// behind: it knows of more headers than it has blocks (catching up), or
/// says it is in initial block download.
pub fn behind(state: &chain::SyncState) -> Option<String> {
    if state.is_synced() {
        return None;
    }
    Some(if state.initial_block_download {
        format!(
            "the node is in initial block download ({} blocks, {} headers); rounds do not close or draw until it has caught up",
            state.tip.height, state.headers
        )
    } else {
        format!(
            "the node is catching up: it knows {} headers but has {} blocks; rounds do not close or draw until it has caught up",
            state.headers, state.tip.height
        )
    })
}

/// Bets as the draw sees them.
pub fn draw_bets(bets: &[Bet]) -> Vec<DrawBet> {
    bets.iter().map(Bet::draw_bet).collect()
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
