//! Reading rounds back: pages of past rounds with their draws, one round, and a player's last result.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::domain::draw;
use crate::domain::phase::{Bet, RoundProof, RoundSummary};
use crate::service::current::{CurrentRound, RoundSnapshot};
use crate::store::{Store, StoreError};

pub use crate::domain::transfer::Transfer;

/// Rounds and transfers read back, as the HTTP layer asks for them: an owned
/// handle over the free functions below and the current-round cache.
#[derive(Debug, Clone)]
pub struct History {
    store: Store,
    current: Arc<CurrentRound>,
}

impl History {
    /// The service over the store and the current-round cache.
    pub fn new(store: Store, current: Arc<CurrentRound>) -> Self {
        Self { store, current }
    }

    /// The current round (cached for a short time).
    ///
    /// # Errors
    /// Database failures.
    pub async fn current(&self) -> Result<RoundSnapshot, StoreError> {
        self.current.snapshot(&self.store).await
    }

    /// Whether user `user_id` bet in round `round_id` (always read from the database).
    ///
    /// # Errors
    /// Database failures.
    pub async fn user_played(&self, round_id: i64, user_id: i64) -> Result<bool, StoreError> {
        self.store.user_played(round_id, user_id).await
    }

    /// See [`rounds_page`].
    ///
    /// # Errors
    /// Database failures.
    pub async fn rounds_page(
        &self,
        limit: i64,
        before_id: Option<i64>,
        user_id: Option<i64>,
    ) -> Result<RoundsPage, StoreError> {
        rounds_page(&self.store, limit, before_id, user_id).await
    }

    /// See [`round`].
    ///
    /// # Errors
    /// Database failures.
    pub async fn round(&self, id: i64) -> Result<Option<(RoundProof, bool)>, StoreError> {
        round(&self.store, id).await
    }

    /// See [`last_result`].
    ///
    /// # Errors
    /// Database failures.
    pub async fn last_result(&self, user_id: i64) -> Result<Option<LastResult>, StoreError> {
        last_result(&self.store, user_id).await
    }

    /// See [`transfers_page`].
    ///
    /// # Errors
    /// Database failures.
    pub async fn transfers_page(
        &self,
        user_id: i64,
        limit: i64,
        before_id: Option<i64>,
    ) -> Result<TransfersPage, StoreError> {
        transfers_page(&self.store, user_id, limit, before_id).await
    }
}

/// How a round ended for one player.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The player's bet won the pot.
    Won,
    /// Another bet won.
    Lost,
    /// The player was alone in the round: the pot came back, less the fee.
    Refunded,
}

/// A player's last round with a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastResult {
    /// The round.
    pub detail: RoundProof,
    /// How it ended for the player.
    pub outcome: Outcome,
    /// Sum of the player's bets.
    pub bet_sats: i64,
    /// What the player received (0 when lost).
    pub won_sats: i64,
    /// The pause flag now.
    pub paused: bool,
}

/// A page of rounds, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundsPage {
    /// The rounds, without their bet lists.
    pub rounds: Vec<RoundSummary>,
    /// Where the next page starts; `None` at the end.
    pub next_before_id: Option<i64>,
    /// The pause flag now.
    pub paused: bool,
}

/// Whether user `user_id` (if any) bet in the round.
pub fn played(d: &RoundProof, user_id: Option<i64>) -> bool {
    user_id.is_some_and(|id| d.bets.iter().any(|b| b.user_id == id))
}

/// Up to `limit` rounds below `before_id`, newest first, with whether
/// `user_id` played each: two statements (the pause flag, the page)
/// whatever the page holds.
///
/// # Errors
/// Database failures.
pub async fn rounds_page(
    store: &Store,
    limit: i64,
    before_id: Option<i64>,
    user_id: Option<i64>,
) -> Result<RoundsPage, StoreError> {
    let paused = store.config().await?.paused;
    let rounds = store.round_page(limit, before_id, user_id).await?;
    let next_before_id = if rounds.len() as i64 == limit {
        rounds.last().map(|r| r.round.id)
    } else {
        None
    };
    Ok(RoundsPage {
        rounds,
        next_before_id,
        paused,
    })
}

/// One round with the pause flag, or `None` when it does not exist.
///
/// # Errors
/// Database failures.
pub async fn round(store: &Store, id: i64) -> Result<Option<(RoundProof, bool)>, StoreError> {
    let Some(d) = store.round_proof(id).await? else {
        return Ok(None);
    };
    let paused = store.config().await?.paused;
    Ok(Some((d, paused)))
}

/// The last round user `user_id` played that has a result, or `None`.
///
/// # Errors
/// Database failures.
pub async fn last_result(store: &Store, user_id: i64) -> Result<Option<LastResult>, StoreError> {
    let Some(id) = store.last_played_round(user_id).await? else {
        return Ok(None);
    };
    let Some(detail) = store.round_proof(id).await? else {
        return Ok(None);
    };
    let paused = store.config().await?.paused;
    let bet_sats = detail
        .bets
        .iter()
        .filter(|b| b.user_id == user_id)
        .map(|b| b.amount_sats)
        .sum();
    let single = draw::single_player(&detail.bets.iter().map(Bet::draw_bet).collect::<Vec<_>>());
    let won = detail.winner().map(|b| b.user_id) == Some(user_id);
    let outcome = match (single, won) {
        (true, _) => Outcome::Refunded,
        (false, true) => Outcome::Won,
        (false, false) => Outcome::Lost,
    };
    let won_sats = if won {
        detail.payout.as_ref().map_or(0, |p| p.winner_sats)
    } else {
        0
    };
    Ok(Some(LastResult {
        detail,
        outcome,
        bet_sats,
        won_sats,
        paused,
    }))
}

/// A page of one user's transfers with what their views need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransfersPage {
    /// Newest first.
    pub transfers: Vec<Transfer>,
    /// Where the next page starts; `None` at the end.
    pub next_before_id: Option<i64>,
    /// Height of the last processed block (0 before the first).
    pub tip: i64,
    /// Confirmations before a deposit is credited.
    pub deposit_confirmations: i64,
}

/// Up to `limit` transfers of user `user_id` below `before_id`, newest first.
///
/// # Errors
/// Database failures.
pub async fn transfers_page(
    store: &Store,
    user_id: i64,
    limit: i64,
    before_id: Option<i64>,
) -> Result<TransfersPage, StoreError> {
    let config = store.config().await?;
    let tip = store.synced_tip().await?.map_or(0, |t| t.0);
    let transfers = store.user_transfer_page(user_id, limit, before_id).await?;
    let next_before_id = if transfers.len() as i64 == limit {
        transfers.last().map(|r| r.id)
    } else {
        None
    };
    Ok(TransfersPage {
        transfers,
        next_before_id,
        tip,
        deposit_confirmations: config.deposit_confirmations,
    })
}
