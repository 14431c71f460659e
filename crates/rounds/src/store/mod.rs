//! All SQL of the service: one store over SQLite or PostgreSQL, its migrations, and the mapping of constraint violations to domain errors.
//!
//! The store talks to both backends through sqlx's `Any` driver so that every
//! query is written once; the SQL is kept to the common subset (`$N`
//! placeholders, `RETURNING`, `ON CONFLICT`, integers and text only).
//! Timestamps are unix seconds.

pub mod bumps;
pub mod chain;
mod group_commit;
pub mod idempotency;
pub mod ledger;
pub mod limits;
pub mod migrations;
pub mod rounds;
pub mod settings;
pub mod users;

pub use ledger::LedgerError;
pub use users::UserRow;

use std::str::FromStr;
use std::sync::Once;

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};

use crate::domain::round::UnknownState;

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
    /// A stored round no lifecycle writes (its draw columns do not fit its
    /// status, or a hash column holds no hash).
    #[error("round {round_id} as stored")]
    Round {
        /// The round.
        round_id: i64,
        /// What is wrong with it.
        #[source]
        source: rounds::RoundDecodeError,
    },
    /// A stored transfer's txid is not one.
    #[error("transfer {transfer_id} holds txid {text:?}")]
    TransferTxid {
        /// The transfer.
        transfer_id: i64,
        /// The stored text.
        text: String,
        /// Why it does not parse.
        #[source]
        source: bitcoin::hex::HexToArrayError,
    },
    /// A stored txid (of an output, a ledger correction, …) is not one.
    #[error("{table} row {id} holds txid {text:?}")]
    StoredTxid {
        /// The table.
        table: &'static str,
        /// The row.
        id: i64,
        /// The stored text.
        text: String,
        /// Why it does not parse.
        #[source]
        source: bitcoin::hex::HexToArrayError,
    },
    /// A processed block's stored hash is not one.
    #[error("block {height} holds hash {text:?}")]
    StoredBlockHash {
        /// The block's height.
        height: i64,
        /// The stored text.
        text: String,
        /// Why it does not parse.
        #[source]
        source: bitcoin::hex::HexToArrayError,
    },
    /// The task writing a group of bets and broadcast marks stopped before
    /// it answered (whether the request was written is unknown until read).
    #[error("the group write stopped before it answered")]
    GroupWriteLost,
    /// Any other database failure.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// A migration failed (or the applied ones do not match this build's).
    #[error(transparent)]
    Migrate(#[from] sqlx::migrate::MigrateError),
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

/// The database of the service: a pool over SQLite or PostgreSQL.
#[derive(Debug, Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// Serialises this process's hot write transactions on SQLite (bets,
    /// withdrawals, broadcast marks): SQLite has one writer, and a
    /// connection that finds the write lock taken sleeps in its busy
    /// handler (1 ms, 2 ms, 5 ms, …) instead of being woken when the lock
    /// frees; queueing here hands the lock over at once.
    write_gate: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// Bets and broadcast marks waiting for the next group commit.
    group: std::sync::Arc<group_commit::GroupCommit>,
    /// Most bets a round takes: [`MAX_ROUND_BETS`](crate::domain::settings::MAX_ROUND_BETS),
    /// lower in the store's own tests.
    max_round_bets: i64,
    /// Most bets one user places in one round.
    max_user_round_bets: i64,
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
        // No ping before each checkout: it is a round trip (PostgreSQL) or a
        // hand-off to the connection's worker thread (SQLite) per query,
        // doubling the cost of the one-statement reads. A connection that
        // died while idle fails its next statement instead (nothing is
        // written; the error is answered) and is then dropped by the pool.
        let mut options = AnyPoolOptions::new()
            .max_connections(max_connections.max(1))
            .test_before_acquire(false);
        if backend == Backend::Sqlite {
            options = options.after_connect(|conn, _meta| {
                Box::pin(async move {
                    // WAL lets readers run beside the single writer; a
                    // generous busy timeout turns writer contention into
                    // waiting instead of errors. FULL: WAL with NORMAL syncs
                    // only at checkpoints, so a power cut could take back
                    // commits already acted on (a withdrawal's record after
                    // its broadcast: paid twice); PostgreSQL flushes every
                    // commit too. Group commit shares the fsync among bets.
                    use sqlx::Executor as _;
                    conn.execute(
                        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; \
                         PRAGMA busy_timeout = 10000; PRAGMA foreign_keys = ON; \
                         PRAGMA temp_store = MEMORY;",
                    )
                    .await?;
                    // The group commit's one-statement write (TEMP: this
                    // connection only, nothing on disk; the tables it names
                    // are looked up when it runs, after the migrations).
                    conn.execute(group_commit::SQLITE_GROUP_SETUP).await?;
                    Ok(())
                })
            });
        } else {
            options = options.after_connect(|conn, _meta| {
                Box::pin(async move {
                    // sqlx prepares every statement; in the default mode
                    // PostgreSQL still planned some of them again on each
                    // run (a bet's context join, the group statement whose
                    // JSON rows it cannot see into anyway), a few hundred
                    // microseconds of its CPU per bet on a machine the
                    // service shares with it. Every statement here is an
                    // index lookup whose best plan does not depend on the
                    // values bound (docs/rounds-engine.md, "Performance
                    // notes").
                    use sqlx::Executor as _;
                    conn.execute("SET plan_cache_mode = force_generic_plan")
                        .await?;
                    Ok(())
                })
            });
        }
        let pool = options.connect(&url).await?;
        Ok(Self {
            pool,
            backend,
            write_gate: std::sync::Arc::default(),
            group: std::sync::Arc::default(),
            max_round_bets: crate::domain::settings::MAX_ROUND_BETS,
            max_user_round_bets: crate::domain::settings::DEFAULT_MAX_USER_ROUND_BETS,
        })
    }

    /// Most bets one user places in one round.
    pub fn max_user_round_bets(&self) -> i64 {
        self.max_user_round_bets
    }

    /// The same store with another per-user share of a round
    /// (`--max-bets-per-user-per-round`).
    pub fn with_max_user_round_bets(mut self, max: i64) -> Self {
        self.max_user_round_bets = max;
        self
    }

    /// Most bets a round takes.
    pub(crate) fn max_round_bets(&self) -> i64 {
        self.max_round_bets
    }

    /// The same store with a smaller cap on bets per round, so that tests
    /// reach it with a few bets.
    #[cfg(test)]
    pub(crate) fn with_max_round_bets(mut self, max: i64) -> Self {
        self.max_round_bets = max;
        self
    }

    /// Held around a hot write transaction: on SQLite the process's turn
    /// at the write lock (see `write_gate`), on PostgreSQL nothing (row
    /// locks let writers of different rows run at once).
    pub(crate) async fn write_turn(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match self.backend {
            Backend::Sqlite => Some(self.write_gate.lock().await),
            Backend::Postgres => None,
        }
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The connection pool, for tests that need to reach around the store.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Whether the database answers a trivial query.
    ///
    /// # Errors
    /// The database error.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Closes every connection.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

enum Unique {
    Username,
    DerivationIndex,
}

/// Binds a stored state as its name: the enum is the value a query is
/// given, so no query spells a state's name itself.
macro_rules! bind_as_stored_name {
    ($($name:ty),+ $(,)?) => {$(
        impl sqlx::Type<sqlx::Any> for $name {
            fn type_info() -> sqlx::any::AnyTypeInfo {
                <&str as sqlx::Type<sqlx::Any>>::type_info()
            }
        }

        impl<'q> sqlx::Encode<'q, sqlx::Any> for $name {
            fn encode_by_ref(
                &self,
                buf: &mut <sqlx::Any as sqlx::Database>::ArgumentBuffer<'q>,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                <&'q str as sqlx::Encode<'q, sqlx::Any>>::encode(self.as_str(), buf)
            }
        }
    )+};
}

bind_as_stored_name!(
    crate::domain::round::RoundStatus,
    crate::domain::round::TransferKind,
    crate::domain::round::TransferStatus,
    crate::domain::round::OutputOrigin,
    crate::domain::round::BetStatus,
    crate::domain::audit::AuditEvent,
    crate::domain::audit::AuditActor,
);

/// Reads a state column (`status`, `kind`, `origin`) into its enum: the
/// store's edge, where stored names become types.
pub(crate) fn state_column<T>(r: &AnyRow, column: &str) -> Result<T, sqlx::Error>
where
    T: FromStr<Err = UnknownState>,
{
    let text: String = r.try_get(column)?;
    text.parse()
        .map_err(|e: UnknownState| sqlx::Error::ColumnDecode {
            index: column.to_string(),
            source: Box::new(e),
        })
}

/// The `txid` column of row `r` of `table` (which carries its `id`),
/// decoded at the store's edge.
///
/// # Errors
/// [`StoreError::StoredTxid`] when the stored text is not a txid.
pub(crate) fn txid_column(r: &AnyRow, table: &'static str) -> Result<bitcoin::Txid, StoreError> {
    let text: String = r.try_get("txid")?;
    bitcoin::Txid::from_str(&text).map_err(|source| StoreError::StoredTxid {
        table,
        id: r.try_get("id").unwrap_or_default(),
        text,
        source,
    })
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

#[cfg(test)]
mod tests;
