//! The SQL of money: outputs the service controls, transfers (deposits, bets, withdrawals, payouts), processed blocks, and the round transitions that move money.
//!
//! Every money-moving step is one database transaction whose guards are in
//! SQL: an output is taken by a conditional `UPDATE … WHERE spent_txid IS
//! NULL` (checked row by row, so two processes on PostgreSQL cannot both
//! spend it), a round moves only from the status the caller saw, and a unique
//! index allows one payout per round. Signed transactions are written
//! (status `signed`) before they are broadcast, so a restart can finish them.

use serde_json::{Map, Value};
use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

use crate::store::{unix_now, RoundRow, Store, StoreError};

/// An output the service's wallet controls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRow {
    /// Row id.
    pub id: i64,
    /// Txid (display hex).
    pub txid: String,
    /// Output index.
    pub vout: i64,
    /// Value.
    pub amount_sats: i64,
    /// Owner user, for user outputs.
    pub user_id: Option<i64>,
    /// Owner round, for pot outputs.
    pub round_id: Option<i64>,
    /// `deposit`, `change`, `payout` or `pot`.
    pub origin: String,
    /// Height of the confirming block; `None` while unconfirmed.
    pub block_height: Option<i64>,
}

/// Confirmations a coinbase output needs before consensus lets it be spent.
pub const COINBASE_MATURITY: i64 = 100;

/// An output paying a user's address, found in a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deposit {
    /// Txid (display hex).
    pub txid: String,
    /// Output index.
    pub vout: i64,
    /// Value.
    pub amount_sats: i64,
    /// The user whose address it pays.
    pub user_id: i64,
    /// Paid by a coinbase: credited no earlier than [`COINBASE_MATURITY`] confirmations.
    pub coinbase: bool,
}

/// A transfer as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferRow {
    /// Row id.
    pub id: i64,
    /// `deposit`, `bet`, `withdrawal` or `payout`.
    pub kind: String,
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
    pub status: String,
    /// Height of the confirming block.
    pub block_height: Option<i64>,
    /// Unix seconds.
    pub created_at: i64,
    /// Deposits: confirmations consensus requires before it can be spent (coinbase: 100).
    pub min_confirmations: i64,
}

/// A new transaction of ours, written before it is broadcast.
#[derive(Debug, Clone)]
pub struct Intent {
    /// `bet`, `withdrawal` or `payout`.
    pub kind: &'static str,
    /// The user paying (bet, withdrawal) or paid (payout).
    pub user_id: Option<i64>,
    /// Round of a bet or payout.
    pub round_id: Option<i64>,
    /// Txid (display hex).
    pub txid: String,
    /// Signed transaction hex.
    pub raw_tx: String,
    /// Amount of the transfer.
    pub amount_sats: i64,
    /// Miner fee.
    pub fee_sats: i64,
    /// Payout commission.
    pub commission_sats: i64,
    /// Withdrawal destination.
    pub address: Option<String>,
    /// Outputs spent whole.
    pub inputs: Vec<i64>,
    /// New outputs we control: `(vout, amount, user_id, round_id, origin)`.
    pub outputs: Vec<NewOutput>,
}

/// An output of one of our transactions that the service controls.
#[derive(Debug, Clone)]
pub struct NewOutput {
    /// Index in the transaction.
    pub vout: i64,
    /// Value.
    pub amount_sats: i64,
    /// Owner user.
    pub user_id: Option<i64>,
    /// Owner round (pot).
    pub round_id: Option<i64>,
    /// `change`, `payout` or `pot`.
    pub origin: &'static str,
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
        expected: &'static str,
    },
    /// One of the outputs was taken by another transaction meanwhile.
    #[error("output {0} is already spent")]
    OutputTaken(i64),
    /// The round already has a payout.
    #[error("round {0} already has a payout")]
    PayoutExists(i64),
    /// Database failure.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for LedgerError {
    fn from(e: sqlx::Error) -> Self {
        LedgerError::Store(StoreError::Database(e))
    }
}

/// The draw as stored on the round.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DrawColumns {
    /// Tip height when the round closed.
    pub tip_height_at_close: Option<i64>,
    /// Hex.
    pub bets_commitment: Option<String>,
    /// Height of the draw block.
    pub block_height: Option<i64>,
    /// Display hex of the draw block.
    pub block_hash: Option<String>,
    /// Hex.
    pub seed: Option<String>,
    /// The winning satoshi.
    pub ticket: Option<i64>,
    /// The winning bet.
    pub winner_bet_id: Option<i64>,
}

/// A bet with its username, as the draw and the views need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BetRow {
    /// Bet id.
    pub id: i64,
    /// Bettor.
    pub user_id: i64,
    /// Username as stored.
    pub username: String,
    /// Amount.
    pub amount_sats: i64,
    /// Bet transaction id.
    pub txid: String,
}

/// A round with everything its view shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundDetail {
    /// The round row.
    pub round: RoundRow,
    /// Draw columns.
    pub draw: DrawColumns,
    /// Placed bets in ascending id.
    pub bets: Vec<BetRow>,
    /// The payout transfer, if any.
    pub payout: Option<TransferRow>,
}

/// Sums for the conservation check (GET /admin/ledger).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct LedgerTotals {
    /// Every deposit ever seen.
    pub deposits_sats: i64,
    /// Unspent outputs owned by users (confirmed or not).
    pub users_unspent_sats: i64,
    /// Unspent pot outputs (rounds not yet paid).
    pub pots_in_flight_sats: i64,
    /// Commissions of payouts written (signed, broadcast or waiting for a retry).
    pub commission_paid_sats: i64,
    /// Withdrawals written and not failed.
    pub withdrawn_sats: i64,
    /// Miner fees of our transactions written and not failed.
    pub miner_fees_sats: i64,
    /// Every unspent output the service holds.
    pub unspent: Vec<UnspentView>,
    /// Height of the last block the watcher processed.
    pub synced_height: i64,
}

/// One unspent output in [`LedgerTotals`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct UnspentView {
    /// Txid.
    pub txid: String,
    /// Index.
    pub vout: i64,
    /// Value.
    pub amount_sats: i64,
}

const OUTPUT_COLS: &str = "id, txid, vout, amount_sats, user_id, round_id, origin, block_height";
const TRANSFER_COLS: &str =
    "id, kind, user_id, round_id, txid, vout, raw_tx, amount_sats, fee_sats, \
     commission_sats, address, status, block_height, created_at, min_confirmations";
const ROUND_COLS: &str =
    "id, status, opened_at, closes_at, pot_sats, bettors, tip_height_at_close, \
     bets_commitment, block_height, block_hash, seed, ticket, winner_bet_id";

fn output_from_row(r: &AnyRow) -> Result<OutputRow, sqlx::Error> {
    Ok(OutputRow {
        id: r.try_get("id")?,
        txid: r.try_get("txid")?,
        vout: r.try_get("vout")?,
        amount_sats: r.try_get("amount_sats")?,
        user_id: r.try_get("user_id")?,
        round_id: r.try_get("round_id")?,
        origin: r.try_get("origin")?,
        block_height: r.try_get("block_height")?,
    })
}

fn transfer_from_row(r: &AnyRow) -> Result<TransferRow, sqlx::Error> {
    Ok(TransferRow {
        id: r.try_get("id")?,
        kind: r.try_get("kind")?,
        user_id: r.try_get("user_id")?,
        round_id: r.try_get("round_id")?,
        txid: r.try_get("txid")?,
        vout: r.try_get("vout")?,
        raw_tx: r.try_get("raw_tx")?,
        amount_sats: r.try_get("amount_sats")?,
        fee_sats: r.try_get("fee_sats")?,
        commission_sats: r.try_get("commission_sats")?,
        address: r.try_get("address")?,
        status: r.try_get("status")?,
        block_height: r.try_get("block_height")?,
        created_at: r.try_get("created_at")?,
        min_confirmations: r.try_get("min_confirmations")?,
    })
}

fn round_and_draw(r: &AnyRow) -> Result<(RoundRow, DrawColumns), sqlx::Error> {
    Ok((
        RoundRow {
            id: r.try_get("id")?,
            status: r.try_get("status")?,
            opened_at: r.try_get("opened_at")?,
            closes_at: r.try_get("closes_at")?,
            pot_sats: r.try_get("pot_sats")?,
            bettors: r.try_get("bettors")?,
        },
        DrawColumns {
            tip_height_at_close: r.try_get("tip_height_at_close")?,
            bets_commitment: r.try_get("bets_commitment")?,
            block_height: r.try_get("block_height")?,
            block_hash: r.try_get("block_hash")?,
            seed: r.try_get("seed")?,
            ticket: r.try_get("ticket")?,
            winner_bet_id: r.try_get("winner_bet_id")?,
        },
    ))
}

/// Sum as BIGINT on both backends (PostgreSQL's SUM(bigint) is numeric).
fn sum(expr: &str) -> String {
    format!("CAST(COALESCE(SUM({expr}), 0) AS BIGINT)")
}

type Tx<'a> = Transaction<'a, Any>;

/// `$first, $first+1, …` for `n` parameters.
fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Rows per batched statement (well below both backends' parameter limits).
const BATCH: usize = 500;

async fn take_outputs(tx: &mut Tx<'_>, inputs: &[i64], txid: &str) -> Result<(), LedgerError> {
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

async fn insert_intent(tx: &mut Tx<'_>, intent: &Intent) -> Result<i64, LedgerError> {
    take_outputs(tx, &intent.inputs, &intent.txid).await?;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO transfers (kind, user_id, round_id, txid, vout, raw_tx, amount_sats, fee_sats, \
         commission_sats, address, status, created_at) \
         VALUES ($1, $2, $3, $4, -1, $5, $6, $7, $8, $9, 'signed', $10) RETURNING id",
    )
    .bind(intent.kind)
    .bind(intent.user_id)
    .bind(intent.round_id)
    .bind(&intent.txid)
    .bind(&intent.raw_tx)
    .bind(intent.amount_sats)
    .bind(intent.fee_sats)
    .bind(intent.commission_sats)
    .bind(intent.address.as_deref())
    .bind(unix_now())
    .fetch_one(&mut **tx)
    .await
    .map_err(|e| match &e {
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            LedgerError::PayoutExists(intent.round_id.unwrap_or(0))
        }
        _ => LedgerError::from(e),
    })?;
    for o in &intent.outputs {
        sqlx::query(
            "INSERT INTO outputs (txid, vout, amount_sats, user_id, round_id, origin) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&intent.txid)
        .bind(o.vout)
        .bind(o.amount_sats)
        .bind(o.user_id)
        .bind(o.round_id)
        .bind(o.origin)
        .execute(&mut **tx)
        .await?;
    }
    Ok(id)
}

async fn recount_round(tx: &mut Tx<'_>, round_id: i64) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "UPDATE rounds SET pot_sats = (SELECT {} FROM bets WHERE round_id = $1 AND status = 'placed'), \
         bettors = (SELECT COUNT(DISTINCT user_id) FROM bets WHERE round_id = $1 AND status = 'placed') \
         WHERE id = $1",
        sum("amount_sats")
    ))
    .bind(round_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl Store {
    /// The highest processed block `(height, hash)`.
    ///
    /// # Errors
    /// Database failures.
    pub async fn synced_tip(&self) -> Result<Option<(i64, String)>, StoreError> {
        let row = sqlx::query("SELECT height, hash FROM blocks ORDER BY height DESC LIMIT 1")
            .fetch_optional(self.pool())
            .await?;
        Ok(row
            .map(|r| Ok::<_, sqlx::Error>((r.try_get("height")?, r.try_get("hash")?)))
            .transpose()?)
    }

    /// The processed block hash at `height`.
    ///
    /// # Errors
    /// Database failures.
    pub async fn synced_hash(&self, height: i64) -> Result<Option<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT hash FROM blocks WHERE height = $1")
                .bind(height)
                .fetch_optional(self.pool())
                .await?,
        )
    }

    /// Records the block the watcher starts from on a fresh database.
    ///
    /// # Errors
    /// Database failures.
    pub async fn record_start_block(&self, height: i64, hash: &str) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO blocks (height, hash) SELECT $1, $2 WHERE NOT EXISTS (SELECT 1 FROM blocks)")
            .bind(height)
            .bind(hash)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Undoes every confirmation above `fork_height` (a reorganisation):
    /// deposits there stop counting, our transactions go back to pending.
    /// Returns how many transfers lost their confirmation.
    ///
    /// # Errors
    /// Database failures.
    pub async fn unwind_above(&self, fork_height: i64) -> Result<u64, StoreError> {
        let mut tx = self.pool().begin().await?;
        sqlx::query("UPDATE outputs SET block_height = NULL WHERE block_height > $1")
            .bind(fork_height)
            .execute(&mut *tx)
            .await?;
        let n = sqlx::query("UPDATE transfers SET block_height = NULL WHERE block_height > $1")
            .bind(fork_height)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        sqlx::query("DELETE FROM blocks WHERE height > $1")
            .bind(fork_height)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(n)
    }

    /// Txids of our transactions and outputs that are not confirmed.
    ///
    /// # Errors
    /// Database failures.
    pub async fn unconfirmed_txids(&self) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT txid FROM outputs WHERE block_height IS NULL \
             UNION SELECT txid FROM transfers WHERE block_height IS NULL AND kind <> 'deposit' \
             AND status IN ('signed', 'broadcast')",
        )
        .fetch_all(self.pool())
        .await?)
    }

    /// Every user's `(id, address)`.
    ///
    /// # Errors
    /// Database failures.
    pub async fn user_addresses(&self) -> Result<Vec<(i64, String)>, StoreError> {
        let rows = sqlx::query("SELECT id, address FROM users")
            .fetch_all(self.pool())
            .await?;
        Ok(rows
            .iter()
            .map(|r| Ok::<_, sqlx::Error>((r.try_get("id")?, r.try_get("address")?)))
            .collect::<Result<_, _>>()?)
    }

    /// Processes one block: confirms our transactions in `ours` (txids in the
    /// block we know), records `deposits`, and
    /// remembers the block. Idempotent. Returns (deposits new, confirmations).
    ///
    /// # Errors
    /// Database failures.
    pub async fn connect_block(
        &self,
        height: i64,
        hash: &str,
        ours: &[String],
        deposits: &[Deposit],
    ) -> Result<(u64, u64), StoreError> {
        let mut tx = self.pool().begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO blocks (height, hash) VALUES ($1, $2) ON CONFLICT (height) DO NOTHING",
        )
        .bind(height)
        .bind(hash)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            // Another process (or an earlier run) processed this height.
            tx.rollback().await?;
            return Ok((0, 0));
        }
        let mut confirmed = 0;
        for chunk in ours.chunks(BATCH) {
            let list = placeholders(2, chunk.len());
            let sql = format!("UPDATE outputs SET block_height = $1 WHERE txid IN ({list})");
            let mut q = sqlx::query(&sql).bind(height);
            for t in chunk {
                q = q.bind(t);
            }
            q.execute(&mut *tx).await?;
            let sql = format!(
                "UPDATE transfers SET block_height = $1, \
                 status = CASE WHEN status IN ('signed', 'broadcast_failed') THEN 'broadcast' ELSE status END \
                 WHERE kind <> 'deposit' AND txid IN ({list})"
            );
            let mut q = sqlx::query(&sql).bind(height);
            for t in chunk {
                q = q.bind(t);
            }
            confirmed += q.execute(&mut *tx).await?.rows_affected();
        }
        // Outputs to users' addresses that we recorded ourselves (change,
        // payouts) are not deposits; any other one (also one of our
        // withdrawals paying another user) is.
        let mut known = std::collections::HashSet::new();
        let txids: Vec<&String> = {
            let mut v: Vec<&String> = deposits.iter().map(|d| &d.txid).collect();
            v.sort();
            v.dedup();
            v
        };
        for chunk in txids.chunks(BATCH) {
            let sql = format!(
                "SELECT txid, vout FROM outputs WHERE origin <> 'deposit' AND txid IN ({})",
                placeholders(1, chunk.len())
            );
            let mut q = sqlx::query(&sql);
            for t in chunk {
                q = q.bind(*t);
            }
            for r in q.fetch_all(&mut *tx).await? {
                known.insert((
                    r.try_get::<String, _>("txid")?,
                    r.try_get::<i64, _>("vout")?,
                ));
            }
        }
        let mut new_deposits = 0;
        for d in deposits {
            let (txid, vout, amount, user_id) = (&d.txid, &d.vout, &d.amount_sats, &d.user_id);
            let min_confirmations = if d.coinbase { COINBASE_MATURITY } else { 0 };
            if known.contains(&(txid.clone(), *vout)) {
                continue;
            }
            sqlx::query(
                "INSERT INTO outputs (txid, vout, amount_sats, user_id, origin, block_height, min_confirmations) \
                 VALUES ($1, $2, $3, $4, 'deposit', $5, $6) \
                 ON CONFLICT (txid, vout) DO UPDATE SET block_height = $5",
            )
            .bind(txid)
            .bind(vout)
            .bind(amount)
            .bind(user_id)
            .bind(height)
            .bind(min_confirmations)
            .execute(&mut *tx)
            .await?;
            let existing: Option<i64> = sqlx::query_scalar(
                "SELECT id FROM transfers WHERE kind = 'deposit' AND txid = $1 AND vout = $2",
            )
            .bind(txid)
            .bind(vout)
            .fetch_optional(&mut *tx)
            .await?;
            match existing {
                Some(id) => {
                    sqlx::query("UPDATE transfers SET block_height = $1 WHERE id = $2")
                        .bind(height)
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                }
                None => {
                    sqlx::query(
                        "INSERT INTO transfers (kind, user_id, txid, vout, amount_sats, status, block_height, created_at, min_confirmations) \
                         VALUES ('deposit', $1, $2, $3, $4, 'seen', $5, $6, $7)",
                    )
                    .bind(user_id)
                    .bind(txid)
                    .bind(vout)
                    .bind(amount)
                    .bind(height)
                    .bind(unix_now())
                    .bind(min_confirmations)
                    .execute(&mut *tx)
                    .await?;
                    new_deposits += 1;
                }
            }
        }
        tx.commit().await?;
        Ok((new_deposits, confirmed))
    }

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
            sum("CASE WHEN block_height IS NOT NULL AND (origin <> 'deposit' OR ($2 - block_height + 1 >= $3 AND $2 - block_height + 1 >= min_confirmations)) THEN amount_sats ELSE 0 END"),
            sum("CASE WHEN block_height IS NULL AND origin = 'change' THEN amount_sats ELSE 0 END"),
        ))
        .bind(user_id)
        .bind(tip)
        .bind(confirmations)
        .fetch_one(self.pool())
        .await?;
        let balance: i64 = row.try_get("balance")?;
        let change: i64 = row.try_get("change_sats")?;
        let pending: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM transfers WHERE user_id = $1 AND kind IN ('bet', 'withdrawal') \
             AND status IN ('signed', 'broadcast') AND block_height IS NULL",
        )
        .bind(user_id)
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
    ) -> Result<Vec<OutputRow>, StoreError> {
        let tip = self.synced_tip().await?.map_or(0, |t| t.0);
        let rows = sqlx::query(&format!(
            "SELECT {OUTPUT_COLS} FROM outputs WHERE user_id = $1 AND spent_txid IS NULL \
             AND block_height IS NOT NULL AND (origin <> 'deposit' OR ($2 - block_height + 1 >= $3 AND $2 - block_height + 1 >= min_confirmations)) \
             ORDER BY amount_sats DESC, id"
        ))
        .bind(user_id)
        .bind(tip)
        .bind(confirmations)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.iter().map(output_from_row).collect::<Result<_, _>>()?)
    }

    /// Writes a bet: the round must be `open`; takes the inputs, records the
    /// transfer (status `signed`), the bet and the new outputs, in one
    /// transaction. Returns `(bet id, transfer id)`.
    ///
    /// # Errors
    /// [`LedgerError::WrongStatus`], [`LedgerError::OutputTaken`].
    pub async fn place_bet(&self, intent: &Intent) -> Result<(i64, i64), LedgerError> {
        let round_id = intent.round_id.unwrap_or(0);
        let mut tx = self.pool().begin().await?;
        // A write first: takes SQLite's write lock and PostgreSQL's row lock
        // on the round, so closing waits for this bet or this bet sees it.
        let open =
            sqlx::query("UPDATE rounds SET pot_sats = pot_sats WHERE id = $1 AND status = 'open'")
                .bind(round_id)
                .execute(&mut *tx)
                .await?;
        if open.rows_affected() != 1 {
            return Err(LedgerError::WrongStatus {
                round_id,
                expected: "open",
            });
        }
        let transfer_id = insert_intent(&mut tx, intent).await?;
        let bet_id: i64 = sqlx::query_scalar(
            "INSERT INTO bets (round_id, user_id, amount_sats, txid, created_at, status, fee_sats) \
             VALUES ($1, $2, $3, $4, $5, 'placed', $6) RETURNING id",
        )
        .bind(round_id)
        .bind(intent.user_id)
        .bind(intent.amount_sats)
        .bind(&intent.txid)
        .bind(unix_now())
        .bind(intent.fee_sats)
        .fetch_one(&mut *tx)
        .await?;
        recount_round(&mut tx, round_id).await?;
        tx.commit().await?;
        Ok((bet_id, transfer_id))
    }

    /// Writes a withdrawal intent. Returns the transfer id.
    ///
    /// # Errors
    /// [`LedgerError::OutputTaken`].
    pub async fn record_withdrawal(&self, intent: &Intent) -> Result<i64, LedgerError> {
        let mut tx = self.pool().begin().await?;
        let id = insert_intent(&mut tx, intent).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Marks a signed transfer as broadcast.
    ///
    /// # Errors
    /// Database failures.
    pub async fn mark_broadcast(&self, transfer_id: i64) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE transfers SET status = 'broadcast' WHERE id = $1 AND status = 'signed'",
        )
        .bind(transfer_id)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Undoes a bet or withdrawal whose broadcast was refused: releases its
    /// inputs, drops its outputs, marks it failed and recounts its round.
    ///
    /// # Errors
    /// Database failures.
    pub async fn fail_transfer(&self, transfer_id: i64) -> Result<(), StoreError> {
        let mut tx = self.pool().begin().await?;
        let row = sqlx::query(&format!(
            "UPDATE transfers SET status = 'failed' WHERE id = $1 AND status = 'signed' RETURNING {TRANSFER_COLS}"
        ))
        .bind(transfer_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            tx.rollback().await?;
            return Ok(());
        };
        let t = transfer_from_row(&row)?;
        sqlx::query("UPDATE outputs SET spent_txid = NULL WHERE spent_txid = $1")
            .bind(&t.txid)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM outputs WHERE txid = $1")
            .bind(&t.txid)
            .execute(&mut *tx)
            .await?;
        if t.kind == "bet" {
            sqlx::query("UPDATE bets SET status = 'failed' WHERE txid = $1")
                .bind(&t.txid)
                .execute(&mut *tx)
                .await?;
            if let Some(r) = t.round_id {
                recount_round(&mut tx, r).await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    /// Our transfers written but not yet broadcast (to finish after a crash).
    ///
    /// # Errors
    /// Database failures.
    pub async fn signed_transfers(&self) -> Result<Vec<TransferRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {TRANSFER_COLS} FROM transfers WHERE status = 'signed' ORDER BY id"
        ))
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .iter()
            .map(transfer_from_row)
            .collect::<Result<_, _>>()?)
    }

    /// Our broadcast transfers without a confirmation (to re-send after a reorg).
    ///
    /// # Errors
    /// Database failures.
    pub async fn unconfirmed_broadcasts(&self) -> Result<Vec<TransferRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {TRANSFER_COLS} FROM transfers WHERE status = 'broadcast' AND kind <> 'deposit' \
             AND block_height IS NULL ORDER BY id"
        ))
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

    /// The user's transfers, newest first.
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
            "SELECT {TRANSFER_COLS} FROM transfers WHERE user_id = $1 AND id < $2 ORDER BY id DESC LIMIT $3"
        ))
        .bind(user_id)
        .bind(before_id.unwrap_or(i64::MAX))
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .iter()
            .map(transfer_from_row)
            .collect::<Result<_, _>>()?)
    }

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
        let payout = sqlx::query(&format!(
            "SELECT {TRANSFER_COLS} FROM transfers WHERE kind = 'payout' AND round_id = $1"
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
    pub async fn round_bets(&self, round_id: i64) -> Result<Vec<BetRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT b.id, b.user_id, u.username, b.amount_sats, b.txid FROM bets b \
             JOIN users u ON u.id = b.user_id WHERE b.round_id = $1 AND b.status = 'placed' ORDER BY b.id",
        )
        .bind(round_id)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .iter()
            .map(|r| {
                Ok::<_, sqlx::Error>(BetRow {
                    id: r.try_get("id")?,
                    user_id: r.try_get("user_id")?,
                    username: r.try_get("username")?,
                    amount_sats: r.try_get("amount_sats")?,
                    txid: r.try_get::<Option<String>, _>("txid")?.unwrap_or_default(),
                })
            })
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
            "SELECT r.id FROM rounds r WHERE r.status IN ('paying_out', 'closed') AND EXISTS \
             (SELECT 1 FROM bets b WHERE b.round_id = r.id AND b.user_id = $1 AND b.status = 'placed') \
             ORDER BY r.id DESC LIMIT 1",
        )
        .bind(user_id)
        .fetch_optional(self.pool())
        .await?)
    }

    /// Rounds that are not closed, oldest first (the engine's work list).
    ///
    /// # Errors
    /// Database failures.
    pub async fn unfinished_rounds(&self) -> Result<Vec<RoundRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {ROUND_COLS} FROM rounds WHERE status <> 'closed' ORDER BY id"
        ))
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .iter()
            .map(|r| round_and_draw(r).map(|x| x.0))
            .collect::<Result<_, _>>()?)
    }

    /// open → closing: fixes the tip height and the bets commitment, unless a
    /// bet of the round is still being broadcast. Returns whether it moved.
    ///
    /// # Errors
    /// Database failures.
    pub async fn close_round(
        &self,
        round_id: i64,
        tip_height: i64,
        commitment_of: impl FnOnce(&[BetRow]) -> String,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin().await?;
        let moved =
            sqlx::query("UPDATE rounds SET status = 'closing' WHERE id = $1 AND status = 'open'")
                .bind(round_id)
                .execute(&mut *tx)
                .await?;
        if moved.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        let in_flight: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM transfers WHERE round_id = $1 AND kind = 'bet' AND status = 'signed'",
        )
        .bind(round_id)
        .fetch_one(&mut *tx)
        .await?;
        if in_flight > 0 {
            tx.rollback().await?;
            return Ok(false);
        }
        let rows = sqlx::query(
            "SELECT b.id, b.user_id, u.username, b.amount_sats, b.txid FROM bets b \
             JOIN users u ON u.id = b.user_id WHERE b.round_id = $1 AND b.status = 'placed' ORDER BY b.id",
        )
        .bind(round_id)
        .fetch_all(&mut *tx)
        .await?;
        let bets = rows
            .iter()
            .map(|r| {
                Ok::<_, sqlx::Error>(BetRow {
                    id: r.try_get("id")?,
                    user_id: r.try_get("user_id")?,
                    username: r.try_get("username")?,
                    amount_sats: r.try_get("amount_sats")?,
                    txid: r.try_get::<Option<String>, _>("txid")?.unwrap_or_default(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        sqlx::query(
            "UPDATE rounds SET tip_height_at_close = $1, bets_commitment = $2 WHERE id = $3",
        )
        .bind(tip_height)
        .bind(commitment_of(&bets))
        .bind(round_id)
        .execute(&mut *tx)
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
        from: &str,
        to: &str,
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
        from: &str,
        now: i64,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin().await?;
        let moved =
            sqlx::query("UPDATE rounds SET status = 'closed' WHERE id = $1 AND status = $2")
                .bind(round_id)
                .bind(from)
                .execute(&mut *tx)
                .await?;
        if moved.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        if from == "paying_out" {
            sqlx::query("UPDATE transfers SET status = 'broadcast' WHERE kind = 'payout' AND round_id = $1 AND status = 'signed'")
                .bind(round_id)
                .execute(&mut *tx)
                .await?;
        }
        let newest: i64 = sqlx::query_scalar("SELECT MAX(id) FROM rounds")
            .fetch_one(&mut *tx)
            .await?;
        if newest == round_id {
            let duration: i64 = sqlx::query_scalar(
                "SELECT round_duration_seconds FROM service_config WHERE id = 1",
            )
            .fetch_one(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO rounds (status, opened_at, closes_at, pot_sats, bettors) VALUES ('open', $1, $2, 0, 0)",
            )
            .bind(now)
            .bind(now + duration)
            .execute(&mut *tx)
            .await?;
        }
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
        draw: &DrawColumns,
        intent: &Intent,
    ) -> Result<i64, LedgerError> {
        let mut tx = self.pool().begin().await?;
        let moved = sqlx::query(
            "UPDATE rounds SET status = 'paying_out', block_height = $1, block_hash = $2, seed = $3, \
             ticket = $4, winner_bet_id = $5 WHERE id = $6 AND status = 'drawing'",
        )
        .bind(draw.block_height)
        .bind(draw.block_hash.as_deref())
        .bind(draw.seed.as_deref())
        .bind(draw.ticket)
        .bind(draw.winner_bet_id)
        .bind(round_id)
        .execute(&mut *tx)
        .await?;
        if moved.rows_affected() != 1 {
            return Err(LedgerError::WrongStatus {
                round_id,
                expected: "drawing",
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
    pub async fn pot_outputs(&self, round_id: i64) -> Result<Vec<OutputRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {OUTPUT_COLS} FROM outputs WHERE round_id = $1 AND origin = 'pot' AND spent_txid IS NULL ORDER BY id"
        ))
        .bind(round_id)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.iter().map(output_from_row).collect::<Result<_, _>>()?)
    }

    /// Pot outputs taken by transaction `txid` (a failed payout to rebuild).
    ///
    /// # Errors
    /// Database failures.
    pub async fn pot_outputs_spent_by(&self, txid: &str) -> Result<Vec<OutputRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {OUTPUT_COLS} FROM outputs WHERE origin = 'pot' AND spent_txid = $1 ORDER BY id"
        ))
        .bind(txid)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.iter().map(output_from_row).collect::<Result<_, _>>()?)
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
        let n = sqlx::query(
            "UPDATE transfers SET status = 'broadcast_failed' WHERE id = $1 AND status = 'signed'",
        )
        .bind(transfer_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        crate::store::insert_audit_entry(
            &mut tx,
            "payout_failed",
            "engine",
            &Map::new(),
            &serde_json::json!({"round_id": round_id, "transfer_id": transfer_id, "reason": reason}),
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
    #[allow(clippy::too_many_arguments)]
    pub async fn replace_failed_payout(
        &self,
        transfer_id: i64,
        round_id: i64,
        old_txid: &str,
        txid: &str,
        raw_tx: &str,
        fee_sats: i64,
        winner_sats: i64,
        winner_vout: Option<i64>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin().await?;
        let n = sqlx::query(
            "UPDATE transfers SET status = 'signed', txid = $1, raw_tx = $2, fee_sats = $3, amount_sats = $4 \
             WHERE id = $5 AND status = 'broadcast_failed'",
        )
        .bind(txid)
        .bind(raw_tx)
        .bind(fee_sats)
        .bind(winner_sats)
        .bind(transfer_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        sqlx::query("UPDATE outputs SET spent_txid = $1 WHERE spent_txid = $2")
            .bind(txid)
            .bind(old_txid)
            .execute(&mut *tx)
            .await?;
        match winner_vout {
            Some(v) => {
                sqlx::query(
                    "UPDATE outputs SET txid = $1, vout = $2, amount_sats = $3 WHERE txid = $4",
                )
                .bind(txid)
                .bind(v)
                .bind(winner_sats)
                .bind(old_txid)
                .execute(&mut *tx)
                .await?;
            }
            None => {
                sqlx::query("DELETE FROM outputs WHERE txid = $1")
                    .bind(old_txid)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        crate::store::insert_audit_entry(
            &mut tx,
            "payout_retried",
            "admin",
            &Map::new(),
            &serde_json::json!({"round_id": round_id, "txid": txid, "replaced_txid": old_txid}),
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Totals for the conservation check.
    ///
    /// # Errors
    /// Database failures.
    pub async fn ledger_totals(&self) -> Result<LedgerTotals, StoreError> {
        // One statement, so the six sums come from one consistent snapshot.
        let totals = [
            (
                "deposits_sats",
                "transfers",
                "amount_sats",
                "kind = 'deposit'",
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
                "kind = 'payout' AND status <> 'failed'",
            ),
            (
                "withdrawn_sats",
                "transfers",
                "amount_sats",
                "kind = 'withdrawal' AND status <> 'failed'",
            ),
            (
                "miner_fees_sats",
                "transfers",
                "fee_sats",
                "kind <> 'deposit' AND status <> 'failed'",
            ),
        ]
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
            .fetch_one(self.pool())
            .await?;
        let deposits_sats: i64 = row.try_get("deposits_sats")?;
        let users_unspent_sats: i64 = row.try_get("users_unspent_sats")?;
        let pots_in_flight_sats: i64 = row.try_get("pots_in_flight_sats")?;
        let commission_paid_sats: i64 = row.try_get("commission_paid_sats")?;
        let withdrawn_sats: i64 = row.try_get("withdrawn_sats")?;
        let miner_fees_sats: i64 = row.try_get("miner_fees_sats")?;
        let rows = sqlx::query(
            "SELECT txid, vout, amount_sats FROM outputs WHERE spent_txid IS NULL ORDER BY id",
        )
        .fetch_all(self.pool())
        .await?;
        let unspent = rows
            .iter()
            .map(|r| {
                Ok::<_, sqlx::Error>(UnspentView {
                    txid: r.try_get("txid")?,
                    vout: r.try_get("vout")?,
                    amount_sats: r.try_get("amount_sats")?,
                })
            })
            .collect::<Result<_, _>>()?;
        let synced_height = self.synced_tip().await?.map_or(0, |t| t.0);
        Ok(LedgerTotals {
            synced_height,
            deposits_sats,
            users_unspent_sats,
            pots_in_flight_sats,
            commission_paid_sats,
            withdrawn_sats,
            miner_fees_sats,
            unspent,
        })
    }
}

/// JSON object helper for audit details.
pub fn details(pairs: &[(&str, Value)]) -> Value {
    Value::Object(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), v.clone()))
            .collect(),
    )
}
