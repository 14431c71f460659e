//! The HTTP error types: structured `{"detail": {code, message, params}}` for the API, a bare-string `detail` for admin endpoints.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::round::RoundStatus;
use crate::http::codes::ErrorCode;
use crate::security::password::{MAX_PASSWORD_LENGTH, MIN_PASSWORD_LENGTH};
use crate::service::accounts::{AccountError, MAX_USERNAME_LENGTH, MIN_USERNAME_LENGTH};
use crate::service::admin::AdminOpError;
use crate::service::bump::BumpError;
use crate::service::engine::EngineError;
use crate::service::payments::PaymentError;
use crate::service::StoreError;

/// The values interpolated into an error's message (`detail.params`): only
/// the fields of the error's code are present (an error without values sends
/// `{}`); amounts end in `_sats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorParams {
    /// The request field a password rule applies to (`password`, `new_password`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The shortest allowed length (usernames, passwords).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_length: Option<usize>,
    /// The longest allowed length (usernames, passwords).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<usize>,
    /// The name asked for (`username_taken`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Seconds to wait (`too_many_attempts`, `registration_quota_exceeded`; also `Retry-After`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
    /// The amount asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount_sats: Option<i64>,
    /// The configured minimum bet (`bet_below_minimum`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_bet_sats: Option<i64>,
    /// What the bet's own pot input would cost in fees (`bet_uneconomic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_fee_sats: Option<i64>,
    /// The current fee rate (`bet_uneconomic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fee_rate_sat_vb: Option<i64>,
    /// The largest share of a bet its input may cost (`bet_uneconomic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_percent: Option<u32>,
    /// The round (`round_not_open`, `round_full`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round_id: Option<i64>,
    /// The round's status (`round_not_open`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RoundStatus>,
    /// The most coins one transaction spends (`too_many_inputs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_inputs: Option<usize>,
    /// The most one payment can take (`too_many_inputs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_amount_sats: Option<i64>,
    /// The most bets a round takes (`round_full`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bets: Option<i64>,
    /// The address as given, trimmed (`invalid_address`, `address_wrong_network`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The service's network (`address_wrong_network`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// The effective minimum withdrawal (`withdrawal_below_minimum`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_withdrawal_sats: Option<i64>,
    /// Amount plus miner fee (`insufficient_funds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needed_sats: Option<i64>,
    /// The confirmed spendable balance (`insufficient_funds`, `debt_outstanding`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance_sats: Option<i64>,
    /// What the user owes after a reversed deposit (`debt_outstanding`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debt_sats: Option<i64>,
    /// The dust threshold of the destination (`amount_below_dust`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dust_sats: Option<i64>,
    /// The smallest allowed amount (`faucet_amount_invalid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_sats: Option<i64>,
    /// The largest allowed amount (`faucet_amount_invalid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sats: Option<i64>,
    /// The request time-out in whole seconds (`request_timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    /// The transaction whose fate is in question (`payment_outcome_unknown`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txid: Option<String>,
}

impl ErrorParams {
    /// No values: `{}`.
    pub fn none() -> Self {
        Self::default()
    }
}

/// An error answered by a user-facing endpoint. The `Internal` variant is
/// logged and answered as a generic 500; its text never leaves the server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// No bearer token was sent.
    #[error("not authenticated")]
    NotAuthenticated,
    /// A refused registration, login, session or password change: the
    /// service's own error, its status, code and params given by
    /// `account_refusal` (never one of its internal causes).
    #[error(transparent)]
    Account(AccountError),
    /// A request field breaks a rule; `code` names the rule.
    #[error("{message}")]
    Validation {
        /// Machine-readable rule name, e.g. `password_too_short`.
        code: ErrorCode,
        /// English text.
        message: String,
        /// Values interpolated into the message.
        params: ErrorParams,
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
        code: ErrorCode,
        /// English text.
        message: String,
        /// Values interpolated into the message; amounts end in `_sats`.
        params: ErrorParams,
    },
    /// The request outlived the request time-out; nothing it would have
    /// written was written.
    #[error(
        "the request took longer than {timeout_secs} s; nothing was changed, it can be retried"
    )]
    RequestTimeout {
        /// The time-out in whole seconds.
        timeout_secs: u64,
    },
    /// Anything the client cannot act on; logged with its causes, never sent.
    #[error("internal error")]
    Internal(#[source] BoxError),
}

/// The cause of an internal error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

impl ApiError {
    /// A validation error for `field` with a rule `code`.
    pub fn validation(code: ErrorCode, message: impl Into<String>, params: ErrorParams) -> Self {
        ApiError::Validation {
            code,
            message: message.into(),
            params,
        }
    }

    /// A domain error with its status, code, message and params.
    pub fn domain(
        status: StatusCode,
        code: ErrorCode,
        message: impl Into<String>,
        params: ErrorParams,
    ) -> Self {
        ApiError::Domain {
            status,
            code,
            message: message.into(),
            params,
        }
    }

    /// An internal error caused by `source` (logged with its chain when answered).
    pub fn internal(source: impl Into<BoxError>) -> Self {
        ApiError::Internal(source.into())
    }

    /// HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::NotAuthenticated => StatusCode::UNAUTHORIZED,
            ApiError::Account(e) => account_refusal(e).0,
            ApiError::Validation { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::StreamCapacity => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::Domain { status, .. } => *status,
            ApiError::RequestTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The machine-readable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            ApiError::NotAuthenticated => ErrorCode::NotAuthenticated,
            ApiError::Account(e) => account_refusal(e).1,
            ApiError::Validation { code, .. } | ApiError::Domain { code, .. } => *code,
            ApiError::StreamCapacity => ErrorCode::StreamCapacity,
            ApiError::NotFound => ErrorCode::NotFound,
            ApiError::RequestTimeout { .. } => ErrorCode::RequestTimeout,
            ApiError::Internal(_) => ErrorCode::InternalError,
        }
    }

    /// The values of `detail.params`.
    pub fn params(&self) -> ErrorParams {
        match self {
            ApiError::Validation { params, .. } | ApiError::Domain { params, .. } => params.clone(),
            ApiError::Account(e) => account_refusal(e).2,
            ApiError::RequestTimeout { timeout_secs } => ErrorParams {
                timeout_seconds: Some(*timeout_secs),
                ..ErrorParams::none()
            },
            _ => ErrorParams::none(),
        }
    }

    /// Seconds the client waits before it tries again (`Retry-After`).
    fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::Account(
                AccountError::TooManyAttempts { retry_after_secs }
                | AccountError::RegistrationQuotaExceeded { retry_after_secs },
            ) => Some(*retry_after_secs),
            _ => None,
        }
    }
}

/// The status, code and params of a refused account operation. The
/// internal failures (hashing, the store) never reach it: `From<AccountError>`
/// turns them into [`ApiError::Internal`].
fn account_refusal(e: &AccountError) -> (StatusCode, ErrorCode, ErrorParams) {
    let lengths = ErrorParams {
        min_length: Some(MIN_USERNAME_LENGTH),
        max_length: Some(MAX_USERNAME_LENGTH),
        ..ErrorParams::none()
    };
    let retry = |secs: u64| ErrorParams {
        retry_after_seconds: Some(secs),
        ..ErrorParams::none()
    };
    let invalid = StatusCode::UNPROCESSABLE_ENTITY;
    match e {
        AccountError::UsernameInvalidCharacters => {
            (invalid, ErrorCode::UsernameInvalidCharacters, lengths)
        }
        AccountError::UsernameTooShort => (invalid, ErrorCode::UsernameTooShort, lengths),
        AccountError::UsernameTooLong => (invalid, ErrorCode::UsernameTooLong, lengths),
        AccountError::PasswordTooShort { field } => (
            invalid,
            ErrorCode::PasswordTooShort,
            ErrorParams {
                field: Some(field.to_string()),
                min_length: Some(MIN_PASSWORD_LENGTH),
                ..ErrorParams::none()
            },
        ),
        AccountError::PasswordTooLong { field } => (
            invalid,
            ErrorCode::PasswordTooLong,
            ErrorParams {
                field: Some(field.to_string()),
                max_length: Some(MAX_PASSWORD_LENGTH),
                ..ErrorParams::none()
            },
        ),
        AccountError::RegistrationClosed => (
            StatusCode::FORBIDDEN,
            ErrorCode::RegistrationClosed,
            ErrorParams::none(),
        ),
        AccountError::RegistrationQuotaExceeded { retry_after_secs } => (
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::RegistrationQuotaExceeded,
            retry(*retry_after_secs),
        ),
        AccountError::UsernameTaken { username } => (
            StatusCode::CONFLICT,
            ErrorCode::UsernameTaken,
            ErrorParams {
                username: Some(username.clone()),
                ..ErrorParams::none()
            },
        ),
        AccountError::DerivationIndexConflict => (
            StatusCode::CONFLICT,
            ErrorCode::DerivationIndexConflict,
            ErrorParams::none(),
        ),
        AccountError::TooManyAttempts { retry_after_secs } => (
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::TooManyAttempts,
            retry(*retry_after_secs),
        ),
        AccountError::InvalidCredentials => (
            StatusCode::UNAUTHORIZED,
            ErrorCode::InvalidCredentials,
            ErrorParams::none(),
        ),
        AccountError::CurrentPasswordIncorrect => (
            StatusCode::BAD_REQUEST,
            ErrorCode::CurrentPasswordIncorrect,
            ErrorParams::none(),
        ),
        AccountError::InvalidToken => (
            StatusCode::UNAUTHORIZED,
            ErrorCode::InvalidToken,
            ErrorParams::none(),
        ),
        AccountError::SessionExpired | AccountError::UnknownUser => (
            StatusCode::UNAUTHORIZED,
            ErrorCode::SessionExpired,
            ErrorParams::none(),
        ),
        AccountError::Hashing(_) | AccountError::Store(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::InternalError,
            ErrorParams::none(),
        ),
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::UsernameTaken(_) | StoreError::DerivationIndexConflict => {
                AccountError::from(e).into()
            }
            other => ApiError::internal(other),
        }
    }
}

impl From<AccountError> for ApiError {
    fn from(e: AccountError) -> Self {
        match e {
            // A session whose user is gone is over.
            AccountError::UnknownUser => ApiError::Account(AccountError::SessionExpired),
            AccountError::Store(e) => e.into(),
            AccountError::Hashing(_) => ApiError::internal(e),
            refusal => ApiError::Account(refusal),
        }
    }
}

impl From<PaymentError> for ApiError {
    fn from(e: PaymentError) -> Self {
        if let PaymentError::OutcomeUnknown { txid, source } = &e {
            tracing::error!(error = %error_chain(source), %txid, "payment outcome unknown");
        }
        if let Some((status, code, params)) = payment_refusal(&e) {
            let message = match e {
                PaymentError::RoundNotOpen { .. } => "the round is not open for bets".to_string(),
                _ => e.to_string(),
            };
            return ApiError::domain(status, code, message, params);
        }
        match e {
            PaymentError::UnknownUser => ApiError::Account(AccountError::SessionExpired),
            PaymentError::Session(e) => e.into(),
            PaymentError::TimedOut { timeout_secs } => ApiError::RequestTimeout { timeout_secs },
            PaymentError::Store(e) => e.into(),
            other => ApiError::internal(other),
        }
    }
}

/// `ErrorParams` with the named fields set (`field` from a binding of the
/// same name, or `field = value`), the others absent.
macro_rules! params {
    ($($field:ident $(= $value:expr)?),* $(,)?) => {
        ErrorParams { $($field: Some(params!(@value $field $(, $value)?)),)* ..ErrorParams::none() }
    };
    (@value $field:ident) => { $field };
    (@value $field:ident, $value:expr) => { $value };
}

/// The status and code of a payment the service refused (the message is
/// the error's own text); `None` for the errors that are not refusals (a
/// dead session, a time-out, an internal failure).
fn payment_refusal(e: &PaymentError) -> Option<(StatusCode, ErrorCode, ErrorParams)> {
    use PaymentError as P;
    const UNPROCESSABLE: StatusCode = StatusCode::UNPROCESSABLE_ENTITY;
    const CONFLICT: StatusCode = StatusCode::CONFLICT;
    let (status, code) = match e {
        P::Paused => (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Paused),
        P::BetBelowMinimum { .. } => (UNPROCESSABLE, ErrorCode::BetBelowMinimum),
        P::BetUneconomic { .. } => (UNPROCESSABLE, ErrorCode::BetUneconomic),
        P::RoundNotOpen { .. } => (CONFLICT, ErrorCode::RoundNotOpen),
        P::TooManyInputs { .. } => (UNPROCESSABLE, ErrorCode::TooManyInputs),
        P::RoundFull { .. } => (CONFLICT, ErrorCode::RoundFull),
        P::RoundShareFull { .. } => (CONFLICT, ErrorCode::RoundShareFull),
        P::InvalidAddress { .. } => (UNPROCESSABLE, ErrorCode::InvalidAddress),
        P::WrongNetwork { .. } => (UNPROCESSABLE, ErrorCode::AddressWrongNetwork),
        P::WithdrawalBelowMinimum { .. } => (UNPROCESSABLE, ErrorCode::WithdrawalBelowMinimum),
        P::InsufficientFunds { .. } => (UNPROCESSABLE, ErrorCode::InsufficientFunds),
        P::Dust { .. } => (UNPROCESSABLE, ErrorCode::AmountBelowDust),
        P::BroadcastRejected => (StatusCode::BAD_GATEWAY, ErrorCode::BroadcastRejected),
        P::DebtOutstanding { .. } => (CONFLICT, ErrorCode::DebtOutstanding),
        P::FundsBusy => (CONFLICT, ErrorCode::FundsBusy),
        P::IdempotencyKeyReused => (UNPROCESSABLE, ErrorCode::IdempotencyKeyReused),
        P::IdempotencyKeyInProgress => (CONFLICT, ErrorCode::IdempotencyKeyInProgress),
        P::OutcomeUnknown { .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::PaymentOutcomeUnknown,
        ),
        _ => return None,
    };
    Some((status, code, payment_params(e)))
}

/// The values a refused payment's message interpolates.
fn payment_params(e: &PaymentError) -> ErrorParams {
    use PaymentError as P;
    match *e {
        P::BetBelowMinimum {
            amount_sats,
            min_bet_sats,
        } => params!(amount_sats, min_bet_sats),
        P::BetUneconomic {
            amount_sats,
            input_fee_sats,
            fee_rate_sat_vb,
            max_percent,
        } => params!(amount_sats, input_fee_sats, fee_rate_sat_vb, max_percent),
        P::RoundNotOpen { round_id, status } => params!(round_id, status),
        P::TooManyInputs {
            amount_sats,
            max_inputs,
            max_amount_sats,
        } => params!(amount_sats, max_inputs, max_amount_sats),
        P::RoundFull { round_id, max_bets } => params!(round_id, max_bets),
        P::RoundShareFull { round_id, max_bets } => params!(round_id, max_bets),
        P::InvalidAddress { ref address } => params!(address = address.clone()),
        P::WrongNetwork {
            ref address,
            expected,
        } => params!(address = address.clone(), network = expected.to_string()),
        P::WithdrawalBelowMinimum {
            amount_sats,
            min_withdrawal_sats,
        } => params!(amount_sats, min_withdrawal_sats),
        P::InsufficientFunds {
            amount_sats,
            needed_sats,
            balance_sats,
        } => params!(amount_sats, needed_sats, balance_sats),
        P::Dust {
            amount_sats,
            threshold_sats,
        } => params!(amount_sats, dust_sats = threshold_sats),
        P::DebtOutstanding {
            debt_sats,
            balance_sats,
        } => params!(debt_sats, balance_sats),
        P::OutcomeUnknown { ref txid, .. } => params!(txid = txid.to_string()),
        _ => ErrorParams::none(),
    }
}

pub use crate::service::error_chain;

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
    pub params: ErrorParams,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let message = match &self {
            ApiError::Internal(source) => {
                tracing::error!(error = %error_chain(source.as_ref()), "internal error");
                "internal server error".to_string()
            }
            other => other.to_string(),
        };
        let body = ErrorBody {
            detail: ErrorDetail {
                code: self.code().as_str().to_string(),
                message,
                params: self.params(),
            },
        };
        let mut response = (self.status(), axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
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
    /// Too many wrong admin tokens from this client; wait this many seconds.
    #[error("too many failed admin-token attempts, retry later")]
    TooManyAttempts(u64),
    /// The request outlived the request time-out of this many seconds.
    #[error("the request took longer than {0} s")]
    TimedOut(u64),
    /// Logged with its causes, answered as a generic 500.
    #[error("internal error")]
    Internal(#[source] BoxError),
}

impl AdminError {
    /// An internal error caused by `source`.
    pub fn internal(source: impl Into<BoxError>) -> Self {
        AdminError::Internal(source.into())
    }
}

impl From<StoreError> for AdminError {
    fn from(e: StoreError) -> Self {
        AdminError::internal(e)
    }
}

impl From<AdminOpError> for AdminError {
    fn from(e: AdminOpError) -> Self {
        match e {
            AdminOpError::UnknownRound(_) => AdminError::NotFound(e.to_string()),
            AdminOpError::NothingToRetry(_) => AdminError::Conflict(e.to_string()),
            // The operator must change something (the fee rate, the fee
            // address) or wait for the chain (a bet that may still confirm) first.
            AdminOpError::Engine(
                EngineError::Unbuildable(reason) | EngineError::PotUnsettled(reason),
            ) => AdminError::Conflict(reason),
            AdminOpError::Bump(BumpError::NotFound(_)) => AdminError::NotFound(bump_text(&e)),
            AdminOpError::Bump(
                BumpError::NotWaiting(_) | BumpError::OverCap { .. } | BumpError::Build { .. },
            ) => AdminError::Conflict(bump_text(&e)),
            other => AdminError::internal(other),
        }
    }
}

/// The bump refusal's own text (the operator's answer), without the layer's prefix.
fn bump_text(e: &AdminOpError) -> String {
    match e {
        AdminOpError::Bump(b) => match b {
            BumpError::Build { source, .. } => format!("{b}: {source}"),
            _ => b.to_string(),
        },
        other => other.to_string(),
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
            AdminError::TimedOut(secs) => (
                StatusCode::REQUEST_TIMEOUT,
                format!("the request took longer than {secs} s"),
            ),
            AdminError::TooManyAttempts(secs) => {
                let mut r = (
                    StatusCode::TOO_MANY_REQUESTS,
                    axum::Json(AdminErrorBody {
                        detail: "too many failed admin-token attempts, retry later".into(),
                    }),
                )
                    .into_response();
                if let Ok(v) = axum::http::HeaderValue::from_str(&secs.to_string()) {
                    r.headers_mut().insert(axum::http::header::RETRY_AFTER, v);
                }
                return r;
            }
            AdminError::Internal(source) => {
                tracing::error!(error = %error_chain(source.as_ref()), "internal error (admin)");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal server error".to_string(),
                )
            }
        };
        (status, axum::Json(AdminErrorBody { detail })).into_response()
    }
}
