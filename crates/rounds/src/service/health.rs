//! Readiness: whether the database and the chain answer.

use std::sync::Arc;

use crate::store::{Store, StoreError};

/// The dependencies a readiness check asks.
#[derive(Clone)]
pub struct Health {
    store: Store,
    chain: Arc<dyn chain::Chain>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health").finish_non_exhaustive()
    }
}

impl Health {
    /// The check over these parts.
    pub fn new(store: Store, chain: Arc<dyn chain::Chain>) -> Self {
        Self { store, chain }
    }

    /// Whether the database answers a trivial query.
    ///
    /// # Errors
    /// The database error.
    pub async fn database(&self) -> Result<(), StoreError> {
        self.store.ping().await
    }

    /// Whether the chain reports its tip: `Some(why)` when it answers but
    /// is behind (catching up or in initial block download), so that rounds
    /// neither close nor draw.
    ///
    /// # Errors
    /// The chain error.
    pub async fn chain(&self) -> Result<Option<String>, chain::ChainError> {
        let state = self.chain.sync_state().await?;
        Ok(crate::service::engine::behind(&state))
    }
}
