//! The operator's workflows: the service config and its audited changes, pause and resume, the audit log, the payout retry and the ledger totals.

use std::sync::Arc;

use crate::domain::audit::AuditActor;
use crate::domain::settings::{ConfigDiff, ConfigPatch, ServiceConfig};
use crate::service::bump::{BumpError, Bumped};
use crate::service::current::CurrentRound;
use crate::service::engine::{Engine, EngineError};
use crate::service::stream::StreamHub;
use crate::store::{Store, StoreError};

pub use crate::domain::audit::AuditEntry;
pub use crate::domain::ledger::LedgerTotals;
use crate::domain::transfer::{Transfer, WaitingForConfirmation};
use crate::store::bumps::WaitingTransfer;

/// Why an operator's request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminOpError {
    /// No round has this id.
    #[error("round {0} does not exist")]
    UnknownRound(i64),
    /// The round's payout is not waiting for a retry.
    #[error("round {0} has no payout waiting for a retry")]
    NothingToRetry(i64),
    /// The database.
    #[error("admin store")]
    Store(#[from] StoreError),
    /// The engine (building, signing or broadcasting the payout).
    #[error("payout retry")]
    Engine(#[from] EngineError),
    /// A fee bump by hand was refused or failed.
    #[error("fee bump")]
    Bump(#[from] BumpError),
}

/// The operator's workflows over the store, the engine and the caches they invalidate.
#[derive(Clone)]
pub struct Administration {
    store: Store,
    engine: Arc<Engine>,
    rounds: Arc<CurrentRound>,
    hub: StreamHub,
}

impl std::fmt::Debug for Administration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Administration").finish_non_exhaustive()
    }
}

impl Administration {
    /// The service over these parts.
    pub fn new(
        store: Store,
        engine: Arc<Engine>,
        rounds: Arc<CurrentRound>,
        hub: StreamHub,
    ) -> Self {
        Self {
            store,
            engine,
            rounds,
            hub,
        }
    }

    /// The current config.
    ///
    /// # Errors
    /// Store failures.
    pub async fn config(&self) -> Result<ServiceConfig, AdminOpError> {
        Ok(self.store.config().await?)
    }

    /// Applies a checked patch as `actor`; audited with the diff when something changed.
    ///
    /// # Errors
    /// Store failures.
    pub async fn update_config(
        &self,
        patch: &ConfigPatch,
        actor: AuditActor,
    ) -> Result<(ServiceConfig, ConfigDiff), AdminOpError> {
        Ok(self.store.update_config(patch, actor).await?)
    }

    /// Pauses or resumes as `actor`; when the state changes, the cached
    /// current round is refreshed and stream subscribers are told.
    ///
    /// # Errors
    /// Store failures.
    pub async fn set_paused(
        &self,
        paused: bool,
        actor: AuditActor,
    ) -> Result<ServiceConfig, AdminOpError> {
        let (config, changed) = self.store.set_paused(paused, actor).await?;
        if changed {
            self.rounds.refresh(&self.store).await?;
            self.hub.publish();
            tracing::info!(paused, "pause state changed");
        }
        Ok(config)
    }

    /// Audit entries newest first, at most `limit`, below `before_id`.
    ///
    /// # Errors
    /// Store failures.
    pub async fn audit_page(
        &self,
        limit: i64,
        before_id: Option<i64>,
    ) -> Result<Vec<AuditEntry>, AdminOpError> {
        Ok(self.store.audit_page(limit, before_id).await?)
    }

    /// Rebuilds and broadcasts the failed payout of round `round_id`; returns the new payout.
    ///
    /// # Errors
    /// [`AdminOpError::UnknownRound`], [`AdminOpError::NothingToRetry`], or an internal failure.
    pub async fn retry_payout(&self, round_id: i64) -> Result<Transfer, AdminOpError> {
        if self.store.round_detail(round_id).await?.is_none() {
            return Err(AdminOpError::UnknownRound(round_id));
        }
        self.engine
            .retry_payout(round_id)
            .await?
            .ok_or(AdminOpError::NothingToRetry(round_id))
    }

    /// Replaces waiting withdrawal or payout `transfer_id` at `rate` now
    /// (held to the bump cap), audited as `transfer_bumped` by `admin`.
    ///
    /// # Errors
    /// [`AdminOpError::Bump`].
    pub async fn bump_transfer(
        &self,
        transfer_id: i64,
        rate: bitcoin::FeeRate,
    ) -> Result<Bumped, AdminOpError> {
        let bumped = self.engine.bump_by_hand(transfer_id, rate).await?;
        self.hub.publish();
        Ok(bumped)
    }

    /// Withdrawals and payouts waiting for their first confirmation, with
    /// the synced height (the dashboard's stuck list).
    ///
    /// # Errors
    /// Store failures.
    pub async fn waiting_transfers(
        &self,
    ) -> Result<(Vec<WaitingForConfirmation>, i64), AdminOpError> {
        let height = self.store.synced_tip().await?.map_or(0, |t| t.0);
        let waiting = self
            .store
            .waiting_transfers()
            .await?
            .iter()
            .map(WaitingTransfer::decode)
            .collect::<Result<_, _>>()?;
        Ok((waiting, height))
    }

    /// The conservation totals.
    ///
    /// # Errors
    /// Store failures.
    pub async fn ledger_totals(&self) -> Result<LedgerTotals, AdminOpError> {
        Ok(self.store.ledger_totals().await?)
    }
}
