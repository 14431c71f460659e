//! Money endpoints: bets, withdrawals, the caller's transactions and last round result, round history with draw proofs, the development faucet, and the admin payout retry and ledger.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::address::AddressError;
use crate::admin::DUST_LIMIT_SATS;
use crate::app::AppState;
use crate::auth::{Admin, ApiJson, AuthUser, MaybeUser};
use crate::draw;
use crate::engine::draw_bets;
use crate::error::{AdminError, AdminErrorBody, ApiError, ErrorBody};
use crate::ledger::{LedgerError, LedgerTotals, RoundDetail, TransferRow};
use crate::rounds_api::RoundView;
use crate::spend::{self, SpendFailure};
use crate::time::rfc3339;

/// Largest faucet payment (1 BTC).
pub const FAUCET_MAX_SATS: i64 = 100_000_000;
/// Faucet payment when the body names no amount.
pub const FAUCET_DEFAULT_SATS: i64 = 1_000_000;
/// Attempts of a bet or withdrawal when a concurrent spend took an output.
const SPEND_ATTEMPTS: usize = 3;

/// Routes of this module (the faucet only with the development chain).
pub fn router(dev_chain: bool) -> OpenApiRouter<AppState> {
    let r = OpenApiRouter::new()
        .routes(routes!(place_bet))
        .routes(routes!(withdraw))
        .routes(routes!(transactions))
        .routes(routes!(last_round_result))
        .routes(routes!(list_rounds))
        .routes(routes!(get_round))
        .routes(routes!(retry_payout))
        .routes(routes!(ledger));
    if dev_chain {
        r.routes(routes!(faucet))
    } else {
        r
    }
}

fn draw_json(d: &RoundDetail) -> Option<Value> {
    if d.round.status == "open" {
        return None;
    }
    let bets = draw_bets(&d.bets);
    let spans = draw::ranges(&bets).unwrap_or_default();
    let winner = d.draw.winner_bet_id.and_then(|id| {
        d.bets
            .iter()
            .find(|b| b.id == id)
            .map(|b| json!({"username": b.username, "bet_id": b.id}))
    });
    let list: Vec<Value> = d
        .bets
        .iter()
        .zip(spans.iter())
        .map(|(b, (s, e))| {
            json!({"bet_id": b.id, "username": b.username, "amount_sats": b.amount_sats,
                   "txid": b.txid, "range_start": s, "range_end": e})
        })
        .collect();
    Some(json!({
        "tip_height_at_close": d.draw.tip_height_at_close,
        "bets_commitment": d.draw.bets_commitment,
        "block_height": d.draw.block_height,
        "block_hash": d.draw.block_hash,
        "seed": d.draw.seed,
        "ticket": d.draw.ticket,
        "winner": winner,
        "bets": list,
    }))
}

fn own_status(t: &TransferRow) -> &'static str {
    match (t.status.as_str(), t.block_height) {
        ("failed", _) => "failed",
        ("broadcast_failed", _) => "broadcast_failed",
        (_, Some(_)) => "confirmed",
        ("signed", None) => "pending",
        _ => "broadcast",
    }
}

/// The JSON of a round: DESIGN §4.1's shape.
pub fn round_view(d: &RoundDetail, user_played: bool, paused: bool) -> RoundView {
    let mut v = RoundView::new(&d.round, user_played, paused);
    v.draw = draw_json(d);
    v.payout = d.payout.as_ref().map(|p| {
        json!({"txid": p.txid, "winner_sats": p.amount_sats, "commission_sats": p.commission_sats,
               "fee_sats": p.fee_sats, "status": own_status(p)})
    });
    v
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
}

fn paused_error() -> ApiError {
    ApiError::domain(
        StatusCode::SERVICE_UNAVAILABLE,
        "paused",
        "the service is paused for maintenance",
        json!({}),
    )
}

fn spend_error(e: SpendFailure, amount_sats: i64) -> ApiError {
    match e {
        SpendFailure::Insufficient {
            balance_sats,
            needed_sats,
        } => ApiError::domain(
            StatusCode::UNPROCESSABLE_ENTITY,
            "insufficient_funds",
            format!("insufficient funds: {needed_sats} sats needed including the miner fee, {balance_sats} sats available"),
            json!({"amount_sats": amount_sats, "needed_sats": needed_sats, "balance_sats": balance_sats}),
        ),
        SpendFailure::Dust {
            amount_sats,
            threshold_sats,
        } => ApiError::domain(
            StatusCode::UNPROCESSABLE_ENTITY,
            "amount_below_dust",
            format!("amount must be at least {threshold_sats} sats"),
            json!({"amount_sats": amount_sats, "dust_sats": threshold_sats}),
        ),
        other => ApiError::Internal(other.to_string()),
    }
}

fn broadcast_refused() -> ApiError {
    ApiError::domain(
        StatusCode::BAD_GATEWAY,
        "broadcast_rejected",
        "the network refused the transaction; nothing was spent",
        json!({}),
    )
}

fn funds_busy() -> ApiError {
    ApiError::domain(
        StatusCode::CONFLICT,
        "funds_busy",
        "your funds are being spent by another request, try again",
        json!({}),
    )
}

/// Place a bet in the current round: spends the caller's outputs whole into the round's pot address, change back.
#[utoipa::path(post, path = "/rounds/current/bets", tag = "rounds", security(("bearer" = [])),
    request_body = BetRequest,
    responses(
        (status = 201, body = BetPlaced),
        (status = 202, description = "written but the chain is unreachable: broadcast later by the worker", body = BetPlaced),
        (status = 409, description = "round_not_open, funds_busy", body = ErrorBody),
        (status = 422, description = "bet_below_minimum, insufficient_funds, amount_below_dust", body = ErrorBody),
        (status = 502, description = "broadcast_rejected", body = ErrorBody),
        (status = 503, description = "paused", body = ErrorBody),
    ))]
async fn place_bet(
    State(state): State<AppState>,
    user: AuthUser,
    ApiJson(body): ApiJson<BetRequest>,
) -> Result<(StatusCode, Json<BetPlaced>), ApiError> {
    let config = state.store.config().await?;
    if config.paused {
        return Err(paused_error());
    }
    if body.amount_sats < config.min_bet_sats {
        return Err(ApiError::domain(
            StatusCode::UNPROCESSABLE_ENTITY,
            "bet_below_minimum",
            format!("a bet must be at least {} sats", config.min_bet_sats),
            json!({"amount_sats": body.amount_sats, "min_bet_sats": config.min_bet_sats}),
        ));
    }
    let round = state
        .store
        .current_round()
        .await?
        .ok_or_else(|| ApiError::Internal("no round".into()))?;
    if round.status != "open" {
        return Err(round_not_open(round.id, &round.status));
    }
    let me = state
        .store
        .user_by_id(user.id)
        .await?
        .ok_or(ApiError::SessionExpired)?;
    let (_, pot_script) = spend::pot_key(state.engine.wallet(), round.id)
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let paid = pay_from_user(
        &state,
        &me,
        &config,
        &pot_script,
        body.amount_sats,
        Destination::Pot { round_id: round.id },
    )
    .await?;
    Ok((
        paid.status(),
        Json(BetPlaced {
            bet_id: paid.bet_id.unwrap_or_default(),
            round_id: round.id,
            amount_sats: body.amount_sats,
            fee_sats: paid.fee_sats,
            txid: paid.txid,
        }),
    ))
}

/// Where a user's payment goes.
#[derive(Debug, Clone, Copy)]
enum Destination<'a> {
    /// A bet: the round's pot address.
    Pot {
        /// The round, which must still be open when the intent is written.
        round_id: i64,
    },
    /// A withdrawal to this address.
    Address(&'a str),
}

/// A payment written and broadcast.
struct Paid {
    transfer_id: i64,
    bet_id: Option<i64>,
    fee_sats: i64,
    txid: String,
    /// False when the chain could not be reached: written, broadcast later.
    broadcast: bool,
}

impl Paid {
    /// 201 once broadcast; 202 while the worker still has to broadcast it.
    fn status(&self) -> StatusCode {
        if self.broadcast {
            StatusCode::CREATED
        } else {
            StatusCode::ACCEPTED
        }
    }
}

/// Spends the user's confirmed outputs whole to `to`, change back, writes the
/// intent before the broadcast (the crash-safety rule), then broadcasts it.
/// An output taken by a concurrent request between selection and write makes
/// it select again, a few times, then answer `funds_busy`.
async fn pay_from_user(
    state: &AppState,
    me: &crate::store::UserRow,
    config: &crate::store::ServiceConfig,
    to: &bitcoin::ScriptBuf,
    amount_sats: i64,
    dest: Destination<'_>,
) -> Result<Paid, ApiError> {
    let (kind, round_id, address) = match dest {
        Destination::Pot { round_id } => ("bet", Some(round_id), None),
        Destination::Address(a) => ("withdrawal", None, Some(a.to_string())),
    };
    let wallet = state.engine.wallet().clone();
    for _ in 0..SPEND_ATTEMPTS {
        let outputs = state
            .store
            .spendable_outputs(me.id, config.deposit_confirmations)
            .await?;
        let signed = spend::user_payment(
            &wallet,
            me.derivation_index,
            &outputs,
            to,
            amount_sats,
            config.fee_rate_sat_vb,
            kind,
            me.id,
            round_id,
            address.clone(),
        )
        .map_err(|e| spend_error(e, amount_sats))?;
        let written = match dest {
            Destination::Pot { .. } => state
                .store
                .place_bet(&signed.intent)
                .await
                .map(|(bet, transfer)| (Some(bet), transfer)),
            Destination::Address(_) => state
                .store
                .record_withdrawal(&signed.intent)
                .await
                .map(|transfer| (None, transfer)),
        };
        let (bet_id, transfer_id) = match written {
            Ok(ids) => ids,
            Err(LedgerError::OutputTaken(_)) => continue,
            Err(LedgerError::WrongStatus { .. }) => {
                return Err(round_not_open(round_id.unwrap_or_default(), "closing"))
            }
            Err(e) => return Err(ApiError::Internal(e.to_string())),
        };
        crate::engine::crash_point(&format!("{kind}_signed"));
        let t = state
            .store
            .transfer(transfer_id)
            .await?
            .ok_or_else(|| ApiError::Internal("transfer vanished".into()))?;
        // The intent is durable from here on: a chain that cannot be reached
        // leaves it signed and the worker broadcasts it later, so the answer
        // is "accepted, pending" rather than an error the client would retry
        // (and pay twice).
        let broadcast = match state.engine.broadcast_transfer(&t).await {
            Ok(true) => true,
            Ok(false) => {
                state.engine.notify().await;
                return Err(broadcast_refused());
            }
            Err(e) => {
                tracing::warn!(transfer = transfer_id, error = %e, "broadcast deferred; the worker retries");
                false
            }
        };
        state.engine.notify().await;
        return Ok(Paid {
            transfer_id,
            bet_id,
            fee_sats: signed.intent.fee_sats,
            txid: signed.intent.txid,
            broadcast,
        });
    }
    Err(funds_busy())
}

fn round_not_open(round_id: i64, status: &str) -> ApiError {
    ApiError::domain(
        StatusCode::CONFLICT,
        "round_not_open",
        "the round is not open for bets",
        json!({"round_id": round_id, "status": status}),
    )
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
    pub status: String,
}

/// Withdraw to an address of the service's network.
#[utoipa::path(post, path = "/users/me/withdrawals", tag = "accounts", security(("bearer" = [])),
    request_body = WithdrawalRequest,
    responses(
        (status = 201, body = WithdrawalDone),
        (status = 202, description = "written but the chain is unreachable: broadcast later by the worker", body = WithdrawalDone),
        (status = 409, description = "funds_busy", body = ErrorBody),
        (status = 422, description = "invalid_address, address_wrong_network, withdrawal_below_minimum, insufficient_funds", body = ErrorBody),
        (status = 502, description = "broadcast_rejected", body = ErrorBody),
        (status = 503, description = "paused", body = ErrorBody),
    ))]
async fn withdraw(
    State(state): State<AppState>,
    user: AuthUser,
    ApiJson(body): ApiJson<WithdrawalRequest>,
) -> Result<(StatusCode, Json<WithdrawalDone>), ApiError> {
    let config = state.store.config().await?;
    if config.paused {
        return Err(paused_error());
    }
    let address = body.address.trim().to_string();
    match state.addresses.validate(&address) {
        Ok(()) => {}
        Err(AddressError::WrongNetwork { expected }) => {
            return Err(ApiError::domain(
                StatusCode::UNPROCESSABLE_ENTITY,
                "address_wrong_network",
                format!("address is for another network (expected {expected})"),
                json!({"address": address, "network": expected.to_string()}),
            ))
        }
        Err(_) => {
            return Err(ApiError::domain(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_address",
                "address is not a valid address",
                json!({"address": address}),
            ))
        }
    }
    let min = config.min_withdrawal_sats.max(DUST_LIMIT_SATS);
    if body.amount_sats < min {
        return Err(ApiError::domain(
            StatusCode::UNPROCESSABLE_ENTITY,
            "withdrawal_below_minimum",
            format!("a withdrawal must be at least {min} sats"),
            json!({"amount_sats": body.amount_sats, "min_withdrawal_sats": min}),
        ));
    }
    let me = state
        .store
        .user_by_id(user.id)
        .await?
        .ok_or(ApiError::SessionExpired)?;
    let to = spend::script_of(&address, state.engine.wallet().network())
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let paid = pay_from_user(
        &state,
        &me,
        &config,
        &to,
        body.amount_sats,
        Destination::Address(&address),
    )
    .await?;
    Ok((
        paid.status(),
        Json(WithdrawalDone {
            id: paid.transfer_id,
            address,
            amount_sats: body.amount_sats,
            fee_sats: paid.fee_sats,
            status: if paid.broadcast {
                "broadcast"
            } else {
                "pending"
            }
            .into(),
            txid: paid.txid,
        }),
    ))
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
    fn limit(&self) -> i64 {
        self.limit.unwrap_or(20).clamp(1, 100)
    }
}

/// One of the caller's transfers.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TransferView {
    /// Id (pages go by `before_id`).
    pub id: i64,
    /// `deposit`, `bet`, `withdrawal` or `payout`.
    pub kind: String,
    /// Deposits: `unconfirmed`, `confirming`, `credited`; others: `pending`, `broadcast`, `confirmed`, `failed`, `broadcast_failed`.
    pub status: String,
    /// The transaction.
    pub txid: String,
    /// Deposit value, bet or withdrawal amount, payout received.
    pub amount_sats: i64,
    /// Miner fee the caller paid (bets, withdrawals) or the payout's fee.
    pub fee_sats: i64,
    /// Bets and payouts.
    pub round_id: Option<i64>,
    /// Withdrawals: destination.
    pub address: Option<String>,
    /// Depth in the chain (0 = unconfirmed).
    pub confirmations: i64,
    /// RFC 3339 UTC.
    pub created_at: String,
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
    Query(page): Query<Page>,
) -> Result<Json<TransferPage>, ApiError> {
    let config = state.store.config().await?;
    let tip = state.store.synced_tip().await?.map_or(0, |t| t.0);
    let limit = page.limit();
    let rows = state
        .store
        .user_transfers(user.id, limit, page.before_id)
        .await?;
    let next_before_id = if rows.len() as i64 == limit {
        rows.last().map(|r| r.id)
    } else {
        None
    };
    let transactions = rows
        .iter()
        .map(|t| {
            let confirmations = t.block_height.map_or(0, |h| (tip - h + 1).max(0));
            let status = if t.kind == "deposit" {
                match t.block_height {
                    None => "unconfirmed",
                    Some(_)
                        if confirmations
                            < config.deposit_confirmations.max(t.min_confirmations) =>
                    {
                        "confirming"
                    }
                    Some(_) => "credited",
                }
            } else {
                own_status(t)
            };
            TransferView {
                id: t.id,
                kind: t.kind.clone(),
                status: status.into(),
                txid: t.txid.clone(),
                amount_sats: t.amount_sats,
                fee_sats: t.fee_sats,
                round_id: t.round_id,
                address: t.address.clone(),
                confirmations,
                created_at: rfc3339(t.created_at),
            }
        })
        .collect();
    Ok(Json(TransferPage {
        transactions,
        next_before_id,
    }))
}

/// The caller's last round with a result.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LastRoundResult {
    /// The round.
    pub round_id: i64,
    /// `won`, `lost` or `refunded`.
    pub outcome: String,
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
    let no_round = || {
        ApiError::domain(
            StatusCode::NOT_FOUND,
            "no_round_played",
            "you have not played a round with a result yet",
            json!({}),
        )
    };
    let id = state
        .store
        .last_played_round(user.id)
        .await?
        .ok_or_else(no_round)?;
    let d = state.store.round_detail(id).await?.ok_or_else(no_round)?;
    let paused = state.store.config().await?.paused;
    let bet_sats = d
        .bets
        .iter()
        .filter(|b| b.user_id == user.id)
        .map(|b| b.amount_sats)
        .sum();
    let single = draw::single_player(&draw_bets(&d.bets));
    let winner = d
        .draw
        .winner_bet_id
        .and_then(|w| d.bets.iter().find(|b| b.id == w))
        .map(|b| b.user_id);
    let won = winner == Some(user.id);
    let outcome = match (single, won) {
        (true, _) => "refunded",
        (false, true) => "won",
        (false, false) => "lost",
    };
    let won_sats = if won {
        d.payout.as_ref().map_or(0, |p| p.amount_sats)
    } else {
        0
    };
    Ok(Json(LastRoundResult {
        round_id: id,
        outcome: outcome.into(),
        bet_sats,
        won_sats,
        round: round_view(&d, true, paused),
    }))
}

/// A page of rounds.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RoundPage {
    /// Newest first.
    pub rounds: Vec<RoundView>,
    /// Pass as `before_id` for the next page; null at the end.
    pub next_before_id: Option<i64>,
}

/// Recent rounds, newest first, with their draw proofs.
#[utoipa::path(get, path = "/rounds", tag = "rounds", security((), ("bearer" = [])),
    params(Page), responses((status = 200, body = RoundPage)))]
async fn list_rounds(
    State(state): State<AppState>,
    MaybeUser(user): MaybeUser,
    Query(page): Query<Page>,
) -> Result<Json<RoundPage>, ApiError> {
    let paused = state.store.config().await?.paused;
    let limit = page.limit();
    let ids = state.store.round_ids(limit, page.before_id).await?;
    let mut rounds = Vec::with_capacity(ids.len());
    for id in &ids {
        if let Some(d) = state.store.round_detail(*id).await? {
            let played = user
                .as_ref()
                .is_some_and(|u| d.bets.iter().any(|b| b.user_id == u.id));
            rounds.push(round_view(&d, played, paused));
        }
    }
    let next_before_id = if ids.len() as i64 == limit {
        ids.last().copied()
    } else {
        None
    };
    Ok(Json(RoundPage {
        rounds,
        next_before_id,
    }))
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
    let d = state
        .store
        .round_detail(id)
        .await?
        .ok_or(ApiError::NotFound)?;
    let paused = state.store.config().await?.paused;
    let played = user
        .as_ref()
        .is_some_and(|u| d.bets.iter().any(|b| b.user_id == u.id));
    Ok(Json(round_view(&d, played, paused)))
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
    responses((status = 200, body = FaucetPaid), (status = 422, description = "faucet_amount_invalid", body = ErrorBody)))]
async fn faucet(
    State(state): State<AppState>,
    user: AuthUser,
    body: Option<Json<FaucetRequest>>,
) -> Result<Json<FaucetPaid>, ApiError> {
    let amount = body
        .and_then(|b| b.0.amount_sats)
        .unwrap_or(FAUCET_DEFAULT_SATS);
    if !(DUST_LIMIT_SATS..=FAUCET_MAX_SATS).contains(&amount) {
        return Err(ApiError::domain(
            StatusCode::UNPROCESSABLE_ENTITY,
            "faucet_amount_invalid",
            format!("amount_sats must be between {DUST_LIMIT_SATS} and {FAUCET_MAX_SATS}"),
            json!({"amount_sats": amount, "min_sats": DUST_LIMIT_SATS, "max_sats": FAUCET_MAX_SATS}),
        ));
    }
    let dev = state.dev_chain.clone().ok_or(ApiError::NotFound)?;
    let me = state
        .store
        .user_by_id(user.id)
        .await?
        .ok_or(ApiError::SessionExpired)?;
    let (_, script) = spend::user_key(state.engine.wallet(), me.derivation_index)
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let confirmations = state
        .store
        .config()
        .await?
        .deposit_confirmations
        .clamp(1, 100) as u32;
    let txid = tokio::task::spawn_blocking(move || {
        let txid = dev.faucet(&script, bitcoin::Amount::from_sat(amount as u64))?;
        let miner = dev.faucet_script().to_owned();
        dev.mine(confirmations, &miner)?;
        Ok::<_, chain::DevChainError>(txid)
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))?
    .map_err(|e| ApiError::Internal(format!("faucet: {e}")))?;
    state
        .engine
        .run_once()
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Json(FaucetPaid {
        txid: txid.to_string(),
        amount_sats: amount,
    }))
}

/// Result of a payout retry.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RetryDone {
    /// The round.
    pub round_id: i64,
    /// The new payout transaction.
    pub txid: String,
    /// `broadcast`, or `broadcast_failed` when the network refused it again.
    pub status: String,
}

/// Manual intervention after `payout_failed`: rebuilds the payout from the same pot outputs at the current fee rate and broadcasts it.
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
    if state.store.round_detail(id).await?.is_none() {
        return Err(AdminError::NotFound(format!("round {id} does not exist")));
    }
    let t = state
        .engine
        .retry_payout(id)
        .await
        .map_err(|e| AdminError::Internal(e.to_string()))?
        .ok_or_else(|| {
            AdminError::Conflict(format!("round {id} has no payout waiting for a retry"))
        })?;
    Ok(Json(RetryDone {
        round_id: id,
        txid: t.txid.clone(),
        status: match t.status.as_str() {
            "signed" => "pending".into(),
            s => s.to_string(),
        },
    }))
}

/// The ledger totals behind the conservation check: deposits = users' unspent + pots in flight + commission + withdrawals + miner fees, and every unspent output listed.
#[utoipa::path(get, path = "/admin/ledger", tag = "admin", security(("admin_token" = [])),
    responses((status = 200, body = LedgerTotals), (status = 403, body = AdminErrorBody)))]
async fn ledger(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<LedgerTotals>, AdminError> {
    Ok(Json(state.store.ledger_totals().await?))
}
