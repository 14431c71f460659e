//! The caller's money: withdrawals, the transaction history, and the development faucet.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::round::TransferProgress;
use crate::domain::settings::DUST_LIMIT_SATS;
use crate::http::codes::ErrorCode;
use crate::http::error::{ApiError, ErrorBody, ErrorParams};
use crate::http::extract::{ApiJson, ApiQuery, AuthUser, IdempotencyKey, SignedBearer};
use crate::http::rounds::{paid_status, progress, Page};
use crate::http::state::AppState;
use crate::http::views::TransferView;
use crate::service::payments::{FAUCET_DEFAULT_SATS, FAUCET_MAX_SATS};

/// Routes of this module (the faucet only with the development chain).
pub fn router(dev_chain: bool) -> OpenApiRouter<AppState> {
    let r = OpenApiRouter::new()
        .routes(routes!(transactions))
        .routes(routes!(deposit_qr));
    if dev_chain {
        r.routes(routes!(faucet))
    } else {
        r
    }
}

/// The money route, kept out of the time-out layer (see
/// [`crate::http::rounds::money_router`]).
pub fn money_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(withdraw))
}

/// POST /users/me/withdrawals body.
#[derive(Debug, Deserialize, ToSchema)]
pub struct WithdrawalRequest {
    /// An address of the service's network.
    pub address: String,
    /// At least `min_withdrawal_sats` and the dust limit.
    pub amount_sats: i64,
}

/// A broadcast withdrawal.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WithdrawalDone {
    /// Transfer id.
    pub id: i64,
    /// Destination.
    pub address: String,
    /// Amount sent.
    pub amount_sats: i64,
    /// Miner fee paid.
    pub fee_sats: i64,
    /// The transaction.
    pub txid: String,
    /// `broadcast`, or `pending` (202) when the worker still has to broadcast it.
    pub status: TransferProgress,
}

/// Withdraw to an address of the service's network.
#[utoipa::path(post, path = "/users/me/withdrawals", tag = "accounts", security(("bearer" = [])),
    request_body = WithdrawalRequest,
    responses(
        (status = 201, body = WithdrawalDone),
        (status = 202, description = "saved, its broadcast not yet ended (a slow or unreachable node): `status: pending`, broadcast by the worker", body = WithdrawalDone),
        (status = 408, description = "request_timeout: nothing was saved, retry", body = ErrorBody),
        (status = 409, description = "funds_busy, idempotency_key_in_progress", body = ErrorBody),
        (status = 422, description = "invalid_address, address_wrong_network, withdrawal_below_minimum, insufficient_funds, too_many_inputs, invalid_idempotency_key, idempotency_key_reused", body = ErrorBody),
        (status = 502, description = "broadcast_rejected", body = ErrorBody),
        (status = 503, description = "paused, payment_outcome_unknown", body = ErrorBody),
    ),
    params(("Idempotency-Key" = Option<String>, Header, description = "1–255 visible ASCII characters; the same key and body give the same withdrawal, kept 24 h per user")))]
async fn withdraw(
    State(state): State<AppState>,
    SignedBearer(session): SignedBearer,
    IdempotencyKey(key): IdempotencyKey,
    ApiJson(body): ApiJson<WithdrawalRequest>,
) -> Result<(StatusCode, Json<WithdrawalDone>), ApiError> {
    let paid = state
        .cashier
        .withdraw(session, body.address.clone(), body.amount_sats, key)
        .await?;
    Ok((
        paid_status(paid.broadcast),
        Json(WithdrawalDone {
            id: paid.transfer_id,
            address: body.address.trim().to_string(),
            amount_sats: body.amount_sats,
            fee_sats: paid.fee_sats,
            status: progress(paid.broadcast),
            txid: paid.txid.to_string(),
        }),
    ))
}

/// A page of transfers.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TransferPage {
    /// Newest first.
    pub transactions: Vec<TransferView>,
    /// Pass as `before_id` for the next page; null at the end.
    pub next_before_id: Option<i64>,
}

/// The caller's deposits, bets, withdrawals and payouts with status and txid.
#[utoipa::path(get, path = "/users/me/transactions", tag = "accounts", security(("bearer" = [])),
    params(Page), responses((status = 200, body = TransferPage), (status = 401, body = ErrorBody)))]
async fn transactions(
    State(state): State<AppState>,
    user: AuthUser,
    ApiQuery(page): ApiQuery<Page>,
) -> Result<Json<TransferPage>, ApiError> {
    let p = state
        .history
        .transfers_page(user.id, page.limit(), page.before_id)
        .await?;
    let transactions = p
        .transfers
        .iter()
        .map(|t| TransferView::of(t, p.tip, p.deposit_confirmations))
        .collect();
    Ok(Json(TransferPage {
        transactions,
        next_before_id: p.next_before_id,
    }))
}

/// The caller's deposit address as an SVG QR code (drawn by the server).
#[utoipa::path(get, path = "/users/me/deposit-qr.svg", tag = "accounts", security(("bearer" = [])),
    responses((status = 200, content_type = "image/svg+xml", body = String), (status = 401, body = ErrorBody)))]
async fn deposit_qr(
    State(state): State<AppState>,
    user: AuthUser,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse as _;
    let address = state.accounts.deposit_address(user.id).await?;
    let svg = crate::http::qr::svg(&address).map_err(ApiError::internal)?;
    Ok((
        [
            (axum::http::header::CONTENT_TYPE, "image/svg+xml"),
            (axum::http::header::CACHE_CONTROL, "private, max-age=3600"),
        ],
        svg,
    )
        .into_response())
}

/// POST /dev/faucet body.
#[derive(Debug, Deserialize, ToSchema, Default)]
pub struct FaucetRequest {
    /// Default 1,000,000; at most 100,000,000.
    pub amount_sats: Option<i64>,
}

/// A faucet payment.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FaucetPaid {
    /// The deposit transaction.
    pub txid: String,
    /// Amount deposited (credited when this answers).
    pub amount_sats: i64,
}

/// Development chain only: sends the caller test coins and mines until they are credited.
#[utoipa::path(post, path = "/dev/faucet", tag = "dev", security(("bearer" = [])),
    request_body = FaucetRequest,
    responses((status = 200, body = FaucetPaid), (status = 422, description = "faucet_amount_invalid, invalid_body", body = ErrorBody)))]
async fn faucet(
    State(state): State<AppState>,
    user: AuthUser,
    body: Option<ApiJson<FaucetRequest>>,
) -> Result<Json<FaucetPaid>, ApiError> {
    let amount = body
        .and_then(|b| b.0.amount_sats)
        .unwrap_or(FAUCET_DEFAULT_SATS);
    if !(DUST_LIMIT_SATS..=FAUCET_MAX_SATS).contains(&amount) {
        return Err(ApiError::domain(
            StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::FaucetAmountInvalid,
            format!("amount_sats must be between {DUST_LIMIT_SATS} and {FAUCET_MAX_SATS}"),
            ErrorParams {
                amount_sats: Some(amount),
                min_sats: Some(DUST_LIMIT_SATS),
                max_sats: Some(FAUCET_MAX_SATS),
                ..ErrorParams::none()
            },
        ));
    }
    let txid = state
        .cashier
        .faucet(user.id, amount)
        .await
        .ok_or(ApiError::NotFound)??;
    Ok(Json(FaucetPaid {
        txid: txid.to_string(),
        amount_sats: amount,
    }))
}
