//! Operations endpoints: liveness (`/livez`), readiness (`/healthz`: the database and the chain answer), Prometheus metrics and the OpenAPI document.

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::metrics::Gauges;
use crate::http::state::AppState;

/// Routes of this module.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(livez))
        .routes(routes!(healthz))
        .routes(routes!(metrics))
        .routes(routes!(openapi_json))
}

/// How long a health check waits for the database or the chain.
const CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// GET /livez answer.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Live {
    /// Always `ok` while the process serves.
    pub status: String,
}

/// GET /healthz answer.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Health {
    /// `ok` when every dependency answered, else `unavailable`.
    pub status: String,
    /// `ok`, or why the database did not answer.
    pub database: String,
    /// `ok`, why the chain did not answer, or `behind: …` when the node is catching up (rounds do not close or draw meanwhile).
    pub chain: String,
}

/// Liveness: answers while the process runs, whatever its dependencies do.
#[utoipa::path(get, path = "/livez", tag = "ops", responses((status = 200, description = "the process is up", body = Live)))]
async fn livez() -> axum::Json<Live> {
    axum::Json(Live {
        status: "ok".into(),
    })
}

/// Readiness: 200 when the database and the chain answer and the node is not behind, else 503 naming which failed and why.
#[utoipa::path(get, path = "/healthz", tag = "ops", responses(
    (status = 200, description = "database and chain answer", body = Health),
    (status = 503, description = "a dependency failed; its field says why", body = Health),
))]
async fn healthz(State(state): State<AppState>) -> (StatusCode, axum::Json<Health>) {
    let (db, tip) = tokio::join!(
        tokio::time::timeout(CHECK_TIMEOUT, state.health.database()),
        tokio::time::timeout(CHECK_TIMEOUT, state.health.chain()),
    );
    let database = match db {
        Ok(Ok(())) => "ok".to_string(),
        Ok(Err(e)) => format!("error: {e}"),
        Err(_) => "timed out".to_string(),
    };
    let chain = match tip {
        Ok(Ok(None)) => "ok".to_string(),
        Ok(Ok(Some(behind))) => format!("behind: {behind}"),
        Ok(Err(e)) => format!("error: {e}"),
        Err(_) => "timed out".to_string(),
    };
    let ok = database == "ok" && chain == "ok";
    if !ok {
        tracing::warn!(%database, %chain, "health check failed");
    }
    (
        if ok {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        axum::Json(Health {
            status: if ok { "ok" } else { "unavailable" }.into(),
            database,
            chain,
        }),
    )
}

/// Prometheus metrics in the text exposition format.
#[utoipa::path(get, path = "/metrics", tag = "ops", responses((status = 200, content_type = "text/plain", body = String)))]
async fn metrics(State(state): State<AppState>, request: HeaderMap) -> Response {
    let text = state.metrics.render(Gauges {
        stream_subscribers: state.hub.len(),
        login_throttle_keys: state.accounts.throttle().len(),
        registration_quota_keys: state.accounts.quota().len(),
        password_hashes_in_flight: state.accounts.hasher().in_flight(),
        password_hash_concurrency: state.accounts.hasher().concurrency(),
    });
    // The body is OpenMetrics text; Prometheus reads it under either type,
    // and scrapers that ask for OpenMetrics get it labelled as such.
    let openmetrics = request
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    let content_type = if openmetrics {
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    } else {
        "text/plain; version=0.0.4; charset=utf-8"
    };
    ([(header::CONTENT_TYPE, content_type)], text).into_response()
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "ops", responses((status = 200, body = Object)))]
async fn openapi_json() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::http::openapi_document().to_string(),
    )
        .into_response()
}
