//! Round endpoints: the current round, the live-update stream, bets, round history with draw proofs, and the caller's last result.

use std::convert::Infallible;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::round::TransferProgress;
use crate::http::client_ip::ClientIp;
use crate::http::codes::ErrorCode;
use crate::http::error::{ApiError, ErrorBody, ErrorParams};
use crate::http::extract::{ApiJson, ApiQuery, AuthUser, IdempotencyKey, MaybeUser, SignedBearer};
use crate::http::state::AppState;
use crate::http::views::RoundView;
use crate::service::history::{self, Outcome};
use crate::service::limits::StreamSlot;
use crate::service::stream::{Delivery, Subscription};

/// Routes served under the request time-out.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(current_round))
        .routes(routes!(list_rounds))
        .routes(routes!(get_round))
        .routes(routes!(last_round_result))
}

/// The money route: kept out of the time-out layer, it answers by the
/// time-out itself without ever cutting a saved payment short (see
/// [`crate::service::cashier::Cashier::bet`]).
pub fn money_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(place_bet))
}

/// The stream route: long-lived, so it is kept out of the time-out layer.
pub fn stream_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(round_stream))
}

/// The current round; works logged out.
#[utoipa::path(get, path = "/rounds/current", tag = "rounds", security((), ("bearer" = [])),
    responses((status = 200, body = RoundView)))]
async fn current_round(
    State(state): State<AppState>,
    MaybeUser(user): MaybeUser,
) -> Result<Response, ApiError> {
    let snapshot = state.history.current().await?;
    let Some(user) = user else {
        // The hot anonymous path serves the body rendered once per snapshot.
        return Ok((
            [(header::CONTENT_TYPE, "application/json")],
            state
                .anonymous_round
                .body(&snapshot)
                .map_err(ApiError::internal)?,
        )
            .into_response());
    };
    let played = state
        .history
        .user_played(snapshot.detail.round.id, user.id)
        .await?;
    Ok(Json(RoundView::of(&snapshot.detail, played, snapshot.paused)).into_response())
}

fn events(
    sub: Subscription,
    slot: Option<StreamSlot>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    // The slot lives as long as the stream: dropping it forgets the
    // stream's row in the shared cap.
    stream::unfold((sub, slot), |(sub, slot)| async move {
        match sub.next().await {
            Delivery::Changed => Some((Ok(Event::default().data("refetch")), (sub, slot))),
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
    let (sub, slot) = match &state.streams {
        Some(shared) => {
            let (sub, slot) = shared
                .subscribe(&state.hub, ip)
                .await
                .map_err(|_| ApiError::StreamCapacity)?;
            (sub, Some(slot))
        }
        None => (
            state
                .hub
                .subscribe(ip)
                .map_err(|_| ApiError::StreamCapacity)?,
            None,
        ),
    };
    let sse = Sse::new(events(sub, slot)).keep_alive(
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

/// POST /rounds/current/bets body.
#[derive(Debug, Deserialize, ToSchema)]
pub struct BetRequest {
    /// At least `min_bet_sats`.
    pub amount_sats: i64,
}

/// A placed bet.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BetPlaced {
    /// Bet id (orders the draw).
    pub bet_id: i64,
    /// The round.
    pub round_id: i64,
    /// Amount in the pot.
    pub amount_sats: i64,
    /// Miner fee paid by the bettor.
    pub fee_sats: i64,
    /// The bet transaction.
    pub txid: String,
    /// `broadcast` (201), or `pending` (202) while its broadcast has not
    /// ended: the bet is saved and the worker broadcasts it.
    pub status: TransferProgress,
}

/// 201 once broadcast; 202 while the worker still has to broadcast it.
pub(crate) fn paid_status(broadcast: bool) -> StatusCode {
    if broadcast {
        StatusCode::CREATED
    } else {
        StatusCode::ACCEPTED
    }
}

/// Place a bet in the current round: spends the caller's outputs whole into the round's pot address, change back.
#[utoipa::path(post, path = "/rounds/current/bets", tag = "rounds", security(("bearer" = [])),
    request_body = BetRequest,
    responses(
        (status = 201, body = BetPlaced),
        (status = 202, description = "saved, its broadcast not yet ended (a slow or unreachable node): `status: pending`, broadcast by the worker", body = BetPlaced),
        (status = 408, description = "request_timeout: nothing was saved, retry", body = ErrorBody),
        (status = 409, description = "round_not_open, round_full, round_share_full, funds_busy, idempotency_key_in_progress", body = ErrorBody),
        (status = 422, description = "bet_below_minimum, insufficient_funds, amount_below_dust, too_many_inputs, invalid_idempotency_key, idempotency_key_reused", body = ErrorBody),
        (status = 502, description = "broadcast_rejected", body = ErrorBody),
        (status = 503, description = "paused, payment_outcome_unknown", body = ErrorBody),
    ),
    params(("Idempotency-Key" = Option<String>, Header, description = "1–255 visible ASCII characters; the same key and body give the same bet, kept 24 h per user")))]
async fn place_bet(
    State(state): State<AppState>,
    SignedBearer(session): SignedBearer,
    IdempotencyKey(key): IdempotencyKey,
    ApiJson(body): ApiJson<BetRequest>,
) -> Result<(StatusCode, Json<BetPlaced>), ApiError> {
    let paid = state.cashier.bet(session, body.amount_sats, key).await?;
    Ok((
        paid_status(paid.broadcast),
        Json(BetPlaced {
            bet_id: paid.bet_id.unwrap_or_default(),
            round_id: paid.round_id.unwrap_or_default(),
            amount_sats: body.amount_sats,
            fee_sats: paid.fee_sats,
            txid: paid.txid.to_string(),
            status: progress(paid.broadcast),
        }),
    ))
}

/// `broadcast` or `pending`, as a saved payment is answered.
pub(crate) fn progress(broadcast: bool) -> TransferProgress {
    if broadcast {
        TransferProgress::Broadcast
    } else {
        TransferProgress::Pending
    }
}

/// Pagination of lists, newest first.
#[derive(Debug, Deserialize, IntoParams)]
pub struct Page {
    /// At most this many (1–100, default 20).
    pub limit: Option<i64>,
    /// Only ids below this one.
    pub before_id: Option<i64>,
}

impl Page {
    /// The page size, clamped to 1–100.
    pub fn limit(&self) -> i64 {
        self.limit.unwrap_or(20).clamp(1, 100)
    }
}

/// The caller's last round with a result.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LastRoundResult {
    /// The round.
    pub round_id: i64,
    /// `won`, `lost` or `refunded`.
    pub outcome: Outcome,
    /// Sum of the caller's bets in the round.
    pub bet_sats: i64,
    /// What the caller received (0 when lost).
    pub won_sats: i64,
    /// The round with its draw proof.
    pub round: RoundView,
}

/// The result of the last round the caller played (database-backed, for players who missed the reveal).
#[utoipa::path(get, path = "/users/me/last-round-result", tag = "accounts", security(("bearer" = [])),
    responses((status = 200, body = LastRoundResult), (status = 404, description = "no_round_played", body = ErrorBody)))]
async fn last_round_result(
    State(state): State<AppState>,
    user: AuthUser,
) -> Result<Json<LastRoundResult>, ApiError> {
    let r = state
        .history
        .last_result(user.id)
        .await?
        .ok_or_else(no_round_played)?;
    Ok(Json(LastRoundResult {
        round_id: r.detail.round.id,
        outcome: r.outcome,
        bet_sats: r.bet_sats,
        won_sats: r.won_sats,
        round: RoundView::of(&r.detail, true, r.paused),
    }))
}

fn no_round_played() -> ApiError {
    ApiError::domain(
        StatusCode::NOT_FOUND,
        ErrorCode::NoRoundPlayed,
        "you have not played a round with a result yet",
        ErrorParams::none(),
    )
}

/// A page of rounds.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RoundPage {
    /// Newest first; each round's `draw.bets` is null here (the round's
    /// `bets` and `pot_sats` give their count and total; `GET /rounds/{id}`
    /// has the list).
    pub rounds: Vec<RoundView>,
    /// Pass as `before_id` for the next page; null at the end.
    pub next_before_id: Option<i64>,
}

/// Recent rounds, newest first (at most 100 a page), with their draws
/// summarised: `draw.bets` is null, the full proof is on `GET /rounds/{id}`.
#[utoipa::path(get, path = "/rounds", tag = "rounds", security((), ("bearer" = [])),
    params(Page), responses((status = 200, body = RoundPage)))]
async fn list_rounds(
    State(state): State<AppState>,
    MaybeUser(user): MaybeUser,
    ApiQuery(page): ApiQuery<Page>,
) -> Result<Json<RoundPage>, ApiError> {
    let limit = page.limit();
    let user_id = user.as_ref().map(|u| u.id);
    let p = state
        .history
        .rounds_page(limit, page.before_id, user_id)
        .await?;
    Ok(Json(page_view(&p)))
}

/// The JSON of a page of rounds (the caller's `user_played` read with it).
pub fn page_view(p: &history::RoundsPage) -> RoundPage {
    let rounds = p
        .rounds
        .iter()
        .map(|r| RoundView::summary(r, p.paused))
        .collect();
    RoundPage {
        rounds,
        next_before_id: p.next_before_id,
    }
}

/// One round, with the full draw proof once drawn.
#[utoipa::path(get, path = "/rounds/{id}", tag = "rounds", security((), ("bearer" = [])),
    params(("id" = i64, Path, description = "round id")),
    responses((status = 200, body = RoundView), (status = 404, body = ErrorBody)))]
async fn get_round(
    State(state): State<AppState>,
    MaybeUser(user): MaybeUser,
    Path(id): Path<String>,
) -> Result<Json<RoundView>, ApiError> {
    let id: i64 = id.parse().map_err(|_| ApiError::NotFound)?;
    let (d, paused) = state.history.round(id).await?.ok_or(ApiError::NotFound)?;
    let played = history::played(&d, user.as_ref().map(|u| u.id));
    Ok(Json(RoundView::of(&d, played, paused)))
}
