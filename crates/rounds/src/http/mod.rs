//! The HTTP layer: one module per resource, the extractors, the error types and the typed views; here the router with its layers and the OpenAPI document.
//!
//! Handlers parse the request, call a service (or a read of the store) and
//! render the answer; nothing below this module knows about HTTP.

pub mod accounts;
pub mod admin;
pub mod client_ip;
pub mod codes;
pub mod dashboard;
pub mod error;
pub mod extract;
pub mod metrics;
pub mod ops;
pub mod qr;
pub mod rounds;
pub mod state;
pub mod transfers;
pub mod views;
pub mod wallet;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use axum::Router;
use tower::ServiceBuilder;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;

use crate::config::Config;
use codes::ErrorCode;
use error::{AdminError, ApiError};
use metrics::Metrics;
pub use state::{AppState, Services};

#[derive(OpenApi)]
#[openapi(
    info(title = "potluck rounds service", description = "Custodial round-based wallet: accounts, sessions, admin, rounds, live stream."),
    modifiers(&SecuritySchemes),
    components(schemas(error::ErrorBody, error::ErrorDetail, error::AdminErrorBody))
)]
struct ApiDoc;

struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .build(),
            ),
        );
        components.add_security_scheme(
            "admin_token",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-Admin-Token"))),
        );
    }
}

async fn not_found() -> ApiError {
    ApiError::NotFound
}

/// All documented routes, before layers and state.
fn api_routes(config: &Config, dev_chain: bool) -> OpenApiRouter<AppState> {
    let timed = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(accounts::router())
        .merge(rounds::router())
        .merge(wallet::router(dev_chain))
        .merge(admin::router())
        .merge(transfers::router())
        .merge(ops::router())
        .layer(axum::middleware::from_fn_with_state(
            config.request_timeout,
            time_out,
        ));
    // Money routes answer by the time-out themselves: a payment saved
    // before it is answered with the payment, never with a time-out.
    timed
        .merge(rounds::stream_router())
        .merge(rounds::money_router())
        .merge(wallet::money_router())
}

/// Cuts a request that outlives `limit` with the structured 408 (admin
/// routes: a bare-string `detail`), as every other error is answered.
async fn time_out(State(limit): State<Duration>, request: Request, next: Next) -> Response {
    let admin = request.uri().path().starts_with("/admin/");
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) if admin => AdminError::TimedOut(limit.as_secs()).into_response(),
        Err(_) => ApiError::RequestTimeout {
            timeout_secs: limit.as_secs(),
        }
        .into_response(),
    }
}

/// Gives the errors that layers and the router answer without a body (an
/// over-long body, a method the path does not serve) the structured body.
async fn structured_errors(request: Request, next: Next) -> Response {
    let admin = request.uri().path().starts_with("/admin/");
    let response = next.run(request).await;
    let json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    let (code, text) = match response.status() {
        _ if json => return response,
        StatusCode::PAYLOAD_TOO_LARGE => (
            ErrorCode::BodyTooLarge,
            "the request body is over the size limit",
        ),
        StatusCode::METHOD_NOT_ALLOWED => (
            ErrorCode::MethodNotAllowed,
            "this method is not served on this path",
        ),
        _ => return response,
    };
    let status = response.status();
    if admin {
        let mut r = (
            status,
            axum::Json(error::AdminErrorBody {
                detail: text.to_string(),
            }),
        )
            .into_response();
        copy_allow(&response, &mut r);
        return r;
    }
    let mut r = ApiError::domain(status, code, text, error::ErrorParams::none()).into_response();
    copy_allow(&response, &mut r);
    r
}

/// Keeps the `Allow` header of a 405.
fn copy_allow(from: &Response, to: &mut Response) {
    if let Some(allow) = from.headers().get(axum::http::header::ALLOW) {
        to.headers_mut()
            .insert(axum::http::header::ALLOW, allow.clone());
    }
}

/// The OpenAPI document generated from the routes, as JSON.
pub fn openapi_document() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| {
        let (_, api) = api_routes(&Config::new(".".into()), true).split_for_parts();
        api.to_json()
            .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    })
}

/// The header of the request id (the contract of docs/rounds-api.md).
const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest caller-chosen request id that is kept.
const MAX_REQUEST_ID_LEN: usize = 64;

/// A fresh random id for requests that bring no sane one.
#[derive(Debug, Clone, Copy, Default)]
struct RandomRequestId;

impl MakeRequestId for RandomRequestId {
    fn make_request_id<B>(&mut self, _: &axum::http::Request<B>) -> Option<RequestId> {
        HeaderValue::from_str(&format!("{:016x}", rand::random::<u64>()))
            .ok()
            .map(RequestId::new)
    }
}

/// Drops a caller's request id that is empty, too long or not visible
/// ASCII, so that `SetRequestIdLayer` generates one instead: ids end up in
/// log lines, which must not be forged or flooded by clients.
async fn drop_insane_request_id(mut request: Request) -> Request {
    let sane = request.headers().get(&REQUEST_ID).is_some_and(|v| {
        !v.is_empty()
            && v.len() <= MAX_REQUEST_ID_LEN
            && v.as_bytes().iter().all(u8::is_ascii_graphic)
    });
    if !sane {
        request.headers_mut().remove(&REQUEST_ID);
    }
    request
}

/// The per-request span: request id, method and matched route.
fn request_span(request: &axum::http::Request<axum::body::Body>) -> tracing::Span {
    let id = request
        .headers()
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str);
    tracing::info_span!("request", request_id = %id, method = %request.method(), route = %route)
}

/// Metrics per matched route.
async fn record_metrics(
    State(metrics): State<Arc<Metrics>>,
    request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let response = next.run(request).await;
    metrics.record(
        &method,
        &route,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

/// Builds the full router for `state`.
pub fn router(state: AppState) -> Router {
    let (routes, _) = api_routes(&state.config, state.cashier.has_faucet()).split_for_parts();
    let metrics = state.metrics.clone();
    let observe = ServiceBuilder::new()
        .layer(axum::middleware::map_request(drop_insane_request_id))
        .layer(SetRequestIdLayer::new(REQUEST_ID, RandomRequestId))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_request(())
                .on_response(DefaultOnResponse::new().level(tracing::Level::DEBUG))
                // Internal errors are logged with their cause by the error type.
                .on_failure(()),
        )
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(axum::middleware::from_fn_with_state(
            metrics,
            record_metrics,
        ));
    routes
        .merge(dashboard::router())
        .fallback(not_found)
        .layer(RequestBodyLimitLayer::new(state.config.body_limit_bytes))
        .layer(axum::middleware::from_fn(structured_errors))
        .layer(observe)
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openapi_documents_the_draw_proof_field_by_field() {
        let doc: serde_json::Value =
            serde_json::from_str(openapi_document()).expect("the document is JSON");
        let schemas = &doc["components"]["schemas"];
        let draw = &schemas["DrawView"]["properties"];
        for field in [
            "tip_height_at_close",
            "bets_commitment",
            "block_height",
            "block_hash",
            "seed",
            "ticket",
            "winner",
            "bets",
        ] {
            assert!(draw.get(field).is_some(), "DrawView.{field} is documented");
        }
        for field in [
            "bet_id",
            "username",
            "amount_sats",
            "txid",
            "range_start",
            "range_end",
        ] {
            assert!(
                schemas["DrawBetView"]["properties"].get(field).is_some(),
                "DrawBetView.{field} is documented"
            );
        }
        assert!(schemas["PayoutView"]["properties"]
            .get("winner_sats")
            .is_some());
        let statuses = schemas["RoundStatus"]["enum"].as_array().expect("an enum");
        assert_eq!(statuses.len(), 6);
        assert!(statuses.iter().any(|s| s == "payout_failed"));
    }

    #[test]
    fn openapi_documents_error_params_and_audit_entries_field_by_field() {
        let doc: serde_json::Value =
            serde_json::from_str(openapi_document()).expect("the document is JSON");
        let schemas = &doc["components"]["schemas"];
        for (schema, field) in [
            ("ErrorParams", "retry_after_seconds"),
            ("ErrorParams", "needed_sats"),
            ("ErrorParams", "min_length"),
            ("AuditDetails", "username"),
            ("AuditDetails", "replaced_txid"),
        ] {
            assert!(
                schemas[schema]["properties"].get(field).is_some(),
                "{schema}.{field} is documented: {}",
                schemas[schema]
            );
        }
        let params = &schemas["ErrorDetail"]["properties"]["params"];
        assert!(
            params.to_string().contains("ErrorParams"),
            "params refers to ErrorParams: {params}"
        );
        let entry = &schemas["AuditEntry"]["properties"];
        assert!(
            entry["details"].to_string().contains("AuditDetails"),
            "{entry}"
        );
        assert!(
            entry["diff"].to_string().contains("before"),
            "diff documents before/after: {entry}"
        );
    }
}
