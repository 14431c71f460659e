//! Rounds: the current round, its creation, and who played.

use bitcoin::{BlockHash, Txid};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::ledger::{
    insert_intent, output_from_row, transfer_from_row, LedgerError, TransferRow, Tx, OUTPUT_COLS,
    TRANSFER_COLS,
};
use super::settings::insert_audit_entry;
use super::{state_column, Store, StoreError};
use crate::domain::audit::{AuditActor, AuditDetails, AuditEvent, AuditOutput};
use crate::domain::money::{Coin, Intent};
use crate::domain::phase::{
    Bet, DrawColumnValues, DrawResult, Payout, PhaseError, Round, RoundPhase, RoundProof,
    RoundSummary,
};
use crate::domain::round::{BetStatus, OutputOrigin, RoundStatus, TransferKind, TransferStatus};
use crate::domain::settings::ConfigDiff;
use crate::domain::time::unix_now;

/// A round as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundRow {
    /// Primary key, the round id shown to clients.
    pub id: i64,
    /// `open`, `closing`, `drawing`, `paying_out` or `closed`.
    pub status: RoundStatus,
    /// Unix seconds.
    pub opened_at: i64,
    /// Unix seconds.
    pub closes_at: i64,
    /// Sum of the round's bets.
    pub pot_sats: i64,
    /// Number of distinct users who bet.
    pub bettors: i64,
    /// Number of placed bets (at most [`MAX_ROUND_BETS`](crate::domain::settings::MAX_ROUND_BETS)).
    pub bet_count: i64,
}

/// Pot inputs that no longer exist leave the ledger; their value is
/// recorded as a correction so the conservation check still balances.
async fn correct_vanished_inputs(
    tx: &mut Tx<'_>,
    r: &PayoutReplacement<'_>,
) -> Result<(), sqlx::Error> {
    let PayoutReplacement {
        round_id,
        transfer_id,
        dropped,
        ..
    } = *r;
    for o in dropped {
        sqlx::query("DELETE FROM outputs WHERE id = $1")
            .bind(o.id)
            .execute(&mut **tx)
            .await?;
        sqlx::query(
            "INSERT INTO ledger_corrections (at, round_id, transfer_id, txid, vout, amount_sats, reason) \
             VALUES ($1, $2, $3, $4, $5, $6, 'pot input no longer exists')",
        )
        .bind(unix_now())
        .bind(round_id)
        .bind(transfer_id)
        .bind(o.txid.to_string())
        .bind(o.vout)
        .bind(o.amount_sats)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// The replacement takes over the refused payout's inputs and its outputs
/// (the winner's, at its new value), or drops them when it pays none.
async fn move_payout_outputs(
    tx: &mut Tx<'_>,
    r: &PayoutReplacement<'_>,
) -> Result<(), sqlx::Error> {
    let PayoutReplacement {
        transfer_id,
        old_txid,
        txid,
        winner_sats,
        winner_vout,
        ..
    } = *r;
    let (txid, old_txid) = (txid.to_string(), old_txid.to_string());
    sqlx::query("UPDATE outputs SET spent_txid = $1 WHERE spent_txid = $2")
        .bind(&txid)
        .bind(&old_txid)
        .execute(&mut **tx)
        .await?;
    match winner_vout {
        Some(v) => {
            let moved = sqlx::query(
                "UPDATE outputs SET txid = $1, vout = $2, amount_sats = $3 WHERE txid = $4",
            )
            .bind(&txid)
            .bind(v)
            .bind(winner_sats)
            .bind(&old_txid)
            .execute(&mut **tx)
            .await?
            .rows_affected();
            if moved == 0 {
                // A payout signed before the winner's share became a
                // payment may have had no winner output; without this
                // row the watcher would credit the new one as a deposit.
                sqlx::query(
                    "INSERT INTO outputs (txid, vout, amount_sats, user_id, round_id, origin) \
                     SELECT $1, $2, $3, user_id, NULL, $5 FROM transfers WHERE id = $4",
                )
                .bind(&txid)
                .bind(v)
                .bind(winner_sats)
                .bind(transfer_id)
                .bind(OutputOrigin::Payout)
                .execute(&mut **tx)
                .await?;
            }
        }
        None => {
            sqlx::query("DELETE FROM outputs WHERE txid = $1")
                .bind(&old_txid)
                .execute(&mut **tx)
                .await?;
        }
    }
    Ok(())
}

/// A failed payout's replacement, signed, for [`Store::replace_failed_payout`].
#[derive(Debug, Clone, Copy)]
pub struct PayoutReplacement<'a> {
    /// The payout transfer.
    pub transfer_id: i64,
    /// Its round.
    pub round_id: i64,
    /// The refused transaction.
    pub old_txid: Txid,
    /// The replacement.
    pub txid: Txid,
    /// The replacement, signed, in hex.
    pub raw_tx: &'a str,
    /// Its miner fee.
    pub fee_sats: i64,
    /// The winner's share.
    pub winner_sats: i64,
    /// The winner's output, when the share is paid.
    pub winner_vout: Option<i64>,
    /// The commission.
    pub commission_sats: i64,
    /// Pot outputs gone from the chain, left out (ledger corrections).
    pub dropped: &'a [Coin],
}

impl Store {
    /// The newest round, if any.
    ///
    /// # Errors
    /// Database failures.
    pub async fn current_round(&self) -> Result<Option<RoundRow>, StoreError> {
        let row = sqlx::query(
            "SELECT id, status, opened_at, closes_at, pot_sats, bettors, bet_count FROM rounds ORDER BY id DESC LIMIT 1",
        )
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| round_from_row(&r)).transpose()
    }

    /// Returns the newest round, opening the first one (status `open`,
    /// `closes_at = now + round_duration_seconds`) if there is none.
    ///
    /// # Errors
    /// Database failures.
    pub async fn ensure_round(&self, now: i64) -> Result<RoundRow, StoreError> {
        if let Some(round) = self.current_round().await? {
            return Ok(round);
        }
        let mut tx = self.pool.begin().await?;
        // Takes the write lock first (SQLite) / locks the config row
        // (PostgreSQL) so that two starting processes open one round.
        let duration: i64 = sqlx::query_scalar(
            "UPDATE service_config SET id = id WHERE id = 1 RETURNING round_duration_seconds",
        )
        .fetch_one(&mut *tx)
        .await?;
        let existing = sqlx::query(
            "SELECT id, status, opened_at, closes_at, pot_sats, bettors, bet_count FROM rounds ORDER BY id DESC LIMIT 1",
        )
        .fetch_optional(&mut *tx)
        .await?;
        let round = match existing {
            Some(r) => round_from_row(&r)?,
            None => {
                let row = sqlx::query(
                    "INSERT INTO rounds (status, opened_at, closes_at, pot_sats, bettors) \
                     VALUES ($3, $1, $2, 0, 0) \
                     RETURNING id, status, opened_at, closes_at, pot_sats, bettors, bet_count",
                )
                .bind(now)
                .bind(now + duration)
                .bind(RoundStatus::Open)
                .fetch_one(&mut *tx)
                .await?;
                round_from_row(&row)?
            }
        };
        tx.commit().await?;
        Ok(round)
    }

    /// Whether user `user_id` bet in round `round_id`.
    ///
    /// # Errors
    /// Database failures.
    pub async fn user_played(&self, round_id: i64, user_id: i64) -> Result<bool, StoreError> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM bets WHERE round_id = $1 AND user_id = $2 AND status = $3",
        )
        .bind(round_id)
        .bind(user_id)
        .bind(BetStatus::Placed)
        .fetch_one(&self.pool)
        .await?;
        Ok(n > 0)
    }
}

fn round_from_row(r: &AnyRow) -> Result<RoundRow, StoreError> {
    Ok(RoundRow {
        id: r.try_get("id")?,
        status: state_column(r, "status")?,
        opened_at: r.try_get("opened_at")?,
        closes_at: r.try_get("closes_at")?,
        pot_sats: r.try_get("pot_sats")?,
        bettors: r.try_get("bettors")?,
        bet_count: r.try_get("bet_count")?,
    })
}

/// Opens the next round when `round_id` is the newest one, inside the
/// transaction that ends `round_id` (closed or payout_failed), so exactly one
/// round is open afterwards.
async fn open_next_if_newest(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    round_id: i64,
    now: i64,
) -> Result<(), StoreError> {
    let newest: i64 = sqlx::query_scalar("SELECT MAX(id) FROM rounds")
        .fetch_one(&mut **tx)
        .await?;
    if newest == round_id {
        let duration: i64 =
            sqlx::query_scalar("SELECT round_duration_seconds FROM service_config WHERE id = 1")
                .fetch_one(&mut **tx)
                .await?;
        sqlx::query(
            "INSERT INTO rounds (status, opened_at, closes_at, pot_sats, bettors) VALUES ($3, $1, $2, 0, 0)",
        )
        .bind(now)
        .bind(now + duration)
        .bind(RoundStatus::Open)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// The draw as stored on the round: seven nullable columns that only this
/// module reads and writes; above the store a round's draw is its
/// [`RoundPhase`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct DrawColumns {
    /// Tip height when the round closed.
    pub(super) tip_height_at_close: Option<i64>,
    /// Display hex of that tip's hash: the draw block's parent.
    pub(super) tip_hash_at_close: Option<String>,
    /// Hex.
    pub(super) bets_commitment: Option<String>,
    /// Height of the draw block.
    pub(super) block_height: Option<i64>,
    /// Display hex of the draw block.
    pub(super) block_hash: Option<String>,
    /// Hex.
    pub(super) seed: Option<String>,
    /// The winning satoshi.
    pub(super) ticket: Option<i64>,
    /// The winning bet.
    pub(super) winner_bet_id: Option<i64>,
}

impl DrawColumns {
    /// The columns a stored draw writes (the close's anchor aside).
    fn of_draw(draw: &DrawResult) -> Self {
        DrawColumns {
            block_height: Some(draw.block.height),
            block_hash: Some(draw.block.hash.to_string()),
            seed: Some(draw.seed.to_string()),
            ticket: Some(draw.ticket),
            winner_bet_id: Some(draw.winner_bet_id),
            ..DrawColumns::default()
        }
    }
}

const BET_COLS: &str = "b.id, b.user_id, u.username, b.amount_sats, b.txid";

/// A bet of round `round_id` as read with [`BET_COLS`], its txid decoded.
fn bet_from_row(round_id: i64, r: &AnyRow) -> Result<Bet, StoreError> {
    // Bets placed before the service recorded transactions have none.
    let txid = r.try_get::<Option<String>, _>("txid")?;
    Ok(Bet {
        id: r.try_get("id")?,
        user_id: r.try_get("user_id")?,
        username: r.try_get("username")?,
        amount_sats: r.try_get("amount_sats")?,
        txid: hash_column("bets.txid", txid.as_deref().filter(|t| !t.is_empty()))
            .map_err(|source| StoreError::Round { round_id, source })?,
    })
}

/// A round with everything its view shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundDetail {
    /// The round row.
    pub round: RoundRow,
    /// Draw columns.
    pub(super) draw: DrawColumns,
    /// Placed bets in ascending id.
    pub bets: Vec<Bet>,
    /// The payout transfer, if any.
    pub payout: Option<TransferRow>,
}

/// A round as the list of rounds shows it: no bet list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundSummaryRow {
    /// The round row (with its bet count and pot).
    pub round: RoundRow,
    /// Draw columns.
    pub(super) draw: DrawColumns,
    /// The winner's username, once drawn.
    pub winner_username: Option<String>,
    /// The payout, if any.
    pub payout: Option<PayoutSummaryRow>,
    /// Whether the caller bet in the round.
    pub user_played: bool,
}

/// What the list shows of a payout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayoutSummaryRow {
    /// The payout transaction.
    pub txid: String,
    /// Paid to the winner.
    pub amount_sats: i64,
    /// Paid to the fee address.
    pub commission_sats: i64,
    /// Miner fee.
    pub fee_sats: i64,
    /// Stored status.
    pub status: crate::domain::round::TransferStatus,
    /// Height of the confirming block.
    pub block_height: Option<i64>,
}

fn summary_from_row(r: &AnyRow) -> Result<RoundSummaryRow, sqlx::Error> {
    let (round, draw) = round_and_draw(r)?;
    let payout = match r.try_get::<Option<String>, _>("payout_txid")? {
        Some(txid) => Some(PayoutSummaryRow {
            txid,
            amount_sats: r.try_get("payout_amount_sats")?,
            commission_sats: r.try_get("payout_commission_sats")?,
            fee_sats: r.try_get("payout_fee_sats")?,
            status: state_column(r, "payout_status")?,
            block_height: r.try_get("payout_block_height")?,
        }),
        None => None,
    };
    Ok(RoundSummaryRow {
        round,
        draw,
        winner_username: r.try_get("winner_username")?,
        payout,
        user_played: r.try_get::<i64, _>("user_played")? != 0,
    })
}

const ROUND_COLS: &str =
    "id, status, opened_at, closes_at, pot_sats, bettors, bet_count, tip_height_at_close, tip_hash_at_close, \
     bets_commitment, block_height, block_hash, seed, ticket, winner_bet_id";

fn round_and_draw(r: &AnyRow) -> Result<(RoundRow, DrawColumns), sqlx::Error> {
    Ok((
        RoundRow {
            id: r.try_get("id")?,
            status: state_column(r, "status")?,
            opened_at: r.try_get("opened_at")?,
            closes_at: r.try_get("closes_at")?,
            pot_sats: r.try_get("pot_sats")?,
            bettors: r.try_get("bettors")?,
            bet_count: r.try_get("bet_count")?,
        },
        DrawColumns {
            tip_height_at_close: r.try_get("tip_height_at_close")?,
            tip_hash_at_close: r.try_get("tip_hash_at_close")?,
            bets_commitment: r.try_get("bets_commitment")?,
            block_height: r.try_get("block_height")?,
            block_hash: r.try_get("block_hash")?,
            seed: r.try_get("seed")?,
            ticket: r.try_get("ticket")?,
            winner_bet_id: r.try_get("winner_bet_id")?,
        },
    ))
}

impl Store {
    /// A round with its draw, bets and payout.
    ///
    /// # Errors
    /// Database failures.
    pub async fn round_detail(&self, round_id: i64) -> Result<Option<RoundDetail>, StoreError> {
        let row = sqlx::query(&format!("SELECT {ROUND_COLS} FROM rounds WHERE id = $1"))
            .bind(round_id)
            .fetch_optional(self.pool())
            .await?;
        let Some(row) = row else { return Ok(None) };
        let (round, draw) = round_and_draw(&row)?;
        let bets = self.round_bets(round_id).await?;
        // Spliced from the enums, not bound: the planner takes the partial
        // index `transfers_one_payout` only for a query that repeats its
        // predicate (`kind = 'payout' AND status <> 'superseded'`) as literals.
        let payout = sqlx::query(&format!(
            "SELECT {TRANSFER_COLS} FROM transfers WHERE kind = '{}' AND round_id = $1 \
             AND status <> '{}'",
            TransferKind::Payout,
            TransferStatus::Superseded,
        ))
        .bind(round_id)
        .fetch_optional(self.pool())
        .await?
        .map(|r| transfer_from_row(&r))
        .transpose()?;
        Ok(Some(RoundDetail {
            round,
            draw,
            bets,
            payout,
        }))
    }

    /// Placed bets of a round in ascending id.
    ///
    /// # Errors
    /// Database failures.
    pub async fn round_bets(&self, round_id: i64) -> Result<Vec<Bet>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {BET_COLS} FROM bets b \
             JOIN users u ON u.id = b.user_id WHERE b.round_id = $1 AND b.status = $2 ORDER BY b.id"
        ))
        .bind(round_id)
        .bind(BetStatus::Placed)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(|r| bet_from_row(round_id, r)).collect()
    }

    /// A page of rounds newest first, below `before_id`, as the list shows
    /// them: each round's row, draw columns, winner's name, payout and
    /// whether `user_id` bet in it, in **one statement** whatever the page
    /// size (the list used to read each round's row, bets and payout, three
    /// statements a round). The bet lists are not read: the list shows
    /// their count and total, `GET /rounds/{id}` the bets.
    ///
    /// # Errors
    /// Database failures.
    pub async fn round_summaries(
        &self,
        limit: i64,
        before_id: Option<i64>,
        user_id: Option<i64>,
    ) -> Result<Vec<RoundSummaryRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {}, wu.username AS winner_username, \
             p.txid AS payout_txid, p.amount_sats AS payout_amount_sats, \
             p.commission_sats AS payout_commission_sats, p.fee_sats AS payout_fee_sats, \
             p.status AS payout_status, p.block_height AS payout_block_height, \
             CAST(CASE WHEN EXISTS (SELECT 1 FROM bets ub WHERE ub.round_id = r.id \
             AND ub.user_id = $3 AND ub.status = $4) THEN 1 ELSE 0 END AS BIGINT) AS user_played \
             FROM rounds r \
             LEFT JOIN bets wb ON wb.id = r.winner_bet_id \
             LEFT JOIN users wu ON wu.id = wb.user_id \
             LEFT JOIN transfers p ON p.kind = $5 AND p.round_id = r.id AND p.status <> $6 \
             WHERE r.id < $1 ORDER BY r.id DESC LIMIT $2",
            ROUND_COLS
                .split(", ")
                .map(|c| format!("r.{}", c.trim()))
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .bind(before_id.unwrap_or(i64::MAX))
        .bind(limit)
        // No user has id 0: an anonymous caller played nothing.
        .bind(user_id.unwrap_or(0))
        .bind(BetStatus::Placed)
        .bind(TransferKind::Payout)
        // A bumped payout's superseded versions stay beside its live one.
        .bind(TransferStatus::Superseded)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .iter()
            .map(summary_from_row)
            .collect::<Result<_, _>>()?)
    }

    /// Round ids newest first, below `before_id`.
    ///
    /// # Errors
    /// Database failures.
    pub async fn round_ids(
        &self,
        limit: i64,
        before_id: Option<i64>,
    ) -> Result<Vec<i64>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT id FROM rounds WHERE id < $1 ORDER BY id DESC LIMIT $2")
                .bind(before_id.unwrap_or(i64::MAX))
                .bind(limit)
                .fetch_all(self.pool())
                .await?,
        )
    }

    /// The newest round the user bet in that has a result (paying out or closed).
    ///
    /// # Errors
    /// Database failures.
    pub async fn last_played_round(&self, user_id: i64) -> Result<Option<i64>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT r.id FROM rounds r WHERE r.status IN ($2, $3, $4) AND EXISTS \
             (SELECT 1 FROM bets b WHERE b.round_id = r.id AND b.user_id = $1 AND b.status = $5) \
             ORDER BY r.id DESC LIMIT 1",
        )
        .bind(user_id)
        .bind(RoundStatus::PayingOut)
        .bind(RoundStatus::Closed)
        .bind(RoundStatus::PayoutFailed)
        .bind(BetStatus::Placed)
        .fetch_optional(self.pool())
        .await?)
    }

    /// Rounds that are neither closed nor waiting for an admin retry, oldest
    /// first (the engine's work list).
    ///
    /// # Errors
    /// Database failures.
    pub async fn unfinished_rounds(&self) -> Result<Vec<RoundRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {ROUND_COLS} FROM rounds WHERE status NOT IN ($1, $2) ORDER BY id"
        ))
        .bind(RoundStatus::Closed)
        .bind(RoundStatus::PayoutFailed)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .iter()
            .map(|r| round_and_draw(r).map(|x| x.0))
            .collect::<Result<_, _>>()?)
    }

    /// open → closing: fixes `tip_height` (the node's tip, read by the
    /// caller after `closes_at` and before this transaction begins: no
    /// transaction waits on the chain) and the bets commitment, unless a bet
    /// of the round is still being broadcast. Every bet was accepted before
    /// `closes_at` (the guard of every bet write), so before the tip was
    /// read; the draw block, above that tip, is mined after it. Returns
    /// whether it moved.
    ///
    /// # Errors
    /// Database failures.
    pub async fn close_round(
        &self,
        round_id: i64,
        tip_height: i64,
        tip_hash: Option<BlockHash>,
        commitment_of: impl FnOnce(&[Bet]) -> String,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin().await?;
        let moved = sqlx::query("UPDATE rounds SET status = $2 WHERE id = $1 AND status = $3")
            .bind(round_id)
            .bind(RoundStatus::Closing)
            .bind(RoundStatus::Open)
            .execute(&mut *tx)
            .await?;
        if moved.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        let in_flight: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM transfers WHERE round_id = $1 AND kind = $2 AND status = $3 \
             AND set_aside_at IS NULL",
        )
        .bind(round_id)
        .bind(TransferKind::Bet)
        .bind(TransferStatus::Signed)
        .fetch_one(&mut *tx)
        .await?;
        if in_flight > 0 {
            tx.rollback().await?;
            return Ok(false);
        }
        let rows = sqlx::query(&format!(
            "SELECT {BET_COLS} FROM bets b \
             JOIN users u ON u.id = b.user_id WHERE b.round_id = $1 AND b.status = $2 ORDER BY b.id"
        ))
        .bind(round_id)
        .bind(BetStatus::Placed)
        .fetch_all(&mut *tx)
        .await?;
        let bets = rows
            .iter()
            .map(|r| bet_from_row(round_id, r))
            .collect::<Result<Vec<_>, _>>()?;
        sqlx::query(
            "UPDATE rounds SET tip_height_at_close = $1, tip_hash_at_close = $4, bets_commitment = $2 \
             WHERE id = $3",
        )
        .bind(tip_height)
        .bind(commitment_of(&bets))
        .bind(round_id)
        .bind(tip_hash.map(|h| h.to_string()))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Anchors a drawing round's draw again at `tip` (height, hash) when
    /// the tip read at its close, `old_hash`, is no longer the parent of
    /// the block at the draw height (a reorganisation replaced it): the
    /// draw block becomes the first block above `tip`, and any block stored
    /// as the draw block is dropped, with any draw an earlier attempt
    /// stored from it (an admin retry keeps it, but it was drawn from a
    /// block that no longer follows the anchor). One guarded update with an audit
    /// entry; returns whether it moved.
    ///
    /// # Errors
    /// Database failures.
    pub async fn anchor_draw_again(
        &self,
        round_id: i64,
        old_hash: BlockHash,
        tip: (i64, BlockHash),
        reason: &str,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin().await?;
        let moved = sqlx::query(
            "UPDATE rounds SET tip_height_at_close = $1, tip_hash_at_close = $2, \
             block_height = NULL, block_hash = NULL, seed = NULL, ticket = NULL, winner_bet_id = NULL \
             WHERE id = $3 AND status = $5 AND tip_hash_at_close = $4",
        )
        .bind(tip.0)
        .bind(tip.1.to_string())
        .bind(round_id)
        .bind(old_hash.to_string())
        .bind(RoundStatus::Drawing)
        .execute(&mut *tx)
        .await?;
        if moved.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        insert_audit_entry(
            &mut tx,
            AuditEvent::DrawAnchoredAgain,
            AuditActor::Engine,
            &ConfigDiff::new(),
            &AuditDetails {
                round_id: Some(round_id),
                reason: Some(reason.to_string()),
                ..AuditDetails::none()
            },
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Moves a round from `from` to `to` if it is still in `from`.
    ///
    /// # Errors
    /// Database failures.
    pub async fn move_round(
        &self,
        round_id: i64,
        from: RoundStatus,
        to: RoundStatus,
    ) -> Result<bool, StoreError> {
        Ok(
            sqlx::query("UPDATE rounds SET status = $1 WHERE id = $2 AND status = $3")
                .bind(to)
                .bind(round_id)
                .bind(from)
                .execute(self.pool())
                .await?
                .rows_affected()
                == 1,
        )
    }

    /// Closes a round (from `from`) and opens the next one in the same
    /// transaction, if this round is the newest. Returns whether it moved.
    ///
    /// # Errors
    /// Database failures.
    pub async fn finish_round(
        &self,
        round_id: i64,
        from: RoundStatus,
        now: i64,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin().await?;
        let moved = sqlx::query("UPDATE rounds SET status = $3 WHERE id = $1 AND status = $2")
            .bind(round_id)
            .bind(from)
            .bind(RoundStatus::Closed)
            .execute(&mut *tx)
            .await?;
        if moved.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        if from == RoundStatus::PayingOut {
            sqlx::query(
                "UPDATE transfers SET status = $2 WHERE kind = $3 AND round_id = $1 AND status = $4",
            )
            .bind(round_id)
            .bind(TransferStatus::Broadcast)
            .bind(TransferKind::Payout)
            .bind(TransferStatus::Signed)
                .execute(&mut *tx)
                .await?;
        }
        open_next_if_newest(&mut tx, round_id, now).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// drawing → paying_out: stores the draw, takes the pot outputs and
    /// writes the payout intent (one per round by a unique index).
    ///
    /// # Errors
    /// [`LedgerError::WrongStatus`], [`LedgerError::OutputTaken`],
    /// [`LedgerError::PayoutExists`].
    pub async fn begin_payout(
        &self,
        round_id: i64,
        draw: &DrawResult,
        intent: &Intent,
    ) -> Result<i64, LedgerError> {
        let draw = DrawColumns::of_draw(draw);
        let mut tx = self.pool().begin().await?;
        let moved = sqlx::query(
            "UPDATE rounds SET status = $7, block_height = $1, block_hash = $2, seed = $3, \
             ticket = $4, winner_bet_id = $5 WHERE id = $6 AND status = $8",
        )
        .bind(draw.block_height)
        .bind(draw.block_hash.as_deref())
        .bind(draw.seed.as_deref())
        .bind(draw.ticket)
        .bind(draw.winner_bet_id)
        .bind(round_id)
        .bind(RoundStatus::PayingOut)
        .bind(RoundStatus::Drawing)
        .execute(&mut *tx)
        .await?;
        if moved.rows_affected() != 1 {
            return Err(LedgerError::WrongStatus {
                round_id,
                expected: RoundStatus::Drawing,
            });
        }
        let id = insert_intent(&mut tx, intent).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Unspent pot outputs of a round.
    ///
    /// # Errors
    /// Database failures.
    pub async fn pot_outputs(&self, round_id: i64) -> Result<Vec<Coin>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {OUTPUT_COLS} FROM outputs WHERE round_id = $1 AND origin = $2 AND spent_txid IS NULL ORDER BY id"
        ))
        .bind(round_id)
        .bind(OutputOrigin::Pot)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(output_from_row).collect()
    }

    /// Pot outputs taken by transaction `txid` (a failed payout to rebuild).
    ///
    /// # Errors
    /// Database failures.
    pub async fn pot_outputs_spent_by(&self, txid: &Txid) -> Result<Vec<Coin>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {OUTPUT_COLS} FROM outputs WHERE origin = $2 AND spent_txid = $1 ORDER BY id"
        ))
        .bind(txid.to_string())
        .bind(OutputOrigin::Pot)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(output_from_row).collect()
    }

    /// A payout whose broadcast failed: marks it and writes `payout_failed`
    /// to the audit log, once. Returns whether this call marked it.
    ///
    /// # Errors
    /// Database failures.
    pub async fn payout_failed(
        &self,
        transfer_id: i64,
        round_id: i64,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin().await?;
        let n = sqlx::query("UPDATE transfers SET status = $2 WHERE id = $1 AND status = $3")
            .bind(transfer_id)
            .bind(TransferStatus::BroadcastFailed)
            .bind(TransferStatus::Signed)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if n != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        sqlx::query("UPDATE rounds SET status = $2 WHERE id = $1 AND status = $3")
            .bind(round_id)
            .bind(RoundStatus::PayoutFailed)
            .bind(RoundStatus::PayingOut)
            .execute(&mut *tx)
            .await?;
        open_next_if_newest(&mut tx, round_id, unix_now()).await?;
        insert_audit_entry(
            &mut tx,
            AuditEvent::PayoutFailed,
            AuditActor::Engine,
            &ConfigDiff::new(),
            &AuditDetails {
                round_id: Some(round_id),
                transfer_id: Some(transfer_id),
                reason: Some(reason.to_string()),
                ..AuditDetails::none()
            },
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// drawing → payout_failed when no payout can be built (a fee above the
    /// pot, an unusable fee address …): stores the draw (so a retry draws
    /// from the same block), writes `payout_failed` to the audit log and
    /// opens the next round, in one transaction. Returns whether it moved.
    ///
    /// # Errors
    /// Database failures.
    pub async fn payout_unbuildable(
        &self,
        round_id: i64,
        draw: Option<&DrawResult>,
        reason: &str,
    ) -> Result<bool, StoreError> {
        // No draw: the columns keep whatever an earlier attempt stored.
        let draw = draw.map(DrawColumns::of_draw).unwrap_or_default();
        let mut tx = self.pool().begin().await?;
        let moved = sqlx::query(
            "UPDATE rounds SET status = $7, block_height = COALESCE($1, block_height), \
             block_hash = COALESCE($2, block_hash), seed = COALESCE($3, seed), ticket = COALESCE($4, ticket), \
             winner_bet_id = COALESCE($5, winner_bet_id) WHERE id = $6 AND status = $8",
        )
        .bind(draw.block_height)
        .bind(draw.block_hash.as_deref())
        .bind(draw.seed.as_deref())
        .bind(draw.ticket)
        .bind(draw.winner_bet_id)
        .bind(round_id)
        .bind(RoundStatus::PayoutFailed)
        .bind(RoundStatus::Drawing)
        .execute(&mut *tx)
        .await?;
        if moved.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        open_next_if_newest(&mut tx, round_id, unix_now()).await?;
        insert_audit_entry(
            &mut tx,
            AuditEvent::PayoutFailed,
            AuditActor::Engine,
            &ConfigDiff::new(),
            &AuditDetails {
                round_id: Some(round_id),
                reason: Some(reason.to_string()),
                ..AuditDetails::none()
            },
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// The admin retry of a round that failed before any payout was written:
    /// payout_failed → drawing, audited as `payout_retried`; the engine then
    /// draws again from the stored draw block. Returns whether it moved.
    ///
    /// # Errors
    /// Database failures.
    pub async fn redraw_failed_round(&self, round_id: i64) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin().await?;
        let moved = sqlx::query(
            "UPDATE rounds SET status = $2 WHERE id = $1 AND status = $3 \
             AND NOT EXISTS (SELECT 1 FROM transfers WHERE kind = $4 AND round_id = $1)",
        )
        .bind(round_id)
        .bind(RoundStatus::Drawing)
        .bind(RoundStatus::PayoutFailed)
        .bind(TransferKind::Payout)
        .execute(&mut *tx)
        .await?;
        if moved.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        insert_audit_entry(
            &mut tx,
            AuditEvent::PayoutRetried,
            AuditActor::Admin,
            &ConfigDiff::new(),
            &AuditDetails {
                round_id: Some(round_id),
                ..AuditDetails::none()
            },
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// The admin retry after `payout_failed`: replaces the payout transaction
    /// (same inputs, so the old and the new one can never both confirm),
    /// makes it `signed` again and writes `payout_retried`.
    ///
    /// # Errors
    /// Database failures; `Ok(false)` when the payout is not in `broadcast_failed`.
    pub async fn replace_failed_payout(
        &self,
        r: &PayoutReplacement<'_>,
    ) -> Result<bool, StoreError> {
        let PayoutReplacement {
            transfer_id,
            round_id,
            old_txid,
            txid,
            raw_tx,
            fee_sats,
            winner_sats,
            commission_sats,
            dropped,
            ..
        } = *r;
        let mut tx = self.pool().begin().await?;
        let n = sqlx::query(
            "UPDATE transfers SET status = $7, txid = $1, raw_tx = $2, fee_sats = $3, amount_sats = $4, \
             commission_sats = $6, broadcast_attempts = 0, set_aside_at = NULL \
             WHERE id = $5 AND status = $8",
        )
        .bind(txid.to_string())
        .bind(raw_tx)
        .bind(fee_sats)
        .bind(winner_sats)
        .bind(transfer_id)
        .bind(commission_sats)
        .bind(TransferStatus::Signed)
        .bind(TransferStatus::BroadcastFailed)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        sqlx::query("UPDATE rounds SET status = $2 WHERE id = $1 AND status = $3")
            .bind(round_id)
            .bind(RoundStatus::PayingOut)
            .bind(RoundStatus::PayoutFailed)
            .execute(&mut *tx)
            .await?;
        correct_vanished_inputs(&mut tx, r).await?;
        move_payout_outputs(&mut tx, r).await?;
        insert_audit_entry(
            &mut tx,
            AuditEvent::PayoutRetried,
            AuditActor::Admin,
            &ConfigDiff::new(),
            &AuditDetails {
                round_id: Some(round_id),
                txid: Some(txid.to_string()),
                replaced_txid: Some(old_txid.to_string()),
                dropped_inputs: Some(
                    dropped
                        .iter()
                        .map(|o| AuditOutput {
                            txid: o.txid.to_string(),
                            vout: o.vout,
                            amount_sats: o.amount_sats,
                        })
                        .collect(),
                ),
                ..AuditDetails::none()
            },
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// A round left `paying_out` with a refused payout (written by an older
    /// version): moves it to payout_failed and opens the next round.
    ///
    /// # Errors
    /// Database failures.
    pub async fn park_failed_payout(&self, round_id: i64, now: i64) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin().await?;
        let moved = sqlx::query("UPDATE rounds SET status = $2 WHERE id = $1 AND status = $3")
            .bind(round_id)
            .bind(RoundStatus::PayoutFailed)
            .bind(RoundStatus::PayingOut)
            .execute(&mut *tx)
            .await?;
        if moved.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        open_next_if_newest(&mut tx, round_id, now).await?;
        tx.commit().await?;
        Ok(true)
    }
}

/// Why a stored round cannot be read back as a domain round.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RoundDecodeError {
    /// A hash or txid column holds text that is not one.
    #[error("{column} holds {text:?}, which is not a hash")]
    Hash {
        /// The column.
        column: &'static str,
        /// The stored text.
        text: String,
        /// Why it does not parse.
        #[source]
        source: bitcoin::hex::HexToArrayError,
    },
    /// The draw columns are not a combination the lifecycle writes.
    #[error("its draw columns do not fit its status")]
    Phase(#[source] PhaseError),
}

/// `text` of `column` decoded as a hash.
fn hash_text<T>(column: &'static str, text: &str) -> Result<T, RoundDecodeError>
where
    T: std::str::FromStr<Err = bitcoin::hex::HexToArrayError>,
{
    T::from_str(text).map_err(|source| RoundDecodeError::Hash {
        column,
        text: text.to_string(),
        source,
    })
}

/// `text` of `column` decoded as a hash, when present.
fn hash_column<T>(column: &'static str, text: Option<&str>) -> Result<Option<T>, RoundDecodeError>
where
    T: std::str::FromStr<Err = bitcoin::hex::HexToArrayError>,
{
    text.map(|t| hash_text(column, t)).transpose()
}

fn decode_round(round: &RoundRow, d: &DrawColumns) -> Result<Round, RoundDecodeError> {
    let values = DrawColumnValues {
        tip_height: d.tip_height_at_close,
        tip_hash: hash_column("tip_hash_at_close", d.tip_hash_at_close.as_deref())?,
        bets_commitment: hash_column("bets_commitment", d.bets_commitment.as_deref())?,
        block_height: d.block_height,
        block_hash: hash_column("block_hash", d.block_hash.as_deref())?,
        seed: hash_column("seed", d.seed.as_deref())?,
        ticket: d.ticket,
        winner_bet_id: d.winner_bet_id,
    };
    Ok(Round {
        id: round.id,
        phase: RoundPhase::from_columns(round.status, &values).map_err(RoundDecodeError::Phase)?,
        opened_at: round.opened_at,
        closes_at: round.closes_at,
        pot_sats: round.pot_sats,
        bettors: round.bettors,
        bet_count: round.bet_count,
    })
}

fn decode_payout(p: &TransferRow) -> Result<Payout, RoundDecodeError> {
    Ok(Payout {
        txid: hash_text::<Txid>("transfers.txid", &p.txid)?,
        winner_sats: p.amount_sats,
        commission_sats: p.commission_sats,
        fee_sats: p.fee_sats,
        status: p.status,
        block_height: p.block_height,
    })
}

fn decode_payout_summary(p: &PayoutSummaryRow) -> Result<Payout, RoundDecodeError> {
    Ok(Payout {
        txid: hash_text::<Txid>("transfers.txid", &p.txid)?,
        winner_sats: p.amount_sats,
        commission_sats: p.commission_sats,
        fee_sats: p.fee_sats,
        status: p.status,
        block_height: p.block_height,
    })
}

impl RoundDetail {
    /// The round as the domain reads it: its phase, bets and payout typed.
    ///
    /// # Errors
    /// [`RoundDecodeError`] for a row no lifecycle writes.
    pub fn decode(&self) -> Result<RoundProof, RoundDecodeError> {
        Ok(RoundProof {
            round: decode_round(&self.round, &self.draw)?,
            bets: self.bets.clone(),
            payout: self.payout.as_ref().map(decode_payout).transpose()?,
        })
    }
}

impl RoundSummaryRow {
    /// The summary as the domain reads it.
    ///
    /// # Errors
    /// [`RoundDecodeError`] for a row no lifecycle writes.
    pub fn decode(&self) -> Result<RoundSummary, RoundDecodeError> {
        Ok(RoundSummary {
            round: decode_round(&self.round, &self.draw)?,
            winner_username: self.winner_username.clone(),
            payout: self
                .payout
                .as_ref()
                .map(decode_payout_summary)
                .transpose()?,
            user_played: self.user_played,
        })
    }
}

impl Store {
    /// A round with its draw proof and payout, decoded at this edge.
    ///
    /// # Errors
    /// Database failures; [`StoreError::Round`] for a row no lifecycle writes.
    pub async fn round_proof(&self, round_id: i64) -> Result<Option<RoundProof>, StoreError> {
        let Some(detail) = self.round_detail(round_id).await? else {
            return Ok(None);
        };
        detail
            .decode()
            .map(Some)
            .map_err(|source| StoreError::Round { round_id, source })
    }

    /// [`Store::round_summaries`], decoded at this edge.
    ///
    /// # Errors
    /// Database failures; [`StoreError::Round`] for a row no lifecycle writes.
    pub async fn round_page(
        &self,
        limit: i64,
        before_id: Option<i64>,
        user_id: Option<i64>,
    ) -> Result<Vec<RoundSummary>, StoreError> {
        self.round_summaries(limit, before_id, user_id)
            .await?
            .iter()
            .map(|r| {
                r.decode().map_err(|source| StoreError::Round {
                    round_id: r.round.id,
                    source,
                })
            })
            .collect()
    }
}
