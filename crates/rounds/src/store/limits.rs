//! Shared state of the limits when several processes use one database: login-throttle failures and attempts in flight, registration-quota slots, open streams per IP, and process heartbeats.
//!
//! Every decision is one transaction that first locks the keys it reads
//! (PostgreSQL: transaction-scoped advisory locks per key, taken in sorted
//! order; SQLite: the database write lock), so two processes racing on one
//! key are serialised and cannot both pass. The rules themselves stay in
//! `security::throttle` and the callers; the store hands rows to closures.

use std::time::Duration;

use sqlx::Row;

use super::{Backend, Store, StoreError};
use crate::domain::lockout::Failures;
use crate::domain::time::UnixMillis;

/// The `LISTEN`/`NOTIFY` channel that tells a process to close one of its
/// streams (payload `process:stream`).
pub const EVICT_CHANNEL: &str = "potluck_stream_evict";

type Tx<'a> = sqlx::Transaction<'a, sqlx::Any>;

/// The new failure record of the i-th key given its old one, and when the
/// new one fully expires.
pub type FailureUpdate =
    dyn Fn(usize, Option<&Failures<UnixMillis>>) -> (Failures<UnixMillis>, UnixMillis) + Sync;

/// The new failure record of one key given its old one, and when the new
/// one fully expires.
pub type KeyFailureUpdate<'a> =
    dyn Fn(Option<&Failures<UnixMillis>>) -> (Failures<UnixMillis>, UnixMillis) + Sync + 'a;

/// A throttle key's failure record and its attempts in flight.
pub type ThrottleState = (Option<Failures<UnixMillis>>, u32);

/// The lock [`Store::throttle_cap`] takes; no throttle key has this form
/// (they are `u:…` and `i:…`).
const THROTTLE_CAP_LOCK: &str = "throttle table cap";

impl Store {
    /// Serialises transactions on `keys` (sorted, deduplicated by the caller).
    async fn lock_limit_keys(&self, tx: &mut Tx<'_>, keys: &[String]) -> Result<(), StoreError> {
        match self.backend {
            Backend::Postgres => {
                for key in keys {
                    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 18))")
                        .bind(key)
                        .execute(&mut **tx)
                        .await?;
                }
            }
            Backend::Sqlite => {
                sqlx::query("UPDATE limits_lock SET id = id WHERE id = 1")
                    .execute(&mut **tx)
                    .await?;
            }
        }
        Ok(())
    }

    async fn throttle_state(
        tx: &mut Tx<'_>,
        key: &str,
        now: UnixMillis,
    ) -> Result<ThrottleState, StoreError> {
        let row = sqlx::query(
            "SELECT failures, last_failure_ms, locked_until_ms FROM throttle_failures WHERE key = $1",
        )
        .bind(key)
        .fetch_optional(&mut **tx)
        .await?;
        let record = match row {
            Some(r) => Some(Failures {
                failures: u32::try_from(r.try_get::<i64, _>(0)?).unwrap_or(u32::MAX),
                last_failure: UnixMillis(r.try_get(1)?),
                locked_until: UnixMillis(r.try_get(2)?),
            }),
            None => None,
        };
        let in_flight: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM throttle_attempts WHERE key = $1 AND lease_until_ms > $2",
        )
        .bind(key)
        .bind(now.0)
        .fetch_one(&mut **tx)
        .await?;
        Ok((record, u32::try_from(in_flight).unwrap_or(u32::MAX)))
    }

    /// Checks `keys` and, when `admit` returns no wait, records attempt
    /// `attempt` in flight against each of them until `lease_until`; both in
    /// one transaction. Returns the wait (zero: admitted).
    ///
    /// # Errors
    /// The database.
    pub async fn throttle_begin(
        &self,
        keys: &[String],
        attempt: i64,
        now: UnixMillis,
        lease_until: UnixMillis,
        admit: impl FnOnce(&[ThrottleState]) -> Duration,
    ) -> Result<Duration, StoreError> {
        let mut tx = self.pool.begin().await?;
        self.lock_limit_keys(&mut tx, &sorted(keys)).await?;
        let mut states = Vec::with_capacity(keys.len());
        for key in keys {
            states.push(Self::throttle_state(&mut tx, key, now).await?);
        }
        let wait = admit(&states);
        if !wait.is_zero() {
            tx.rollback().await?;
            return Ok(wait);
        }
        for key in keys {
            sqlx::query(
                "INSERT INTO throttle_attempts (attempt, key, lease_until_ms) VALUES ($1, $2, $3)",
            )
            .bind(attempt)
            .bind(key)
            .bind(lease_until.0)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(Duration::ZERO)
    }

    /// Settles attempt `attempt`: its reservations go; with `failure`, each
    /// key's record becomes `failure(index, record)` (the new record and
    /// when it fully expires); `forget` (a successful login's user key)
    /// loses its record.
    ///
    /// # Errors
    /// The database.
    pub async fn throttle_settle(
        &self,
        attempt: i64,
        keys: &[String],
        failure: Option<&FailureUpdate>,
        forget: Option<&str>,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        self.lock_limit_keys(&mut tx, &sorted(keys)).await?;
        sqlx::query("DELETE FROM throttle_attempts WHERE attempt = $1")
            .bind(attempt)
            .execute(&mut *tx)
            .await?;
        if let Some(update) = failure {
            for (i, key) in keys.iter().enumerate() {
                let (before, _) = Self::throttle_state(&mut tx, key, now).await?;
                let (after, expires) = update(i, before.as_ref());
                upsert_failures(&mut tx, key, &after, expires).await?;
            }
        }
        if let Some(key) = forget {
            sqlx::query("DELETE FROM throttle_failures WHERE key = $1")
                .bind(key)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Counts one failure against `key` alone, with no attempt in flight
    /// (the admin throttle reserves in memory): the new record is
    /// `update(old record)`, with when it fully expires; read and written
    /// under the key's lock, so concurrent failures each count.
    ///
    /// # Errors
    /// The database.
    pub async fn throttle_count_failure(
        &self,
        key: &str,
        now: UnixMillis,
        update: &KeyFailureUpdate<'_>,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        self.lock_limit_keys(&mut tx, &[key.to_string()]).await?;
        let (before, _) = Self::throttle_state(&mut tx, key, now).await?;
        let (after, expires) = update(before.as_ref());
        upsert_failures(&mut tx, key, &after, expires).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Forgets the failure record of `key` (a correct admin token).
    ///
    /// # Errors
    /// The database.
    pub async fn throttle_forget(&self, key: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM throttle_failures WHERE key = $1")
            .bind(key)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Gives back the reservations of an attempt that was never settled.
    ///
    /// # Errors
    /// The database.
    pub async fn throttle_release(&self, attempt: i64) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM throttle_attempts WHERE attempt = $1")
            .bind(attempt)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The stored failure record of `key` (not decayed).
    ///
    /// # Errors
    /// The database.
    pub async fn throttle_record(
        &self,
        key: &str,
    ) -> Result<Option<Failures<UnixMillis>>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let (record, _) = Self::throttle_state(&mut tx, key, UnixMillis(i64::MAX)).await?;
        tx.rollback().await?;
        Ok(record)
    }

    /// Removes records that fully decayed and leases that ran out; past
    /// `max_keys` records, the ones closest to expiry go first.
    ///
    /// # Errors
    /// The database.
    pub async fn throttle_sweep(&self, now: UnixMillis, max_keys: usize) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM throttle_attempts WHERE lease_until_ms <= $1")
            .bind(now.0)
            .execute(&self.pool)
            .await?;
        sqlx::query(
            "DELETE FROM throttle_failures WHERE expires_ms <= $1 \
             AND key NOT IN (SELECT key FROM throttle_attempts)",
        )
        .bind(now.0)
        .execute(&self.pool)
        .await?;
        self.throttle_cap(max_keys).await?;
        Ok(())
    }

    /// Past `max_keys` records, removes the ones closest to expiry (1% of
    /// the cap at least); returns how many are left.
    ///
    /// # Errors
    /// The database.
    pub async fn throttle_cap(&self, max_keys: usize) -> Result<usize, StoreError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM throttle_failures")
            .fetch_one(&self.pool)
            .await?;
        let max = i64::try_from(max_keys).unwrap_or(i64::MAX);
        if n <= max {
            return Ok(usize::try_from(n).unwrap_or(0));
        }
        // One trimmer at a time, counting again under the lock. Two at once
        // (PostgreSQL reads each DELETE's subquery from its own snapshot)
        // chose the same oldest rows, deleted them once between them, and
        // left the table over the cap after every check had run.
        let mut tx = self.pool.begin().await?;
        self.lock_limit_keys(&mut tx, &[THROTTLE_CAP_LOCK.to_string()])
            .await?;
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM throttle_failures")
            .fetch_one(&mut *tx)
            .await?;
        if n > max {
            let batch = (max / 100).max(1).max(n - max);
            sqlx::query(
                "DELETE FROM throttle_failures WHERE key IN \
                 (SELECT key FROM throttle_failures ORDER BY expires_ms LIMIT $1)",
            )
            .bind(batch)
            .execute(&mut *tx)
            .await?;
        }
        let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM throttle_failures")
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(usize::try_from(left).unwrap_or(0))
    }

    /// Number of throttle records.
    ///
    /// # Errors
    /// The database.
    pub async fn throttle_len(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM throttle_failures")
            .fetch_one(&self.pool)
            .await?)
    }

    /// Holds a registration slot for `ip` until `pending_until` when fewer
    /// than `limit` registrations (counted in the `window` before `now`,
    /// plus those in progress) exist; returns the slot's id, or the wait:
    /// until the oldest of the counted registrations that fill the quota
    /// leaves the window, or 1 s when registrations in progress fill it.
    ///
    /// # Errors
    /// The database.
    pub async fn quota_reserve(
        &self,
        ip: &str,
        now: UnixMillis,
        window: Duration,
        limit: usize,
        pending_until: UnixMillis,
    ) -> Result<Result<i64, Duration>, StoreError> {
        let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
        let mut tx = self.pool.begin().await?;
        self.lock_limit_keys(&mut tx, &[format!("q:{ip}")]).await?;
        sqlx::query(
            "DELETE FROM registration_slots WHERE ip = $1 AND \
             ((pending_until_ms IS NULL AND at_ms <= $2) OR pending_until_ms <= $3)",
        )
        .bind(ip)
        .bind(now.0.saturating_sub(window_ms))
        .bind(now.0)
        .execute(&mut *tx)
        .await?;
        let counted: Vec<i64> = sqlx::query_scalar(
            "SELECT at_ms FROM registration_slots WHERE ip = $1 AND pending_until_ms IS NULL \
             ORDER BY at_ms",
        )
        .bind(ip)
        .fetch_all(&mut *tx)
        .await?;
        let pending: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM registration_slots WHERE ip = $1 AND pending_until_ms IS NOT NULL",
        )
        .bind(ip)
        .fetch_one(&mut *tx)
        .await?;
        if counted.len() >= limit {
            tx.rollback().await?;
            let oldest = UnixMillis(counted[counted.len() - limit]);
            let leaves = UnixMillis(oldest.0.saturating_add(window_ms));
            return Ok(Err(Duration::from_millis(
                u64::try_from(leaves.0.saturating_sub(now.0)).unwrap_or(0),
            )));
        }
        if counted.len() + usize::try_from(pending).unwrap_or(usize::MAX) >= limit {
            tx.rollback().await?;
            return Ok(Err(Duration::from_secs(1)));
        }
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO registration_slots (ip, at_ms, pending_until_ms) VALUES ($1, $2, $3) \
             RETURNING id",
        )
        .bind(ip)
        .bind(now.0)
        .bind(pending_until.0)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Ok(id))
    }

    /// Counts slot `id` as a registration of `ip` at `now` (the account
    /// exists); recreated if its lease ran out meanwhile.
    ///
    /// # Errors
    /// The database.
    pub async fn quota_commit(&self, id: i64, ip: &str, now: UnixMillis) -> Result<(), StoreError> {
        let done = sqlx::query(
            "UPDATE registration_slots SET at_ms = $2, pending_until_ms = NULL WHERE id = $1",
        )
        .bind(id)
        .bind(now.0)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 {
            sqlx::query("INSERT INTO registration_slots (ip, at_ms) VALUES ($1, $2)")
                .bind(ip)
                .bind(now.0)
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    /// Gives back slot `id` of a registration that did not create an account.
    ///
    /// # Errors
    /// The database.
    pub async fn quota_release(&self, id: i64) -> Result<(), StoreError> {
        sqlx::query(
            "DELETE FROM registration_slots WHERE id = $1 AND pending_until_ms IS NOT NULL",
        )
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Counted registrations of `ip` in the `window` before `now`.
    ///
    /// # Errors
    /// The database.
    pub async fn quota_used(
        &self,
        ip: &str,
        now: UnixMillis,
        window: Duration,
    ) -> Result<i64, StoreError> {
        let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
        Ok(sqlx::query_scalar(
            "SELECT COUNT(*) FROM registration_slots WHERE ip = $1 AND pending_until_ms IS NULL \
             AND at_ms > $2",
        )
        .bind(ip)
        .bind(now.0.saturating_sub(window_ms))
        .fetch_one(&self.pool)
        .await?)
    }

    /// Removes registrations that left the window and leases that ran out.
    ///
    /// # Errors
    /// The database.
    pub async fn quota_sweep(&self, now: UnixMillis, window: Duration) -> Result<(), StoreError> {
        let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
        sqlx::query(
            "DELETE FROM registration_slots WHERE \
             (pending_until_ms IS NULL AND at_ms <= $1) OR pending_until_ms <= $2",
        )
        .bind(now.0.saturating_sub(window_ms))
        .bind(now.0)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records stream `stream` of `process` for `ip` and evicts the IP's
    /// oldest streams beyond `max_per_ip`, in every process: returns the
    /// evicted streams as (process, stream). On PostgreSQL each evicted
    /// stream of another process is announced on [`EVICT_CHANNEL`] when the
    /// transaction commits.
    ///
    /// # Errors
    /// The database.
    pub async fn stream_open(
        &self,
        process: &str,
        stream: i64,
        ip: &str,
        max_per_ip: usize,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let mut tx = self.pool.begin().await?;
        self.lock_limit_keys(&mut tx, &[format!("s:{ip}")]).await?;
        sqlx::query("INSERT INTO stream_slots (process, stream, ip) VALUES ($1, $2, $3)")
            .bind(process)
            .bind(stream)
            .bind(ip)
            .execute(&mut *tx)
            .await?;
        let open: Vec<(i64, String, i64)> =
            sqlx::query("SELECT seq, process, stream FROM stream_slots WHERE ip = $1 ORDER BY seq")
                .bind(ip)
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
                .collect::<Result<_, sqlx::Error>>()?;
        let over = open.len().saturating_sub(max_per_ip);
        let mut evicted = Vec::with_capacity(over);
        for (seq, owner, id) in open.into_iter().take(over) {
            sqlx::query("DELETE FROM stream_slots WHERE seq = $1")
                .bind(seq)
                .execute(&mut *tx)
                .await?;
            if owner != process && self.backend == Backend::Postgres {
                sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(EVICT_CHANNEL)
                    .bind(format!("{owner}:{id}"))
                    .execute(&mut *tx)
                    .await?;
            }
            evicted.push((owner, id));
        }
        tx.commit().await?;
        Ok(evicted)
    }

    /// Forgets stream `stream` of `process` (it ended).
    ///
    /// # Errors
    /// The database.
    pub async fn stream_close(&self, process: &str, stream: i64) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM stream_slots WHERE process = $1 AND stream = $2")
            .bind(process)
            .bind(stream)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Open streams of `ip` in every process, oldest first, as (process, stream).
    ///
    /// # Errors
    /// The database.
    pub async fn streams_of(&self, ip: &str) -> Result<Vec<(String, i64)>, StoreError> {
        Ok(
            sqlx::query("SELECT process, stream FROM stream_slots WHERE ip = $1 ORDER BY seq")
                .bind(ip)
                .fetch_all(&self.pool)
                .await?
                .iter()
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                .collect::<Result<_, sqlx::Error>>()?,
        )
    }

    /// Records that `process` is alive at `now`, and removes the processes
    /// (with their streams) not seen since `stale_before`: a killed process
    /// leaves no stream behind for longer than that.
    ///
    /// # Errors
    /// The database.
    pub async fn process_heartbeat(
        &self,
        process: &str,
        now: UnixMillis,
        stale_before: UnixMillis,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO service_processes (process, seen_ms) VALUES ($1, $2) \
             ON CONFLICT (process) DO UPDATE SET seen_ms = excluded.seen_ms",
        )
        .bind(process)
        .bind(now.0)
        .execute(&self.pool)
        .await?;
        sqlx::query("DELETE FROM service_processes WHERE seen_ms < $1")
            .bind(stale_before.0)
            .execute(&self.pool)
            .await?;
        sqlx::query(
            "DELETE FROM stream_slots WHERE process NOT IN (SELECT process FROM service_processes)",
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Removes `process` and its streams (a clean shutdown).
    ///
    /// # Errors
    /// The database.
    pub async fn process_gone(&self, process: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM stream_slots WHERE process = $1")
            .bind(process)
            .execute(&self.pool)
            .await?;
        sqlx::query("DELETE FROM service_processes WHERE process = $1")
            .bind(process)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

fn sorted(keys: &[String]) -> Vec<String> {
    let mut v = keys.to_vec();
    v.sort();
    v.dedup();
    v
}

/// Writes `key`'s failure record and when it fully expires.
async fn upsert_failures(
    tx: &mut Tx<'_>,
    key: &str,
    after: &Failures<UnixMillis>,
    expires: UnixMillis,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO throttle_failures \
         (key, failures, last_failure_ms, locked_until_ms, expires_ms) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (key) DO UPDATE SET \
         failures = excluded.failures, last_failure_ms = excluded.last_failure_ms, \
         locked_until_ms = excluded.locked_until_ms, expires_ms = excluded.expires_ms",
    )
    .bind(key)
    .bind(i64::from(after.failures))
    .bind(after.last_failure.0)
    .bind(after.locked_until.0)
    .bind(expires.0)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
