//! A short-lived in-process copy of the current round and the pause flag, so the hot GET /rounds/current does not hit the database on every request.
//!
//! Writers in this process refresh it at once; the time-to-live bounds how
//! stale it can be against writes by other processes sharing the database.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::domain::phase::RoundProof;
use crate::store::{Store, StoreError};

/// What GET /rounds/current needs besides the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundSnapshot {
    /// The newest round with draw, bets and payout.
    pub detail: RoundProof,
    /// The pause flag.
    pub paused: bool,
    /// Which read of the store this is: it changes with every refresh, so
    /// whoever caches something derived from a snapshot (the HTTP layer, its
    /// rendered anonymous answer) knows when to derive it again.
    pub generation: u64,
}

/// The cache.
#[derive(Debug)]
pub struct CurrentRound {
    ttl: Duration,
    cached: Mutex<Option<(Instant, RoundSnapshot)>>,
    generations: std::sync::atomic::AtomicU64,
}

impl CurrentRound {
    /// A cache whose entries live `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            cached: Mutex::new(None),
            generations: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The snapshot, read from the store when missing or older than the TTL.
    ///
    /// # Errors
    /// Store failures, or [`StoreError::Corrupt`] when no round exists.
    pub async fn snapshot(&self, store: &Store) -> Result<RoundSnapshot, StoreError> {
        if let Some((at, snap)) = self
            .cached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            if at.elapsed() < self.ttl {
                return Ok(snap.clone());
            }
        }
        self.refresh(store).await
    }

    /// Drops the cached snapshot, so the next read loads a fresh one. Cheaper
    /// than [`CurrentRound::refresh`] on hot write paths (each bet), where
    /// reading a round with many bets on every write would cost O(bets).
    pub fn invalidate(&self) {
        *self.cached.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Re-reads the snapshot now (after a write by this process).
    ///
    /// # Errors
    /// As [`CurrentRound::snapshot`].
    pub async fn refresh(&self, store: &Store) -> Result<RoundSnapshot, StoreError> {
        let round = store
            .current_round()
            .await?
            .ok_or_else(|| StoreError::Corrupt("no round exists".into()))?;
        let paused = store.config().await?.paused;
        let detail = store
            .round_proof(round.id)
            .await?
            .ok_or_else(|| StoreError::Corrupt("round vanished".into()))?;
        let generation = self
            .generations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let snap = RoundSnapshot {
            detail,
            paused,
            generation,
        };
        *self.cached.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), snap.clone()));
        Ok(snap)
    }
}
