//! A round read back for the views: its phase, which carries exactly the draw data that exists in it, its bets and its payout.
//!
//! The store keeps the draw in seven nullable columns; [`RoundPhase::from_columns`]
//! turns them into a phase at the store's edge and refuses a combination no
//! lifecycle writes (a seed without its block, a paying-out round without a
//! winner, …) with a [`PhaseError`], so the views never guess which columns
//! belong together.

use bitcoin::hashes::sha256;
use bitcoin::{BlockHash, Txid};

use crate::domain::draw::DrawBet;
use crate::domain::round::{RoundStatus, TransferProgress, TransferStatus};

/// What a round fixed when it closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    /// Chain tip height when the round closed; the draw block is the next one.
    pub tip_height: i64,
    /// That tip's hash, the draw block's parent; `None` for rounds closed
    /// before it was recorded.
    pub tip_hash: Option<BlockHash>,
    /// SHA-256 over the ordered bets.
    pub bets_commitment: sha256::Hash,
}

/// The block a round is drawn from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrawBlock {
    /// Its height (`tip_height + 1` of the anchor it was drawn under).
    pub height: i64,
    /// Its hash.
    pub hash: BlockHash,
}

/// A draw computed and stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrawResult {
    /// The block drawn from.
    pub block: DrawBlock,
    /// The seed from the block hash, the round id and the commitment.
    pub seed: sha256::Hash,
    /// The winning satoshi.
    pub ticket: i64,
    /// The bet whose range holds the ticket.
    pub winner_bet_id: i64,
}

/// How far the draw of a round past its close has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrawProgress {
    /// The draw block is not known yet.
    Waiting,
    /// The draw block is known, the draw not stored.
    Block(DrawBlock),
    /// Drawn (a round retried by an admin keeps its earlier draw until it is
    /// drawn again from the same block).
    Drawn(DrawResult),
}

/// How a closed round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Closed before the service recorded draws: nothing is known.
    Unanchored,
    /// Closed without bets: anchored, nothing drawn.
    Empty(Anchor),
    /// Drawn and paid.
    Paid {
        /// What the close fixed.
        anchor: Anchor,
        /// The draw.
        draw: DrawResult,
    },
}

/// A round's phase with the data that exists in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundPhase {
    /// Taking bets: nothing is fixed.
    Open,
    /// Closed to bets; the watcher may already have stored the draw block.
    Closing {
        /// What the close fixed.
        anchor: Anchor,
        /// The draw block, once processed.
        block: Option<DrawBlock>,
    },
    /// Waiting for the draw block, or drawing.
    Drawing {
        /// What the close fixed.
        anchor: Anchor,
        /// How far the draw has come.
        draw: DrawProgress,
    },
    /// Drawn; the payout is on its way.
    PayingOut {
        /// What the close fixed.
        anchor: Anchor,
        /// The draw.
        draw: DrawResult,
    },
    /// No payout could be made; the round waits for an admin retry.
    PayoutFailed {
        /// What the close fixed.
        anchor: Anchor,
        /// How far the draw had come.
        draw: DrawProgress,
    },
    /// Over.
    Closed(Settled),
}

/// The draw columns of a round as decoded at the store's edge: hashes
/// typed, still each on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DrawColumnValues {
    /// `tip_height_at_close`.
    pub tip_height: Option<i64>,
    /// `tip_hash_at_close`.
    pub tip_hash: Option<BlockHash>,
    /// `bets_commitment`.
    pub bets_commitment: Option<sha256::Hash>,
    /// `block_height`.
    pub block_height: Option<i64>,
    /// `block_hash`.
    pub block_hash: Option<BlockHash>,
    /// `seed`.
    pub seed: Option<sha256::Hash>,
    /// `ticket`.
    pub ticket: Option<i64>,
    /// `winner_bet_id`.
    pub winner_bet_id: Option<i64>,
}

/// A stored round whose draw columns no lifecycle writes for its status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("round in status {status} with {found}, which it cannot have")]
pub struct PhaseError {
    /// The stored status.
    pub status: RoundStatus,
    /// What was found (or missing).
    pub found: &'static str,
}

impl RoundPhase {
    /// The phase of a round in `status` with the draw columns `c`.
    ///
    /// # Errors
    /// [`PhaseError`] when the columns are not a combination the lifecycle
    /// writes for `status`.
    pub fn from_columns(status: RoundStatus, c: &DrawColumnValues) -> Result<Self, PhaseError> {
        let err = |found| PhaseError { status, found };
        let anchor = match (c.tip_height, c.bets_commitment) {
            (Some(tip_height), Some(bets_commitment)) => Some(Anchor {
                tip_height,
                tip_hash: c.tip_hash,
                bets_commitment,
            }),
            (None, None) if c.tip_hash.is_none() => None,
            _ => return Err(err("a partial close (tip height, tip hash, commitment)")),
        };
        let block = match (c.block_height, c.block_hash) {
            (Some(height), Some(hash)) => Some(DrawBlock { height, hash }),
            (None, None) => None,
            _ => return Err(err("a draw block height without its hash, or the reverse")),
        };
        let result = match (block, c.seed, c.ticket, c.winner_bet_id) {
            (Some(block), Some(seed), Some(ticket), Some(winner_bet_id)) => Some(DrawResult {
                block,
                seed,
                ticket,
                winner_bet_id,
            }),
            (_, None, None, None) => None,
            _ => return Err(err("a partial draw (block, seed, ticket, winner)")),
        };
        let progress = match (block, result) {
            (_, Some(r)) => DrawProgress::Drawn(r),
            (Some(b), None) => DrawProgress::Block(b),
            (None, None) => DrawProgress::Waiting,
        };
        let anchored = |anchor: Option<Anchor>| anchor.ok_or_else(|| err("no close anchor"));
        Ok(match status {
            RoundStatus::Open if anchor.is_none() && block.is_none() => RoundPhase::Open,
            RoundStatus::Open => return Err(err("draw data")),
            RoundStatus::Closing if result.is_none() => RoundPhase::Closing {
                anchor: anchored(anchor)?,
                block,
            },
            RoundStatus::Closing => return Err(err("a draw")),
            RoundStatus::Drawing => RoundPhase::Drawing {
                anchor: anchored(anchor)?,
                draw: progress,
            },
            RoundStatus::PayingOut => RoundPhase::PayingOut {
                anchor: anchored(anchor)?,
                draw: result.ok_or_else(|| err("no draw"))?,
            },
            RoundStatus::PayoutFailed => RoundPhase::PayoutFailed {
                anchor: anchored(anchor)?,
                draw: progress,
            },
            RoundStatus::Closed => RoundPhase::Closed(match (anchor, progress) {
                (None, DrawProgress::Waiting) => Settled::Unanchored,
                (Some(anchor), DrawProgress::Waiting) => Settled::Empty(anchor),
                (Some(anchor), DrawProgress::Drawn(draw)) => Settled::Paid { anchor, draw },
                _ => return Err(err("a draw block without a draw")),
            }),
        })
    }

    /// The stored status of this phase.
    pub fn status(&self) -> RoundStatus {
        match self {
            RoundPhase::Open => RoundStatus::Open,
            RoundPhase::Closing { .. } => RoundStatus::Closing,
            RoundPhase::Drawing { .. } => RoundStatus::Drawing,
            RoundPhase::PayingOut { .. } => RoundStatus::PayingOut,
            RoundPhase::PayoutFailed { .. } => RoundStatus::PayoutFailed,
            RoundPhase::Closed(_) => RoundStatus::Closed,
        }
    }

    /// What the close fixed, once closed.
    pub fn anchor(&self) -> Option<&Anchor> {
        match self {
            RoundPhase::Open | RoundPhase::Closed(Settled::Unanchored) => None,
            RoundPhase::Closing { anchor, .. }
            | RoundPhase::Drawing { anchor, .. }
            | RoundPhase::PayingOut { anchor, .. }
            | RoundPhase::PayoutFailed { anchor, .. }
            | RoundPhase::Closed(Settled::Empty(anchor) | Settled::Paid { anchor, .. }) => {
                Some(anchor)
            }
        }
    }

    /// The draw, once stored.
    pub fn draw(&self) -> Option<&DrawResult> {
        match self {
            RoundPhase::PayingOut { draw, .. }
            | RoundPhase::Closed(Settled::Paid { draw, .. })
            | RoundPhase::Drawing {
                draw: DrawProgress::Drawn(draw),
                ..
            }
            | RoundPhase::PayoutFailed {
                draw: DrawProgress::Drawn(draw),
                ..
            } => Some(draw),
            _ => None,
        }
    }

    /// The draw block, once known.
    pub fn block(&self) -> Option<&DrawBlock> {
        if let Some(draw) = self.draw() {
            return Some(&draw.block);
        }
        match self {
            RoundPhase::Closing {
                block: Some(block), ..
            }
            | RoundPhase::Drawing {
                draw: DrawProgress::Block(block),
                ..
            }
            | RoundPhase::PayoutFailed {
                draw: DrawProgress::Block(block),
                ..
            } => Some(block),
            _ => None,
        }
    }
}

/// A round: its numbers and its phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    /// The round id shown to clients.
    pub id: i64,
    /// Where the round is, with the draw data that exists there.
    pub phase: RoundPhase,
    /// Unix seconds.
    pub opened_at: i64,
    /// Unix seconds.
    pub closes_at: i64,
    /// Sum of the round's bets.
    pub pot_sats: i64,
    /// Number of distinct users who bet.
    pub bettors: i64,
    /// Number of placed bets.
    pub bet_count: i64,
}

/// A placed bet as the draw proof lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bet {
    /// Bet id (orders the draw).
    pub id: i64,
    /// Bettor.
    pub user_id: i64,
    /// Username as stored.
    pub username: String,
    /// Amount in the pot.
    pub amount_sats: i64,
    /// The bet transaction; `None` for bets placed before the service
    /// recorded them.
    pub txid: Option<Txid>,
}

impl Bet {
    /// The bet as the draw and its commitment see it (a bet without a
    /// recorded transaction commits to an empty txid).
    pub fn draw_bet(&self) -> DrawBet {
        DrawBet {
            bet_id: self.id,
            username: self.username.clone(),
            amount_sats: u64::try_from(self.amount_sats).unwrap_or(0),
            txid: self.txid,
        }
    }
}

/// A round's payout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Payout {
    /// The payout transaction.
    pub txid: Txid,
    /// Paid to the winner.
    pub winner_sats: i64,
    /// Paid to the fee address.
    pub commission_sats: i64,
    /// Miner fee.
    pub fee_sats: i64,
    /// Stored status.
    pub status: TransferStatus,
    /// Height of the confirming block.
    pub block_height: Option<i64>,
}

impl Payout {
    /// How far the payout has come, as its owner sees it.
    pub fn progress(&self) -> TransferProgress {
        TransferProgress::of_own(self.status, self.block_height.is_some())
    }
}

/// A round with its bets and payout: everything its draw proof shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundProof {
    /// The round.
    pub round: Round,
    /// Placed bets in ascending id.
    pub bets: Vec<Bet>,
    /// The payout, if any.
    pub payout: Option<Payout>,
}

impl RoundProof {
    /// The satoshi range `[start, end)` each bet covers, in draw order
    /// (none when the pot overflows, which no stored round does).
    pub fn bet_ranges(&self) -> Vec<(u64, u64)> {
        let bets: Vec<DrawBet> = self.bets.iter().map(Bet::draw_bet).collect();
        crate::domain::draw::ranges(&bets).unwrap_or_default()
    }

    /// The winning bet, once drawn.
    pub fn winner(&self) -> Option<&Bet> {
        let id = self.round.phase.draw()?.winner_bet_id;
        self.bets.iter().find(|b| b.id == id)
    }
}

/// A round as a page of rounds shows it: no bet list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundSummary {
    /// The round.
    pub round: Round,
    /// The winner's username, once drawn.
    pub winner_username: Option<String>,
    /// The payout, if any.
    pub payout: Option<Payout>,
    /// Whether the caller bet in the round.
    pub user_played: bool,
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    fn hash(c: char) -> BlockHash {
        BlockHash::from_str(&c.to_string().repeat(64)).unwrap()
    }

    fn digest(c: char) -> sha256::Hash {
        sha256::Hash::from_str(&c.to_string().repeat(64)).unwrap()
    }

    fn anchored() -> DrawColumnValues {
        DrawColumnValues {
            tip_height: Some(10),
            tip_hash: Some(hash('a')),
            bets_commitment: Some(digest('c')),
            ..DrawColumnValues::default()
        }
    }

    fn with_block() -> DrawColumnValues {
        DrawColumnValues {
            block_height: Some(11),
            block_hash: Some(hash('b')),
            ..anchored()
        }
    }

    fn drawn() -> DrawColumnValues {
        DrawColumnValues {
            seed: Some(digest('5')),
            ticket: Some(7),
            winner_bet_id: Some(3),
            ..with_block()
        }
    }

    #[test]
    fn each_status_takes_the_columns_its_lifecycle_writes() {
        use RoundStatus::*;
        let none = DrawColumnValues::default();
        for (status, columns) in [
            (Open, none),
            (Closing, anchored()),
            (Closing, with_block()),
            (Drawing, anchored()),
            (Drawing, with_block()),
            (Drawing, drawn()),
            (PayingOut, drawn()),
            (PayoutFailed, anchored()),
            (PayoutFailed, with_block()),
            (PayoutFailed, drawn()),
            (Closed, none),
            (Closed, anchored()),
            (Closed, drawn()),
        ] {
            let phase = RoundPhase::from_columns(status, &columns)
                .unwrap_or_else(|e| panic!("{status} {columns:?}: {e}"));
            assert_eq!(phase.status(), status);
            assert_eq!(phase.anchor().map(|a| a.tip_height), columns.tip_height);
            assert_eq!(phase.block().map(|b| b.hash), columns.block_hash);
            assert_eq!(phase.draw().map(|d| d.seed), columns.seed);
        }
    }

    #[test]
    fn impossible_combinations_are_refused_with_a_typed_error() {
        use RoundStatus::*;
        let seed_without_block = DrawColumnValues {
            block_height: None,
            block_hash: None,
            ..drawn()
        };
        let ticket_without_winner = DrawColumnValues {
            winner_bet_id: None,
            ..drawn()
        };
        let height_without_hash = DrawColumnValues {
            block_hash: None,
            ..with_block()
        };
        let tip_without_commitment = DrawColumnValues {
            bets_commitment: None,
            ..anchored()
        };
        for (status, columns, found) in [
            (Open, anchored(), "draw data"),
            (Closing, DrawColumnValues::default(), "no close anchor"),
            (Closing, drawn(), "a draw"),
            (PayingOut, with_block(), "no draw"),
            (Drawing, DrawColumnValues::default(), "no close anchor"),
            (Closed, with_block(), "a draw block without a draw"),
            (
                Drawing,
                seed_without_block,
                "a partial draw (block, seed, ticket, winner)",
            ),
            (
                PayoutFailed,
                ticket_without_winner,
                "a partial draw (block, seed, ticket, winner)",
            ),
            (
                Drawing,
                height_without_hash,
                "a draw block height without its hash, or the reverse",
            ),
            (
                Closing,
                tip_without_commitment,
                "a partial close (tip height, tip hash, commitment)",
            ),
        ] {
            assert_eq!(
                RoundPhase::from_columns(status, &columns),
                Err(PhaseError { status, found }),
                "{status} {columns:?}"
            );
        }
    }
}
