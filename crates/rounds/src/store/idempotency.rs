//! Idempotency keys of money requests: a key is claimed by one request at a time and bound to its payment in the payment's own transaction, so one key pays at most once.

use sqlx::Row;

use super::ledger::{LedgerError, Tx};
use super::{Store, StoreError};

/// How long a key is kept, per user, after its first use (24 h).
pub const IDEMPOTENCY_KEY_RETENTION_SECS: i64 = 24 * 60 * 60;

/// How long an unbound claim holds a key before another request may take it
/// over: a process killed mid-request leaves its claim behind. A request
/// whose claim was taken over can no longer bind the key, so its write is
/// rolled back (see `bind_key`).
pub const IDEMPOTENCY_CLAIM_LEASE_SECS: i64 = 60;

/// A key held by the request that claimed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyClaim {
    /// The paying user (keys are per user).
    pub user_id: i64,
    /// The client's key.
    pub key: String,
    /// This request's token: only it can bind or release the key.
    pub token: i64,
}

/// What claiming a key found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Claimed {
    /// The key is this request's now.
    New(KeyClaim),
    /// The key already paid: the transfer it is bound to.
    Bound(i64),
    /// The key was used with another request (body or endpoint).
    Reused,
    /// Another request holds the key and has not paid yet.
    InProgress,
}

impl Store {
    /// Claims `key` of user `user_id` for a request whose endpoint and body
    /// give `fingerprint`, at unix time `now`. Keys older than
    /// [`IDEMPOTENCY_KEY_RETENTION_SECS`] are forgotten first.
    ///
    /// # Errors
    /// Database failures.
    pub async fn claim_idempotency_key(
        &self,
        user_id: i64,
        key: &str,
        fingerprint: &str,
        now: i64,
    ) -> Result<Claimed, StoreError> {
        sqlx::query("DELETE FROM idempotency_keys WHERE user_id = $1 AND created_at < $2")
            .bind(user_id)
            .bind(now - IDEMPOTENCY_KEY_RETENTION_SECS)
            .execute(self.pool())
            .await?;
        let token = i64::from(rand::random::<u32>()) + 1;
        let inserted = sqlx::query(
            "INSERT INTO idempotency_keys (user_id, idem_key, fingerprint, claim, claimed_at, created_at) \
             VALUES ($1, $2, $3, $4, $5, $5) ON CONFLICT (user_id, idem_key) DO NOTHING",
        )
        .bind(user_id)
        .bind(key)
        .bind(fingerprint)
        .bind(token)
        .bind(now)
        .execute(self.pool())
        .await?;
        let claim = KeyClaim {
            user_id,
            key: key.to_string(),
            token,
        };
        if inserted.rows_affected() == 1 {
            return Ok(Claimed::New(claim));
        }
        let Some(row) = sqlx::query(
            "SELECT fingerprint, claim, claimed_at, transfer_id FROM idempotency_keys \
             WHERE user_id = $1 AND idem_key = $2",
        )
        .bind(user_id)
        .bind(key)
        .fetch_optional(self.pool())
        .await?
        else {
            // Released between the insert and this read: the client's retry
            // claims it afresh.
            return Ok(Claimed::InProgress);
        };
        let stored: String = row.try_get("fingerprint")?;
        if stored != fingerprint {
            return Ok(Claimed::Reused);
        }
        if let Some(transfer_id) = row.try_get::<Option<i64>, _>("transfer_id")? {
            return Ok(Claimed::Bound(transfer_id));
        }
        let held_by: i64 = row.try_get("claim")?;
        let claimed_at: i64 = row.try_get("claimed_at")?;
        if claimed_at > now - IDEMPOTENCY_CLAIM_LEASE_SECS {
            return Ok(Claimed::InProgress);
        }
        let taken = sqlx::query(
            "UPDATE idempotency_keys SET claim = $1, claimed_at = $2 \
             WHERE user_id = $3 AND idem_key = $4 AND claim = $5 AND transfer_id IS NULL",
        )
        .bind(token)
        .bind(now)
        .bind(user_id)
        .bind(key)
        .bind(held_by)
        .execute(self.pool())
        .await?;
        Ok(if taken.rows_affected() == 1 {
            Claimed::New(claim)
        } else {
            Claimed::InProgress
        })
    }

    /// Gives up `claim` when its request paid nothing, so that a retry with
    /// the key is evaluated afresh. A key already bound to a payment stays.
    ///
    /// # Errors
    /// Database failures.
    pub async fn release_idempotency_key(&self, claim: &KeyClaim) -> Result<(), StoreError> {
        sqlx::query(
            "DELETE FROM idempotency_keys WHERE user_id = $1 AND idem_key = $2 AND claim = $3 \
             AND transfer_id IS NULL",
        )
        .bind(claim.user_id)
        .bind(&claim.key)
        .bind(claim.token)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// The bet of transfer `transfer_id`, if it is one.
    ///
    /// # Errors
    /// Database failures.
    pub async fn bet_of_transfer(&self, transfer_id: i64) -> Result<Option<i64>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT b.id FROM bets b JOIN transfers t ON t.txid = b.txid \
             WHERE t.id = $1 AND t.kind = $2 ORDER BY b.id LIMIT 1",
        )
        .bind(transfer_id)
        .bind(crate::domain::round::TransferKind::Bet)
        .fetch_optional(self.pool())
        .await?)
    }
}

/// Binds `claim` to the payment `transfer_id` inside the payment's own
/// transaction.
///
/// # Errors
/// [`LedgerError::IdempotencyClaimLost`] when the claim was taken over (its
/// lease ran out): the caller rolls the payment back.
pub(super) async fn bind_key(
    tx: &mut Tx<'_>,
    claim: &KeyClaim,
    transfer_id: i64,
) -> Result<(), LedgerError> {
    let bound = sqlx::query(
        "UPDATE idempotency_keys SET transfer_id = $1 \
         WHERE user_id = $2 AND idem_key = $3 AND claim = $4 AND transfer_id IS NULL",
    )
    .bind(transfer_id)
    .bind(claim.user_id)
    .bind(&claim.key)
    .bind(claim.token)
    .execute(&mut **tx)
    .await?;
    if bound.rows_affected() != 1 {
        return Err(LedgerError::IdempotencyClaimLost);
    }
    Ok(())
}
