//! All SQL of the service: one store over SQLite or PostgreSQL, its migrations, and the mapping of constraint violations to domain errors.
//!
//! The store talks to both backends through sqlx's `Any` driver so that every
//! query is written once; the SQL is kept to the common subset (`$N`
//! placeholders, `RETURNING`, `ON CONFLICT`, integers and text only).
//! Timestamps are unix seconds.

use std::collections::BTreeMap;
use std::sync::Once;

use serde_json::{Map, Value};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};

/// How many times registration retries when the derivation index it picked
/// was taken by a concurrent registration.
pub const DERIVATION_INDEX_ATTEMPTS: u32 = 5;

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A username equal to this one, ignoring case, already exists.
    #[error("username {0:?} is taken")]
    UsernameTaken(String),
    /// Every attempt to pick a derivation index collided with another account.
    #[error("derivation index still collided after {DERIVATION_INDEX_ATTEMPTS} attempts")]
    DerivationIndexConflict,
    /// The schema upgrade to case-insensitive usernames was refused.
    #[error("refusing schema upgrade {version}: usernames that differ only by case exist: {}", format_collisions(.collisions))]
    CaseCollisions {
        /// The migration that was refused.
        version: i64,
        /// Each group holds the stored names that are equal ignoring case.
        collisions: Vec<Vec<String>>,
    },
    /// The database URL names a backend the store does not support.
    #[error("unsupported database URL {0:?}: expected sqlite://… or postgres://…")]
    UnsupportedUrl(String),
    /// The address of a new account could not be derived.
    #[error("address derivation failed: {0}")]
    Address(String),
    /// A stored row does not have the shape the store expects.
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// Any other database failure.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

fn format_collisions(groups: &[Vec<String>]) -> String {
    groups
        .iter()
        .map(|g| g.join(" / "))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Which database the store runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// SQLite (a file in the data directory by default).
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

struct Migration {
    version: i64,
    description: &'static str,
    sql: &'static str,
}

/// The version of the migration that adds case-insensitive username uniqueness.
pub const CASE_INSENSITIVE_USERNAMES: i64 = 2;

const SQLITE_MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "initial",
        sql: include_str!("../migrations/sqlite/0001_initial.sql"),
    },
    Migration {
        version: 2,
        description: "username_case_insensitive",
        sql: include_str!("../migrations/sqlite/0002_username_case_insensitive.sql"),
    },
    Migration {
        version: 3,
        description: "money",
        sql: include_str!("../migrations/sqlite/0003_money.sql"),
    },
    Migration {
        version: 4,
        description: "coinbase_maturity",
        sql: include_str!("../migrations/sqlite/0004_coinbase_maturity.sql"),
    },
];

const POSTGRES_MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "initial",
        sql: include_str!("../migrations/postgres/0001_initial.sql"),
    },
    Migration {
        version: 2,
        description: "username_case_insensitive",
        sql: include_str!("../migrations/postgres/0002_username_case_insensitive.sql"),
    },
    Migration {
        version: 3,
        description: "money",
        sql: include_str!("../migrations/postgres/0003_money.sql"),
    },
    Migration {
        version: 4,
        description: "coinbase_maturity",
        sql: include_str!("../migrations/postgres/0004_coinbase_maturity.sql"),
    },
];

/// A user account as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserRow {
    /// Primary key.
    pub id: i64,
    /// The name exactly as typed at registration.
    pub username: String,
    /// The Argon2 PHC string.
    pub password_hash: String,
    /// Embedded in tokens as `tv`; raised to revoke every earlier token.
    pub token_version: i64,
    /// The account's unique wallet derivation index.
    pub derivation_index: i64,
    /// The deposit address derived from `derivation_index`.
    pub address: String,
}

/// A round as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundRow {
    /// Primary key, the round id shown to clients.
    pub id: i64,
    /// `open`, `closing`, `drawing`, `paying_out` or `closed`.
    pub status: String,
    /// Unix seconds.
    pub opened_at: i64,
    /// Unix seconds.
    pub closes_at: i64,
    /// Sum of the round's bets.
    pub pot_sats: i64,
    /// Number of distinct users who bet.
    pub bettors: i64,
}

/// The service configuration row.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct ServiceConfig {
    /// Where the 30% commission goes.
    pub fee_address: String,
    /// Miner fee rate of the service's transactions.
    pub fee_rate_sat_vb: i64,
    /// Length of a round; applies from the next round.
    pub round_duration_seconds: i64,
    /// Smallest accepted bet.
    pub min_bet_sats: i64,
    /// Smallest accepted withdrawal.
    pub min_withdrawal_sats: i64,
    /// Confirmations before a deposit is credited.
    pub deposit_confirmations: i64,
    /// Maintenance switch; changed only by pause and resume.
    pub paused: bool,
}

impl ServiceConfig {
    /// The settable fields as JSON values, keyed by name, for diffs.
    pub fn settable_fields(&self) -> BTreeMap<&'static str, Value> {
        BTreeMap::from([
            ("fee_address", Value::from(self.fee_address.clone())),
            ("fee_rate_sat_vb", Value::from(self.fee_rate_sat_vb)),
            (
                "round_duration_seconds",
                Value::from(self.round_duration_seconds),
            ),
            ("min_bet_sats", Value::from(self.min_bet_sats)),
            ("min_withdrawal_sats", Value::from(self.min_withdrawal_sats)),
            (
                "deposit_confirmations",
                Value::from(self.deposit_confirmations),
            ),
        ])
    }
}

/// A change to the settable config fields; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigPatch {
    /// New fee address (already validated).
    pub fee_address: Option<String>,
    /// New fee rate.
    pub fee_rate_sat_vb: Option<i64>,
    /// New round duration.
    pub round_duration_seconds: Option<i64>,
    /// New minimum bet.
    pub min_bet_sats: Option<i64>,
    /// New minimum withdrawal.
    pub min_withdrawal_sats: Option<i64>,
    /// New deposit confirmations.
    pub deposit_confirmations: Option<i64>,
}

impl ConfigPatch {
    fn apply(&self, base: &ServiceConfig) -> ServiceConfig {
        let mut next = base.clone();
        if let Some(v) = &self.fee_address {
            next.fee_address = v.clone();
        }
        if let Some(v) = self.fee_rate_sat_vb {
            next.fee_rate_sat_vb = v;
        }
        if let Some(v) = self.round_duration_seconds {
            next.round_duration_seconds = v;
        }
        if let Some(v) = self.min_bet_sats {
            next.min_bet_sats = v;
        }
        if let Some(v) = self.min_withdrawal_sats {
            next.min_withdrawal_sats = v;
        }
        if let Some(v) = self.deposit_confirmations {
            next.deposit_confirmations = v;
        }
        next
    }
}

/// One `{before, after}` pair per changed field.
pub type ConfigDiff = Map<String, Value>;

/// The per-field difference between two configs, only for changed fields.
pub fn config_diff(before: &ServiceConfig, after: &ServiceConfig) -> ConfigDiff {
    let a = before.settable_fields();
    let b = after.settable_fields();
    let mut diff = Map::new();
    for (field, old) in a {
        let new = b.get(field).cloned().unwrap_or(Value::Null);
        if old != new {
            diff.insert(
                field.to_string(),
                serde_json::json!({"before": old, "after": new}),
            );
        }
    }
    diff
}

/// One audit-log entry.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct AuditEntry {
    /// Increasing id; pages go by `before_id`.
    pub id: i64,
    /// RFC 3339 UTC time of the entry.
    pub at: String,
    /// `config_updated`, `paused`, `resumed`, `password_reset`, …
    pub event: String,
    /// Who did it (`admin` for the admin token).
    pub actor: String,
    /// `{field: {before, after}}` for config changes, else empty.
    #[schema(value_type = Object)]
    pub diff: Value,
    /// Event-specific details.
    #[schema(value_type = Object)]
    pub details: Value,
}

/// The database of the service.
#[derive(Debug, Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
}

static INSTALL_DRIVERS: Once = Once::new();

impl Store {
    /// Connects to `url` (`sqlite://path` creates the file, `postgres://…`).
    ///
    /// # Errors
    /// [`StoreError::UnsupportedUrl`] for other schemes, or the connection error.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        INSTALL_DRIVERS.call_once(sqlx::any::install_default_drivers);
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres
        } else {
            return Err(StoreError::UnsupportedUrl(url.to_string()));
        };
        let url = match backend {
            Backend::Sqlite if !url.contains("mode=") => {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}mode=rwc")
            }
            _ => url.to_string(),
        };
        let mut options = AnyPoolOptions::new().max_connections(max_connections.max(1));
        if backend == Backend::Sqlite {
            options = options.after_connect(|conn, _meta| {
                Box::pin(async move {
                    // WAL lets readers run beside the single writer; a
                    // generous busy timeout turns writer contention into
                    // waiting instead of errors.
                    use sqlx::Executor as _;
                    conn.execute(
                        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
                         PRAGMA busy_timeout = 10000; PRAGMA foreign_keys = ON;",
                    )
                    .await?;
                    Ok(())
                })
            });
        }
        let pool = options.connect(&url).await?;
        Ok(Self { pool, backend })
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The connection pool, for tests that need to reach around the store.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Closes every connection.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    fn migrations(&self) -> &'static [Migration] {
        match self.backend {
            Backend::Sqlite => SQLITE_MIGRATIONS,
            Backend::Postgres => POSTGRES_MIGRATIONS,
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
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS potluck_schema_migrations (\
               version BIGINT PRIMARY KEY, description TEXT NOT NULL, applied_at BIGINT NOT NULL)",
        )
        .execute(&self.pool)
        .await?;
        for m in self.migrations().iter().filter(|m| m.version <= target) {
            let applied: Option<i64> = sqlx::query_scalar(
                "SELECT version FROM potluck_schema_migrations WHERE version = $1",
            )
            .bind(m.version)
            .fetch_optional(&self.pool)
            .await?;
            if applied.is_some() {
                continue;
            }
            let mut tx = self.pool.begin().await?;
            if m.version == CASE_INSENSITIVE_USERNAMES {
                let collisions = case_collisions(&mut tx).await?;
                if !collisions.is_empty() {
                    return Err(StoreError::CaseCollisions {
                        version: m.version,
                        collisions,
                    });
                }
            }
            sqlx::raw_sql(m.sql).execute(&mut *tx).await?;
            sqlx::query(
                "INSERT INTO potluck_schema_migrations (version, description, applied_at) VALUES ($1, $2, $3)",
            )
            .bind(m.version)
            .bind(m.description)
            .bind(unix_now())
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            tracing::info!(
                version = m.version,
                description = m.description,
                "applied migration"
            );
        }
        Ok(())
    }

    /// Creates an account, picking the next free derivation index and
    /// retrying on an index collision up to [`DERIVATION_INDEX_ATTEMPTS`] times.
    ///
    /// # Errors
    /// [`StoreError::UsernameTaken`], [`StoreError::DerivationIndexConflict`],
    /// [`StoreError::Address`] when `derive` fails.
    pub async fn create_user(
        &self,
        username: &str,
        password_hash: &str,
        derive: impl Fn(u32) -> Result<String, String>,
    ) -> Result<UserRow, StoreError> {
        let pool = self.pool.clone();
        self.create_user_with(username, password_hash, derive, move || {
            let pool = pool.clone();
            async move {
                // One atomic increment per attempt, so concurrent
                // registrations get distinct indexes on both backends.
                let next: i64 = sqlx::query_scalar(
                    "UPDATE derivation_counter SET next_index = next_index + 1 WHERE id = 1 \
                     RETURNING next_index - 1",
                )
                .fetch_one(&pool)
                .await?;
                Ok(next)
            }
        })
        .await
    }

    /// [`Store::create_user`] with the index picker given, so that tests can
    /// force collisions.
    ///
    /// # Errors
    /// As [`Store::create_user`].
    pub async fn create_user_with<F, Fut>(
        &self,
        username: &str,
        password_hash: &str,
        derive: impl Fn(u32) -> Result<String, String>,
        pick_index: F,
    ) -> Result<UserRow, StoreError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<i64, StoreError>>,
    {
        for attempt in 1..=DERIVATION_INDEX_ATTEMPTS {
            let index = pick_index().await?;
            let index_u32 = u32::try_from(index)
                .ok()
                .filter(|i| *i < (1 << 31))
                .ok_or_else(|| {
                    StoreError::Address(format!("derivation index {index} out of range"))
                })?;
            let address = derive(index_u32).map_err(StoreError::Address)?;
            let result = sqlx::query(
                "INSERT INTO users (username, password_hash, token_version, derivation_index, address, created_at) \
                 VALUES ($1, $2, 0, $3, $4, $5) RETURNING id",
            )
            .bind(username)
            .bind(password_hash)
            .bind(index)
            .bind(&address)
            .bind(unix_now())
            .fetch_one(&self.pool)
            .await;
            match result {
                Ok(row) => {
                    return Ok(UserRow {
                        id: row.try_get("id")?,
                        username: username.to_string(),
                        password_hash: password_hash.to_string(),
                        token_version: 0,
                        derivation_index: index,
                        address,
                    })
                }
                Err(e) => match unique_violation(&e) {
                    Some(Unique::DerivationIndex) => {
                        tracing::warn!(index, attempt, "derivation index collision, retrying");
                        continue;
                    }
                    Some(Unique::Username) => {
                        return Err(StoreError::UsernameTaken(username.to_string()))
                    }
                    None => return Err(e.into()),
                },
            }
        }
        Err(StoreError::DerivationIndexConflict)
    }

    /// The account whose name equals `username` ignoring case.
    ///
    /// # Errors
    /// Database failures.
    pub async fn user_by_name(&self, username: &str) -> Result<Option<UserRow>, StoreError> {
        let row = sqlx::query(
            "SELECT id, username, password_hash, token_version, derivation_index, address \
             FROM users WHERE lower(username) = lower($1)",
        )
        .bind(username)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| user_from_row(&r)).transpose()
    }

    /// The account with primary key `id`.
    ///
    /// # Errors
    /// Database failures.
    pub async fn user_by_id(&self, id: i64) -> Result<Option<UserRow>, StoreError> {
        let row = sqlx::query(
            "SELECT id, username, password_hash, token_version, derivation_index, address \
             FROM users WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| user_from_row(&r)).transpose()
    }

    /// The oldest and the newest account (fewer when there are fewer), whose
    /// stored addresses show whether the wallet seed is the one that made them.
    ///
    /// # Errors
    /// Database failures.
    pub async fn first_and_last_users(&self) -> Result<Vec<UserRow>, StoreError> {
        let mut users = Vec::new();
        for order in ["ASC", "DESC"] {
            let row = sqlx::query(&format!(
                "SELECT id, username, password_hash, token_version, derivation_index, address \
                 FROM users ORDER BY id {order} LIMIT 1"
            ))
            .fetch_optional(&self.pool)
            .await?;
            if let Some(r) = row {
                let user = user_from_row(&r)?;
                if users.iter().all(|u: &UserRow| u.id != user.id) {
                    users.push(user);
                }
            }
        }
        Ok(users)
    }

    /// The stored token version of user `id`, the only thing the per-request
    /// session check needs.
    ///
    /// # Errors
    /// Database failures.
    pub async fn token_version(&self, id: i64) -> Result<Option<(String, i64)>, StoreError> {
        let row = sqlx::query("SELECT username, token_version FROM users WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Ok((r.try_get("username")?, r.try_get("token_version")?)))
            .transpose()
    }

    /// Replaces the password hash of user `id` if its token version is still
    /// `expected_tv`, raising the version; returns the new version, or `None`
    /// when the session changed meanwhile.
    ///
    /// # Errors
    /// Database failures.
    pub async fn change_password(
        &self,
        id: i64,
        expected_tv: i64,
        password_hash: &str,
    ) -> Result<Option<i64>, StoreError> {
        let tv: Option<i64> = sqlx::query_scalar(
            "UPDATE users SET password_hash = $1, token_version = token_version + 1 \
             WHERE id = $2 AND token_version = $3 RETURNING token_version",
        )
        .bind(password_hash)
        .bind(id)
        .bind(expected_tv)
        .fetch_optional(&self.pool)
        .await?;
        Ok(tv)
    }

    /// Admin reset: sets a new hash for `username` (ignoring case), raises the
    /// token version and writes the audit entry in one transaction.
    /// Returns the stored name and the new token version, `None` if unknown.
    ///
    /// # Errors
    /// Database failures.
    pub async fn reset_password(
        &self,
        username: &str,
        password_hash: &str,
        actor: &str,
    ) -> Result<Option<(String, i64)>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "UPDATE users SET password_hash = $1, token_version = token_version + 1 \
             WHERE lower(username) = lower($2) RETURNING username, token_version",
        )
        .bind(password_hash)
        .bind(username)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let name: String = row.try_get("username")?;
        let tv: i64 = row.try_get("token_version")?;
        insert_audit(
            &mut tx,
            "password_reset",
            actor,
            &Map::new(),
            &serde_json::json!({"username": name, "token_version": tv}),
        )
        .await?;
        tx.commit().await?;
        Ok(Some((name, tv)))
    }

    /// The newest round, if any.
    ///
    /// # Errors
    /// Database failures.
    pub async fn current_round(&self) -> Result<Option<RoundRow>, StoreError> {
        let row = sqlx::query(
            "SELECT id, status, opened_at, closes_at, pot_sats, bettors FROM rounds ORDER BY id DESC LIMIT 1",
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
            "SELECT id, status, opened_at, closes_at, pot_sats, bettors FROM rounds ORDER BY id DESC LIMIT 1",
        )
        .fetch_optional(&mut *tx)
        .await?;
        let round = match existing {
            Some(r) => round_from_row(&r)?,
            None => {
                let row = sqlx::query(
                    "INSERT INTO rounds (status, opened_at, closes_at, pot_sats, bettors) \
                     VALUES ('open', $1, $2, 0, 0) \
                     RETURNING id, status, opened_at, closes_at, pot_sats, bettors",
                )
                .bind(now)
                .bind(now + duration)
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
            "SELECT COUNT(*) FROM bets WHERE round_id = $1 AND user_id = $2 AND status = 'placed'",
        )
        .bind(round_id)
        .bind(user_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(n > 0)
    }

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
        actor: &str,
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
            "config_updated",
            actor,
            &diff,
            &Value::Object(Map::new()),
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
        actor: &str,
    ) -> Result<(ServiceConfig, bool), StoreError> {
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
        let mut diff = Map::new();
        diff.insert(
            "paused".into(),
            serde_json::json!({"before": config.paused, "after": paused}),
        );
        let event = if paused { "paused" } else { "resumed" };
        insert_audit(&mut tx, event, actor, &diff, &Value::Object(Map::new())).await?;
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
                    at: crate::time::rfc3339(r.try_get("at")?),
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
    event: &str,
    actor: &str,
    diff: &ConfigDiff,
    details: &Value,
) -> Result<(), StoreError> {
    insert_audit(tx, event, actor, diff, details).await
}

async fn insert_audit(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    event: &str,
    actor: &str,
    diff: &ConfigDiff,
    details: &Value,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO audit_log (at, event, actor, diff, details) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(unix_now())
    .bind(event)
    .bind(actor)
    .bind(Value::Object(diff.clone()).to_string())
    .bind(details.to_string())
    .execute(&mut **tx)
    .await?;
    Ok(())
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

enum Unique {
    Username,
    DerivationIndex,
}

/// Names the unique constraint an insert into `users` violated. SQLite
/// reports it only in the message, PostgreSQL by constraint name.
fn unique_violation(e: &sqlx::Error) -> Option<Unique> {
    let sqlx::Error::Database(db) = e else {
        return None;
    };
    if !db.is_unique_violation() {
        return None;
    }
    let text = format!("{} {}", db.constraint().unwrap_or(""), db.message());
    if text.contains("derivation_index") {
        Some(Unique::DerivationIndex)
    } else {
        Some(Unique::Username)
    }
}

fn user_from_row(r: &AnyRow) -> Result<UserRow, StoreError> {
    Ok(UserRow {
        id: r.try_get("id")?,
        username: r.try_get("username")?,
        password_hash: r.try_get("password_hash")?,
        token_version: r.try_get("token_version")?,
        derivation_index: r.try_get("derivation_index")?,
        address: r.try_get("address")?,
    })
}

fn round_from_row(r: &AnyRow) -> Result<RoundRow, StoreError> {
    Ok(RoundRow {
        id: r.try_get("id")?,
        status: r.try_get("status")?,
        opened_at: r.try_get("opened_at")?,
        closes_at: r.try_get("closes_at")?,
        pot_sats: r.try_get("pot_sats")?,
        bettors: r.try_get("bettors")?,
    })
}

fn config_from_row(r: &AnyRow) -> Result<ServiceConfig, StoreError> {
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

/// Current unix time in seconds.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
