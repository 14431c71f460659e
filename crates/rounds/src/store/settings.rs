//! The service configuration row and the admin audit log.

use sqlx::any::AnyRow;
use sqlx::Row;

use super::{Store, StoreError};
use crate::domain::audit::{AuditActor, AuditDetails, AuditEntry, AuditEvent};
use crate::domain::settings::{
    config_diff, ConfigDiff, ConfigPatch, FieldChange, ServiceConfig, SettingValue,
};
use crate::domain::time::unix_now;

impl Store {
    /// Writes the config row unless one exists.
    ///
    /// # Errors
    /// Database failures.
    pub async fn init_config(&self, defaults: &ServiceConfig) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO service_config (id, fee_address, fee_rate_sat_vb, round_duration_seconds, \
             min_bet_sats, min_withdrawal_sats, deposit_confirmations, paused) \
             VALUES (1, $1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO NOTHING",
        )
        .bind(&defaults.fee_address)
        .bind(defaults.fee_rate_sat_vb)
        .bind(defaults.round_duration_seconds)
        .bind(defaults.min_bet_sats)
        .bind(defaults.min_withdrawal_sats)
        .bind(defaults.deposit_confirmations)
        .bind(i64::from(defaults.paused))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The current config.
    ///
    /// # Errors
    /// Database failures, or [`StoreError::Corrupt`] when the row is missing.
    pub async fn config(&self) -> Result<ServiceConfig, StoreError> {
        let row = sqlx::query(CONFIG_SELECT)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(r) => config_from_row(&r),
            None => Err(StoreError::Corrupt("service_config row missing".into())),
        }
    }

    /// Applies `patch`; when something changed, writes a `config_updated`
    /// audit entry whose diff was computed from the values before the update,
    /// in the same transaction. Returns the resulting config and the diff
    /// (empty for a no-op, which writes nothing).
    ///
    /// # Errors
    /// Database failures.
    pub async fn update_config(
        &self,
        patch: &ConfigPatch,
        actor: AuditActor,
    ) -> Result<(ServiceConfig, ConfigDiff), StoreError> {
        let mut tx = self.pool.begin().await?;
        lock_config(&mut tx).await?;
        let before = match sqlx::query(CONFIG_SELECT).fetch_optional(&mut *tx).await? {
            Some(r) => config_from_row(&r)?,
            None => return Err(StoreError::Corrupt("service_config row missing".into())),
        };
        let after = patch.apply(&before);
        let diff = config_diff(&before, &after);
        if diff.is_empty() {
            tx.rollback().await?;
            return Ok((before, diff));
        }
        sqlx::query(
            "UPDATE service_config SET fee_address = $1, fee_rate_sat_vb = $2, round_duration_seconds = $3, \
             min_bet_sats = $4, min_withdrawal_sats = $5, deposit_confirmations = $6 WHERE id = 1",
        )
        .bind(&after.fee_address)
        .bind(after.fee_rate_sat_vb)
        .bind(after.round_duration_seconds)
        .bind(after.min_bet_sats)
        .bind(after.min_withdrawal_sats)
        .bind(after.deposit_confirmations)
        .execute(&mut *tx)
        .await?;
        insert_audit(
            &mut tx,
            AuditEvent::ConfigUpdated,
            actor,
            &diff,
            &AuditDetails::none(),
        )
        .await?;
        tx.commit().await?;
        Ok((after, diff))
    }

    /// Sets `paused`; writes a `paused`/`resumed` audit entry only when the
    /// state changes. Returns the config and whether it changed.
    ///
    /// # Errors
    /// Database failures.
    pub async fn set_paused(
        &self,
        paused: bool,
        actor: AuditActor,
    ) -> Result<(ServiceConfig, bool), StoreError> {
        // On SQLite the payments' writes check the flag under the write
        // turn: taking it here makes the pause a barrier for them.
        let _turn = self.write_turn().await;
        let mut tx = self.pool.begin().await?;
        lock_config(&mut tx).await?;
        let mut config = match sqlx::query(CONFIG_SELECT).fetch_optional(&mut *tx).await? {
            Some(r) => config_from_row(&r)?,
            None => return Err(StoreError::Corrupt("service_config row missing".into())),
        };
        if config.paused == paused {
            tx.rollback().await?;
            return Ok((config, false));
        }
        sqlx::query("UPDATE service_config SET paused = $1 WHERE id = 1")
            .bind(i64::from(paused))
            .execute(&mut *tx)
            .await?;
        let diff = ConfigDiff::from([(
            "paused".to_string(),
            FieldChange {
                before: SettingValue::Bool(config.paused),
                after: SettingValue::Bool(paused),
            },
        )]);
        let event = if paused {
            AuditEvent::Paused
        } else {
            AuditEvent::Resumed
        };
        insert_audit(&mut tx, event, actor, &diff, &AuditDetails::none()).await?;
        tx.commit().await?;
        config.paused = paused;
        Ok((config, true))
    }

    /// Audit entries newest first, at most `limit`, with ids below `before_id`.
    ///
    /// # Errors
    /// Database failures, or [`StoreError::Corrupt`] for unparseable JSON.
    pub async fn audit_page(
        &self,
        limit: i64,
        before_id: Option<i64>,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, at, event, actor, diff, details FROM audit_log \
             WHERE id < $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(before_id.unwrap_or(i64::MAX))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let diff: String = r.try_get("diff")?;
                let details: String = r.try_get("details")?;
                Ok(AuditEntry {
                    id: r.try_get("id")?,
                    at: crate::domain::time::rfc3339(r.try_get("at")?),
                    event: r.try_get("event")?,
                    actor: r.try_get("actor")?,
                    diff: serde_json::from_str(&diff)
                        .map_err(|e| StoreError::Corrupt(format!("audit diff: {e}")))?,
                    details: serde_json::from_str(&details)
                        .map_err(|e| StoreError::Corrupt(format!("audit details: {e}")))?,
                })
            })
            .collect()
    }
}

const CONFIG_SELECT: &str =
    "SELECT fee_address, fee_rate_sat_vb, round_duration_seconds, min_bet_sats, \
     min_withdrawal_sats, deposit_confirmations, paused FROM service_config WHERE id = 1";

/// Takes the write lock before reading (SQLite would otherwise fail a
/// read-then-write transaction under contention) and locks the config row
/// on PostgreSQL, so concurrent updates serialise and each diff is exact.
async fn lock_config(tx: &mut sqlx::Transaction<'_, sqlx::Any>) -> Result<(), StoreError> {
    sqlx::query("UPDATE service_config SET id = id WHERE id = 1")
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Writes one audit entry inside the caller's transaction.
pub(crate) async fn insert_audit_entry(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    event: AuditEvent,
    actor: AuditActor,
    diff: &ConfigDiff,
    details: &AuditDetails,
) -> Result<(), StoreError> {
    insert_audit(tx, event, actor, diff, details).await
}

pub(super) async fn insert_audit(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    event: AuditEvent,
    actor: AuditActor,
    diff: &ConfigDiff,
    details: &AuditDetails,
) -> Result<(), StoreError> {
    let diff =
        serde_json::to_string(diff).map_err(|e| StoreError::Corrupt(format!("audit diff: {e}")))?;
    let details = serde_json::to_string(details)
        .map_err(|e| StoreError::Corrupt(format!("audit details: {e}")))?;
    sqlx::query(
        "INSERT INTO audit_log (at, event, actor, diff, details) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(unix_now())
    .bind(event)
    .bind(actor)
    .bind(diff)
    .bind(details)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub(super) fn config_from_row(r: &AnyRow) -> Result<ServiceConfig, StoreError> {
    let paused: i64 = r.try_get("paused")?;
    Ok(ServiceConfig {
        fee_address: r.try_get("fee_address")?,
        fee_rate_sat_vb: r.try_get("fee_rate_sat_vb")?,
        round_duration_seconds: r.try_get("round_duration_seconds")?,
        min_bet_sats: r.try_get("min_bet_sats")?,
        min_withdrawal_sats: r.try_get("min_withdrawal_sats")?,
        deposit_confirmations: r.try_get("deposit_confirmations")?,
        paused: paused != 0,
    })
}

impl Store {
    /// Records `fingerprint` as the one of secret `name` unless one is
    /// recorded already; returns the recorded one when it differs (another
    /// process started on this database with another secret).
    ///
    /// # Errors
    /// Database failures.
    pub async fn check_secret_fingerprint(
        &self,
        name: &str,
        fingerprint: &str,
        now: i64,
    ) -> Result<Option<String>, StoreError> {
        // Two processes starting together: one insert wins, the other reads it.
        sqlx::query(
            "INSERT INTO secret_fingerprints (name, fingerprint, recorded_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(fingerprint)
        .bind(now)
        .execute(self.pool())
        .await?;
        let stored: String =
            sqlx::query_scalar("SELECT fingerprint FROM secret_fingerprints WHERE name = $1")
                .bind(name)
                .fetch_one(self.pool())
                .await?;
        Ok((stored != fingerprint).then_some(stored))
    }
}
