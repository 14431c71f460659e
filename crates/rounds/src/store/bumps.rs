//! The SQL of fee bumps: a replacement of a stuck withdrawal or payout written before its broadcast, and the version a block holds made the one the ledger follows.
//!
//! A family is a first transfer and its replacements (`bump_of` names the
//! first on every later one). Exactly one version is live (`signed` or
//! `broadcast`): it holds the inputs (`spent_txid`) and its outputs count.
//! The others are `superseded` (or `failed`, a replacement the node refused
//! as invalid), and their outputs are marked spent by [`SUPERSEDED`], so the
//! family debits the payer and credits the payee once. When a block holds
//! a superseded version, that version becomes the live one in the block's
//! own database transaction (`make_confirmed_live`).

use bitcoin::Txid;
use sqlx::Row as _;

use super::ledger::{
    output_from_row, transfer_from_row, LedgerError, Tx, OUTPUT_COLS, TRANSFER_COLS,
};
use super::settings::insert_audit_entry;
use super::{Store, StoreError};
use crate::domain::audit::{AuditActor, AuditDetails, AuditEvent};
use crate::domain::money::{Coin, NewOutput};
use crate::domain::round::{TransferKind, TransferStatus};
use crate::domain::settings::ConfigDiff;
use crate::domain::time::unix_now;
use crate::domain::transfer::WaitingForConfirmation;
use crate::store::ledger::TransferRow;

/// `spent_txid` of an output of a version that lost: it exists in no block.
pub const SUPERSEDED: &str = "superseded";

/// A replacement, built and signed, to write before it is broadcast.
#[derive(Debug, Clone)]
pub struct BumpIntent {
    /// The live version it replaces.
    pub replaces: i64,
    /// Its txid.
    pub txid: Txid,
    /// The signed transaction in hex.
    pub raw_tx: String,
    /// Its miner fee.
    pub fee_sats: i64,
    /// The transfer's amount (a payout's winner share shrinks by the extra fee).
    pub amount_sats: i64,
    /// Its outputs the service controls (change, or the winner's payout).
    pub outputs: Vec<NewOutput>,
    /// The synced tip when it was written: its own wait counts from here.
    pub sent_height: i64,
    /// The engine, or the admin for a bump by hand.
    pub actor: AuditActor,
    /// The fee rate asked for (sat/vB), for the audit log.
    pub fee_rate_sat_vb: i64,
}

/// A withdrawal or payout waiting for its first confirmation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingTransfer {
    /// Its live version.
    pub transfer: TransferRow,
    /// The synced tip when that version was first seen waiting.
    pub sent_height: Option<i64>,
    /// Versions written so far (1: never bumped).
    pub versions: i64,
}

impl WaitingTransfer {
    /// The waiting transfer as the domain reads it, its txid decoded at this edge.
    ///
    /// # Errors
    /// [`StoreError::TransferTxid`] when the stored txid is not one.
    pub fn decode(&self) -> Result<WaitingForConfirmation, StoreError> {
        Ok(WaitingForConfirmation {
            transfer: self.transfer.decode()?,
            sent_height: self.sent_height,
            versions: self.versions,
        })
    }
}

impl Store {
    /// Stamps live, unconfirmed withdrawals and payouts seen waiting for the
    /// first time with the synced tip `height`.
    ///
    /// # Errors
    /// Database failures.
    pub async fn stamp_waiting(&self, height: i64) -> Result<(), StoreError> {
        // Read first: the worker asks every pass, and an UPDATE (even one
        // that matches nothing) takes SQLite's write lock from the payments.
        let unstamped: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM transfers WHERE sent_height IS NULL \
             AND kind IN ($1, $2) AND status = $3 AND block_height IS NULL",
        )
        .bind(TransferKind::Withdrawal)
        .bind(TransferKind::Payout)
        .bind(TransferStatus::Broadcast)
        .fetch_one(self.pool())
        .await?;
        if unstamped == 0 {
            return Ok(());
        }
        sqlx::query(
            "UPDATE transfers SET sent_height = $1 WHERE sent_height IS NULL \
             AND kind IN ($2, $3) AND status = $4 AND block_height IS NULL",
        )
        .bind(height)
        .bind(TransferKind::Withdrawal)
        .bind(TransferKind::Payout)
        .bind(TransferStatus::Broadcast)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Live, broadcast withdrawals and payouts without a confirmation, not
    /// set aside, oldest first, with when they were first seen waiting.
    ///
    /// # Errors
    /// Database failures.
    pub async fn waiting_transfers(&self) -> Result<Vec<WaitingTransfer>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {TRANSFER_COLS}, sent_height, \
             (SELECT COUNT(*) FROM transfers v WHERE v.id = t.id OR v.bump_of = COALESCE(t.bump_of, t.id) \
              OR v.id = t.bump_of) AS versions \
             FROM transfers t WHERE kind IN ($1, $2) AND status = $3 \
             AND block_height IS NULL AND set_aside_at IS NULL ORDER BY id"
        ))
        .bind(TransferKind::Withdrawal)
        .bind(TransferKind::Payout)
        .bind(TransferStatus::Broadcast)
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(WaitingTransfer {
                    transfer: transfer_from_row(r)?,
                    sent_height: r.try_get("sent_height")?,
                    versions: r.try_get("versions")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(StoreError::from)
    }

    /// The outputs of transaction `txid` that the ledger holds, whatever
    /// their state (a bump re-states them with one value changed).
    ///
    /// # Errors
    /// Database failures.
    pub async fn outputs_created_by(&self, txid: &Txid) -> Result<Vec<Coin>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {OUTPUT_COLS} FROM outputs WHERE txid = $1 ORDER BY vout"
        ))
        .bind(txid.to_string())
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(output_from_row).collect()
    }

    /// Replacements written but not yet broadcast (a crash between the
    /// write and the broadcast leaves them so), oldest first.
    ///
    /// # Errors
    /// Database failures.
    pub async fn signed_bumps(&self) -> Result<Vec<TransferRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {TRANSFER_COLS} FROM transfers WHERE status = $1 AND bump_of IS NOT NULL \
             AND set_aside_at IS NULL ORDER BY id"
        ))
        .bind(TransferStatus::Signed)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .iter()
            .map(transfer_from_row)
            .collect::<Result<_, _>>()?)
    }

    /// Writes replacement `b` of a live, broadcast, unconfirmed withdrawal
    /// or payout, before its broadcast: the new version takes the inputs,
    /// the old one is superseded, and `transfer_bumped` goes to the audit
    /// log. Returns the new transfer id, or `None` when the old version is
    /// no longer the live, waiting one (confirmed, replaced or refused
    /// meanwhile).
    ///
    /// # Errors
    /// Database failures; [`LedgerError::OutputTaken`] when the old version
    /// holds no inputs (the ledger would not follow the replacement).
    pub async fn write_bump(&self, b: &BumpIntent) -> Result<Option<i64>, LedgerError> {
        let _turn = self.write_turn().await;
        let mut tx = self.pool().begin().await?;
        let old = sqlx::query(&format!(
            "UPDATE transfers SET status = $2 WHERE id = $1 AND status = $3 \
             AND block_height IS NULL AND kind IN ($4, $5) RETURNING {TRANSFER_COLS}"
        ))
        .bind(b.replaces)
        .bind(TransferStatus::Superseded)
        .bind(TransferStatus::Broadcast)
        .bind(TransferKind::Withdrawal)
        .bind(TransferKind::Payout)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(old) = old else {
            tx.rollback().await?;
            return Ok(None);
        };
        let old = transfer_from_row(&old)?;
        let root: Option<i64> =
            sqlx::query_scalar("SELECT COALESCE(bump_of, id) FROM transfers WHERE id = $1")
                .bind(old.id)
                .fetch_optional(&mut *tx)
                .await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO transfers (kind, user_id, round_id, txid, vout, raw_tx, amount_sats, fee_sats, \
             commission_sats, address, status, created_at, bump_of, sent_height, replaces) \
             VALUES ($1, $2, $3, $4, -1, $5, $6, $7, $8, $9, $14, $10, $11, $12, $13) RETURNING id",
        )
        .bind(old.kind)
        .bind(old.user_id)
        .bind(old.round_id)
        .bind(b.txid.to_string())
        .bind(&b.raw_tx)
        .bind(b.amount_sats)
        .bind(b.fee_sats)
        .bind(old.commission_sats)
        .bind(old.address.as_deref())
        .bind(unix_now())
        .bind(root.unwrap_or(old.id))
        .bind(b.sent_height)
        .bind(old.id)
        .bind(TransferStatus::Signed)
        .fetch_one(&mut *tx)
        .await?;
        let moved = sqlx::query("UPDATE outputs SET spent_txid = $1 WHERE spent_txid = $2")
            .bind(b.txid.to_string())
            .bind(&old.txid)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if moved == 0 {
            return Err(LedgerError::OutputTaken(old.id));
        }
        retire_outputs(&mut tx, &old.txid).await?;
        for o in &b.outputs {
            sqlx::query(
                "INSERT INTO outputs (txid, vout, amount_sats, user_id, round_id, origin) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(b.txid.to_string())
            .bind(o.vout)
            .bind(o.amount_sats)
            .bind(o.user_id)
            .bind(o.round_id)
            .bind(o.origin)
            .execute(&mut *tx)
            .await?;
        }
        insert_audit_entry(
            &mut tx,
            AuditEvent::TransferBumped,
            b.actor,
            &ConfigDiff::new(),
            &AuditDetails {
                transfer_id: Some(id),
                kind: Some(old.kind.as_str().to_owned()),
                user_id: old.user_id,
                round_id: old.round_id,
                txid: Some(b.txid.to_string()),
                replaced_txid: Some(old.txid.clone()),
                fee_sats: Some(b.fee_sats),
                fee_rate_sat_vb: Some(b.fee_rate_sat_vb),
                ..AuditDetails::none()
            },
        )
        .await?;
        tx.commit().await?;
        Ok(Some(id))
    }

    /// A replacement the node refused (invalid, or not enough to replace
    /// under BIP125): the version it replaced is live again and it is
    /// superseded (still watched: a block holding it after all wins).
    /// Returns whether this call did it.
    ///
    /// # Errors
    /// Database failures.
    pub async fn refuse_bump(&self, id: i64) -> Result<bool, StoreError> {
        let _turn = self.write_turn().await;
        let mut tx = self.pool().begin().await?;
        let row = sqlx::query(&format!(
            "SELECT {TRANSFER_COLS}, bump_of, replaces FROM transfers WHERE id = $1 \
             AND status = $2 AND bump_of IS NOT NULL"
        ))
        .bind(id)
        .bind(TransferStatus::Signed)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            tx.rollback().await?;
            return Ok(false);
        };
        let root: i64 = row.try_get("bump_of")?;
        let replaced: Option<i64> = row.try_get("replaces")?;
        let previous = sqlx::query(&format!(
            "SELECT {TRANSFER_COLS} FROM transfers WHERE id = $1 AND status = $2"
        ))
        .bind(replaced)
        .bind(TransferStatus::Superseded)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(previous) = previous else {
            tx.rollback().await?;
            return Err(StoreError::Corrupt(format!(
                "replacement {id} has no earlier version"
            )));
        };
        make_live(&mut tx, root, &transfer_from_row(&previous)?).await?;
        tx.commit().await?;
        Ok(true)
    }
}

/// Marks the outputs of version `txid` spent by [`SUPERSEDED`]: no block
/// holds them while another version is live.
async fn retire_outputs(tx: &mut Tx<'_>, txid: &str) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE outputs SET spent_txid = $1 WHERE txid = $2 AND spent_txid IS NULL")
        .bind(SUPERSEDED)
        .bind(txid)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Makes `winner` the live version of family `root`: every other live
/// version is superseded and gives up its inputs to `winner`, its outputs
/// retired; `winner`'s outputs count again.
async fn make_live(tx: &mut Tx<'_>, root: i64, winner: &TransferRow) -> Result<(), StoreError> {
    let losers = sqlx::query(&format!(
        "SELECT {TRANSFER_COLS} FROM transfers WHERE (id = $1 OR bump_of = $1) AND id <> $2 \
         AND status IN ($3, $4)"
    ))
    .bind(root)
    .bind(winner.id)
    .bind(TransferStatus::Signed)
    .bind(TransferStatus::Broadcast)
    .fetch_all(&mut **tx)
    .await?;
    for row in &losers {
        let loser = transfer_from_row(row)?;
        // The loser first: the payout's unique index allows one live version.
        sqlx::query("UPDATE transfers SET status = $2 WHERE id = $1")
            .bind(loser.id)
            .bind(TransferStatus::Superseded)
            .execute(&mut **tx)
            .await?;
        sqlx::query("UPDATE outputs SET spent_txid = $1 WHERE spent_txid = $2")
            .bind(&winner.txid)
            .bind(&loser.txid)
            .execute(&mut **tx)
            .await?;
        retire_outputs(tx, &loser.txid).await?;
    }
    sqlx::query("UPDATE transfers SET status = $2 WHERE id = $1")
        .bind(winner.id)
        .bind(TransferStatus::Broadcast)
        .execute(&mut **tx)
        .await?;
    sqlx::query("UPDATE outputs SET spent_txid = NULL WHERE txid = $1 AND spent_txid = $2")
        .bind(&winner.txid)
        .bind(SUPERSEDED)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Inside a block's transaction: every superseded version that block
/// `height` confirmed becomes the live one of its family, so the ledger
/// follows the version the chain took, once.
///
/// # Errors
/// Database failures.
pub(super) async fn make_confirmed_live(tx: &mut Tx<'_>, height: i64) -> Result<u64, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {TRANSFER_COLS}, COALESCE(bump_of, id) AS root FROM transfers \
         WHERE status = $2 AND block_height = $1"
    ))
    .bind(height)
    .bind(TransferStatus::Superseded)
    .fetch_all(&mut **tx)
    .await?;
    for row in &rows {
        let winner = transfer_from_row(row)?;
        let root: i64 = row.try_get("root")?;
        tracing::warn!(transfer = winner.id, txid = %winner.txid,
            "a replaced version of a transfer confirmed; the ledger follows it");
        make_live(tx, root, &winner).await?;
        insert_audit_entry(
            tx,
            AuditEvent::TransferVersionConfirmed,
            AuditActor::Engine,
            &ConfigDiff::new(),
            &AuditDetails {
                transfer_id: Some(winner.id),
                kind: Some(winner.kind.as_str().to_owned()),
                user_id: winner.user_id,
                round_id: winner.round_id,
                txid: Some(winner.txid.clone()),
                ..AuditDetails::none()
            },
        )
        .await?;
    }
    Ok(rows.len() as u64)
}
