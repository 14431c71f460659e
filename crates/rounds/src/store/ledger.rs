//! The SQL of money: outputs the service controls, transfers (deposits, bets, withdrawals, payouts), processed blocks, and the round transitions that move money.
//!
//! Every money-moving step is one database transaction whose guards are in
//! SQL: an output is taken by a conditional `UPDATE … WHERE spent_txid IS
//! NULL` (checked row by row, so two processes on PostgreSQL cannot both
//! spend it), a round moves only from the status the caller saw, and a unique
//! index allows one payout per round. Signed transactions are written
//! (status `signed`) before they are broadcast, so a restart can finish them.

use std::str::FromStr;

use bitcoin::Txid;
use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

use super::idempotency::{bind_key, KeyClaim};
use super::settings::config_from_row;
use super::{state_column, txid_column, Backend, Store, StoreError};
use crate::domain::audit::{AuditActor, AuditDetails, AuditEvent};
use crate::domain::ledger::{CorrectionView, LedgerTotals, UnspentView};
use crate::domain::money::{Coin, Intent};
use crate::domain::round::{BetStatus, OutputOrigin, RoundStatus, TransferKind, TransferStatus};
use crate::domain::settings::{ConfigDiff, ServiceConfig, DUST_COIN_MAX_SATS, PAYMENT_COINS_READ};
use crate::domain::time::unix_now;
use crate::domain::transfer::Transfer;

/// A transfer as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferRow {
    /// Row id.
    pub id: i64,
    /// `deposit`, `bet`, `withdrawal` or `payout`.
    pub kind: TransferKind,
    /// The user concerned (payout: the winner).
    pub user_id: Option<i64>,
    /// The round (bets, payouts).
    pub round_id: Option<i64>,
    /// Txid (display hex).
    pub txid: String,
    /// Deposits: the output index.
    pub vout: i64,
    /// Our own transactions: the signed transaction in hex.
    pub raw_tx: Option<String>,
    /// Deposit value, bet or withdrawal amount, payout to the winner.
    pub amount_sats: i64,
    /// Miner fee of our own transactions.
    pub fee_sats: i64,
    /// Payouts: the commission to the fee address.
    pub commission_sats: i64,
    /// Withdrawals: the destination.
    pub address: Option<String>,
    /// `signed`, `broadcast`, `failed`, `broadcast_failed` (payouts), `seen` (deposits).
    pub status: TransferStatus,
    /// Height of the confirming block.
    pub block_height: Option<i64>,
    /// Unix seconds.
    pub created_at: i64,
    /// Deposits: confirmations consensus requires before it can be spent (coinbase: 100).
    pub min_confirmations: i64,
}

/// What a bet or withdrawal reads before it signs, from one statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentContext {
    /// The service config (pause flag, minimums, fee rate, confirmations).
    pub config: ServiceConfig,
    /// The newest round, if any.
    pub round: Option<NewestRound>,
    /// The paying user, if the user exists.
    pub user: Option<PayerRow>,
    /// Height of the last processed block, if any.
    pub tip_height: Option<i64>,
    /// The user's spendable coins at `tip_height`, largest first, at most
    /// [`PAYMENT_COINS_READ`] of them, no dust (what
    /// [`Store::spendable_outputs_at`] returns at that tip).
    pub coins: Vec<Coin>,
}

/// The newest round as a payment reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewestRound {
    /// Its id.
    pub id: i64,
    /// Its status.
    pub status: RoundStatus,
    /// When it stops taking bets (unix seconds).
    pub closes_at: i64,
    /// Its placed bets.
    pub bets: i64,
}

/// The paying user's row as a payment reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayerRow {
    /// The user's wallet derivation index.
    pub derivation_index: i64,
    /// What a reversed deposit left the user owing.
    pub debt_sats: i64,
    /// The stored token version (a session's token must carry it).
    pub token_version: i64,
}

/// Why a money step was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// The round is no longer in the status the step needs.
    #[error("round {round_id} is not {expected}")]
    WrongStatus {
        /// The round.
        round_id: i64,
        /// The status the step needed.
        expected: RoundStatus,
    },
    /// The round holds as many bets as its payout can spend
    /// ([`MAX_ROUND_BETS`](crate::domain::settings::MAX_ROUND_BETS)).
    #[error("round {round_id} is full ({max_bets} bets)")]
    RoundFull {
        /// The round.
        round_id: i64,
        /// The most bets a round takes.
        max_bets: i64,
    },
    /// The user holds its share of the round's bets.
    #[error("user {user_id} holds {max_bets} bets of round {round_id}, its share")]
    UserShareFull {
        /// The round.
        round_id: i64,
        /// The user.
        user_id: i64,
        /// The most bets one user places in a round.
        max_bets: i64,
    },
    /// The service is paused: no payment is written.
    #[error("the service is paused")]
    Paused,
    /// One of the outputs was taken by another transaction meanwhile.
    #[error("output {0} is already spent")]
    OutputTaken(i64),
    /// The round already has a payout.
    #[error("round {0} already has a payout")]
    PayoutExists(i64),
    /// The payment's idempotency key was taken over by another request
    /// (its claim outlived the lease); the payment was rolled back.
    #[error("the idempotency key was taken over by another request")]
    IdempotencyClaimLost,
    /// Database failure.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for LedgerError {
    fn from(e: sqlx::Error) -> Self {
        LedgerError::Store(StoreError::Database(e))
    }
}

pub(super) const OUTPUT_COLS: &str =
    "id, txid, vout, amount_sats, user_id, round_id, origin, block_height";
/// The coins a user may spend (binds: `$1` user, `$2` tip height, `$3`
/// deposit confirmations, `$4` the dust bound, `$5` [`OutputOrigin::Deposit`]): unspent, confirmed, deposits
/// deep enough (coinbase: 100), and worth more than dust.
const SPENDABLE: &str = "user_id = $1 AND spent_txid IS NULL AND amount_sats > $4 \
     AND block_height IS NOT NULL AND (origin <> $5 OR \
     ($2 - block_height + 1 >= $3 AND $2 - block_height + 1 >= min_confirmations))";

pub(super) const TRANSFER_COLS: &str =
    "id, kind, user_id, round_id, txid, vout, raw_tx, amount_sats, fee_sats, \
     commission_sats, address, status, block_height, created_at, min_confirmations";
pub(super) fn output_from_row(r: &AnyRow) -> Result<Coin, StoreError> {
    Ok(Coin {
        id: r.try_get("id")?,
        txid: txid_column(r, "outputs")?,
        vout: r.try_get("vout")?,
        amount_sats: r.try_get("amount_sats")?,
        user_id: r.try_get("user_id")?,
        round_id: r.try_get("round_id")?,
        origin: state_column(r, "origin")?,
        block_height: r.try_get("block_height")?,
    })
}

pub(super) fn transfer_from_row(r: &AnyRow) -> Result<TransferRow, sqlx::Error> {
    Ok(TransferRow {
        id: r.try_get("id")?,
        kind: state_column(r, "kind")?,
        user_id: r.try_get("user_id")?,
        round_id: r.try_get("round_id")?,
        txid: r.try_get("txid")?,
        vout: r.try_get("vout")?,
        raw_tx: r.try_get("raw_tx")?,
        amount_sats: r.try_get("amount_sats")?,
        fee_sats: r.try_get("fee_sats")?,
        commission_sats: r.try_get("commission_sats")?,
        address: r.try_get("address")?,
        status: state_column(r, "status")?,
        block_height: r.try_get("block_height")?,
        created_at: r.try_get("created_at")?,
        min_confirmations: r.try_get("min_confirmations")?,
    })
}

impl TransferRow {
    /// The transfer's txid, decoded at this edge.
    ///
    /// # Errors
    /// [`StoreError::TransferTxid`] when the stored txid is not one.
    pub fn txid(&self) -> Result<Txid, StoreError> {
        Txid::from_str(&self.txid).map_err(|source| StoreError::TransferTxid {
            transfer_id: self.id,
            text: self.txid.clone(),
            source,
        })
    }

    /// The transfer as the domain reads it, its txid decoded at this edge.
    ///
    /// # Errors
    /// [`StoreError::TransferTxid`] when the stored txid is not one.
    pub fn decode(&self) -> Result<Transfer, StoreError> {
        let txid = self.txid()?;
        Ok(Transfer {
            id: self.id,
            kind: self.kind,
            round_id: self.round_id,
            txid,
            amount_sats: self.amount_sats,
            fee_sats: self.fee_sats,
            address: self.address.clone(),
            status: self.status,
            block_height: self.block_height,
            created_at: self.created_at,
            min_confirmations: self.min_confirmations,
        })
    }
}

/// The sums of the conservation check: `(name, table, column, filter)`,
/// the filters binding `$1` deposit, `$2` reversed, `$3` payout, `$4`
/// withdrawal, `$5` failed and `$6` superseded.
const LEDGER_SUMS: [(&str, &str, &str, &str); 8] = [
    (
        "deposits_sats",
        "transfers",
        "amount_sats",
        "kind = $1 AND status <> $2",
    ),
    (
        "users_unspent_sats",
        "outputs",
        "amount_sats",
        "user_id IS NOT NULL AND spent_txid IS NULL",
    ),
    (
        "pots_in_flight_sats",
        "outputs",
        "amount_sats",
        "round_id IS NOT NULL AND spent_txid IS NULL",
    ),
    (
        "commission_paid_sats",
        "transfers",
        "commission_sats",
        "kind = $3 AND status NOT IN ($5, $6)",
    ),
    (
        "withdrawn_sats",
        "transfers",
        "amount_sats",
        "kind = $4 AND status NOT IN ($5, $6)",
    ),
    (
        "miner_fees_sats",
        "transfers",
        "fee_sats",
        "kind <> $1 AND status NOT IN ($5, $6)",
    ),
    (
        "corrections_sats",
        "ledger_corrections",
        "amount_sats",
        "1 = 1",
    ),
    ("debts_sats", "users", "debt_sats", "debt_sats <> 0"),
];

/// What [`LEDGER_SUMS`] reads, by name.
struct LedgerSums {
    deposits_sats: i64,
    users_unspent_sats: i64,
    pots_in_flight_sats: i64,
    commission_paid_sats: i64,
    withdrawn_sats: i64,
    miner_fees_sats: i64,
    corrections_sats: i64,
    debts_sats: i64,
}

/// Sum as BIGINT on both backends (PostgreSQL's SUM(bigint) is numeric).
pub(super) fn sum(expr: &str) -> String {
    format!("CAST(COALESCE(SUM({expr}), 0) AS BIGINT)")
}

pub(super) type Tx<'a> = Transaction<'a, Any>;

/// `$first, $first+1, …` for `n` parameters.
pub(super) fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Rows per batched statement (well below both backends' parameter limits).
pub(super) const BATCH: usize = 500;

pub(super) async fn take_outputs(
    tx: &mut Tx<'_>,
    inputs: &[i64],
    txid: &str,
) -> Result<(), LedgerError> {
    // Batched, but the guard is the same: every row must still be unspent,
    // or the whole step rolls back.
    for chunk in inputs.chunks(BATCH) {
        let sql = format!(
            "UPDATE outputs SET spent_txid = $1 WHERE spent_txid IS NULL AND id IN ({})",
            placeholders(2, chunk.len())
        );
        let mut q = sqlx::query(&sql).bind(txid);
        for id in chunk {
            q = q.bind(id);
        }
        let done = q.execute(&mut **tx).await?;
        if done.rows_affected() != chunk.len() as u64 {
            return Err(LedgerError::OutputTaken(chunk[0]));
        }
    }
    Ok(())
}

pub(super) async fn insert_intent(tx: &mut Tx<'_>, intent: &Intent) -> Result<i64, LedgerError> {
    let txid = intent.txid.to_string();
    take_outputs(tx, &intent.inputs, &txid).await?;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO transfers (kind, user_id, round_id, txid, vout, raw_tx, amount_sats, fee_sats, \
         commission_sats, address, status, created_at) \
         VALUES ($1, $2, $3, $4, -1, $5, $6, $7, $8, $9, $11, $10) RETURNING id",
    )
    .bind(intent.kind)
    .bind(intent.user_id)
    .bind(intent.round_id)
    .bind(&txid)
    .bind(&intent.raw_tx)
    .bind(intent.amount_sats)
    .bind(intent.fee_sats)
    .bind(intent.commission_sats)
    .bind(intent.address.as_deref())
    .bind(unix_now())
    .bind(TransferStatus::Signed)
    .fetch_one(&mut **tx)
    .await
    .map_err(|e| match &e {
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            LedgerError::PayoutExists(intent.round_id.unwrap_or(0))
        }
        _ => LedgerError::from(e),
    })?;
    // All new outputs in one statement (a bet has two: pot and change).
    for chunk in intent.outputs.chunks(BATCH / 6) {
        let rows = (0..chunk.len())
            .map(|i| format!("({})", placeholders(1 + 6 * i, 6)))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "INSERT INTO outputs (txid, vout, amount_sats, user_id, round_id, origin) VALUES {rows}"
        );
        let mut q = sqlx::query(&sql);
        for o in chunk {
            q = q
                .bind(&txid)
                .bind(o.vout)
                .bind(o.amount_sats)
                .bind(o.user_id)
                .bind(o.round_id)
                .bind(o.origin);
        }
        q.execute(&mut **tx).await?;
    }
    Ok(id)
}

/// Grows round `$1` by `$4` bets worth `$3` while it is open (`$6`, bound
/// to [`RoundStatus::Open`]) at `$2` and holds at most `$5` bets after them; otherwise changes nothing (the row
/// count says so). The one guard of every path that writes bets.
pub(super) const GROW_OPEN_ROUND: &str =
    "UPDATE rounds SET pot_sats = pot_sats + $3, bet_count = bet_count + $4 \
     WHERE id = $1 AND status = $6 AND closes_at > $2 AND bet_count + $4 <= $5";

/// The per-user share of a round: the first of `bettors` (user → bets
/// being added) whose placed bets in round `round_id` and the new ones would
/// pass `max`. Read once the round's row is held (every bet write takes it
/// first; on SQLite under the process's write turn), so concurrent bets of
/// one user cannot pass it together.
pub(super) async fn user_share_refusal<'c, E>(
    executor: E,
    round_id: i64,
    bettors: &std::collections::BTreeMap<i64, i64>,
    max: i64,
) -> Result<Option<LedgerError>, LedgerError>
where
    E: sqlx::Executor<'c, Database = Any>,
{
    if bettors.values().all(|&n| n <= max) && bettors.len() <= BATCH {
        let sql = format!(
            "SELECT user_id, COUNT(*) AS n FROM bets WHERE round_id = $1 AND status = $2 \
             AND user_id IN ({}) GROUP BY user_id",
            placeholders(3, bettors.len())
        );
        let mut q = sqlx::query(&sql).bind(round_id).bind(BetStatus::Placed);
        for user in bettors.keys() {
            q = q.bind(*user);
        }
        for row in q.fetch_all(executor).await? {
            let user_id: i64 = row.try_get("user_id")?;
            let placed: i64 = row.try_get("n")?;
            if placed + bettors.get(&user_id).copied().unwrap_or(0) > max {
                return Ok(Some(LedgerError::UserShareFull {
                    round_id,
                    user_id,
                    max_bets: max,
                }));
            }
        }
        return Ok(None);
    }
    let user_id = bettors
        .iter()
        .find(|(_, &n)| n > max)
        .map_or(0, |(&u, _)| u);
    Ok(Some(LedgerError::UserShareFull {
        round_id,
        user_id,
        max_bets: max,
    }))
}

/// Refuses a payment's write while the service is paused. Run inside the
/// write's transaction after its first write: on PostgreSQL the config row
/// is shared-locked (the pause's update waits for the payments that read
/// "not paused", and they for it), on SQLite the write lock is held. So
/// once a pause has answered, no payment is saved.
pub(super) async fn refuse_if_paused(tx: &mut Tx<'_>, backend: Backend) -> Result<(), LedgerError> {
    let sql = match backend {
        Backend::Postgres => "SELECT paused FROM service_config WHERE id = 1 FOR SHARE",
        Backend::Sqlite => "SELECT paused FROM service_config WHERE id = 1",
    };
    let paused: Option<i64> = sqlx::query_scalar(sql).fetch_optional(&mut **tx).await?;
    if paused.unwrap_or(0) != 0 {
        return Err(LedgerError::Paused);
    }
    Ok(())
}

/// Undoes payment `t` (a bet or withdrawal the chain will not hold) once
/// its status says so: its inputs are released, its outputs dropped, and a
/// bet leaves its round's pot. The one place a payment is taken back.
pub(super) async fn undo_payment(tx: &mut Tx<'_>, t: &TransferRow) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE outputs SET spent_txid = NULL WHERE spent_txid = $1")
        .bind(&t.txid)
        .execute(&mut **tx)
        .await?;
    sqlx::query("DELETE FROM outputs WHERE txid = $1")
        .bind(&t.txid)
        .execute(&mut **tx)
        .await?;
    if t.kind == TransferKind::Bet {
        sqlx::query("UPDATE bets SET status = $2 WHERE txid = $1")
            .bind(&t.txid)
            .bind(BetStatus::Failed)
            .execute(&mut **tx)
            .await?;
        if let Some(r) = t.round_id {
            recount_round(tx, r).await?;
        }
    }
    Ok(())
}

/// Our payment that spent the output of `deposit`, if any.
async fn spender_of(
    tx: &mut Tx<'_>,
    deposit: &TransferRow,
) -> Result<Option<TransferRow>, sqlx::Error> {
    let spent_by: Option<Option<String>> = sqlx::query_scalar(
        "SELECT spent_txid FROM outputs WHERE txid = $1 AND vout = $2 AND origin = $3",
    )
    .bind(&deposit.txid)
    .bind(deposit.vout)
    .bind(OutputOrigin::Deposit)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(txid) = spent_by.flatten() else {
        return Ok(None);
    };
    sqlx::query(&format!(
        "SELECT {TRANSFER_COLS} FROM transfers WHERE txid = $1 AND kind <> $2"
    ))
    .bind(&txid)
    .bind(TransferKind::Deposit)
    .fetch_optional(&mut **tx)
    .await?
    .map(|r| transfer_from_row(&r))
    .transpose()
}

/// Whether payment `s`, which spent a reversed deposit, can still be taken
/// back: unconfirmed, and a withdrawal or a bet whose round is still open.
async fn may_undo(tx: &mut Tx<'_>, s: &TransferRow) -> Result<bool, sqlx::Error> {
    let round_open = match s.round_id {
        Some(r) => {
            sqlx::query_scalar::<_, String>("SELECT status FROM rounds WHERE id = $1")
                .bind(r)
                .fetch_optional(&mut **tx)
                .await?
                .as_deref()
                == Some(RoundStatus::Open.as_str())
        }
        None => false,
    };
    Ok(s.block_height.is_none()
        && matches!(s.status, TransferStatus::Signed | TransferStatus::Broadcast)
        && (s.kind == TransferKind::Withdrawal || (s.kind == TransferKind::Bet && round_open)))
}

/// Payment `s` spent `deposit` and stays: its unspent change is taken
/// back, it is set aside, and the user owes what the change does not
/// cover. Returns that debt.
async fn charge_spent_deposit(
    tx: &mut Tx<'_>,
    deposit: &TransferRow,
    s: &TransferRow,
) -> Result<i64, sqlx::Error> {
    let change: i64 = sqlx::query_scalar(&format!(
        "SELECT {} FROM outputs WHERE txid = $1 AND origin = $2 AND spent_txid IS NULL",
        sum("amount_sats")
    ))
    .bind(&s.txid)
    .bind(OutputOrigin::Change)
    .fetch_one(&mut **tx)
    .await?;
    sqlx::query("DELETE FROM outputs WHERE txid = $1 AND origin = $2 AND spent_txid IS NULL")
        .bind(&s.txid)
        .bind(OutputOrigin::Change)
        .execute(&mut **tx)
        .await?;
    sqlx::query("UPDATE transfers SET set_aside_at = $2 WHERE id = $1 AND set_aside_at IS NULL")
        .bind(s.id)
        .bind(unix_now())
        .execute(&mut **tx)
        .await?;
    let debt = (deposit.amount_sats - change).max(0);
    sqlx::query("UPDATE users SET debt_sats = debt_sats + $1 WHERE id = $2")
        .bind(debt)
        .bind(deposit.user_id)
        .execute(&mut **tx)
        .await?;
    Ok(debt)
}

pub(super) async fn recount_round(tx: &mut Tx<'_>, round_id: i64) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "UPDATE rounds SET pot_sats = (SELECT {} FROM bets WHERE round_id = $1 AND status = $2), \
         bettors = (SELECT COUNT(DISTINCT user_id) FROM bets WHERE round_id = $1 AND status = $2), \
         bet_count = (SELECT COUNT(*) FROM bets WHERE round_id = $1 AND status = $2) \
         WHERE id = $1",
        sum("amount_sats")
    ))
    .bind(round_id)
    .bind(BetStatus::Placed)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl Store {
    /// `(balance, pending balance, has pending)` of a user; see DESIGN §4.1.
    ///
    /// # Errors
    /// Database failures.
    pub async fn balances(
        &self,
        user_id: i64,
        confirmations: i64,
    ) -> Result<(i64, i64, bool), StoreError> {
        let tip = self.synced_tip().await?.map_or(0, |t| t.0);
        let row = sqlx::query(&format!(
            "SELECT {} AS balance, {} AS change_sats FROM outputs WHERE user_id = $1 AND spent_txid IS NULL",
            sum("CASE WHEN block_height IS NOT NULL AND amount_sats > $4 AND (origin <> $5 OR ($2 - block_height + 1 >= $3 AND $2 - block_height + 1 >= min_confirmations)) THEN amount_sats ELSE 0 END"),
            sum("CASE WHEN block_height IS NULL AND amount_sats > $4 AND origin = $6 THEN amount_sats ELSE 0 END"),
        ))
        .bind(user_id)
        .bind(tip)
        .bind(confirmations)
        .bind(DUST_COIN_MAX_SATS)
        .bind(OutputOrigin::Deposit)
        .bind(OutputOrigin::Change)
        .fetch_one(self.pool())
        .await?;
        // A debt left by a reversed deposit shows as a negative balance.
        let debt = self.user_debt(user_id).await?;
        let balance: i64 = row.try_get::<i64, _>("balance")? - debt;
        let change: i64 = row.try_get("change_sats")?;
        let pending: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM transfers WHERE user_id = $1 AND kind IN ($2, $3) \
             AND status IN ($4, $5) AND block_height IS NULL",
        )
        .bind(user_id)
        .bind(TransferKind::Bet)
        .bind(TransferKind::Withdrawal)
        .bind(TransferStatus::Signed)
        .bind(TransferStatus::Broadcast)
        .fetch_one(self.pool())
        .await?;
        Ok((balance, balance + change, pending > 0))
    }

    /// The user's credited, unspent outputs, largest first.
    ///
    /// # Errors
    /// Database failures.
    pub async fn spendable_outputs(
        &self,
        user_id: i64,
        confirmations: i64,
    ) -> Result<Vec<Coin>, StoreError> {
        let tip = self.synced_tip().await?.map_or(0, |t| t.0);
        self.spendable_outputs_at(user_id, confirmations, tip).await
    }

    /// What a payment by `user_id` reads before it signs (config, newest
    /// round, the user's key index, debt and token version, the synced tip,
    /// and the user's spendable coins at that tip), in one statement: one
    /// round trip where the session check, the context and the coins were
    /// three. Everything is read from one snapshot, so the coins are those
    /// spendable at the tip read with them.
    ///
    /// # Errors
    /// Database failures, or [`StoreError::Corrupt`] when the config row is missing.
    pub async fn payment_context(&self, user_id: i64) -> Result<PaymentContext, StoreError> {
        // One row per coin (the context repeated), or one row with no coin.
        // The coin conditions are those of `spendable_outputs_at`, with the
        // tip and the confirmations taken from the same row.
        let rows = sqlx::query(
            "SELECT c.fee_address, c.fee_rate_sat_vb, c.round_duration_seconds, c.min_bet_sats, \
             c.min_withdrawal_sats, c.deposit_confirmations, c.paused, \
             r.id AS newest_round, r.status AS round_status, r.closes_at AS round_closes_at, \
             r.bet_count AS round_bets, \
             u.derivation_index AS user_index, u.debt_sats AS user_debt, \
             u.token_version AS user_token_version, t.h AS tip_height, \
             o.id, o.txid, o.vout, o.amount_sats, o.user_id, o.round_id, o.origin, o.block_height \
             FROM service_config c \
             CROSS JOIN (SELECT MAX(height) AS h FROM blocks) t \
             LEFT JOIN rounds r ON r.id = (SELECT MAX(id) FROM rounds) \
             LEFT JOIN users u ON u.id = $1 \
             LEFT JOIN outputs o ON o.user_id = $1 AND u.id IS NOT NULL AND o.spent_txid IS NULL \
             AND o.amount_sats > $2 \
             AND o.block_height IS NOT NULL AND (o.origin <> $4 OR \
             (COALESCE(t.h, 0) - o.block_height + 1 >= c.deposit_confirmations \
             AND COALESCE(t.h, 0) - o.block_height + 1 >= o.min_confirmations)) \
             WHERE c.id = 1 \
             ORDER BY o.amount_sats DESC, o.id LIMIT $3",
        )
        .bind(user_id)
        .bind(DUST_COIN_MAX_SATS)
        .bind(PAYMENT_COINS_READ)
        .bind(OutputOrigin::Deposit)
        .fetch_all(self.pool())
        .await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::Corrupt("service_config row missing".into()))?;
        let config = config_from_row(row)?;
        let round = match row.try_get::<Option<i64>, _>("newest_round")? {
            Some(id) => Some(NewestRound {
                id,
                status: state_column(row, "round_status")?,
                closes_at: row.try_get("round_closes_at")?,
                bets: row.try_get("round_bets")?,
            }),
            None => None,
        };
        let user = match row.try_get::<Option<i64>, _>("user_index")? {
            Some(derivation_index) => Some(PayerRow {
                derivation_index,
                debt_sats: row.try_get("user_debt")?,
                token_version: row.try_get("user_token_version")?,
            }),
            None => None,
        };
        let mut coins = Vec::with_capacity(rows.len());
        for r in &rows {
            if r.try_get::<Option<i64>, _>("id")?.is_some() {
                coins.push(output_from_row(r)?);
            }
        }
        Ok(PaymentContext {
            config,
            round,
            user,
            tip_height: row.try_get("tip_height")?,
            coins,
        })
    }

    /// [`Store::spendable_outputs`] with the synced tip height already read:
    /// the largest [`PAYMENT_COINS_READ`] coins worth more than dust (a
    /// payment spends at most one transaction's worth; thousands of small
    /// deposits no longer make every payment of their owner read them all).
    ///
    /// # Errors
    /// Database failures.
    pub async fn spendable_outputs_at(
        &self,
        user_id: i64,
        confirmations: i64,
        tip_height: i64,
    ) -> Result<Vec<Coin>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {OUTPUT_COLS} FROM outputs WHERE {SPENDABLE} \
             ORDER BY amount_sats DESC, id LIMIT $6"
        ))
        .bind(user_id)
        .bind(tip_height)
        .bind(confirmations)
        .bind(DUST_COIN_MAX_SATS)
        .bind(OutputOrigin::Deposit)
        .bind(PAYMENT_COINS_READ)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(output_from_row).collect()
    }

    /// The sum of every coin [`Store::spendable_outputs_at`] would list
    /// without its limit: read only when a payment's coins were cut at the
    /// limit, so that its refusal names the whole balance.
    ///
    /// # Errors
    /// Database failures.
    pub async fn spendable_sum_at(
        &self,
        user_id: i64,
        confirmations: i64,
        tip_height: i64,
    ) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(&format!(
            "SELECT {} FROM outputs WHERE {SPENDABLE}",
            sum("amount_sats")
        ))
        .bind(user_id)
        .bind(tip_height)
        .bind(confirmations)
        .bind(DUST_COIN_MAX_SATS)
        .bind(OutputOrigin::Deposit)
        .fetch_one(self.pool())
        .await?)
    }

    /// What `user_id` holds in dust (unspent coins of at most
    /// [`DUST_COIN_MAX_SATS`]): never spent, not in the balance, shown apart.
    ///
    /// # Errors
    /// Database failures.
    pub async fn dust_sats(&self, user_id: i64) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(&format!(
            "SELECT {} FROM outputs WHERE user_id = $1 AND spent_txid IS NULL AND amount_sats <= $2",
            sum("amount_sats")
        ))
        .bind(user_id)
        .bind(DUST_COIN_MAX_SATS)
        .fetch_one(self.pool())
        .await?)
    }

    /// [`Store::place_bet`] in a transaction of its own: a group's bets
    /// when the group as a whole was refused.
    ///
    /// # Errors
    /// [`LedgerError::WrongStatus`], [`LedgerError::OutputTaken`].
    pub(super) async fn place_bet_alone(&self, intent: &Intent) -> Result<(i64, i64), LedgerError> {
        self.place_bet_keyed(intent, None).await
    }

    /// Writes a bet alone (not in a group), binding `claim`'s idempotency
    /// key to it in the same transaction. Returns `(bet id, transfer id)`.
    ///
    /// # Errors
    /// As [`Store::place_bet`], and [`LedgerError::IdempotencyClaimLost`].
    pub async fn place_bet_keyed(
        &self,
        intent: &Intent,
        claim: Option<&KeyClaim>,
    ) -> Result<(i64, i64), LedgerError> {
        let round_id = intent.round_id.unwrap_or(0);
        let _turn = self.write_turn().await;
        let mut tx = self.pool().begin().await?;
        // A write first: takes SQLite's write lock and PostgreSQL's row lock
        // on the round, so closing waits for this bet or this bet sees it.
        // closes_at in the same statement as the status: a bet after the
        // close time is refused even while the engine has not closed yet.
        // The pot grows by the bet here (a rollback undoes it), instead of
        // a recount over every bet of the round, which made a bet's cost
        // grow with the round.
        // The bet count in the same statement: a full round refuses the bet
        // under the same lock as a closed one.
        let now = unix_now();
        let open = sqlx::query(GROW_OPEN_ROUND)
            .bind(round_id)
            .bind(now)
            .bind(intent.amount_sats)
            .bind(1_i64)
            .bind(self.max_round_bets())
            .bind(RoundStatus::Open)
            .execute(&mut *tx)
            .await?;
        if open.rows_affected() != 1 {
            return Err(self.refusal(&mut tx, round_id, now).await?);
        }
        refuse_if_paused(&mut tx, self.backend()).await?;
        let bettor = std::collections::BTreeMap::from([(intent.user_id.unwrap_or(0), 1)]);
        if let Some(refusal) =
            user_share_refusal(&mut *tx, round_id, &bettor, self.max_user_round_bets()).await?
        {
            return Err(refusal);
        }
        let transfer_id = insert_intent(&mut tx, intent).await?;
        let bet_id: i64 = sqlx::query_scalar(
            "INSERT INTO bets (round_id, user_id, amount_sats, txid, created_at, status, fee_sats) \
             VALUES ($1, $2, $3, $4, $5, $7, $6) RETURNING id",
        )
        .bind(round_id)
        .bind(intent.user_id)
        .bind(intent.amount_sats)
        .bind(intent.txid.to_string())
        .bind(unix_now())
        .bind(intent.fee_sats)
        .bind(BetStatus::Placed)
        .fetch_one(&mut *tx)
        .await?;
        // A new bettor unless this user already has a placed bet in the
        // round. Read after the round's lock is held (a statement of its own,
        // so PostgreSQL reads with a snapshot that sees every bet committed
        // before this one), by the (round_id, user_id) index.
        sqlx::query(
            "UPDATE rounds SET bettors = bettors + 1 WHERE id = $1 AND NOT EXISTS \
             (SELECT 1 FROM bets WHERE round_id = $1 AND user_id = $2 AND status = $4 AND id <> $3)",
        )
        .bind(round_id)
        .bind(intent.user_id)
        .bind(bet_id)
        .bind(BetStatus::Placed)
        .execute(&mut *tx)
        .await?;
        if let Some(claim) = claim {
            bind_key(&mut tx, claim, transfer_id).await?;
        }
        tx.commit().await?;
        Ok((bet_id, transfer_id))
    }

    /// Why round `round_id` refused a bet at `now`: full, or not open.
    async fn refusal(
        &self,
        tx: &mut Tx<'_>,
        round_id: i64,
        now: i64,
    ) -> Result<LedgerError, sqlx::Error> {
        let open_count: Option<i64> = sqlx::query_scalar(
            "SELECT bet_count FROM rounds WHERE id = $1 AND status = $3 AND closes_at > $2",
        )
        .bind(round_id)
        .bind(now)
        .bind(RoundStatus::Open)
        .fetch_optional(&mut **tx)
        .await?;
        Ok(if open_count.is_some_and(|n| n >= self.max_round_bets()) {
            LedgerError::RoundFull {
                round_id,
                max_bets: self.max_round_bets(),
            }
        } else {
            LedgerError::WrongStatus {
                round_id,
                expected: RoundStatus::Open,
            }
        })
    }

    /// Writes a withdrawal intent. Returns the transfer id.
    ///
    /// # Errors
    /// [`LedgerError::OutputTaken`].
    pub async fn record_withdrawal(&self, intent: &Intent) -> Result<i64, LedgerError> {
        self.record_withdrawal_keyed(intent, None).await
    }

    /// [`Store::record_withdrawal`], binding `claim`'s idempotency key to the
    /// withdrawal in the same transaction.
    ///
    /// # Errors
    /// [`LedgerError::OutputTaken`], [`LedgerError::IdempotencyClaimLost`].
    pub async fn record_withdrawal_keyed(
        &self,
        intent: &Intent,
        claim: Option<&KeyClaim>,
    ) -> Result<i64, LedgerError> {
        let _turn = self.write_turn().await;
        let mut tx = self.pool().begin().await?;
        let id = insert_intent(&mut tx, intent).await?;
        refuse_if_paused(&mut tx, self.backend()).await?;
        if let Some(claim) = claim {
            bind_key(&mut tx, claim, id).await?;
        }
        tx.commit().await?;
        Ok(id)
    }

    /// Undoes a bet or withdrawal whose broadcast was refused: releases its
    /// inputs, drops its outputs, marks it failed and recounts its round.
    ///
    /// # Errors
    /// Database failures.
    pub async fn fail_transfer(&self, transfer_id: i64) -> Result<(), StoreError> {
        self.fail_transfer_keeping(transfer_id, &[]).await
    }

    /// [`Store::fail_transfer`], except that the inputs in `lost` (found
    /// spent on the chain by a transaction we do not know) are not released
    /// but taken out of the books as ledger corrections.
    ///
    /// # Errors
    /// Database failures.
    pub async fn fail_transfer_keeping(
        &self,
        transfer_id: i64,
        lost: &[Coin],
    ) -> Result<(), StoreError> {
        let mut tx = self.pool().begin().await?;
        let row = sqlx::query(&format!(
            "UPDATE transfers SET status = $2 WHERE id = $1 AND status = $3 \
             AND bump_of IS NULL RETURNING {TRANSFER_COLS}"
        ))
        .bind(transfer_id)
        .bind(TransferStatus::Failed)
        .bind(TransferStatus::Signed)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            tx.rollback().await?;
            return Ok(());
        };
        let t = transfer_from_row(&row)?;
        for o in lost {
            sqlx::query("DELETE FROM outputs WHERE id = $1 AND spent_txid = $2")
                .bind(o.id)
                .bind(&t.txid)
                .execute(&mut *tx)
                .await?;
            sqlx::query(
                "INSERT INTO ledger_corrections (at, round_id, transfer_id, txid, vout, amount_sats, reason) \
                 VALUES ($1, NULL, $2, $3, $4, $5, 'spent by an unknown transaction')",
            )
            .bind(unix_now())
            .bind(transfer_id)
            .bind(o.txid.to_string())
            .bind(o.vout)
            .bind(o.amount_sats)
            .execute(&mut *tx)
            .await?;
        }
        undo_payment(&mut tx, &t).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Our transfers written but not yet broadcast (to finish after a
    /// crash), except those set aside and fee bumps (a refused bump must
    /// not release inputs its older version still spends: the bumper
    /// finishes those, `service::bump`).
    ///
    /// # Errors
    /// Database failures.
    pub async fn signed_transfers(&self) -> Result<Vec<TransferRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {TRANSFER_COLS} FROM transfers WHERE status = $1 AND set_aside_at IS NULL \
             AND bump_of IS NULL ORDER BY id"
        ))
        .bind(TransferStatus::Signed)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .iter()
            .map(transfer_from_row)
            .collect::<Result<_, _>>()?)
    }

    /// Our broadcast transfers without a confirmation, except those set
    /// aside (re-sent every few blocks and after a reorg).
    ///
    /// # Errors
    /// Database failures.
    pub async fn unconfirmed_broadcasts(&self) -> Result<Vec<TransferRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {TRANSFER_COLS} FROM transfers WHERE status = $1 AND kind <> $2 \
             AND block_height IS NULL AND set_aside_at IS NULL ORDER BY id"
        ))
        .bind(TransferStatus::Broadcast)
        .bind(TransferKind::Deposit)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .iter()
            .map(transfer_from_row)
            .collect::<Result<_, _>>()?)
    }

    /// A transfer by id.
    ///
    /// # Errors
    /// Database failures.
    pub async fn transfer(&self, id: i64) -> Result<Option<TransferRow>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {TRANSFER_COLS} FROM transfers WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(self.pool())
        .await?;
        Ok(row.map(|r| transfer_from_row(&r)).transpose()?)
    }

    /// The user's transfers, newest first; one this process broadcast
    /// whose mark is still being written reads `broadcast`, as its payer
    /// was told ([`Store::mark_broadcast_soon`]).
    ///
    /// # Errors
    /// Database failures.
    pub async fn user_transfers(
        &self,
        user_id: i64,
        limit: i64,
        before_id: Option<i64>,
    ) -> Result<Vec<TransferRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {TRANSFER_COLS} FROM transfers WHERE user_id = $1 AND id < $2 \
             AND status <> $4 ORDER BY id DESC LIMIT $3"
        ))
        .bind(user_id)
        .bind(before_id.unwrap_or(i64::MAX))
        .bind(limit)
        .bind(TransferStatus::Superseded)
        .fetch_all(self.pool())
        .await?;
        let mut transfers: Vec<TransferRow> = rows
            .iter()
            .map(transfer_from_row)
            .collect::<Result<_, _>>()?;
        for t in &mut transfers {
            if t.status == TransferStatus::Signed && self.broadcast_unmarked(t.id) {
                t.status = TransferStatus::Broadcast;
            }
        }
        Ok(transfers)
    }

    /// [`Store::user_transfers`], decoded at this edge.
    ///
    /// # Errors
    /// Database failures; [`StoreError::TransferTxid`].
    pub async fn user_transfer_page(
        &self,
        user_id: i64,
        limit: i64,
        before_id: Option<i64>,
    ) -> Result<Vec<Transfer>, StoreError> {
        self.user_transfers(user_id, limit, before_id)
            .await?
            .iter()
            .map(TransferRow::decode)
            .collect()
    }

    /// Totals for the conservation check.
    ///
    /// # Errors
    /// Database failures.
    pub async fn ledger_totals(&self) -> Result<LedgerTotals, StoreError> {
        let sums = self.ledger_sums().await?;
        let corrections = self.ledger_corrections().await?;
        let unspent = self.unspent_outputs().await?;
        let synced_height = self.synced_tip().await?.map_or(0, |t| t.0);
        Ok(LedgerTotals {
            synced_height,
            deposits_sats: sums.deposits_sats,
            users_unspent_sats: sums.users_unspent_sats,
            pots_in_flight_sats: sums.pots_in_flight_sats,
            commission_paid_sats: sums.commission_paid_sats,
            withdrawn_sats: sums.withdrawn_sats,
            miner_fees_sats: sums.miner_fees_sats,
            corrections_sats: sums.corrections_sats,
            corrections,
            debts_sats: sums.debts_sats,
            unspent,
        })
    }

    /// The conservation check's sums, from one statement so that they come
    /// from one consistent snapshot.
    async fn ledger_sums(&self) -> Result<LedgerSums, StoreError> {
        let totals = LEDGER_SUMS
            .iter()
            .map(|(name, table, column, filter)| {
                format!(
                    "(SELECT {} FROM {table} WHERE {filter}) AS {name}",
                    sum(column)
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let row = sqlx::query(&format!("SELECT {totals}"))
            .bind(TransferKind::Deposit)
            .bind(TransferStatus::Reversed)
            .bind(TransferKind::Payout)
            .bind(TransferKind::Withdrawal)
            .bind(TransferStatus::Failed)
            .bind(TransferStatus::Superseded)
            .fetch_one(self.pool())
            .await?;
        Ok(LedgerSums {
            deposits_sats: row.try_get("deposits_sats")?,
            users_unspent_sats: row.try_get("users_unspent_sats")?,
            pots_in_flight_sats: row.try_get("pots_in_flight_sats")?,
            commission_paid_sats: row.try_get("commission_paid_sats")?,
            withdrawn_sats: row.try_get("withdrawn_sats")?,
            miner_fees_sats: row.try_get("miner_fees_sats")?,
            corrections_sats: row.try_get("corrections_sats")?,
            debts_sats: row.try_get("debts_sats")?,
        })
    }

    /// The ledger corrections, oldest first.
    async fn ledger_corrections(&self) -> Result<Vec<CorrectionView>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, at, round_id, txid, vout, amount_sats, reason FROM ledger_corrections ORDER BY id",
        )
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(CorrectionView {
                    at: r.try_get("at")?,
                    round_id: r.try_get("round_id")?,
                    txid: txid_column(r, "ledger_corrections")?,
                    vout: r.try_get("vout")?,
                    amount_sats: r.try_get("amount_sats")?,
                    reason: r.try_get("reason")?,
                })
            })
            .collect()
    }

    /// Every unspent output the service holds.
    async fn unspent_outputs(&self) -> Result<Vec<UnspentView>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, txid, vout, amount_sats FROM outputs WHERE spent_txid IS NULL ORDER BY id",
        )
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(UnspentView {
                    txid: txid_column(r, "outputs")?,
                    vout: r.try_get("vout")?,
                    amount_sats: r.try_get("amount_sats")?,
                })
            })
            .collect()
    }

    /// Our transfer with this txid, if any.
    ///
    /// # Errors
    /// Database failures.
    pub async fn transfer_by_txid(&self, txid: &Txid) -> Result<Option<TransferRow>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {TRANSFER_COLS} FROM transfers WHERE txid = $1 AND kind <> $2 ORDER BY id LIMIT 1"
        ))
        .bind(txid.to_string())
        .bind(TransferKind::Deposit)
        .fetch_optional(self.pool())
        .await?;
        Ok(row.map(|r| transfer_from_row(&r)).transpose()?)
    }

    /// Outputs taken by transaction `txid` (the inputs of one of ours).
    ///
    /// # Errors
    /// Database failures.
    pub async fn outputs_spent_by(&self, txid: &Txid) -> Result<Vec<Coin>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {OUTPUT_COLS} FROM outputs WHERE spent_txid = $1 ORDER BY id"
        ))
        .bind(txid.to_string())
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(output_from_row).collect()
    }

    /// Counts a broadcast attempt of transfer `id` that had no settled
    /// answer, at most once per block `height`. Returns the attempts so far.
    ///
    /// # Errors
    /// Database failures.
    pub async fn count_broadcast_attempt(&self, id: i64, height: i64) -> Result<i64, StoreError> {
        sqlx::query(
            "UPDATE transfers SET broadcast_attempts = broadcast_attempts + 1, attempt_height = $2 \
             WHERE id = $1 AND (attempt_height IS NULL OR attempt_height < $2)",
        )
        .bind(id)
        .bind(height)
        .execute(self.pool())
        .await?;
        Ok(
            sqlx::query_scalar("SELECT broadcast_attempts FROM transfers WHERE id = $1")
                .bind(id)
                .fetch_optional(self.pool())
                .await?
                .unwrap_or(0),
        )
    }

    /// Whether transfer `id` was set aside (the worker no longer sends it).
    ///
    /// # Errors
    /// Database failures.
    pub async fn is_set_aside(&self, id: i64) -> Result<bool, StoreError> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM transfers WHERE id = $1 AND set_aside_at IS NOT NULL",
        )
        .bind(id)
        .fetch_one(self.pool())
        .await?;
        Ok(n > 0)
    }

    /// Sets a transfer that keeps failing aside: the worker skips it from
    /// now on; writes `transfer_set_aside` to the audit log, once. Returns
    /// whether this call set it aside.
    ///
    /// # Errors
    /// Database failures.
    pub async fn set_transfer_aside(&self, id: i64, reason: &str) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin().await?;
        let row = sqlx::query(&format!(
            "UPDATE transfers SET set_aside_at = $2 WHERE id = $1 AND set_aside_at IS NULL RETURNING {TRANSFER_COLS}"
        ))
        .bind(id)
        .bind(unix_now())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            tx.rollback().await?;
            return Ok(false);
        };
        let t = transfer_from_row(&row)?;
        super::settings::insert_audit_entry(
            &mut tx,
            AuditEvent::TransferSetAside,
            AuditActor::Engine,
            &ConfigDiff::new(),
            &AuditDetails {
                transfer_id: Some(t.id),
                kind: Some(t.kind.as_str().to_owned()),
                txid: Some(t.txid.clone()),
                user_id: t.user_id,
                round_id: t.round_id,
                reason: Some(reason.to_string()),
                ..AuditDetails::none()
            },
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Writes `unknown_spend` to the audit log, once per output: an output
    /// the service holds is spent on the chain by a transaction it does not
    /// know.
    ///
    /// # Errors
    /// Database failures.
    pub async fn audit_unknown_spend(
        &self,
        txid: &Txid,
        vout: i64,
        amount_sats: i64,
    ) -> Result<(), StoreError> {
        let details = AuditDetails {
            txid: Some(txid.to_string()),
            vout: Some(vout),
            amount_sats: Some(amount_sats),
            ..AuditDetails::none()
        };
        let mut tx = self.pool().begin().await?;
        // Once per output, however often (and by however many processes)
        // the worker finds it: the key decides, inside this transaction.
        let first = sqlx::query(
            "INSERT INTO unknown_spends (txid, vout) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        )
        .bind(txid.to_string())
        .bind(vout)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if first {
            super::settings::insert_audit_entry(
                &mut tx,
                AuditEvent::UnknownSpend,
                AuditActor::Engine,
                &ConfigDiff::new(),
                &details,
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// What user `user_id` owes after a reversed deposit (0 normally).
    ///
    /// # Errors
    /// Database failures.
    pub async fn user_debt(&self, user_id: i64) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT debt_sats FROM users WHERE id = $1")
                .bind(user_id)
                .fetch_optional(self.pool())
                .await?
                .unwrap_or(0),
        )
    }

    /// Deposits whose block was reorganised out and that no block has
    /// confirmed since.
    ///
    /// # Errors
    /// Database failures.
    pub async fn unconfirmed_deposits(&self) -> Result<Vec<TransferRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {TRANSFER_COLS} FROM transfers WHERE kind = $1 AND status = $2 \
             AND block_height IS NULL ORDER BY id"
        ))
        .bind(TransferKind::Deposit)
        .bind(TransferStatus::Seen)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .iter()
            .map(transfer_from_row)
            .collect::<Result<_, _>>()?)
    }

    /// A deposit gone from the chain for good: marks it `reversed` and takes
    /// its output out of the books, so it is never offered again. If our
    /// transaction `S` spent it, `S` is invalid too: a withdrawal, or a bet
    /// of a round still open, is undone (nothing left the user); otherwise
    /// (a bet already committed to a draw) `S` is set aside, its change to
    /// the user is dropped and what the user spent beyond that becomes the
    /// user's debt. Writes `deposit_reversed` to the audit log. Returns the
    /// debt added, or `None` when the deposit was not waiting to be reversed.
    ///
    /// # Errors
    /// Database failures.
    pub async fn reverse_deposit(&self, transfer_id: i64) -> Result<Option<i64>, StoreError> {
        let mut tx = self.pool().begin().await?;
        let row = sqlx::query(&format!(
            "UPDATE transfers SET status = $2 WHERE id = $1 AND kind = $3 \
             AND status = $4 AND block_height IS NULL RETURNING {TRANSFER_COLS}"
        ))
        .bind(transfer_id)
        .bind(TransferStatus::Reversed)
        .bind(TransferKind::Deposit)
        .bind(TransferStatus::Seen)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            tx.rollback().await?;
            return Ok(None);
        };
        let deposit = transfer_from_row(&row)?;
        let spender = spender_of(&mut tx, &deposit).await?;
        let mut debt = 0;
        if let Some(s) = &spender {
            if may_undo(&mut tx, s).await? {
                sqlx::query("UPDATE transfers SET status = $2 WHERE id = $1")
                    .bind(s.id)
                    .bind(TransferStatus::Failed)
                    .execute(&mut *tx)
                    .await?;
                undo_payment(&mut tx, s).await?;
            } else {
                debt = charge_spent_deposit(&mut tx, &deposit, s).await?;
            }
        }
        sqlx::query("DELETE FROM outputs WHERE txid = $1 AND vout = $2 AND origin = $3")
            .bind(&deposit.txid)
            .bind(deposit.vout)
            .bind(OutputOrigin::Deposit)
            .execute(&mut *tx)
            .await?;
        super::settings::insert_audit_entry(
            &mut tx,
            AuditEvent::DepositReversed,
            AuditActor::Engine,
            &ConfigDiff::new(),
            &AuditDetails {
                user_id: deposit.user_id,
                txid: Some(deposit.txid.clone()),
                vout: Some(deposit.vout),
                amount_sats: Some(deposit.amount_sats),
                spent_by: spender.as_ref().map(|s| s.txid.clone()),
                debt_sats: Some(debt),
                ..AuditDetails::none()
            },
        )
        .await?;
        tx.commit().await?;
        Ok(Some(debt))
    }
}
