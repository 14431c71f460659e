//! Account endpoints: register, login, the caller's account view and change-password.

use std::time::Instant;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::time::unix_now;
use crate::http::client_ip::ClientIp;
use crate::http::codes::ErrorCode;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::{ApiJson, AuthUser};
use crate::http::state::AppState;
use crate::security::password::{
    password_length, Verdict, MAX_PASSWORD_LENGTH, MIN_PASSWORD_LENGTH,
};
use crate::security::throttle::ThrottleKey;
use crate::security::token::TOKEN_LIFETIME_SECS;

/// Shortest username.
pub const MIN_USERNAME_LENGTH: usize = 3;
/// Longest username.
pub const MAX_USERNAME_LENGTH: usize = 32;

/// Routes of this module.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(register))
        .routes(routes!(login))
        .routes(routes!(me))
        .routes(routes!(change_password))
}

/// Checks the username rule: 3–32 characters of `A-Z a-z 0-9 _ . -`.
///
/// # Errors
/// A validation error naming the broken rule.
pub fn validate_username(name: &str) -> Result<(), ApiError> {
    let params = json!({"min_length": MIN_USERNAME_LENGTH, "max_length": MAX_USERNAME_LENGTH});
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        return Err(ApiError::validation(
            ErrorCode::UsernameInvalidCharacters,
            "username may contain only A-Z, a-z, 0-9, '_', '.' and '-'",
            params,
        ));
    }
    let n = name.len();
    if n < MIN_USERNAME_LENGTH {
        return Err(ApiError::validation(
            ErrorCode::UsernameTooShort,
            format!("username must be at least {MIN_USERNAME_LENGTH} characters"),
            params,
        ));
    }
    if n > MAX_USERNAME_LENGTH {
        return Err(ApiError::validation(
            ErrorCode::UsernameTooLong,
            format!("username must be at most {MAX_USERNAME_LENGTH} characters"),
            params,
        ));
    }
    Ok(())
}

/// Checks the password rule shared by every endpoint that sets one.
///
/// # Errors
/// `password_too_short` / `password_too_long` naming `field`.
pub fn validate_password(field: &str, password: &str) -> Result<(), ApiError> {
    let n = password_length(password);
    if n < MIN_PASSWORD_LENGTH {
        return Err(ApiError::password_too_short(field));
    }
    if n > MAX_PASSWORD_LENGTH {
        return Err(ApiError::validation(
            ErrorCode::PasswordTooLong,
            format!("{field} must be at most {MAX_PASSWORD_LENGTH} characters"),
            json!({"field": field, "max_length": MAX_PASSWORD_LENGTH}),
        ));
    }
    Ok(())
}

/// Body of register and login.
#[derive(Debug, Deserialize, ToSchema)]
pub struct Credentials {
    /// 3–32 characters of `A-Z a-z 0-9 _ . -`.
    pub username: String,
    /// At least 8 characters.
    pub password: String,
}

/// A created account.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Registered {
    /// As typed.
    pub username: String,
    /// The account's deposit address.
    pub address: String,
}

/// A session token.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenResponse {
    /// The JWT to send as `Authorization: Bearer …`.
    pub access_token: String,
    /// Always `bearer`.
    pub token_type: String,
    /// Lifetime in seconds (86400).
    pub expires_in: i64,
}

/// The caller's account.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Me {
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
}

/// Body of change-password.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ChangePassword {
    /// The password in use.
    pub current_password: String,
    /// The new one, at least 8 characters.
    pub new_password: String,
}

fn token_response(state: &AppState, user_id: i64, tv: i64) -> TokenResponse {
    TokenResponse {
        access_token: state.tokens.issue(user_id, tv, unix_now()),
        token_type: "bearer".into(),
        expires_in: TOKEN_LIFETIME_SECS,
    }
}

fn retry_secs(d: std::time::Duration) -> u64 {
    // Whole seconds, rounded up, never 0 for a real wait.
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Create an account.
#[utoipa::path(post, path = "/auth/register", tag = "accounts", request_body = Credentials,
    responses(
        (status = 201, body = Registered),
        (status = 409, description = "username_taken, derivation_index_conflict", body = ErrorBody),
        (status = 422, description = "validation", body = ErrorBody),
        (status = 403, description = "registration_closed (quota 0)", body = ErrorBody),
        (status = 429, description = "registration_quota_exceeded, with Retry-After", body = ErrorBody),
    ))]
async fn register(
    State(state): State<AppState>,
    ClientIp(ip): ClientIp,
    ApiJson(body): ApiJson<Credentials>,
) -> Result<(StatusCode, Json<Registered>), ApiError> {
    validate_username(&body.username)?;
    validate_password("password", &body.password)?;
    if state.quota.closed() {
        return Err(ApiError::domain(
            StatusCode::FORBIDDEN,
            ErrorCode::RegistrationClosed,
            "registration is closed",
            serde_json::json!({}),
        ));
    }
    // The quota is checked (and a slot held) before the uniqueness check,
    // so an address over its quota learns nothing about which names exist,
    // and before the costly hash.
    let reservation = state.quota.reserve(ip, Instant::now()).map_err(|wait| {
        ApiError::RegistrationQuotaExceeded {
            retry_after_secs: retry_secs(wait).max(1),
        }
    })?;
    if state.store.user_by_name(&body.username).await?.is_some() {
        return Err(ApiError::UsernameTaken {
            username: body.username,
        });
    }
    let hash = state
        .hasher
        .hash(body.password)
        .await
        .map_err(ApiError::internal)?;
    let addresses = state.addresses.clone();
    let user = state
        .store
        .create_user(&body.username, &hash, move |i| {
            addresses.user_address(i).map_err(|e| e.to_string())
        })
        .await?;
    reservation.commit(Instant::now());
    tracing::info!(username = %user.username, index = user.derivation_index, "account created");
    Ok((
        StatusCode::CREATED,
        Json(Registered {
            username: user.username,
            address: user.address,
        }),
    ))
}

/// Log in and get a session token.
#[utoipa::path(post, path = "/auth/login", tag = "accounts", request_body = Credentials,
    responses(
        (status = 200, body = TokenResponse),
        (status = 401, description = "invalid_credentials", body = ErrorBody),
        (status = 429, description = "too_many_attempts, with Retry-After", body = ErrorBody),
    ))]
async fn login(
    State(state): State<AppState>,
    ClientIp(ip): ClientIp,
    ApiJson(body): ApiJson<Credentials>,
) -> Result<Json<TokenResponse>, ApiError> {
    // Names that cannot exist get no per-name key (they cannot be guessed
    // into) but still cost the IP a failure and the same Argon2 work.
    let name_valid = validate_username(&body.username).is_ok();
    let user_key = ThrottleKey::User(body.username.to_ascii_lowercase());
    let ip_key = ThrottleKey::Ip(ip);
    let keys: Vec<ThrottleKey> = if name_valid {
        vec![user_key.clone(), ip_key]
    } else {
        vec![ip_key]
    };
    // Checked and reserved in one step: this attempt counts against the
    // allowance while its password is hashed.
    let attempt = state
        .throttle
        .begin(&keys, Instant::now())
        .map_err(|wait| ApiError::TooManyAttempts {
            retry_after_secs: retry_secs(wait).max(1),
        })?;
    let user = if name_valid {
        state.store.user_by_name(&body.username).await?
    } else {
        None
    };
    let mut password = body.password;
    if password.len() > MAX_PASSWORD_LENGTH * 4 {
        password.truncate(0);
    }
    let verdict = state
        .hasher
        .verify(password, user.as_ref().map(|u| u.password_hash.clone()))
        .await
        .map_err(ApiError::internal)?;
    match (verdict, user) {
        (Verdict::Match, Some(user)) => {
            attempt.succeeded(&user_key);
            Ok(Json(token_response(&state, user.id, user.token_version)))
        }
        (verdict, user) => {
            if verdict == Verdict::CorruptHash {
                tracing::error!(
                    username = user.as_ref().map(|u| u.username.as_str()).unwrap_or(""),
                    "stored password hash is unparseable; treated as a wrong password"
                );
            }
            attempt.failed(Instant::now());
            Err(ApiError::InvalidCredentials)
        }
    }
}

/// The caller's account and balances.
#[utoipa::path(get, path = "/users/me", tag = "accounts", security(("bearer" = [])),
    responses((status = 200, body = Me), (status = 401, body = ErrorBody)))]
async fn me(State(state): State<AppState>, user: AuthUser) -> Result<Json<Me>, ApiError> {
    let row = state
        .store
        .user_by_id(user.id)
        .await?
        .ok_or(ApiError::SessionExpired)?;
    let confirmations = state.store.config().await?.deposit_confirmations;
    let (balance_sats, pending_balance_sats, has_pending) =
        state.store.balances(user.id, confirmations).await?;
    Ok(Json(Me {
        username: row.username,
        address: row.address,
        balance_sats,
        pending_balance_sats,
        has_pending,
    }))
}

/// Change the caller's password; returns a fresh token, every earlier one stops working.
#[utoipa::path(post, path = "/users/me/change-password", tag = "accounts", security(("bearer" = [])),
    request_body = ChangePassword,
    responses(
        (status = 200, body = TokenResponse),
        (status = 400, description = "current_password_incorrect", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 422, body = ErrorBody),
        (status = 429, description = "too_many_attempts", body = ErrorBody),
    ))]
async fn change_password(
    State(state): State<AppState>,
    user: AuthUser,
    ApiJson(body): ApiJson<ChangePassword>,
) -> Result<Json<TokenResponse>, ApiError> {
    validate_password("new_password", &body.new_password)?;
    // A stolen token must not become a password oracle: wrong current
    // passwords count against the user's login throttle key.
    let key = [ThrottleKey::User(user.username.to_ascii_lowercase())];
    let attempt =
        state
            .throttle
            .begin(&key, Instant::now())
            .map_err(|wait| ApiError::TooManyAttempts {
                retry_after_secs: retry_secs(wait).max(1),
            })?;
    let row = state
        .store
        .user_by_id(user.id)
        .await?
        .ok_or(ApiError::SessionExpired)?;
    let verdict = state
        .hasher
        .verify(body.current_password, Some(row.password_hash))
        .await
        .map_err(ApiError::internal)?;
    if verdict != Verdict::Match {
        if verdict == Verdict::CorruptHash {
            tracing::error!(username = %user.username, "stored password hash is unparseable");
        }
        attempt.failed(Instant::now());
        return Err(ApiError::CurrentPasswordIncorrect);
    }
    attempt.succeeded(&key[0]);
    let hash = state
        .hasher
        .hash(body.new_password)
        .await
        .map_err(ApiError::internal)?;
    let tv = state
        .store
        .change_password(user.id, user.token_version, &hash)
        .await?
        .ok_or(ApiError::SessionExpired)?;
    Ok(Json(token_response(&state, user.id, tv)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn username_rules() {
        assert!(validate_username("Bob").is_ok());
        assert!(validate_username("a.b-c_9").is_ok());
        assert!(validate_username(&"x".repeat(32)).is_ok());
        assert_eq!(
            validate_username("").unwrap_err().code().as_str(),
            "username_too_short"
        );
        assert_eq!(
            validate_username("ab").unwrap_err().code().as_str(),
            "username_too_short"
        );
        assert_eq!(
            validate_username(&"x".repeat(33))
                .unwrap_err()
                .code()
                .as_str(),
            "username_too_long"
        );
        assert_eq!(
            validate_username("bob smith").unwrap_err().code().as_str(),
            "username_invalid_characters"
        );
        assert_eq!(
            validate_username("bøb").unwrap_err().code().as_str(),
            "username_invalid_characters"
        );
    }

    #[test]
    fn password_rule_counts_code_points() {
        assert!(validate_password("password", "ääääääää").is_ok());
        assert_eq!(
            validate_password("password", "1234567")
                .unwrap_err()
                .code()
                .as_str(),
            "password_too_short"
        );
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_secs(std::time::Duration::from_millis(1001)), 2);
        assert_eq!(retry_secs(std::time::Duration::from_secs(3)), 3);
    }
}
