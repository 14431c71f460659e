//! The typed JSON views of rounds, draws, payouts and transfers (DESIGN §4.1's shapes), built from store rows.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::draw;
use crate::domain::round::{RoundStatus, TransferKind, TransferProgress};
use crate::domain::time::rfc3339;
use crate::service::engine::draw_bets;
use crate::service::history::{PayoutSummary, RoundDetail, RoundRow, RoundSummary, TransferRow};

/// A round as clients see it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct RoundView {
    /// Round id.
    pub id: i64,
    /// Where the round is in its lifecycle.
    pub status: RoundStatus,
    /// RFC 3339 UTC.
    pub opened_at: String,
    /// RFC 3339 UTC; clients anchor reveal delays to it.
    pub closes_at: String,
    /// Sum of bets.
    pub pot_sats: i64,
    /// Distinct bettors.
    pub bettors: i64,
    /// Bets placed in the round.
    pub bets: i64,
    /// The most bets a round takes (so that its payout fits in one standard
    /// transaction); further bets are refused with `round_full`.
    pub max_bets: i64,
    /// Whether the authenticated caller bet in this round (false when anonymous).
    pub user_played: bool,
    /// Whether the service is paused.
    pub paused: bool,
    /// The draw proof once the round is closing or later (null before).
    pub draw: Option<DrawView>,
    /// The payout once known (null before).
    pub payout: Option<PayoutView>,
}

/// The draw proof of a round: everything needed to recompute the winner
/// (see docs/rounds-engine.md, "Checking a draw").
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct DrawView {
    /// Chain tip height when the round closed; the draw block is the next one.
    pub tip_height_at_close: Option<i64>,
    /// Hash of that tip (display hex): the draw block's parent, so the draw
    /// block was mined after the close. Null for rounds closed before it
    /// was recorded.
    pub tip_hash_at_close: Option<String>,
    /// SHA-256 (hex) over the ordered bets, fixed at close.
    pub bets_commitment: Option<String>,
    /// Height of the draw block (`tip_height_at_close + 1`); null until it is known.
    pub block_height: Option<i64>,
    /// Display hex of the draw block's hash.
    pub block_hash: Option<String>,
    /// Hex of the seed derived from the round id, the block hash and the commitment.
    pub seed: Option<String>,
    /// The winning satoshi, in `0..pot_sats`.
    pub ticket: Option<i64>,
    /// The bet whose range holds the ticket.
    pub winner: Option<DrawWinner>,
    /// The bets in draw order with the satoshi range each one covers; null
    /// in `GET /rounds`, whose pages summarise rounds (the round's `bets`
    /// and `pot_sats` are their count and total).
    pub bets: Option<Vec<DrawBetView>>,
}

/// The winner named by a draw.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct DrawWinner {
    /// Winner's username.
    pub username: String,
    /// The winning bet.
    pub bet_id: i64,
}

/// One bet of a draw with its ticket range.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct DrawBetView {
    /// Bet id (orders the draw).
    pub bet_id: i64,
    /// Bettor.
    pub username: String,
    /// Amount in the pot.
    pub amount_sats: i64,
    /// The bet transaction.
    pub txid: String,
    /// First satoshi of the bet's range (inclusive).
    pub range_start: u64,
    /// End of the bet's range (exclusive).
    pub range_end: u64,
}

/// The payout of a round.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct PayoutView {
    /// The payout transaction.
    pub txid: String,
    /// Paid to the winner.
    pub winner_sats: i64,
    /// Paid to the fee address.
    pub commission_sats: i64,
    /// Miner fee.
    pub fee_sats: i64,
    /// `pending`, `broadcast`, `confirmed` or `broadcast_failed`.
    pub status: TransferProgress,
}

/// The progress of one of our own transactions as its owner sees it.
pub fn own_progress(t: &TransferRow) -> TransferProgress {
    TransferProgress::of_own(t.status, t.block_height.is_some())
}

fn draw_view(d: &RoundDetail) -> Option<DrawView> {
    if d.round.status == RoundStatus::Open {
        return None;
    }
    let bets = draw_bets(&d.bets);
    let spans = draw::ranges(&bets).unwrap_or_default();
    let winner = d.draw.winner_bet_id.and_then(|id| {
        d.bets.iter().find(|b| b.id == id).map(|b| DrawWinner {
            username: b.username.clone(),
            bet_id: b.id,
        })
    });
    let list = d
        .bets
        .iter()
        .zip(spans.iter())
        .map(|(b, (s, e))| DrawBetView {
            bet_id: b.id,
            username: b.username.clone(),
            amount_sats: b.amount_sats,
            txid: b.txid.clone(),
            range_start: *s,
            range_end: *e,
        })
        .collect();
    Some(DrawView {
        tip_height_at_close: d.draw.tip_height_at_close,
        tip_hash_at_close: d.draw.tip_hash_at_close.clone(),
        bets_commitment: d.draw.bets_commitment.clone(),
        block_height: d.draw.block_height,
        block_hash: d.draw.block_hash.clone(),
        seed: d.draw.seed.clone(),
        ticket: d.draw.ticket,
        winner,
        bets: Some(list),
    })
}

impl RoundView {
    /// The view of a stored round without its draw and payout.
    pub fn new(r: &RoundRow, user_played: bool, paused: bool) -> Self {
        Self {
            id: r.id,
            status: r.status,
            opened_at: rfc3339(r.opened_at),
            closes_at: rfc3339(r.closes_at),
            pot_sats: r.pot_sats,
            bettors: r.bettors,
            bets: r.bet_count,
            max_bets: crate::domain::settings::MAX_ROUND_BETS,
            user_played,
            paused,
            draw: None,
            payout: None,
        }
    }

    /// The view of a round in a page of rounds: the draw without its bet
    /// list (see [`DrawView::bets`]).
    pub fn summary(r: &RoundSummary, paused: bool) -> Self {
        let mut v = Self::new(&r.round, r.user_played, paused);
        if r.round.status != RoundStatus::Open {
            v.draw = Some(DrawView {
                tip_height_at_close: r.draw.tip_height_at_close,
                tip_hash_at_close: r.draw.tip_hash_at_close.clone(),
                bets_commitment: r.draw.bets_commitment.clone(),
                block_height: r.draw.block_height,
                block_hash: r.draw.block_hash.clone(),
                seed: r.draw.seed.clone(),
                ticket: r.draw.ticket,
                winner: match (r.draw.winner_bet_id, &r.winner_username) {
                    (Some(bet_id), Some(username)) => Some(DrawWinner {
                        username: username.clone(),
                        bet_id,
                    }),
                    _ => None,
                },
                bets: None,
            });
        }
        v.payout = r.payout.as_ref().map(payout_summary_view);
        v
    }

    /// The full view of a round: DESIGN §4.1's shape.
    pub fn of(d: &RoundDetail, user_played: bool, paused: bool) -> Self {
        let mut v = Self::new(&d.round, user_played, paused);
        v.draw = draw_view(d);
        v.payout = d.payout.as_ref().map(|p| PayoutView {
            txid: p.txid.clone(),
            winner_sats: p.amount_sats,
            commission_sats: p.commission_sats,
            fee_sats: p.fee_sats,
            status: own_progress(p),
        });
        v
    }
}

fn payout_summary_view(p: &PayoutSummary) -> PayoutView {
    PayoutView {
        txid: p.txid.clone(),
        winner_sats: p.amount_sats,
        commission_sats: p.commission_sats,
        fee_sats: p.fee_sats,
        status: TransferProgress::of_own(p.status, p.block_height.is_some()),
    }
}

/// The anonymous caller's view of a round, serialised (cached by the current-round service).
pub fn anonymous_round_json(d: &RoundDetail, paused: bool) -> Result<axum::body::Bytes, String> {
    serde_json::to_vec(&RoundView::of(d, false, paused))
        .map(Into::into)
        .map_err(|e| e.to_string())
}

/// One of the caller's transfers.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TransferView {
    /// Id (pages go by `before_id`).
    pub id: i64,
    /// What the transfer is.
    pub kind: TransferKind,
    /// Deposits: `unconfirmed`, `confirming`, `credited`; others: `pending`, `broadcast`, `confirmed`, `failed`, `broadcast_failed`.
    pub status: TransferProgress,
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

impl TransferView {
    /// The view of `t` at chain tip `tip`, with deposits credited after `required_confirmations`.
    pub fn of(t: &TransferRow, tip: i64, required_confirmations: i64) -> Self {
        let confirmations = t.block_height.map_or(0, |h| (tip - h + 1).max(0));
        let status = match t.kind {
            TransferKind::Deposit if t.status == crate::domain::round::TransferStatus::Reversed => {
                TransferProgress::Reversed
            }
            TransferKind::Deposit => TransferProgress::of_deposit(
                t.block_height.is_some(),
                confirmations,
                required_confirmations.max(t.min_confirmations),
            ),
            TransferKind::Bet | TransferKind::Withdrawal | TransferKind::Payout => own_progress(t),
        };
        Self {
            id: t.id,
            kind: t.kind,
            status,
            txid: t.txid.clone(),
            amount_sats: t.amount_sats,
            fee_sats: t.fee_sats,
            round_id: t.round_id,
            address: t.address.clone(),
            confirmations,
            created_at: rfc3339(t.created_at),
        }
    }
}
