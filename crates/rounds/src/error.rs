//! The HTTP error types: structured `{"detail": {code, message, params}}` for the API, a bare-string `detail` for admin endpoints.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use crate::password::MIN_PASSWORD_LENGTH;
use crate::store::StoreError;

/// An error answered by a user-facing endpoint. The `Internal` variant is
/// logged and answered as a generic 500; its text never leaves the server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// No bearer token was sent.
    #[error("not authenticated")]
    NotAuthenticated,
    /// The token is malformed, badly signed or uses another algorithm.
    #[error("invalid token")]
    InvalidToken,
    /// The token expired or its `tv` no longer matches.
    #[error("session expired")]
    SessionExpired,
    /// Unknown user or wrong password (deliberately the same).
    #[error("invalid username or password")]
    InvalidCredentials,
    /// Change-password with a wrong current password.
    #[error("current password is incorrect")]
    CurrentPasswordIncorrect,
    /// A request field breaks a rule; `code` names the rule.
    #[error("{message}")]
    Validation {
        /// Machine-readable rule name, e.g. `password_too_short`.
        code: &'static str,
        /// English text.
        message: String,
        /// Values interpolated into the message.
        params: Map<String, Value>,
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
    /// Login throttled.
    #[error("too many failed login attempts, retry later")]
    TooManyAttempts {
        /// Whole seconds, rounded up.
        retry_after_secs: u64,
    },
    /// Registration quota of the client IP used up.
    #[error("too many registrations from this address, retry later")]
    RegistrationQuotaExceeded {
        /// Whole seconds, rounded up.
        retry_after_secs: u64,
    },
    /// The stream is at its global subscriber cap.
    #[error("too many stream subscribers, poll instead")]
    StreamCapacity,
    /// No such resource or route.
    #[error("not found")]
    NotFound,
    /// A refused bet, withdrawal or other domain operation.
    #[error("{message}")]
    Domain {
        /// HTTP status.
        status: StatusCode,
        /// Machine-readable code, e.g. `insufficient_funds`.
        code: &'static str,
        /// English text.
        message: String,
        /// Values interpolated into the message; amounts end in `_sats`.
        params: Map<String, Value>,
    },
    /// Anything the client cannot act on; logged, never sent.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// A validation error for `field` with a rule `code`.
    pub fn validation(code: &'static str, message: impl Into<String>, params: Value) -> Self {
        let params = match params {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        ApiError::Validation {
            code,
            message: message.into(),
            params,
        }
    }

    /// A domain error with its status, code, message and params.
    pub fn domain(
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
        params: Value,
    ) -> Self {
        let params = match params {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        ApiError::Domain {
            status,
            code,
            message: message.into(),
            params,
        }
    }

    /// The password-length rule shared by register and change-password.
    pub fn password_too_short(field: &str) -> Self {
        Self::validation(
            "password_too_short",
            format!("{field} must be at least {MIN_PASSWORD_LENGTH} characters"),
            json!({"field": field, "min_length": MIN_PASSWORD_LENGTH}),
        )
    }

    /// HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::NotAuthenticated
            | ApiError::InvalidToken
            | ApiError::SessionExpired
            | ApiError::InvalidCredentials => StatusCode::UNAUTHORIZED,
            ApiError::CurrentPasswordIncorrect => StatusCode::BAD_REQUEST,
            ApiError::Validation { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::UsernameTaken { .. } | ApiError::DerivationIndexConflict => {
                StatusCode::CONFLICT
            }
            ApiError::TooManyAttempts { .. } | ApiError::RegistrationQuotaExceeded { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::StreamCapacity => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::Domain { status, .. } => *status,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::NotAuthenticated => "not_authenticated",
            ApiError::InvalidToken => "invalid_token",
            ApiError::SessionExpired => "session_expired",
            ApiError::InvalidCredentials => "invalid_credentials",
            ApiError::CurrentPasswordIncorrect => "current_password_incorrect",
            ApiError::Validation { code, .. } => code,
            ApiError::UsernameTaken { .. } => "username_taken",
            ApiError::DerivationIndexConflict => "derivation_index_conflict",
            ApiError::TooManyAttempts { .. } => "too_many_attempts",
            ApiError::RegistrationQuotaExceeded { .. } => "registration_quota_exceeded",
            ApiError::StreamCapacity => "stream_capacity",
            ApiError::NotFound => "not_found",
            ApiError::Domain { code, .. } => code,
            ApiError::Internal(_) => "internal_error",
        }
    }

    fn params(&self) -> Map<String, Value> {
        match self {
            ApiError::Validation { params, .. } | ApiError::Domain { params, .. } => params.clone(),
            ApiError::UsernameTaken { username } => {
                let mut m = Map::new();
                m.insert("username".into(), Value::from(username.clone()));
                m
            }
            ApiError::TooManyAttempts { retry_after_secs }
            | ApiError::RegistrationQuotaExceeded { retry_after_secs } => {
                let mut m = Map::new();
                m.insert("retry_after_seconds".into(), Value::from(*retry_after_secs));
                m
            }
            _ => Map::new(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::UsernameTaken(username) => ApiError::UsernameTaken { username },
            StoreError::DerivationIndexConflict => ApiError::DerivationIndexConflict,
            other => ApiError::Internal(other.to_string()),
        }
    }
}

/// The JSON body of a structured error.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// The error itself.
    pub detail: ErrorDetail,
}

/// `detail` of a structured error.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Machine-readable code a client maps onto its translations.
    pub code: String,
    /// English text, the fallback for unknown codes.
    pub message: String,
    /// Interpolated values; amounts end in `_sats`.
    #[schema(value_type = Object)]
    pub params: Map<String, Value>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let message = match &self {
            ApiError::Internal(reason) => {
                tracing::error!(%reason, "internal error");
                "internal server error".to_string()
            }
            other => other.to_string(),
        };
        let body =
            json!({"detail": {"code": self.code(), "message": message, "params": self.params()}});
        let mut response = (self.status(), axum::Json(body)).into_response();
        if let ApiError::TooManyAttempts { retry_after_secs }
        | ApiError::RegistrationQuotaExceeded { retry_after_secs } = self
        {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
        }
        response
    }
}

/// An error of an admin endpoint: `detail` is a bare string.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// Missing or wrong `X-Admin-Token`, or admin access disabled.
    #[error("{0}")]
    Denied(&'static str),
    /// A field breaks a rule; the text names the field and the rule.
    #[error("{0}")]
    Validation(String),
    /// The named thing does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The operation does not apply in the current state.
    #[error("{0}")]
    Conflict(String),
    /// Logged, answered as a generic 500.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<StoreError> for AdminError {
    fn from(e: StoreError) -> Self {
        AdminError::Internal(e.to_string())
    }
}

/// The JSON body of an admin error.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct AdminErrorBody {
    /// What went wrong, naming the field and the rule.
    pub detail: String,
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let (status, detail) = match self {
            AdminError::Denied(m) => (StatusCode::FORBIDDEN, m.to_string()),
            AdminError::Validation(m) => (StatusCode::UNPROCESSABLE_ENTITY, m),
            AdminError::NotFound(m) => (StatusCode::NOT_FOUND, m),
            AdminError::Conflict(m) => (StatusCode::CONFLICT, m),
            AdminError::Internal(reason) => {
                tracing::error!(%reason, "internal error (admin)");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal server error".to_string(),
                )
            }
        };
        (status, axum::Json(json!({ "detail": detail }))).into_response()
    }
}
