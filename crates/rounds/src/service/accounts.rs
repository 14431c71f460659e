//! Accounts: registration, login, the caller's account, password changes (by the user and by the admin), and the session check behind every authenticated request.
//!
//! The rules of names and passwords, the registration quota and the login
//! throttle are applied here, in the order that keeps them safe (quota before
//! the uniqueness check and the hash; throttle reserved before the hash), so
//! the HTTP layer only maps requests and [`AccountError`]s.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::domain::address::AddressBook;
use crate::domain::audit::AuditActor;
use crate::domain::time::unix_now;
use crate::security::password::{
    password_length, HashError, PasswordHasher, Verdict, MAX_PASSWORD_LENGTH, MIN_PASSWORD_LENGTH,
};
use crate::security::throttle::ThrottleKey;
use crate::security::token::{TokenError, TokenKeys, TOKEN_LIFETIME_SECS};
use crate::service::limits::{Quota, Throttle};
use crate::store::{Store, StoreError};

/// Shortest username.
pub const MIN_USERNAME_LENGTH: usize = 3;
/// Longest username.
pub const MAX_USERNAME_LENGTH: usize = 32;

/// Why an account operation was refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AccountError {
    /// The username has a character outside `A-Z a-z 0-9 _ . -`.
    #[error("username may contain only A-Z, a-z, 0-9, '_', '.' and '-'")]
    UsernameInvalidCharacters,
    /// The username is shorter than [`MIN_USERNAME_LENGTH`].
    #[error("username must be at least {MIN_USERNAME_LENGTH} characters")]
    UsernameTooShort,
    /// The username is longer than [`MAX_USERNAME_LENGTH`].
    #[error("username must be at most {MAX_USERNAME_LENGTH} characters")]
    UsernameTooLong,
    /// The password in `field` is shorter than [`MIN_PASSWORD_LENGTH`].
    #[error("{field} must be at least {MIN_PASSWORD_LENGTH} characters")]
    PasswordTooShort {
        /// The request field holding the password.
        field: &'static str,
    },
    /// The password in `field` is longer than [`MAX_PASSWORD_LENGTH`].
    #[error("{field} must be at most {MAX_PASSWORD_LENGTH} characters")]
    PasswordTooLong {
        /// The request field holding the password.
        field: &'static str,
    },
    /// The registration quota is 0.
    #[error("registration is closed")]
    RegistrationClosed,
    /// The client IP used up its registrations.
    #[error("too many registrations from this address, retry later")]
    RegistrationQuotaExceeded {
        /// Whole seconds, rounded up.
        retry_after_secs: u64,
    },
    /// The name is in use (ignoring case).
    #[error("username is taken")]
    UsernameTaken {
        /// The name that was asked for.
        username: String,
    },
    /// Derivation-index collisions persisted after the retries.
    #[error("could not allocate a wallet derivation index, try again")]
    DerivationIndexConflict,
    /// A key of the attempt is locked by the login throttle.
    #[error("too many failed login attempts, retry later")]
    TooManyAttempts {
        /// Whole seconds, rounded up.
        retry_after_secs: u64,
    },
    /// Unknown user or wrong password (deliberately the same).
    #[error("invalid username or password")]
    InvalidCredentials,
    /// Change-password with a wrong current password.
    #[error("current password is incorrect")]
    CurrentPasswordIncorrect,
    /// The named or authenticated user does not exist (any more).
    #[error("no such user")]
    UnknownUser,
    /// The token is malformed, badly signed or names no user.
    #[error("invalid token")]
    InvalidToken,
    /// The token expired or its token version is no longer the stored one.
    #[error("session expired")]
    SessionExpired,
    /// Argon2 failed or its blocking task died.
    #[error("password hashing failed")]
    Hashing(#[source] HashError),
    /// The database.
    #[error("account store")]
    Store(#[source] StoreError),
}

impl From<StoreError> for AccountError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::UsernameTaken(username) => AccountError::UsernameTaken { username },
            StoreError::DerivationIndexConflict => AccountError::DerivationIndexConflict,
            other => AccountError::Store(other),
        }
    }
}

impl From<HashError> for AccountError {
    fn from(e: HashError) -> Self {
        AccountError::Hashing(e)
    }
}

/// Checks the username rule: 3–32 characters of `A-Z a-z 0-9 _ . -`.
///
/// # Errors
/// The `Username*` variant naming the broken rule.
pub fn validate_username(name: &str) -> Result<(), AccountError> {
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        return Err(AccountError::UsernameInvalidCharacters);
    }
    // Only ASCII is left, so bytes are characters.
    let n = name.len();
    if n < MIN_USERNAME_LENGTH {
        return Err(AccountError::UsernameTooShort);
    }
    if n > MAX_USERNAME_LENGTH {
        return Err(AccountError::UsernameTooLong);
    }
    Ok(())
}

/// Checks the password rule shared by every operation that sets one.
///
/// # Errors
/// [`AccountError::PasswordTooShort`] / [`AccountError::PasswordTooLong`] naming `field`.
pub fn validate_password(field: &'static str, password: &str) -> Result<(), AccountError> {
    let n = password_length(password);
    if n < MIN_PASSWORD_LENGTH {
        return Err(AccountError::PasswordTooShort { field });
    }
    if n > MAX_PASSWORD_LENGTH {
        return Err(AccountError::PasswordTooLong { field });
    }
    Ok(())
}

/// Whole seconds of a wait, rounded up, never 0 for a real wait.
pub fn retry_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// A created account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAccount {
    /// As typed.
    pub username: String,
    /// The account's deposit address.
    pub address: String,
}

/// A session token and its lifetime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The signed token.
    pub token: String,
    /// Lifetime in seconds.
    pub expires_in: i64,
}

/// An account with its balances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// As typed at registration.
    pub username: String,
    /// Deposit address.
    pub address: String,
    /// Confirmed balance.
    pub balance_sats: i64,
    /// Balance including unconfirmed change of in-flight transactions.
    pub pending_balance_sats: i64,
    /// Whether in-flight transactions exist.
    pub has_pending: bool,
    /// Unspent coins too small to spend (dust), not in the balances.
    pub dust_sats: i64,
}

/// The user a valid session token belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionUser {
    /// Primary key.
    pub id: i64,
    /// The name as stored.
    pub username: String,
    /// The token version the token carries (= the stored one).
    pub token_version: i64,
}

/// A session token whose signature and expiry are checked but whose token
/// version is not yet compared with the stored one. Whoever holds one must
/// read the user's stored version and pass it to [`SignedSession::check`]
/// before acting for the user; the payment workflow reads it in the same
/// statement as its context, which saves a round trip per bet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignedSession {
    /// The user the token names (not yet known to be a valid session).
    pub user_id: i64,
    token_version: i64,
}

impl SignedSession {
    /// The user's id if `stored` (the user's stored token version, `None`
    /// when no such user exists) is the one the token carries.
    ///
    /// # Errors
    /// [`AccountError::InvalidToken`] for an unknown user,
    /// [`AccountError::SessionExpired`] for an older token version.
    pub fn check(&self, stored: Option<i64>) -> Result<i64, AccountError> {
        match stored {
            None => Err(AccountError::InvalidToken),
            Some(tv) if tv != self.token_version => Err(AccountError::SessionExpired),
            Some(_) => Ok(self.user_id),
        }
    }
}

/// The account workflows over the store and the security parts.
#[derive(Clone)]
pub struct Accounts {
    store: Store,
    hasher: PasswordHasher,
    tokens: TokenKeys,
    throttle: Throttle,
    quota: Quota,
    addresses: Arc<dyn AddressBook>,
}

impl std::fmt::Debug for Accounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accounts")
            .field("hasher", &self.hasher)
            .finish_non_exhaustive()
    }
}

impl Accounts {
    /// The service over these parts.
    pub fn new(
        store: Store,
        hasher: PasswordHasher,
        tokens: TokenKeys,
        throttle: Throttle,
        quota: Quota,
        addresses: Arc<dyn AddressBook>,
    ) -> Self {
        Self {
            store,
            hasher,
            tokens,
            throttle,
            quota,
            addresses,
        }
    }

    /// The login throttle (for its gauge).
    pub fn throttle(&self) -> &Throttle {
        &self.throttle
    }

    /// The registration quota (for its gauge).
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The password hasher (for its gauges).
    pub fn hasher(&self) -> &PasswordHasher {
        &self.hasher
    }

    fn session(&self, user_id: i64, token_version: i64) -> Session {
        Session {
            token: self.tokens.issue(user_id, token_version, unix_now()),
            expires_in: TOKEN_LIFETIME_SECS,
        }
    }

    /// Creates an account for a client at `ip`.
    ///
    /// # Errors
    /// A rule, the quota, a taken name, or an internal failure.
    pub async fn register(
        &self,
        ip: IpAddr,
        username: String,
        password: String,
    ) -> Result<NewAccount, AccountError> {
        validate_username(&username)?;
        validate_password("password", &password)?;
        if self.quota.closed() {
            return Err(AccountError::RegistrationClosed);
        }
        // The quota is checked (and a slot held) before the uniqueness check,
        // so an address over its quota learns nothing about which names exist,
        // and before the costly hash.
        let reservation = self.quota.reserve(ip).await?.map_err(|wait| {
            AccountError::RegistrationQuotaExceeded {
                retry_after_secs: retry_secs(wait).max(1),
            }
        })?;
        if self.store.user_by_name(&username).await?.is_some() {
            return Err(AccountError::UsernameTaken { username });
        }
        let hash = self.hasher.hash(password).await?;
        let addresses = self.addresses.clone();
        let user = self
            .store
            .create_user(&username, &hash, move |i| {
                addresses.user_address(i).map_err(|e| e.to_string())
            })
            .await?;
        reservation.commit().await;
        tracing::info!(username = %user.username, index = user.derivation_index, "account created");
        Ok(NewAccount {
            username: user.username,
            address: user.address,
        })
    }

    /// Checks a password and opens a session for a client at `ip`.
    ///
    /// # Errors
    /// [`AccountError::InvalidCredentials`], [`AccountError::TooManyAttempts`],
    /// or an internal failure.
    pub async fn login(
        &self,
        ip: IpAddr,
        username: &str,
        mut password: String,
    ) -> Result<Session, AccountError> {
        // Names that cannot exist get no per-name key (they cannot be guessed
        // into) but still cost the IP a failure and the same Argon2 work.
        let name_valid = validate_username(username).is_ok();
        let user_key = ThrottleKey::User(username.to_ascii_lowercase());
        let ip_key = ThrottleKey::Ip(ip);
        let keys: Vec<ThrottleKey> = if name_valid {
            vec![user_key.clone(), ip_key]
        } else {
            vec![ip_key]
        };
        // Checked and reserved in one step: this attempt counts against the
        // allowance while its password is hashed.
        let attempt =
            self.throttle
                .begin(&keys)
                .await?
                .map_err(|wait| AccountError::TooManyAttempts {
                    retry_after_secs: retry_secs(wait).max(1),
                })?;
        let user = if name_valid {
            self.store.user_by_name(username).await?
        } else {
            None
        };
        if password.len() > MAX_PASSWORD_LENGTH * 4 {
            password.truncate(0);
        }
        let verdict = self
            .hasher
            .verify(password, user.as_ref().map(|u| u.password_hash.clone()))
            .await?;
        match (verdict, user) {
            (Verdict::Match, Some(user)) => {
                attempt.succeeded(&user_key).await;
                Ok(self.session(user.id, user.token_version))
            }
            (verdict, user) => {
                if verdict == Verdict::CorruptHash {
                    tracing::error!(
                        username = user.as_ref().map(|u| u.username.as_str()).unwrap_or(""),
                        "stored password hash is unparseable; treated as a wrong password"
                    );
                }
                attempt.failed().await;
                Err(AccountError::InvalidCredentials)
            }
        }
    }

    /// The user a session token belongs to, checked against the stored token
    /// version (so a password change or reset ends every earlier session).
    ///
    /// # Errors
    /// [`AccountError::InvalidToken`], [`AccountError::SessionExpired`], or a store failure.
    pub async fn authenticate(&self, token: &str) -> Result<SessionUser, AccountError> {
        let signed = self.verify_signature(token)?;
        let (username, stored_tv) = self
            .store
            .token_version(signed.user_id)
            .await?
            .ok_or(AccountError::InvalidToken)?;
        let id = signed.check(Some(stored_tv))?;
        Ok(SessionUser {
            id,
            username,
            token_version: stored_tv,
        })
    }

    /// A session token's signature and expiry checked, its token version
    /// not yet: for a workflow that reads the stored version in the same
    /// statement as the rest of what it reads (a bet), see [`SignedSession`].
    ///
    /// # Errors
    /// [`AccountError::InvalidToken`], [`AccountError::SessionExpired`] (expired).
    pub fn verify_signature(&self, token: &str) -> Result<SignedSession, AccountError> {
        let claims = self.tokens.verify(token, unix_now()).map_err(|e| match e {
            TokenError::Expired => AccountError::SessionExpired,
            _ => AccountError::InvalidToken,
        })?;
        let user_id: i64 = claims.sub.parse().map_err(|_| AccountError::InvalidToken)?;
        Ok(SignedSession {
            user_id,
            token_version: claims.tv,
        })
    }

    /// User `user_id`'s account and balances.
    ///
    /// # Errors
    /// [`AccountError::UnknownUser`] or a store failure.
    pub async fn account(&self, user_id: i64) -> Result<Account, AccountError> {
        let row = self
            .store
            .user_by_id(user_id)
            .await?
            .ok_or(AccountError::UnknownUser)?;
        let confirmations = self.store.config().await?.deposit_confirmations;
        let (balance_sats, pending_balance_sats, has_pending) =
            self.store.balances(user_id, confirmations).await?;
        let dust_sats = self.store.dust_sats(user_id).await?;
        Ok(Account {
            username: row.username,
            address: row.address,
            balance_sats,
            pending_balance_sats,
            has_pending,
            dust_sats,
        })
    }

    /// User `user_id`'s deposit address.
    ///
    /// # Errors
    /// [`AccountError::UnknownUser`] or a store failure.
    pub async fn deposit_address(&self, user_id: i64) -> Result<String, AccountError> {
        Ok(self
            .store
            .user_by_id(user_id)
            .await?
            .ok_or(AccountError::UnknownUser)?
            .address)
    }

    /// Changes the password of the session's user after checking the current
    /// one; returns a fresh session, every earlier one stops working.
    ///
    /// # Errors
    /// A password rule, [`AccountError::CurrentPasswordIncorrect`],
    /// [`AccountError::TooManyAttempts`], [`AccountError::SessionExpired`]
    /// (the session was replaced meanwhile), or an internal failure.
    pub async fn change_password(
        &self,
        user: &SessionUser,
        current_password: String,
        new_password: String,
    ) -> Result<Session, AccountError> {
        validate_password("new_password", &new_password)?;
        // A stolen token must not become a password oracle: wrong current
        // passwords count against the user's login throttle key.
        let key = [ThrottleKey::User(user.username.to_ascii_lowercase())];
        let attempt =
            self.throttle
                .begin(&key)
                .await?
                .map_err(|wait| AccountError::TooManyAttempts {
                    retry_after_secs: retry_secs(wait).max(1),
                })?;
        let row = self
            .store
            .user_by_id(user.id)
            .await?
            .ok_or(AccountError::SessionExpired)?;
        let verdict = self
            .hasher
            .verify(current_password, Some(row.password_hash))
            .await?;
        if verdict != Verdict::Match {
            if verdict == Verdict::CorruptHash {
                tracing::error!(username = %user.username, "stored password hash is unparseable");
            }
            attempt.failed().await;
            return Err(AccountError::CurrentPasswordIncorrect);
        }
        attempt.succeeded(&key[0]).await;
        let hash = self.hasher.hash(new_password).await?;
        let tv = self
            .store
            .change_password(user.id, user.token_version, &hash)
            .await?
            .ok_or(AccountError::SessionExpired)?;
        Ok(self.session(user.id, tv))
    }

    /// The admin reset: sets `username`'s password (matched ignoring case),
    /// revokes every session and audits it as `actor`. Returns the stored
    /// name and the new token version.
    ///
    /// # Errors
    /// A password rule, [`AccountError::UnknownUser`], or an internal failure.
    pub async fn reset_password(
        &self,
        username: &str,
        new_password: String,
        actor: AuditActor,
    ) -> Result<(String, i64), AccountError> {
        validate_password("new_password", &new_password)?;
        // Checked before the costly hash.
        if self.store.user_by_name(username).await?.is_none() {
            return Err(AccountError::UnknownUser);
        }
        let hash = self.hasher.hash(new_password).await?;
        self.store
            .reset_password(username, &hash, actor)
            .await?
            .ok_or(AccountError::UnknownUser)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn username_rules() {
        assert!(validate_username("Bob").is_ok());
        assert!(validate_username("a.b-c_9").is_ok());
        assert!(validate_username(&"x".repeat(32)).is_ok());
        assert!(matches!(
            validate_username(""),
            Err(AccountError::UsernameTooShort)
        ));
        assert!(matches!(
            validate_username("ab"),
            Err(AccountError::UsernameTooShort)
        ));
        assert!(matches!(
            validate_username(&"x".repeat(33)),
            Err(AccountError::UsernameTooLong)
        ));
        assert!(matches!(
            validate_username("bob smith"),
            Err(AccountError::UsernameInvalidCharacters)
        ));
        assert!(matches!(
            validate_username("bøb"),
            Err(AccountError::UsernameInvalidCharacters)
        ));
    }

    #[test]
    fn password_rule_counts_code_points_and_names_the_field() {
        assert!(validate_password("password", "ääääääää").is_ok());
        let short = validate_password("new_password", "1234567").unwrap_err();
        assert!(matches!(
            short,
            AccountError::PasswordTooShort {
                field: "new_password"
            }
        ));
        assert_eq!(
            short.to_string(),
            "new_password must be at least 8 characters"
        );
        let long = validate_password("password", &"x".repeat(1025)).unwrap_err();
        assert_eq!(long.to_string(), "password must be at most 1024 characters");
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_secs(Duration::from_secs(3)), 3);
    }
}
