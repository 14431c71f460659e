//! Admin endpoints over the service's own transfers: the fee bump by hand of a stuck withdrawal or payout, and the list of those waiting for a confirmation (the dashboard's stuck list).

use axum::extract::{Path, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::round::TransferProgress;
use crate::http::error::{AdminError, AdminErrorBody};
use crate::http::extract::{Admin, AdminJson};
use crate::http::state::AppState;

/// The highest fee rate an admin may ask for (as `fee_rate_sat_vb` in the config).
const MAX_BUMP_RATE_SAT_VB: i64 = 10_000;

/// Routes of this module.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(bump))
        .routes(routes!(waiting))
}

/// POST /admin/transfers/{id}/bump body.
#[derive(Debug, Deserialize, ToSchema)]
pub struct BumpRequest {
    /// The fee rate to pay at least, sat/vB (1–10,000); BIP125 may ask a
    /// little more, the bump cap allows less.
    pub fee_rate_sat_vb: i64,
}

/// What a bump by hand did with the money.
#[derive(Debug, Serialize, ToSchema)]
pub struct BumpDone {
    /// The new version's transfer id.
    pub transfer_id: i64,
    /// `withdrawal` or `payout`.
    pub kind: String,
    /// The new version's transaction.
    pub txid: String,
    /// The version it replaced (superseded: it moves no money unless a block holds it).
    pub replaced_txid: String,
    /// The new version's miner fee.
    pub fee_sats: i64,
    /// The amount the transfer pays (a payout's winner share pays the extra fee).
    pub amount_sats: i64,
    /// `broadcast`, or `pending` when the node has not taken it yet (sent
    /// again each block), or `failed` when the node refused it and the old
    /// version stands again.
    pub status: TransferProgress,
}

/// Replaces a withdrawal or payout that waits for its first confirmation (BIP125) at the given fee rate now, held to the bump cap; audit-logged as `transfer_bumped` (actor `admin`). 404 for an unknown transfer; 409 when it is not a broadcast withdrawal or payout waiting for a confirmation, or the cap leaves no replacement that relays.
#[utoipa::path(post, path = "/admin/transfers/{id}/bump", tag = "admin", security(("admin_token" = [])),
    params(("id" = i64, Path, description = "transfer id")),
    request_body = BumpRequest,
    responses((status = 200, body = BumpDone), (status = 403, body = AdminErrorBody), (status = 404, body = AdminErrorBody),
        (status = 409, body = AdminErrorBody), (status = 422, body = AdminErrorBody)))]
async fn bump(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
    AdminJson(body): AdminJson,
) -> Result<Json<BumpDone>, AdminError> {
    let id: i64 = id
        .parse()
        .map_err(|_| AdminError::NotFound(format!("transfer {id} does not exist")))?;
    let rate = body
        .get("fee_rate_sat_vb")
        .and_then(Value::as_i64)
        .filter(|r| (1..=MAX_BUMP_RATE_SAT_VB).contains(r))
        .and_then(|r| u64::try_from(r).ok())
        .and_then(bitcoin::FeeRate::from_sat_per_vb)
        .ok_or_else(|| {
            AdminError::Validation(format!(
                "fee_rate_sat_vb is required: an integer from 1 to {MAX_BUMP_RATE_SAT_VB}"
            ))
        })?;
    let b = state.admin.bump_transfer(id, rate).await?;
    let status = match (b.broadcast, b.transfer.status) {
        (true, _) => TransferProgress::Broadcast,
        (false, crate::domain::round::TransferStatus::Signed) => TransferProgress::Pending,
        (false, _) => TransferProgress::Failed,
    };
    Ok(Json(BumpDone {
        transfer_id: b.transfer.id,
        kind: b.transfer.kind.as_str().to_owned(),
        txid: b.transfer.txid.to_string(),
        replaced_txid: b.replaced_txid.to_string(),
        fee_sats: b.transfer.fee_sats,
        amount_sats: b.transfer.amount_sats,
        status,
    }))
}

/// A withdrawal or payout waiting for its first confirmation.
#[derive(Debug, Serialize, ToSchema)]
pub struct WaitingView {
    /// The live version's transfer id (the one to bump).
    pub transfer_id: i64,
    /// `withdrawal` or `payout`.
    pub kind: String,
    /// The live version's transaction.
    pub txid: String,
    /// Its amount.
    pub amount_sats: i64,
    /// Its miner fee.
    pub fee_sats: i64,
    /// Blocks since this version was first seen waiting (`null`: not yet seen by the worker).
    pub blocks_waiting: Option<i64>,
    /// Versions written so far (1: never bumped).
    pub versions: i64,
}

/// Withdrawals and payouts broadcast and not yet confirmed, oldest first, with how long each has waited.
#[utoipa::path(get, path = "/admin/transfers/waiting", tag = "admin", security(("admin_token" = [])),
    responses((status = 200, body = [WaitingView]), (status = 403, body = AdminErrorBody)))]
async fn waiting(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<Vec<WaitingView>>, AdminError> {
    let (list, height) = state.admin.waiting_transfers().await?;
    Ok(Json(
        list.into_iter()
            .map(|w| WaitingView {
                transfer_id: w.transfer.id,
                kind: w.transfer.kind.as_str().to_owned(),
                txid: w.transfer.txid.to_string(),
                amount_sats: w.transfer.amount_sats,
                fee_sats: w.transfer.fee_sats,
                blocks_waiting: w.sent_height.map(|h| height - h),
                versions: w.versions,
            })
            .collect(),
    ))
}
