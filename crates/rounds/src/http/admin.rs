//! Admin endpoints (X-Admin-Token): config read and update with audit diff, pause/resume, password reset, the audit log, the payout retry and the ledger totals. Errors are bare strings.

use axum::extract::{Path, Query, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::address::AddressError;
use crate::domain::audit::AuditActor;
use crate::domain::round::TransferProgress;
use crate::domain::settings::{ConfigPatch, ServiceConfig};
use crate::http::error::{AdminError, AdminErrorBody};
use crate::http::extract::{Admin, AdminJson};
use crate::http::state::AppState;
use crate::service::accounts::AccountError;
use crate::service::admin::{AuditEntry, LedgerTotals};

/// Who admin actions are attributed to in the audit log.
const ACTOR: AuditActor = AuditActor::Admin;

/// Routes of this module.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_config, put_config))
        .routes(routes!(pause))
        .routes(routes!(resume))
        .routes(routes!(reset_password))
        .routes(routes!(audit))
        .routes(routes!(retry_payout))
        .routes(routes!(ledger))
}

/// Turns a PUT body into a checked patch. Every error names the field and the rule.
///
/// # Errors
/// [`AdminError::Validation`].
pub fn parse_patch(
    body: &Value,
    validate_address: impl Fn(&str) -> Result<(), AddressError>,
) -> Result<ConfigPatch, AdminError> {
    let obj = body
        .as_object()
        .ok_or_else(|| AdminError::Validation("body must be a JSON object".into()))?;
    let mut patch = ConfigPatch::default();
    for (key, v) in obj {
        match key.as_str() {
            "fee_address" => {
                let s = v
                    .as_str()
                    .ok_or_else(|| AdminError::Validation("fee_address must be a string".into()))?;
                validate_address(s).map_err(|e| match e {
                    AddressError::WrongNetwork { expected } => AdminError::Validation(format!(
                        "fee_address must be an address of this service's network ({expected}); it belongs to another network"
                    )),
                    _ => AdminError::Validation("fee_address must be a valid address; it is malformed".into()),
                })?;
                patch.fee_address = Some(s.to_string());
            }
            "paused" => {
                return Err(AdminError::Validation(
                    "paused is read-only here; use POST /admin/pause or POST /admin/resume".into(),
                ))
            }
            other => {
                // An integer setting's range is the domain's (ConfigPatch).
                if ConfigPatch::range_of(other).is_some() {
                    let n = v.as_i64().ok_or_else(|| {
                        AdminError::Validation(format!("{other} must be an integer"))
                    })?;
                    patch
                        .set_integer(other, n)
                        .map_err(|e| AdminError::Validation(e.to_string()))?;
                } else {
                    return Err(AdminError::Validation(format!(
                        "{other} is not a config field"
                    )));
                }
            }
        }
    }
    Ok(patch)
}

/// The service configuration.
#[utoipa::path(get, path = "/admin/config", tag = "admin", security(("admin_token" = [])),
    responses((status = 200, body = ServiceConfig), (status = 403, body = AdminErrorBody)))]
async fn get_config(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<ServiceConfig>, AdminError> {
    Ok(Json(state.admin.config().await?))
}

/// Update any of the settable config fields; audit-logged with a before/after diff when something changed.
#[utoipa::path(put, path = "/admin/config", tag = "admin", security(("admin_token" = [])),
    request_body = ConfigPatch,
    responses((status = 200, body = ServiceConfig), (status = 403, body = AdminErrorBody), (status = 422, body = AdminErrorBody)))]
async fn put_config(
    State(state): State<AppState>,
    _admin: Admin,
    AdminJson(body): AdminJson,
) -> Result<Json<ServiceConfig>, AdminError> {
    let addresses = state.addresses.clone();
    let patch = parse_patch(&body, |a| addresses.validate(a))?;
    let (config, diff) = state.admin.update_config(&patch, ACTOR).await?;
    if !diff.is_empty() {
        let diff = serde_json::to_string(&diff).unwrap_or_default();
        tracing::info!(%diff, "config updated");
    }
    Ok(Json(config))
}

async fn set_paused(state: &AppState, paused: bool) -> Result<Json<ServiceConfig>, AdminError> {
    Ok(Json(state.admin.set_paused(paused, ACTOR).await?))
}

/// Pause: no new bets, withdrawals or round transitions. Idempotent.
#[utoipa::path(post, path = "/admin/pause", tag = "admin", security(("admin_token" = [])),
    responses((status = 200, body = ServiceConfig), (status = 403, body = AdminErrorBody)))]
async fn pause(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<ServiceConfig>, AdminError> {
    set_paused(&state, true).await
}

/// Resume after a pause. Idempotent.
#[utoipa::path(post, path = "/admin/resume", tag = "admin", security(("admin_token" = [])),
    responses((status = 200, body = ServiceConfig), (status = 403, body = AdminErrorBody)))]
async fn resume(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<ServiceConfig>, AdminError> {
    set_paused(&state, false).await
}

/// Body of the admin password reset.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ResetPassword {
    /// At least 8 characters.
    pub new_password: String,
}

/// Result of the admin password reset (no token).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ResetDone {
    /// The name as stored.
    pub username: String,
    /// The raised token version; every earlier token is dead.
    pub token_version: i64,
}

/// Set a user's password and revoke every session; returns no token.
#[utoipa::path(post, path = "/admin/users/{username}/reset-password", tag = "admin", security(("admin_token" = [])),
    params(("username" = String, Path, description = "matched ignoring case")),
    request_body = ResetPassword,
    responses((status = 200, body = ResetDone), (status = 403, body = AdminErrorBody), (status = 404, body = AdminErrorBody), (status = 422, body = AdminErrorBody)))]
async fn reset_password(
    State(state): State<AppState>,
    _admin: Admin,
    Path(username): Path<String>,
    AdminJson(body): AdminJson,
) -> Result<Json<ResetDone>, AdminError> {
    let new_password = body
        .get("new_password")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            AdminError::Validation("new_password is required and must be a string".into())
        })?;
    let (username, token_version) = state
        .accounts
        .reset_password(&username, new_password.to_string(), ACTOR)
        .await
        .map_err(|e| match e {
            AccountError::PasswordTooShort { .. } | AccountError::PasswordTooLong { .. } => {
                AdminError::Validation(e.to_string())
            }
            AccountError::UnknownUser => AdminError::NotFound(format!("user {username} not found")),
            other => AdminError::internal(other),
        })?;
    Ok(Json(ResetDone {
        username,
        token_version,
    }))
}

/// Paging of the audit log.
#[derive(Debug, Deserialize, IntoParams)]
pub struct AuditQuery {
    /// 1–200, default 50.
    pub limit: Option<i64>,
    /// Only entries with a smaller id (the previous page's `next_before_id`).
    pub before_id: Option<i64>,
}

/// A page of the audit log.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditPage {
    /// Newest first.
    pub entries: Vec<AuditEntry>,
    /// Pass as `before_id` for the next page; null on the last page.
    pub next_before_id: Option<i64>,
}

/// The audit log, newest first.
#[utoipa::path(get, path = "/admin/audit", tag = "admin", security(("admin_token" = [])),
    params(AuditQuery),
    responses((status = 200, body = AuditPage), (status = 403, body = AdminErrorBody), (status = 422, body = AdminErrorBody)))]
async fn audit(
    State(state): State<AppState>,
    _admin: Admin,
    query: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<AuditPage>, AdminError> {
    let Query(q) =
        query.map_err(|e| AdminError::Validation(format!("invalid query: {}", e.body_text())))?;
    let limit = q.limit.unwrap_or(50);
    if !(1..=200).contains(&limit) {
        return Err(AdminError::Validation(
            "limit must be between 1 and 200".into(),
        ));
    }
    let entries = state.admin.audit_page(limit, q.before_id).await?;
    let next_before_id = if entries.len() as i64 == limit {
        entries.last().map(|e| e.id)
    } else {
        None
    };
    Ok(Json(AuditPage {
        entries,
        next_before_id,
    }))
}

/// Result of a payout retry.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RetryDone {
    /// The round.
    pub round_id: i64,
    /// The new payout transaction.
    pub txid: String,
    /// `broadcast`, or `broadcast_failed` when the network refused it again
    /// (`pending` when the chain could not be reached: the worker retries).
    pub status: TransferProgress,
}

/// Manual intervention for a `payout_failed` round: rebuilds the payout at the current config from the pot outputs that still exist (dropped ones become ledger corrections) and broadcasts it, or draws a round whose payout could not be built again from its stored draw block.
#[utoipa::path(post, path = "/admin/rounds/{id}/retry-payout", tag = "admin", security(("admin_token" = [])),
    params(("id" = i64, Path, description = "round id")),
    responses((status = 200, body = RetryDone), (status = 404, body = AdminErrorBody), (status = 409, body = AdminErrorBody)))]
async fn retry_payout(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<RetryDone>, AdminError> {
    let id: i64 = id
        .parse()
        .map_err(|_| AdminError::NotFound(format!("round {id} does not exist")))?;
    let t = state.admin.retry_payout(id).await?;
    Ok(Json(RetryDone {
        round_id: id,
        txid: t.txid.to_string(),
        status: TransferProgress::of_own(t.status, false),
    }))
}

/// The ledger totals behind the conservation check: deposits = users' unspent + pots in flight + commission + withdrawals + miner fees, and every unspent output listed.
#[utoipa::path(get, path = "/admin/ledger", tag = "admin", security(("admin_token" = [])),
    responses((status = 200, body = LedgerTotals), (status = 403, body = AdminErrorBody)))]
async fn ledger(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<LedgerTotals>, AdminError> {
    Ok(Json(state.admin.ledger_totals().await?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(_: &str) -> Result<(), AddressError> {
        Ok(())
    }

    fn msg(e: AdminError) -> String {
        e.to_string()
    }

    #[test]
    fn zero_and_out_of_range_are_rejected_naming_field_and_rule() {
        assert_eq!(
            msg(parse_patch(&json!({"fee_rate_sat_vb": 0}), ok).unwrap_err()),
            "fee_rate_sat_vb must be at least 1"
        );
        assert_eq!(
            msg(parse_patch(&json!({"round_duration_seconds": 0}), ok).unwrap_err()),
            "round_duration_seconds must be at least 1"
        );
        assert_eq!(
            msg(parse_patch(&json!({"fee_rate_sat_vb": 10_001}), ok).unwrap_err()),
            "fee_rate_sat_vb must be at most 10000"
        );
        assert_eq!(
            msg(parse_patch(&json!({"min_bet_sats": 293}), ok).unwrap_err()),
            "min_bet_sats must be at least 294"
        );
        assert!(msg(parse_patch(&json!({"paused": true}), ok).unwrap_err())
            .starts_with("paused is read-only"));
        assert_eq!(
            msg(parse_patch(&json!({"colour": 1}), ok).unwrap_err()),
            "colour is not a config field"
        );
        assert_eq!(
            msg(parse_patch(&json!({"fee_rate_sat_vb": "5"}), ok).unwrap_err()),
            "fee_rate_sat_vb must be an integer"
        );
        let p = parse_patch(
            &json!({"fee_rate_sat_vb": 1, "round_duration_seconds": 604_800}),
            ok,
        )
        .unwrap();
        assert_eq!(p.fee_rate_sat_vb, Some(1));
        assert_eq!(p.round_duration_seconds, Some(604_800));
    }

    #[test]
    fn address_errors_are_distinct() {
        let wrong = |_: &str| {
            Err(AddressError::WrongNetwork {
                expected: bitcoin::Network::Regtest,
            })
        };
        let bad = |_: &str| Err(AddressError::Malformed);
        let a = msg(parse_patch(&json!({"fee_address": "x"}), wrong).unwrap_err());
        let b = msg(parse_patch(&json!({"fee_address": "x"}), bad).unwrap_err());
        assert!(a.contains("another network"), "{a}");
        assert!(b.contains("malformed"), "{b}");
    }
}
