//! Round endpoints of part 1: the current round (optional token) and the live-update stream.

use std::convert::Infallible;

use axum::extract::State;
use axum::http::header;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::AppState;
use crate::auth::MaybeUser;
use crate::client_ip::ClientIp;
use crate::error::{ApiError, ErrorBody};
use crate::store::RoundRow;
use crate::stream::{Delivery, Subscription};
use crate::time::rfc3339;

/// Routes served under the request time-out.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(current_round))
}

/// The stream route: long-lived, so it is kept out of the time-out layer.
pub fn stream_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(round_stream))
}

/// A round as clients see it.
#[derive(Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct RoundView {
    /// Round id.
    pub id: i64,
    /// `open`, `closing`, `drawing`, `paying_out` or `closed`.
    pub status: String,
    /// RFC 3339 UTC.
    pub opened_at: String,
    /// RFC 3339 UTC; clients anchor reveal delays to it.
    pub closes_at: String,
    /// Sum of bets.
    pub pot_sats: i64,
    /// Distinct bettors.
    pub bettors: i64,
    /// Whether the authenticated caller bet in this round (false when anonymous).
    pub user_played: bool,
    /// Whether the service is paused.
    pub paused: bool,
    /// The draw proof once the round is closing or later (null before).
    #[schema(value_type = Option<Object>)]
    pub draw: Option<serde_json::Value>,
    /// The payout once known (null before).
    #[schema(value_type = Option<Object>)]
    pub payout: Option<serde_json::Value>,
}

impl RoundView {
    /// The view of a stored round.
    pub fn new(r: &RoundRow, user_played: bool, paused: bool) -> Self {
        Self {
            id: r.id,
            status: r.status.clone(),
            opened_at: rfc3339(r.opened_at),
            closes_at: rfc3339(r.closes_at),
            pot_sats: r.pot_sats,
            bettors: r.bettors,
            user_played,
            paused,
            draw: None,
            payout: None,
        }
    }
}

/// The current round; works logged out.
#[utoipa::path(get, path = "/rounds/current", tag = "rounds", security((), ("bearer" = [])),
    responses((status = 200, body = RoundView)))]
async fn current_round(
    State(state): State<AppState>,
    MaybeUser(user): MaybeUser,
) -> Result<Response, ApiError> {
    let snapshot = state.rounds.snapshot(&state.store).await?;
    let Some(user) = user else {
        // The hot anonymous path serves the body rendered at refresh.
        return Ok((
            [(header::CONTENT_TYPE, "application/json")],
            snapshot.anonymous_json,
        )
            .into_response());
    };
    let played = state.store.user_played(snapshot.round.id, user.id).await?;
    Ok(Json(crate::money_api::round_view(
        &snapshot.detail,
        played,
        snapshot.paused,
    ))
    .into_response())
}

fn events(sub: Subscription) -> impl Stream<Item = Result<Event, Infallible>> {
    stream::unfold(sub, |sub| async move {
        match sub.next().await {
            Delivery::Changed => Some((Ok(Event::default().data("refetch")), sub)),
            Delivery::Closed => None,
        }
    })
}

/// Server-Sent Events: each `data: refetch` message means "something changed, refetch"; `: keep-alive` comments while idle.
#[utoipa::path(get, path = "/rounds/stream", tag = "rounds",
    responses(
        (status = 200, description = "text/event-stream", content_type = "text/event-stream", body = String),
        (status = 503, description = "stream_capacity: past the global subscriber cap", body = ErrorBody),
    ))]
async fn round_stream(
    State(state): State<AppState>,
    ClientIp(ip): ClientIp,
) -> Result<impl IntoResponse, ApiError> {
    let sub = state
        .hub
        .subscribe(ip)
        .map_err(|_| ApiError::StreamCapacity)?;
    let sse = Sse::new(events(sub)).keep_alive(
        KeepAlive::new()
            .interval(state.config.keep_alive)
            .text("keep-alive"),
    );
    Ok((
        [
            // Proxies must neither buffer nor compress the stream.
            (header::CACHE_CONTROL, "no-cache, no-transform"),
            (header::HeaderName::from_static("x-accel-buffering"), "no"),
        ],
        sse,
    ))
}
