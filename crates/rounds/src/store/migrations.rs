//! Schema migrations with `sqlx::migrate!` (one folder per backend under `crates/rounds/migrations/`), with the case-collision check that must pass before usernames become unique ignoring case.
//!
//! Installs made before sqlx's migrator recorded their versions in
//! `potluck_schema_migrations`. On the first start with this code those
//! versions are adopted into sqlx's `_sqlx_migrations` table (with the
//! checksums of the embedded files, which are the same files), so sqlx
//! neither re-runs nor rejects them; the old table is left in place, frozen,
//! for anyone inspecting an upgraded database (see docs/rounds-api.md).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use sqlx::migrate::{Migrate, Migrator};
use sqlx::Row;

use super::{Backend, Store, StoreError};

/// The version of the migration that adds case-insensitive username uniqueness.
pub const CASE_INSENSITIVE_USERNAMES: i64 = 2;

static SQLITE: Migrator = sqlx::migrate!("migrations/sqlite");
static POSTGRES: Migrator = sqlx::migrate!("migrations/postgres");

/// The table of the hand-written migrator used before `sqlx::migrate!`.
const LEGACY_TABLE: &str = "potluck_schema_migrations";

impl Store {
    fn migrator(&self) -> &'static Migrator {
        match self.backend {
            Backend::Sqlite => &SQLITE,
            Backend::Postgres => &POSTGRES,
        }
    }

    /// Applies every pending migration.
    ///
    /// # Errors
    /// [`StoreError::CaseCollisions`] when the case-insensitive username
    /// upgrade would have to merge accounts; nothing is changed then.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.migrate_to(i64::MAX).await
    }

    /// Applies pending migrations up to and including `target`.
    ///
    /// # Errors
    /// As [`Store::migrate`].
    pub async fn migrate_to(&self, target: i64) -> Result<(), StoreError> {
        let migrator = self.migrator();
        self.adopt_legacy_versions(migrator).await?;
        let applied: BTreeSet<i64> = {
            let mut conn = self.pool.acquire().await?;
            conn.ensure_migrations_table().await?;
            conn.list_applied_migrations()
                .await?
                .into_iter()
                .map(|m| m.version)
                .collect()
        };
        // Before usernames become unique ignoring case, names that differ
        // only by case must not exist: the upgrade would have to merge
        // accounts. (Without the users table, version 1 is pending and
        // there is nobody to check.)
        if target >= CASE_INSENSITIVE_USERNAMES
            && applied.contains(&1)
            && !applied.contains(&CASE_INSENSITIVE_USERNAMES)
        {
            let mut tx = self.pool.begin().await?;
            let collisions = case_collisions(&mut tx).await?;
            tx.rollback().await?;
            if !collisions.is_empty() {
                return Err(StoreError::CaseCollisions {
                    version: CASE_INSENSITIVE_USERNAMES,
                    collisions,
                });
            }
        }
        let pending: Vec<i64> = migrator
            .iter()
            .map(|m| m.version)
            .filter(|v| *v <= target && !applied.contains(v))
            .collect();
        if target >= migrator.iter().map(|m| m.version).max().unwrap_or(0) {
            migrator.run(&self.pool).await?;
        } else {
            // Tests stop part-way (to build an old schema); a migrator over
            // the first migrations only.
            let partial = Migrator {
                migrations: Cow::Owned(
                    migrator
                        .iter()
                        .filter(|m| m.version <= target)
                        .cloned()
                        .collect(),
                ),
                ignore_missing: true,
                locking: migrator.locking,
                no_tx: migrator.no_tx,
            };
            partial.run(&self.pool).await?;
        }
        if !pending.is_empty() {
            tracing::info!(?pending, "applied migrations");
        }
        Ok(())
    }

    /// Copies the versions recorded by the hand-written migrator into
    /// `_sqlx_migrations`, once, so that an existing install is not migrated
    /// again.
    async fn adopt_legacy_versions(&self, migrator: &Migrator) -> Result<(), StoreError> {
        let legacy_exists = match self.backend {
            Backend::Sqlite => sqlx::query_scalar::<_, i64>(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = $1",
            ),
            Backend::Postgres => sqlx::query_scalar::<_, i64>(
                "SELECT COUNT(*) FROM information_schema.tables \
                 WHERE table_schema = current_schema() AND table_name = $1",
            ),
        }
        .bind(LEGACY_TABLE)
        .fetch_one(&self.pool)
        .await?
            > 0;
        if !legacy_exists {
            return Ok(());
        }
        let mut conn = self.pool.acquire().await?;
        conn.ensure_migrations_table().await?;
        let adopted: BTreeSet<i64> = conn
            .list_applied_migrations()
            .await?
            .into_iter()
            .map(|m| m.version)
            .collect();
        let legacy: Vec<i64> = sqlx::query_scalar(&format!(
            "SELECT version FROM {LEGACY_TABLE} ORDER BY version"
        ))
        .fetch_all(&mut *conn)
        .await?;
        for version in legacy.into_iter().filter(|v| !adopted.contains(v)) {
            let Some(m) = migrator.iter().find(|m| m.version == version) else {
                return Err(StoreError::Corrupt(format!(
                    "{LEGACY_TABLE} records version {version}, which this build does not know"
                )));
            };
            sqlx::query(
                "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
                 VALUES ($1, $2, TRUE, $3, 0) ON CONFLICT (version) DO NOTHING",
            )
            .bind(m.version)
            .bind(m.description.to_string())
            .bind(m.checksum.to_vec())
            .execute(&mut *conn)
            .await?;
            tracing::info!(
                version,
                "adopted a migration applied by the previous migrator"
            );
        }
        Ok(())
    }
}

async fn case_collisions(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
) -> Result<Vec<Vec<String>>, StoreError> {
    let rows = sqlx::query(
        "SELECT lower(username) AS folded, username FROM users WHERE lower(username) IN \
         (SELECT lower(username) FROM users GROUP BY lower(username) HAVING COUNT(*) > 1) \
         ORDER BY lower(username), username",
    )
    .fetch_all(&mut **tx)
    .await?;
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in rows {
        let folded: String = r.try_get("folded")?;
        let name: String = r.try_get("username")?;
        groups.entry(folded).or_default().push(name);
    }
    Ok(groups.into_values().collect())
}
