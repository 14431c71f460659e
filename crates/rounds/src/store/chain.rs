//! The chain watcher's bookkeeping: processed blocks, deposits found in them, confirmations, and unwinding after a reorganisation.

use std::collections::HashSet;
use std::str::FromStr;

use bitcoin::{BlockHash, Txid};
use sqlx::Row;

use super::ledger::{placeholders, Tx, BATCH};

use super::{txid_column, Store, StoreError};
use crate::domain::round::{OutputOrigin, RoundStatus, TransferKind, TransferStatus};
use crate::domain::time::unix_now;

/// Confirmations a coinbase output needs before consensus lets it be spent.
pub const COINBASE_MATURITY: i64 = 100;

/// An output paying a user's address, found in a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deposit {
    /// The transaction.
    pub txid: Txid,
    /// Output index.
    pub vout: i64,
    /// Value.
    pub amount_sats: i64,
    /// The user whose address it pays.
    pub user_id: i64,
    /// Paid by a coinbase: credited no earlier than [`COINBASE_MATURITY`] confirmations.
    pub coinbase: bool,
}

impl Store {
    /// The highest processed block `(height, hash)`.
    ///
    /// # Errors
    /// Database failures; [`StoreError::StoredBlockHash`] when its stored
    /// hash is not one.
    pub async fn synced_tip(&self) -> Result<Option<(i64, BlockHash)>, StoreError> {
        let row = sqlx::query("SELECT height, hash FROM blocks ORDER BY height DESC LIMIT 1")
            .fetch_optional(self.pool())
            .await?;
        let Some(r) = row else {
            return Ok(None);
        };
        let height = r.try_get("height")?;
        Ok(Some((height, block_hash(height, r.try_get("hash")?)?)))
    }

    /// The processed block hash at `height`.
    ///
    /// # Errors
    /// Database failures; [`StoreError::StoredBlockHash`] when the stored
    /// hash is not one.
    pub async fn synced_hash(&self, height: i64) -> Result<Option<BlockHash>, StoreError> {
        let text: Option<String> = sqlx::query_scalar("SELECT hash FROM blocks WHERE height = $1")
            .bind(height)
            .fetch_optional(self.pool())
            .await?;
        text.map(|t| block_hash(height, t)).transpose()
    }

    /// Records the block the watcher starts from on a fresh database.
    ///
    /// # Errors
    /// Database failures.
    pub async fn record_start_block(&self, height: i64, hash: BlockHash) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO blocks (height, hash) SELECT $1, $2 WHERE NOT EXISTS (SELECT 1 FROM blocks)")
            .bind(height)
            .bind(hash.to_string())
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

    /// Txids of our transactions and outputs that are not confirmed (every
    /// version of a bumped transfer: whichever one a block holds wins),
    /// each once. A stored txid that does not decode is left out with a
    /// warning naming its row: no block can hold it, and the engine sets
    /// its transfer aside (failing here would stop the chain watcher, and
    /// every round behind it, on one bad row).
    ///
    /// # Errors
    /// Database failures.
    pub async fn unconfirmed_txids(&self) -> Result<Vec<Txid>, StoreError> {
        // Two reads rather than a `UNION`, so that a txid that does not
        // decode is reported with its table and row.
        let outputs = sqlx::query("SELECT id, txid FROM outputs WHERE block_height IS NULL")
            .fetch_all(self.pool())
            .await?;
        let transfers = sqlx::query(
            "SELECT id, txid FROM transfers WHERE block_height IS NULL AND kind <> $1 \
             AND status IN ($2, $3, $4)",
        )
        .bind(TransferKind::Deposit)
        .bind(TransferStatus::Signed)
        .bind(TransferStatus::Broadcast)
        .bind(TransferStatus::Superseded)
        .fetch_all(self.pool())
        .await?;
        let mut txids = Vec::with_capacity(outputs.len() + transfers.len());
        let outputs = outputs.iter().map(|r| (r, "outputs"));
        for (row, table) in outputs.chain(transfers.iter().map(|r| (r, "transfers"))) {
            match txid_column(row, table) {
                Ok(txid) => txids.push(txid),
                Err(e @ StoreError::StoredTxid { .. }) => {
                    tracing::warn!(error = %e, "a stored txid that is not one is not watched");
                }
                Err(e) => return Err(e),
            }
        }
        txids.sort_unstable();
        txids.dedup();
        Ok(txids)
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
        hash: BlockHash,
        ours: &[Txid],
        deposits: &[Deposit],
    ) -> Result<(u64, u64), StoreError> {
        let mut tx = self.pool().begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO blocks (height, hash) VALUES ($1, $2) ON CONFLICT (height) DO NOTHING",
        )
        .bind(height)
        .bind(hash.to_string())
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            // Another process (or an earlier run) processed this height.
            tx.rollback().await?;
            return Ok((0, 0));
        }
        fix_draw_block(&mut tx, height, hash).await?;
        let confirmed = confirm_ours(&mut tx, height, ours).await?;
        // A replaced version of a withdrawal or payout that this block holds
        // becomes the live one: the ledger follows the chain (fee bumps).
        super::bumps::make_confirmed_live(&mut tx, height).await?;
        let known = recorded_outputs(&mut tx, deposits).await?;
        let mut new_deposits = 0;
        for d in deposits {
            // Outputs to users' addresses that we recorded ourselves
            // (change, payouts) are not deposits; any other one (also one of
            // our withdrawals paying another user) is.
            if !known.contains(&(d.txid.to_string(), d.vout))
                && record_deposit(&mut tx, height, d).await?
            {
                new_deposits += 1;
            }
        }
        tx.commit().await?;
        Ok((new_deposits, confirmed))
    }
}

/// The first block processed at a round's draw height fixes its draw
/// (docs/rounds-engine.md). It is stored with the block: read only when the
/// engine drew, a reorganisation while the engine was paused, down or held
/// up replaced it and redrew, a second roll on an outcome everyone could
/// already compute. Only a child of the tip read at the close qualifies
/// (its parent is the block processed below it): a block on a branch that
/// replaced that tip may have been mined before the close (issue 32).
async fn fix_draw_block(tx: &mut Tx<'_>, height: i64, hash: BlockHash) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE rounds SET block_height = $1, block_hash = $2 \
         WHERE tip_height_at_close = $3 AND block_hash IS NULL AND bet_count > 0 \
         AND status IN ($4, $5) \
         AND (tip_hash_at_close IS NULL \
         OR tip_hash_at_close = (SELECT hash FROM blocks WHERE height = $3))",
    )
    .bind(height)
    .bind(hash.to_string())
    .bind(height - 1)
    .bind(RoundStatus::Closing)
    .bind(RoundStatus::Drawing)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The stored hash `text` of the block at `height`, decoded at the store's edge.
fn block_hash(height: i64, text: String) -> Result<BlockHash, StoreError> {
    BlockHash::from_str(&text).map_err(|source| StoreError::StoredBlockHash {
        height,
        text,
        source,
    })
}

/// Confirms at `height` our outputs and transfers whose transactions are in
/// `ours`; returns how many transfers it confirmed.
async fn confirm_ours(tx: &mut Tx<'_>, height: i64, ours: &[Txid]) -> Result<u64, sqlx::Error> {
    let ours: Vec<String> = ours.iter().map(Txid::to_string).collect();
    let mut confirmed = 0;
    for chunk in ours.chunks(BATCH) {
        let list = placeholders(2, chunk.len());
        let sql = format!("UPDATE outputs SET block_height = $1 WHERE txid IN ({list})");
        let mut q = sqlx::query(&sql).bind(height);
        for t in chunk {
            q = q.bind(t);
        }
        q.execute(&mut **tx).await?;
        let sql = format!(
            "UPDATE transfers SET block_height = $1, \
             status = CASE WHEN status IN ($2, $3) THEN $4 ELSE status END \
             WHERE kind <> $5 AND txid IN ({})",
            placeholders(6, chunk.len())
        );
        let mut q = sqlx::query(&sql)
            .bind(height)
            .bind(TransferStatus::Signed)
            .bind(TransferStatus::BroadcastFailed)
            .bind(TransferStatus::Broadcast)
            .bind(TransferKind::Deposit);
        for t in chunk {
            q = q.bind(t);
        }
        confirmed += q.execute(&mut **tx).await?.rows_affected();
    }
    Ok(confirmed)
}

/// The outputs among `deposits` that we recorded ourselves (change,
/// payouts): `(txid, vout)`.
async fn recorded_outputs(
    tx: &mut Tx<'_>,
    deposits: &[Deposit],
) -> Result<HashSet<(String, i64)>, sqlx::Error> {
    let mut known = HashSet::new();
    let mut txids: Vec<String> = deposits.iter().map(|d| d.txid.to_string()).collect();
    txids.sort();
    txids.dedup();
    for chunk in txids.chunks(BATCH) {
        let sql = format!(
            "SELECT txid, vout FROM outputs WHERE origin <> $1 AND txid IN ({})",
            placeholders(2, chunk.len())
        );
        let mut q = sqlx::query(&sql).bind(OutputOrigin::Deposit);
        for t in chunk {
            q = q.bind(t);
        }
        for r in q.fetch_all(&mut **tx).await? {
            known.insert((
                r.try_get::<String, _>("txid")?,
                r.try_get::<i64, _>("vout")?,
            ));
        }
    }
    Ok(known)
}

/// Records deposit `d` confirmed at `height`: its output, and its transfer
/// (a reversed one is credited again). Returns whether the transfer is new.
async fn record_deposit(tx: &mut Tx<'_>, height: i64, d: &Deposit) -> Result<bool, sqlx::Error> {
    let min_confirmations = if d.coinbase { COINBASE_MATURITY } else { 0 };
    sqlx::query(
        "INSERT INTO outputs (txid, vout, amount_sats, user_id, origin, block_height, min_confirmations) \
         VALUES ($1, $2, $3, $4, $7, $5, $6) \
         ON CONFLICT (txid, vout) DO UPDATE SET block_height = $5",
    )
    .bind(d.txid.to_string())
    .bind(d.vout)
    .bind(d.amount_sats)
    .bind(d.user_id)
    .bind(height)
    .bind(min_confirmations)
    .bind(OutputOrigin::Deposit)
    .execute(&mut **tx)
    .await?;
    let existing: Option<i64> =
        sqlx::query_scalar("SELECT id FROM transfers WHERE kind = $3 AND txid = $1 AND vout = $2")
            .bind(d.txid.to_string())
            .bind(d.vout)
            .bind(TransferKind::Deposit)
            .fetch_optional(&mut **tx)
            .await?;
    if let Some(id) = existing {
        // A reversed deposit that a block confirms after all is credited
        // again (its output was re-inserted above); a debt it left stays
        // for the operator.
        sqlx::query(
            "UPDATE transfers SET block_height = $1, \
             status = CASE WHEN status = $3 THEN $4 ELSE status END WHERE id = $2",
        )
        .bind(height)
        .bind(id)
        .bind(TransferStatus::Reversed)
        .bind(TransferStatus::Seen)
        .execute(&mut **tx)
        .await?;
        return Ok(false);
    }
    sqlx::query(
        "INSERT INTO transfers (kind, user_id, txid, vout, amount_sats, status, block_height, created_at, min_confirmations) \
         VALUES ($8, $1, $2, $3, $4, $9, $5, $6, $7)",
    )
    .bind(d.user_id)
    .bind(d.txid.to_string())
    .bind(d.vout)
    .bind(d.amount_sats)
    .bind(height)
    .bind(unix_now())
    .bind(min_confirmations)
    .bind(TransferKind::Deposit)
    .bind(TransferStatus::Seen)
    .execute(&mut **tx)
    .await?;
    Ok(true)
}
