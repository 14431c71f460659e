//! The provably fair draw as pure functions: the bets commitment, the seed from the draw block, the ticket, the winning bet and the payout split (DESIGN.md §4, §4.1).
//!
//! Nothing here touches the database, the clock or the chain, so anyone can
//! recompute a published draw with these functions (or by hand, see
//! docs/rounds-engine.md).

use bitcoin::hashes::Hash as _;
use bitcoin::{BlockHash, Txid};
use sha2::{Digest, Sha256};

/// Commission of every round with more than one player, in percent.
pub const COMMISSION_PERCENT: u64 = 30;

/// One bet as it enters the commitment and the draw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrawBet {
    /// Bet id (bets are ordered by it).
    pub bet_id: i64,
    /// Username as stored.
    pub username: String,
    /// Amount in satoshis.
    pub amount_sats: u64,
    /// The bet transaction, committed to as Bitcoin Core displays it
    /// (lowercase hex); `None` (bets placed before the service recorded
    /// them) commits to the empty text.
    pub txid: Option<Txid>,
}

/// Why a draw cannot be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DrawError {
    /// A round without bets has nothing to draw.
    #[error("no bets")]
    NoBets,
    /// Bets are not in strictly ascending bet id order.
    #[error("bets are not in ascending bet id order")]
    Unordered,
    /// The pot overflowed u64.
    #[error("pot overflow")]
    Overflow,
}

/// `SHA256` over the lines `"{bet_id}:{username}:{amount_sats}:{txid}\n"`,
/// bets in ascending bet id.
pub fn bets_commitment(bets: &[DrawBet]) -> [u8; 32] {
    let mut h = Sha256::new();
    for b in bets {
        let txid = b.txid.map(|t| t.to_string()).unwrap_or_default();
        h.update(format!("{}:{}:{}:{txid}\n", b.bet_id, b.username, b.amount_sats).as_bytes());
    }
    h.finalize().into()
}

/// `SHA256(block_hash || round_id as 8 bytes big-endian || commitment)`,
/// the block hash as the 32 bytes of its displayed hex.
pub fn draw_seed(block_hash: &BlockHash, round_id: i64, commitment: &[u8; 32]) -> [u8; 32] {
    // The display hex is the hash's bytes in reverse.
    let mut displayed = block_hash.to_byte_array();
    displayed.reverse();
    let mut h = Sha256::new();
    h.update(displayed);
    h.update(round_id.to_be_bytes());
    h.update(commitment);
    h.finalize().into()
}

/// The seed read as a 256-bit big-endian integer, modulo `pot_sats`.
/// `pot_sats` must be positive; 0 yields 0.
pub fn ticket(seed: &[u8; 32], pot_sats: u64) -> u64 {
    if pot_sats == 0 {
        return 0;
    }
    // Horner's rule byte by byte; (r < pot) * 256 + 255 fits in u128.
    let pot = u128::from(pot_sats);
    let mut r: u128 = 0;
    for b in seed {
        r = (r * 256 + u128::from(*b)) % pot;
    }
    r as u64
}

/// The satoshi range `[start, end)` each bet owns, in the given order.
///
/// # Errors
/// [`DrawError::Overflow`].
pub fn ranges(bets: &[DrawBet]) -> Result<Vec<(u64, u64)>, DrawError> {
    let mut start = 0u64;
    let mut out = Vec::with_capacity(bets.len());
    for b in bets {
        let end = start
            .checked_add(b.amount_sats)
            .ok_or(DrawError::Overflow)?;
        out.push((start, end));
        start = end;
    }
    Ok(out)
}

/// A computed draw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draw {
    /// The bets commitment.
    pub commitment: [u8; 32],
    /// The seed.
    pub seed: [u8; 32],
    /// Sum of the bets.
    pub pot_sats: u64,
    /// The winning satoshi.
    pub ticket: u64,
    /// Index into the bets of the winner.
    pub winner_index: usize,
}

/// The whole draw of round `round_id` on the block `block_hash`.
///
/// # Errors
/// [`DrawError`]: no bets, unordered bets or overflow.
pub fn compute_draw(
    round_id: i64,
    block_hash: &BlockHash,
    bets: &[DrawBet],
) -> Result<Draw, DrawError> {
    if bets.is_empty() {
        return Err(DrawError::NoBets);
    }
    if bets.windows(2).any(|w| w[0].bet_id >= w[1].bet_id) {
        return Err(DrawError::Unordered);
    }
    let commitment = bets_commitment(bets);
    let seed = draw_seed(block_hash, round_id, &commitment);
    let spans = ranges(bets)?;
    let pot_sats = spans.last().map_or(0, |s| s.1);
    let ticket = ticket(&seed, pot_sats);
    let winner_index = spans
        .iter()
        .position(|(s, e)| *s <= ticket && ticket < *e)
        .ok_or(DrawError::NoBets)?;
    Ok(Draw {
        commitment,
        seed,
        pot_sats,
        ticket,
        winner_index,
    })
}

/// Whether a round's bets come from one user only (then it is a refund).
pub fn single_player(bets: &[DrawBet]) -> bool {
    bets.windows(2).all(|w| w[0].username == w[1].username)
}

/// `floor(30% of pot)`; 0 for a single-player refund.
pub fn commission(pot_sats: u64, single_player: bool) -> u64 {
    if single_player {
        0
    } else {
        // pot ≤ 21e14, so pot * 30 fits in u64.
        pot_sats.saturating_mul(COMMISSION_PERCENT) / 100
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;
    use proptest::prelude::*;

    fn bet(id: i64, name: &str, amount: u64) -> DrawBet {
        DrawBet {
            bet_id: id,
            username: name.into(),
            amount_sats: amount,
            txid: Some(Txid::from_str(&format!("{:064x}", id)).unwrap()),
        }
    }

    fn block(hex: &str) -> BlockHash {
        BlockHash::from_str(hex).unwrap()
    }

    #[test]
    fn commitment_is_sha256_of_the_documented_lines() {
        let bets = [bet(1, "alice", 5000), bet(2, "Bob", 7000)];
        let text = format!("1:alice:5000:{:064x}\n2:Bob:7000:{:064x}\n", 1, 2);
        let expected: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        assert_eq!(bets_commitment(&bets), expected);
        // A bet without a recorded transaction commits to the empty text.
        let unrecorded = DrawBet {
            txid: None,
            ..bet(3, "c", 1)
        };
        let expected: [u8; 32] = Sha256::digest(b"3:c:1:\n").into();
        assert_eq!(bets_commitment(&[unrecorded]), expected);
        // Known answer: SHA256 of the empty string for no bets.
        assert_eq!(
            hex::encode(bets_commitment(&[])),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn seed_takes_the_displayed_hash_bytes_round_id_be_and_commitment() {
        let hash = "00".repeat(31) + "ff";
        let c = [7u8; 32];
        let mut pre = vec![0u8; 31];
        pre.push(0xff);
        pre.extend_from_slice(&42i64.to_be_bytes());
        pre.extend_from_slice(&c);
        let expected: [u8; 32] = Sha256::digest(&pre).into();
        assert_eq!(draw_seed(&block(&hash), 42, &c), expected);
    }

    #[test]
    fn ticket_is_the_big_endian_integer_mod_pot() {
        let mut seed = [0u8; 32];
        seed[31] = 10;
        assert_eq!(ticket(&seed, 7), 3);
        seed[30] = 1; // 266
        assert_eq!(ticket(&seed, 1000), 266);
        assert_eq!(ticket(&[0xff; 32], 1), 0);
        // 2^256 - 1 mod 2^32 = 2^32 - 1
        assert_eq!(ticket(&[0xff; 32], 1 << 32), (1 << 32) - 1);
    }

    #[test]
    fn winner_owns_the_range_holding_the_ticket() {
        let bets = [bet(1, "a", 100), bet(5, "b", 300), bet(9, "c", 600)];
        let d = compute_draw(3, &block(&"ab".repeat(32)), &bets).unwrap();
        let spans = ranges(&bets).unwrap();
        assert_eq!(spans, vec![(0, 100), (100, 400), (400, 1000)]);
        let (s, e) = spans[d.winner_index];
        assert!(s <= d.ticket && d.ticket < e);
        assert_eq!(d.pot_sats, 1000);
        assert_eq!(
            compute_draw(3, &block(&"ab".repeat(32)), &[]),
            Err(DrawError::NoBets)
        );
        let unordered = [bet(2, "a", 1), bet(1, "b", 1)];
        assert_eq!(
            compute_draw(3, &block(&"ab".repeat(32)), &unordered),
            Err(DrawError::Unordered)
        );
    }

    #[test]
    fn commission_is_floor_30_percent_and_zero_for_refunds() {
        assert_eq!(commission(1000, false), 300);
        assert_eq!(commission(1001, false), 300);
        assert_eq!(commission(1004, false), 301);
        assert_eq!(commission(1004, true), 0);
        assert!(single_player(&[bet(1, "a", 1), bet(2, "a", 1)]));
        assert!(!single_player(&[bet(1, "a", 1), bet(2, "b", 1)]));
    }

    proptest! {
        #[test]
        fn ticket_is_always_inside_the_pot_and_hits_one_bet(
            amounts in proptest::collection::vec(1u64..1_000_000, 1..20),
            hash in proptest::array::uniform32(any::<u8>()),
        ) {
            let bets: Vec<DrawBet> = amounts.iter().enumerate()
                .map(|(i, a)| bet(i as i64 + 1, "u", *a)).collect();
            let d = compute_draw(1, &BlockHash::from_byte_array(hash), &bets).unwrap();
            prop_assert!(d.ticket < d.pot_sats);
            prop_assert_eq!(d.pot_sats, amounts.iter().sum::<u64>());
            let hits = ranges(&bets).unwrap().iter()
                .filter(|(s, e)| *s <= d.ticket && d.ticket < *e).count();
            prop_assert_eq!(hits, 1);
        }
    }
}
