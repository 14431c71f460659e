//! A short-lived in-process copy of the current round and the pause flag, so the hot GET /rounds/current does not hit the database on every request.
//!
//! Writers in this process refresh it at once; the time-to-live bounds how
//! stale it can be against writes by other processes sharing the database.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::store::rounds::{RoundDetail, RoundRow};
use crate::store::{Store, StoreError};

/// Renders the anonymous caller's answer for a round; given by the HTTP
/// layer, so this service caches bytes without knowing the view.
pub type RenderAnonymous = fn(&RoundDetail, bool) -> Result<Bytes, String>;

/// What GET /rounds/current needs besides the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundSnapshot {
    /// The newest round.
    pub round: RoundRow,
    /// The newest round with draw, bets and payout.
    pub detail: RoundDetail,
    /// The pause flag.
    pub paused: bool,
    /// The anonymous caller's answer, serialised once per refresh.
    pub anonymous_json: Bytes,
}

/// The cache.
#[derive(Debug)]
pub struct CurrentRound {
    ttl: Duration,
    render: RenderAnonymous,
    cached: Mutex<Option<(Instant, RoundSnapshot)>>,
}

impl CurrentRound {
    /// A cache whose entries live `ttl`, rendering the anonymous answer with `render`.
    pub fn new(ttl: Duration, render: RenderAnonymous) -> Self {
        Self {
            ttl,
            render,
            cached: Mutex::new(None),
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
    /// rendering a round with many bets on every write would cost O(bets).
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
            .round_detail(round.id)
            .await?
            .ok_or_else(|| StoreError::Corrupt("round vanished".into()))?;
        let anonymous_json = (self.render)(&detail, paused)
            .map_err(|e| StoreError::Corrupt(format!("round view: {e}")))?;
        let snap = RoundSnapshot {
            round,
            detail,
            paused,
            anonymous_json,
        };
        *self.cached.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), snap.clone()));
        Ok(snap)
    }
}
