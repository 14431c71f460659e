//! Authentication extractors: the bearer-token user (checked against the stored token_version on every request), the optional user, and admin access by `X-Admin-Token` in constant time.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::app::AppState;
use crate::error::{AdminError, ApiError};
use crate::store::unix_now;
use crate::token::TokenError;

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
    let claims = state
        .tokens
        .verify(token, unix_now())
        .map_err(|e| match e {
            TokenError::Expired => ApiError::SessionExpired,
            _ => ApiError::InvalidToken,
        })?;
    let id: i64 = claims.sub.parse().map_err(|_| ApiError::InvalidToken)?;
    let (username, stored_tv) = state
        .store
        .token_version(id)
        .await?
        .ok_or(ApiError::InvalidToken)?;
    if stored_tv != claims.tv {
        return Err(ApiError::SessionExpired);
    }
    Ok(AuthUser {
        id,
        username,
        token_version: stored_tv,
    })
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

/// The configured admin token, kept as a digest so the comparison has a
/// fixed length and runs in constant time.
#[derive(Clone)]
pub struct AdminKey(Option<[u8; 32]>);

impl std::fmt::Debug for AdminKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "AdminKey(set)"
        } else {
            "AdminKey(disabled)"
        })
    }
}

impl AdminKey {
    /// From the configured token; unset or empty disables admin access.
    pub fn new(token: Option<&str>) -> Self {
        match token {
            Some(t) if !t.is_empty() => AdminKey(Some(Sha256::digest(t.as_bytes()).into())),
            _ => AdminKey(None),
        }
    }

    /// Whether `presented` grants access.
    ///
    /// # Errors
    /// The denial to answer.
    pub fn check(&self, presented: Option<&[u8]>) -> Result<(), AdminError> {
        // Disabled is decided before any comparison: nothing grants then,
        // not even an empty header.
        let Some(expected) = &self.0 else {
            return Err(AdminError::Denied("admin access is disabled"));
        };
        let Some(presented) = presented else {
            return Err(AdminError::Denied("missing X-Admin-Token header"));
        };
        let digest: [u8; 32] = Sha256::digest(presented).into();
        if bool::from(digest.ct_eq(expected)) {
            Ok(())
        } else {
            Err(AdminError::Denied("invalid admin token"))
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
        let presented = parts.headers.get("x-admin-token").map(|v| v.as_bytes());
        state.admin_key.check(presented).map(|()| Admin)
    }
}

/// JSON body whose rejections use the structured error format.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(e) => Err(ApiError::validation(
                "invalid_body",
                e.body_text(),
                serde_json::json!({}),
            )),
        }
    }
}

/// JSON body of an admin endpoint; rejections are bare strings.
#[derive(Debug)]
pub struct AdminJson(pub serde_json::Value);

impl FromRequest<AppState> for AdminJson {
    type Rejection = AdminError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        match axum::Json::<serde_json::Value>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(AdminJson(v)),
            Err(e) => Err(AdminError::Validation(format!(
                "invalid JSON body: {}",
                e.body_text()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_or_empty_token_never_grants() {
        for key in [AdminKey::new(None), AdminKey::new(Some(""))] {
            assert!(key.check(None).is_err());
            assert!(key.check(Some(b"")).is_err());
            assert!(key.check(Some(b"anything")).is_err());
        }
        let key = AdminKey::new(Some("s3cret"));
        assert!(key.check(Some(b"s3cret")).is_ok());
        assert!(key.check(Some(b"s3cret ")).is_err());
        assert!(key.check(Some(b"")).is_err());
        assert!(key.check(None).is_err());
    }
}
