//! Accounts: creation with a unique derivation index, look-ups, password changes and resets.

use sqlx::any::AnyRow;
use sqlx::Row;

use super::settings::insert_audit;
use super::{unique_violation, Store, StoreError, Unique, DERIVATION_INDEX_ATTEMPTS};
use crate::domain::audit::{AuditActor, AuditDetails, AuditEvent};
use crate::domain::settings::ConfigDiff;
use crate::domain::time::unix_now;

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

impl Store {
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
        actor: AuditActor,
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
            AuditEvent::PasswordReset,
            actor,
            &ConfigDiff::new(),
            &AuditDetails {
                username: Some(name.clone()),
                token_version: Some(tv),
                ..AuditDetails::none()
            },
        )
        .await?;
        tx.commit().await?;
        Ok(Some((name, tv)))
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
