//! The typed JSON views of rounds, draws, payouts and transfers (DESIGN §4.1's shapes), built from the domain's rounds and transfers.

use std::sync::Mutex;

use axum::body::Bytes;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::phase::{Payout, Round, RoundPhase, RoundProof, RoundSummary};
use crate::domain::round::{RoundStatus, TransferKind, TransferProgress, TransferStatus};
use crate::domain::time::rfc3339;
use crate::domain::transfer::Transfer;
use crate::service::current::RoundSnapshot;

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

impl DrawView {
    /// The draw proof as far as `phase` has come (`None` while the round is
    /// open), with the winner and bet list the caller has.
    fn of_phase(
        phase: &RoundPhase,
        winner: Option<DrawWinner>,
        bets: Option<Vec<DrawBetView>>,
    ) -> Option<Self> {
        if *phase == RoundPhase::Open {
            return None;
        }
        let anchor = phase.anchor();
        let block = phase.block();
        let draw = phase.draw();
        Some(DrawView {
            tip_height_at_close: anchor.map(|a| a.tip_height),
            tip_hash_at_close: anchor.and_then(|a| a.tip_hash).map(|h| h.to_string()),
            bets_commitment: anchor.map(|a| a.bets_commitment.to_string()),
            block_height: block.map(|b| b.height),
            block_hash: block.map(|b| b.hash.to_string()),
            seed: draw.map(|d| d.seed.to_string()),
            ticket: draw.map(|d| d.ticket),
            winner,
            bets,
        })
    }
}

/// The bets of a round in draw order with the satoshi range each covers.
fn draw_bet_views(d: &RoundProof) -> Vec<DrawBetView> {
    d.bets
        .iter()
        .zip(d.bet_ranges().iter())
        .map(|(b, (s, e))| DrawBetView {
            bet_id: b.id,
            username: b.username.clone(),
            amount_sats: b.amount_sats,
            txid: b.txid.map(|t| t.to_string()).unwrap_or_default(),
            range_start: *s,
            range_end: *e,
        })
        .collect()
}

impl PayoutView {
    /// The view of a round's payout.
    pub fn of(p: &Payout) -> Self {
        PayoutView {
            txid: p.txid.to_string(),
            winner_sats: p.winner_sats,
            commission_sats: p.commission_sats,
            fee_sats: p.fee_sats,
            status: p.progress(),
        }
    }
}

impl RoundView {
    /// The view of a round without its draw and payout.
    pub fn new(r: &Round, user_played: bool, paused: bool) -> Self {
        Self {
            id: r.id,
            status: r.phase.status(),
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
        let winner = match (r.round.phase.draw(), &r.winner_username) {
            (Some(draw), Some(username)) => Some(DrawWinner {
                username: username.clone(),
                bet_id: draw.winner_bet_id,
            }),
            _ => None,
        };
        v.draw = DrawView::of_phase(&r.round.phase, winner, None);
        v.payout = r.payout.as_ref().map(PayoutView::of);
        v
    }

    /// The full view of a round: DESIGN §4.1's shape.
    pub fn of(d: &RoundProof, user_played: bool, paused: bool) -> Self {
        let mut v = Self::new(&d.round, user_played, paused);
        let winner = d.winner().map(|b| DrawWinner {
            username: b.username.clone(),
            bet_id: b.id,
        });
        v.draw = DrawView::of_phase(&d.round.phase, winner, Some(draw_bet_views(d)));
        v.payout = d.payout.as_ref().map(PayoutView::of);
        v
    }
}

/// The anonymous caller's answer to `GET /rounds/current`, rendered once per
/// snapshot of the current round: the hot path serves these bytes, and a
/// new snapshot (its `generation`) renders them again.
#[derive(Debug, Default)]
pub struct AnonymousRoundCache(Mutex<Option<(u64, Bytes)>>);

impl AnonymousRoundCache {
    /// The rendered anonymous view of `snap`.
    ///
    /// # Errors
    /// The serialiser's, when the view does not serialise.
    pub fn body(&self, snap: &RoundSnapshot) -> Result<Bytes, serde_json::Error> {
        if let Some((generation, body)) = self.0.lock().unwrap_or_else(|p| p.into_inner()).as_ref()
        {
            if *generation == snap.generation {
                return Ok(body.clone());
            }
        }
        // Rendered outside the lock: a round with many bets takes a while,
        // and concurrent callers may render the same snapshot twice.
        let body: Bytes =
            serde_json::to_vec(&RoundView::of(&snap.detail, false, snap.paused))?.into();
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_none_or(|(g, _)| *g < snap.generation) {
            *slot = Some((snap.generation, body.clone()));
        }
        Ok(body)
    }
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
    pub fn of(t: &Transfer, tip: i64, required_confirmations: i64) -> Self {
        let confirmations = t.block_height.map_or(0, |h| (tip - h + 1).max(0));
        let status = match t.kind {
            TransferKind::Deposit if t.status == TransferStatus::Reversed => {
                TransferProgress::Reversed
            }
            TransferKind::Deposit => TransferProgress::of_deposit(
                t.block_height.is_some(),
                confirmations,
                required_confirmations.max(t.min_confirmations),
            ),
            TransferKind::Bet | TransferKind::Withdrawal | TransferKind::Payout => t.own_progress(),
        };
        Self {
            id: t.id,
            kind: t.kind,
            status,
            txid: t.txid.to_string(),
            amount_sats: t.amount_sats,
            fee_sats: t.fee_sats,
            round_id: t.round_id,
            address: t.address.clone(),
            confirmations,
            created_at: rfc3339(t.created_at),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use bitcoin::hashes::sha256;
    use bitcoin::{BlockHash, Txid};

    use super::*;
    use crate::domain::phase::{Bet, DrawColumnValues};
    use crate::domain::round::TransferStatus;

    fn block_hash(c: char) -> BlockHash {
        BlockHash::from_str(&c.to_string().repeat(64)).unwrap()
    }

    fn digest(c: char) -> sha256::Hash {
        sha256::Hash::from_str(&format!("{}{}", c.to_string().repeat(62), "0f")).unwrap()
    }

    fn txid(c: char) -> Txid {
        Txid::from_str(&format!("{}{}", c.to_string().repeat(63), "e")).unwrap()
    }

    fn bets() -> Vec<Bet> {
        vec![
            Bet {
                id: 3,
                user_id: 1,
                username: "alice".into(),
                amount_sats: 10_000,
                txid: Some(txid('1')),
            },
            Bet {
                id: 4,
                user_id: 2,
                username: "Bob".into(),
                amount_sats: 30_000,
                txid: Some(txid('2')),
            },
            // Placed before the service recorded bet transactions.
            Bet {
                id: 5,
                user_id: 1,
                username: "alice".into(),
                amount_sats: 5_000,
                txid: None,
            },
        ]
    }

    fn anchored(tip_hash: Option<BlockHash>) -> DrawColumnValues {
        DrawColumnValues {
            tip_height: Some(10),
            tip_hash,
            bets_commitment: Some(digest('c')),
            ..DrawColumnValues::default()
        }
    }

    fn with_block() -> DrawColumnValues {
        DrawColumnValues {
            block_height: Some(11),
            block_hash: Some(block_hash('b')),
            ..anchored(Some(block_hash('a')))
        }
    }

    fn drawn() -> DrawColumnValues {
        DrawColumnValues {
            seed: Some(digest('5')),
            ticket: Some(27_345),
            winner_bet_id: Some(4),
            ..with_block()
        }
    }

    fn payout(status: TransferStatus, block_height: Option<i64>) -> Option<Payout> {
        Some(Payout {
            txid: txid('9'),
            winner_sats: 31_000,
            commission_sats: 13_500,
            fee_sats: 500,
            status,
            block_height,
        })
    }

    /// One round in each phase the lifecycle writes, with the payout it has there.
    pub(super) fn proofs() -> Vec<(&'static str, RoundProof)> {
        use RoundStatus::*;
        let cases = [
            ("open", Open, DrawColumnValues::default(), None, true),
            (
                "closing",
                Closing,
                anchored(Some(block_hash('a'))),
                None,
                true,
            ),
            ("closing_with_block", Closing, with_block(), None, true),
            (
                "drawing_unhashed_anchor",
                Drawing,
                anchored(None),
                None,
                true,
            ),
            ("drawing_after_retry", Drawing, drawn(), None, true),
            (
                "paying_out",
                PayingOut,
                drawn(),
                payout(TransferStatus::Signed, None),
                true,
            ),
            (
                "payout_failed_at_block",
                PayoutFailed,
                with_block(),
                None,
                true,
            ),
            (
                "payout_failed_drawn",
                PayoutFailed,
                drawn(),
                payout(TransferStatus::BroadcastFailed, None),
                true,
            ),
            (
                "closed_paid",
                Closed,
                drawn(),
                payout(TransferStatus::Broadcast, Some(12)),
                true,
            ),
            (
                "closed_empty",
                Closed,
                anchored(Some(block_hash('a'))),
                None,
                false,
            ),
            (
                "closed_unanchored",
                Closed,
                DrawColumnValues::default(),
                None,
                false,
            ),
        ];
        cases
            .into_iter()
            .enumerate()
            .map(|(i, (name, status, columns, payout, with_bets))| {
                let bets = if with_bets { bets() } else { Vec::new() };
                let round = Round {
                    id: 40 + i as i64,
                    phase: RoundPhase::from_columns(status, &columns).unwrap(),
                    opened_at: 1_795_279_211,
                    closes_at: 1_795_279_271,
                    pot_sats: bets.iter().map(|b| b.amount_sats).sum(),
                    bettors: if with_bets { 2 } else { 0 },
                    bet_count: bets.len() as i64,
                };
                (
                    name,
                    RoundProof {
                        round,
                        bets,
                        payout,
                    },
                )
            })
            .collect()
    }

    pub(super) fn summary_of(p: &RoundProof) -> RoundSummary {
        RoundSummary {
            round: p.round.clone(),
            winner_username: p.winner().map(|b| b.username.clone()),
            payout: p.payout,
            user_played: p.bets.iter().any(|b| b.user_id == 1),
        }
    }

    /// One transfer of each kind and progress.
    pub(super) fn transfers() -> Vec<(&'static str, Transfer)> {
        let t = |id: i64, kind: TransferKind, status: TransferStatus, block_height: Option<i64>| {
            Transfer {
                id,
                kind,
                round_id: (kind == TransferKind::Bet || kind == TransferKind::Payout).then_some(41),
                txid: txid(char::from_digit(id as u32 % 10, 10).unwrap_or('0')),
                amount_sats: 25_000,
                fee_sats: if kind == TransferKind::Deposit {
                    0
                } else {
                    300
                },
                address: (kind == TransferKind::Withdrawal)
                    .then(|| "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080".to_string()),
                status,
                block_height,
                created_at: 1_795_279_211,
                min_confirmations: 0,
            }
        };
        let coinbase = Transfer {
            min_confirmations: 100,
            ..t(7, TransferKind::Deposit, TransferStatus::Seen, Some(95))
        };
        vec![
            (
                "deposit_unconfirmed",
                t(1, TransferKind::Deposit, TransferStatus::Seen, None),
            ),
            (
                "deposit_confirming",
                t(2, TransferKind::Deposit, TransferStatus::Seen, Some(100)),
            ),
            (
                "deposit_credited",
                t(3, TransferKind::Deposit, TransferStatus::Seen, Some(90)),
            ),
            (
                "deposit_reversed",
                t(4, TransferKind::Deposit, TransferStatus::Reversed, None),
            ),
            ("deposit_coinbase", coinbase),
            (
                "bet_pending",
                t(5, TransferKind::Bet, TransferStatus::Signed, None),
            ),
            (
                "withdrawal_confirmed",
                t(
                    6,
                    TransferKind::Withdrawal,
                    TransferStatus::Broadcast,
                    Some(99),
                ),
            ),
            (
                "payout_failed",
                t(
                    8,
                    TransferKind::Payout,
                    TransferStatus::BroadcastFailed,
                    None,
                ),
            ),
            (
                "withdrawal_failed",
                t(9, TransferKind::Withdrawal, TransferStatus::Failed, None),
            ),
        ]
    }

    /// What the views of every case render, one `name: json` line each.
    pub(super) fn rendered() -> String {
        let mut out = String::new();
        for (name, p) in proofs() {
            for (who, played, paused) in [("anonymous", false, false), ("player", true, true)] {
                let json = serde_json::to_string(&RoundView::of(&p, played, paused)).unwrap();
                out.push_str(&format!("round {name} {who}: {json}\n"));
            }
            let json = serde_json::to_string(&RoundView::summary(&summary_of(&p), false)).unwrap();
            out.push_str(&format!("summary {name}: {json}\n"));
        }
        for (name, t) in transfers() {
            let json = serde_json::to_string(&TransferView::of(&t, 101, 3)).unwrap();
            out.push_str(&format!("transfer {name}: {json}\n"));
        }
        out
    }

    /// Each phase renders the bytes the views rendered before the phases
    /// were typed (pinned from the renderer over the store's rows).
    #[test]
    fn every_phase_renders_the_json_it_always_rendered() {
        let expected = include_str!("testdata/views.txt");
        let got = rendered();
        for (line, (want, have)) in expected.lines().zip(got.lines()).enumerate() {
            assert_eq!(have, want, "line {}", line + 1);
        }
        assert_eq!(got.lines().count(), expected.lines().count());
    }
}
