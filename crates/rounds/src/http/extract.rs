//! Authentication extractors: the bearer-token user (checked against the stored token_version on every request), the optional user, and admin access by `X-Admin-Token` in constant time.

use crate::http::client_ip::ClientIp;
use crate::http::codes::ErrorCode;
use crate::http::error::{AdminError, ApiError, ErrorParams};
use crate::http::state::AppState;
use crate::security::admin_key::AdminDenied;
use crate::security::throttle::ThrottleKey;
use crate::service::accounts::{SessionUser, SignedSession};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthUser {
    /// Primary key.
    pub id: i64,
    /// The name as stored.
    pub username: String,
    /// The token version the request's token carries (= the stored one).
    pub token_version: i64,
}

impl From<SessionUser> for AuthUser {
    fn from(u: SessionUser) -> Self {
        AuthUser {
            id: u.id,
            username: u.username,
            token_version: u.token_version,
        }
    }
}

impl From<AuthUser> for SessionUser {
    fn from(u: AuthUser) -> Self {
        SessionUser {
            id: u.id,
            username: u.username,
            token_version: u.token_version,
        }
    }
}

fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts
        .headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

async fn authenticate(parts: &Parts, state: &AppState) -> Result<AuthUser, ApiError> {
    let token = bearer(parts).ok_or(ApiError::NotAuthenticated)?;
    Ok(state.accounts.authenticate(token).await?.into())
}

impl FromRequestParts<AppState> for AuthUser {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        authenticate(parts, state).await
    }
}

/// A bearer token whose signature and expiry are checked, and whose token
/// version the workflow it is handed to checks with its own read (bets: in
/// the payment's context statement, one round trip less than [`AuthUser`]).
/// Only for handlers whose workflow takes a [`SignedSession`] and checks it.
#[derive(Debug, Clone, Copy)]
pub struct SignedBearer(pub SignedSession);

impl FromRequestParts<AppState> for SignedBearer {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let token = bearer(parts).ok_or(ApiError::NotAuthenticated)?;
        Ok(SignedBearer(state.accounts.verify_signature(token)?))
    }
}

/// The longest `Idempotency-Key` kept.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// The optional `Idempotency-Key` header of a money request: 1–255 visible
/// ASCII characters (a UUID fits), else 422 `invalid_idempotency_key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let Some(value) = parts.headers.get("idempotency-key") else {
            return Ok(IdempotencyKey(None));
        };
        let bytes = value.as_bytes();
        if bytes.is_empty()
            || bytes.len() > MAX_IDEMPOTENCY_KEY_LEN
            || !bytes.iter().all(u8::is_ascii_graphic)
        {
            return Err(ApiError::validation(
                ErrorCode::InvalidIdempotencyKey,
                format!("Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"),
                ErrorParams {
                    max_length: Some(MAX_IDEMPOTENCY_KEY_LEN),
                    ..ErrorParams::none()
                },
            ));
        }
        Ok(IdempotencyKey(Some(
            String::from_utf8_lossy(bytes).into_owned(),
        )))
    }
}

/// A user if a valid token was sent; anonymous otherwise. A stale or bad
/// token on an endpoint that works logged out is treated as no token.
#[derive(Debug, Clone)]
pub struct MaybeUser(pub Option<AuthUser>);

impl FromRequestParts<AppState> for MaybeUser {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        if bearer(parts).is_none() {
            return Ok(MaybeUser(None));
        }
        match authenticate(parts, state).await {
            Ok(u) => Ok(MaybeUser(Some(u))),
            Err(ApiError::Internal(e)) => Err(ApiError::Internal(e)),
            Err(_) => Ok(MaybeUser(None)),
        }
    }
}

/// Proof that the request carries the admin token.
#[derive(Debug, Clone, Copy)]
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = AdminError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let Ok(ClientIp(ip)) = ClientIp::from_request_parts(parts, state).await;
        // Wrong tokens are throttled per client like wrong passwords. The
        // failures counted by every process on the database are read first
        // (issue 32: spreading guesses over the processes behind the proxy
        // gains nothing); then this process checks, reserves and settles
        // the attempt in one step with no await in between, so a burst
        // cannot slip through before the first failure is counted.
        let key = ThrottleKey::AdminIp(ip);
        let shared = state
            .admin_throttle
            .shared_admission(&key)
            .await
            .map_err(AdminError::internal)?;
        if !shared.wait.is_zero() {
            return Err(too_many(shared.wait));
        }
        let keys = [key];
        let attempt = state
            .admin_throttle
            .local_throttle()
            .begin(&keys, std::time::Instant::now())
            .map_err(too_many)?;
        let presented = parts.headers.get("x-admin-token").map(|v| v.as_bytes());
        match state.admin_key.check(presented) {
            Ok(()) => {
                attempt.succeeded(&keys[0]);
                if shared.recorded {
                    state.admin_throttle.shared_success(&keys[0]).await;
                }
                Ok(Admin)
            }
            Err(denied) => {
                if denied == AdminDenied::Invalid {
                    tracing::warn!(client = %ip, "wrong admin token");
                    attempt.failed(std::time::Instant::now());
                    state.admin_throttle.shared_failure(&keys[0]).await;
                }
                Err(AdminError::Denied(denied.message()))
            }
        }
    }
}

fn too_many(wait: std::time::Duration) -> AdminError {
    AdminError::TooManyAttempts(wait.as_secs() + u64::from(wait.subsec_nanos() > 0))
}

/// JSON body whose rejections use the structured error format.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        // Parsed as a value first: serde would accept a struct from a JSON
        // array (fields by position), and every request body is an object.
        let value = match axum::Json::<serde_json::Value>::from_request(req, state).await {
            Ok(axum::Json(v)) => v,
            Err(e) => {
                return Err(ApiError::validation(
                    ErrorCode::InvalidBody,
                    e.body_text(),
                    ErrorParams::none(),
                ))
            }
        };
        if !value.is_object() {
            return Err(ApiError::validation(
                ErrorCode::InvalidBody,
                "the request body must be a JSON object",
                ErrorParams::none(),
            ));
        }
        serde_json::from_value(value).map(ApiJson).map_err(|e| {
            ApiError::validation(
                ErrorCode::InvalidBody,
                format!("invalid JSON body: {e}"),
                ErrorParams::none(),
            )
        })
    }
}

/// An optional body (`Option<ApiJson<T>>`): absent only when the request
/// names no `Content-Type`, as axum's `Json` decides; a body that is sent is
/// read as [`ApiJson`] reads it, so a malformed one gets the structured
/// `invalid_body` answer rather than axum's plain-text rejection (and an
/// array is not taken as the struct's fields by position).
impl<T: DeserializeOwned> axum::extract::OptionalFromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Option<Self>, Self::Rejection> {
        if !req.headers().contains_key(axum::http::header::CONTENT_TYPE) {
            return Ok(None);
        }
        <Self as FromRequest<AppState>>::from_request(req, state)
            .await
            .map(Some)
    }
}

/// Query parameters whose rejection uses the structured error format
/// (`invalid_query`), not axum's plain-text 400.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned> FromRequestParts<AppState> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(q)| ApiQuery(q))
            .map_err(|e| {
                ApiError::validation(ErrorCode::InvalidQuery, e.body_text(), ErrorParams::none())
            })
    }
}

/// JSON body of an admin endpoint; rejections are bare strings.
#[derive(Debug)]
pub struct AdminJson(pub serde_json::Value);

impl FromRequest<AppState> for AdminJson {
    type Rejection = AdminError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        match axum::Json::<serde_json::Value>::from_request(req, state).await {
            Ok(axum::Json(v)) if v.is_object() => Ok(AdminJson(v)),
            Ok(_) => Err(AdminError::Validation(
                "the request body must be a JSON object".into(),
            )),
            Err(e) => Err(AdminError::Validation(format!(
                "invalid JSON body: {}",
                e.body_text()
            ))),
        }
    }
}
