//! Account endpoints: register, login, the caller's account view and change-password.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::client_ip::ClientIp;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::{ApiJson, AuthUser};
use crate::http::state::AppState;
use crate::service::accounts::{Session, SessionUser};

/// Routes of this module.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(register))
        .routes(routes!(login))
        .routes(routes!(me))
        .routes(routes!(change_password))
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
    /// Coins of at most 68 sats at the caller's address (dust: each costs
    /// at least its value to spend): never spent, not in the balances.
    pub dust_sats: i64,
}

/// Body of change-password.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ChangePassword {
    /// The password in use.
    pub current_password: String,
    /// The new one, at least 8 characters.
    pub new_password: String,
}

impl From<Session> for TokenResponse {
    fn from(s: Session) -> Self {
        TokenResponse {
            access_token: s.token,
            token_type: "bearer".into(),
            expires_in: s.expires_in,
        }
    }
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
    let created = state
        .accounts
        .register(ip, body.username, body.password)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(Registered {
            username: created.username,
            address: created.address,
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
    let session = state
        .accounts
        .login(ip, &body.username, body.password)
        .await?;
    Ok(Json(session.into()))
}

/// The caller's account and balances.
#[utoipa::path(get, path = "/users/me", tag = "accounts", security(("bearer" = [])),
    responses((status = 200, body = Me), (status = 401, body = ErrorBody)))]
async fn me(State(state): State<AppState>, user: AuthUser) -> Result<Json<Me>, ApiError> {
    let account = state.accounts.account(user.id).await?;
    Ok(Json(Me {
        username: account.username,
        address: account.address,
        balance_sats: account.balance_sats,
        pending_balance_sats: account.pending_balance_sats,
        has_pending: account.has_pending,
        dust_sats: account.dust_sats,
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
    let session = state
        .accounts
        .change_password(
            &SessionUser::from(user),
            body.current_password,
            body.new_password,
        )
        .await?;
    Ok(Json(session.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::accounts::{validate_password, validate_username};

    fn code(e: crate::service::accounts::AccountError) -> &'static str {
        ApiError::from(e).code().as_str()
    }

    #[test]
    fn account_rules_answer_their_codes_and_params() {
        assert_eq!(
            code(validate_username("ab").unwrap_err()),
            "username_too_short"
        );
        assert_eq!(
            code(validate_username(&"x".repeat(33)).unwrap_err()),
            "username_too_long"
        );
        assert_eq!(
            code(validate_username("bob smith").unwrap_err()),
            "username_invalid_characters"
        );
        let short = ApiError::from(validate_password("password", "1234567").unwrap_err());
        assert_eq!(short.code().as_str(), "password_too_short");
        assert_eq!(
            serde_json::to_value(short.params()).unwrap(),
            serde_json::json!({"field": "password", "min_length": 8})
        );
        let name = ApiError::from(validate_username("ab").unwrap_err());
        assert_eq!(
            serde_json::to_value(name.params()).unwrap(),
            serde_json::json!({"min_length": 3, "max_length": 32})
        );
    }
}
