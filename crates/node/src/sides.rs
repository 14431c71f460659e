//! Each side's money in a channel as an operator reads it: its balance, its share of the
//! commitment fee, and what it can spend now (docs/node.md, "Balances and the commitment fee").

use channel::{CState, Htlc, State, Who};
use wire::{Locktime, Sha256};

use bitcoin::hashes::Hash as _;

/// One side's money as `listchannels` shows it (`ours`, `theirs`); its fields in the order
/// of their names, as `rpc::views::ChannelView` needs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct SideView {
    /// What the side owns outside HTLCs, before its fee share.
    pub(crate) balance_msat: u64,
    /// Its share of the commitment transaction's fee.
    pub(crate) fee_share_msat: u64,
    /// The HTLCs it offered that are still pending.
    pub(crate) htlc_msat: u64,
    /// The most that one `pay` and one `newhtlc` from it both accept now.
    pub(crate) spendable_msat: u64,
}

impl SideView {
    /// The side `who` of a channel in `state` with commitment `cs`.
    pub(crate) fn of(cs: &CState, who: Who, state: State) -> SideView {
        let side = cs.side(who);
        // Only a live channel moves money; a command during an update waits for it, then proposes.
        let live = state == State::Normal || state.is_updating();
        SideView {
            balance_msat: side.total_msat(),
            fee_share_msat: side.fee_msat,
            htlc_msat: side.htlc_msat(),
            spendable_msat: if live { spendable_msat(cs, who) } else { 0 },
        }
    }
}

/// The largest amount that one `pay` and one `newhtlc` from `who` both accept now.
///
/// Asks the channel's own arithmetic (`CState::pay`, `CState::add_htlc`) instead of
/// restating the fee rule: both are monotone in the amount, so a binary search finds
/// the edge. One payment is at most `u32::MAX` msat (the wire's `amount_msat`).
pub(crate) fn spendable_msat(cs: &CState, who: Who) -> u64 {
    let r_hash = unused_hash(cs);
    let accepts = |amount: u64| {
        let Ok(amount_msat) = u32::try_from(amount) else {
            return false;
        };
        let htlc = Htlc {
            amount_msat,
            r_hash,
            expiry: Locktime::Blocks(1),
        };
        cs.pay(who, amount).is_ok() && cs.add_htlc(who, htlc).is_ok()
    };
    let (mut low, mut high) = (0u64, cs.side(who).total_msat().min(u64::from(u32::MAX)));
    if !accepts(low) {
        return 0;
    }
    // Invariant: accepts(low); the answer is in low..=high.
    while low < high {
        let mid = low + (high - low).div_ceil(2);
        if accepts(mid) {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    low
}

/// A hash no HTLC of the channel uses, for probing `add_htlc`.
fn unused_hash(cs: &CState) -> Sha256 {
    (0u8..=u8::MAX)
        .map(|b| Sha256::from_byte_array([b; 32]))
        .find(|h| cs.find_htlc(h).is_none())
        .unwrap_or_else(|| Sha256::from_byte_array([0x5a; 32]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/node.md's worked example: a fresh 500,000-sat channel with a 10,000-sat
    /// commitment fee, funded by us.
    fn fresh() -> CState {
        CState::initial(500_000, 10_000, true).unwrap()
    }

    #[test]
    fn a_first_small_payment_goes_to_the_peers_fee_share() {
        let paid = fresh().pay(Who::Us, 1_000_000).unwrap();
        let theirs = SideView::of(&paid, Who::Them, State::Normal);
        assert_eq!(theirs.balance_msat, 1_000_000);
        assert_eq!(theirs.fee_share_msat, 1_000_000);
        assert_eq!(paid.theirs.pay_msat, 0);
        assert_eq!(theirs.spendable_msat, 0);
        let ours = SideView::of(&paid, Who::Us, State::Normal);
        assert_eq!(ours.balance_msat, 499_000_000);
        assert_eq!(ours.fee_share_msat, 9_000_000);
        // pay alone would allow 494,000,000; an HTLC leaves the peer's share unpaid and allows 490,000,000.
        assert_eq!(ours.spendable_msat, 490_000_000);

        let more = paid.pay(Who::Us, 20_000_000).unwrap();
        let theirs = SideView::of(&more, Who::Them, State::Normal);
        assert_eq!(theirs.fee_share_msat, 5_000_000);
        assert_eq!(theirs.spendable_msat, 16_000_000);
        assert_eq!(
            SideView::of(&more, Who::Us, State::Normal).spendable_msat,
            474_000_000
        );
        // A closed channel (or one not yet open) spends nothing, whatever it owned.
        for state in [State::Closed, State::OnChain, State::CloseWaitAck] {
            assert_eq!(SideView::of(&more, Who::Us, state).spendable_msat, 0);
            assert_eq!(
                SideView::of(&more, Who::Us, state).balance_msat,
                479_000_000
            );
        }
    }

    #[test]
    fn spendable_is_exactly_the_edge_of_what_the_channel_accepts() {
        let htlc = |amount_msat: u64, byte: u8| Htlc {
            amount_msat: u32::try_from(amount_msat).unwrap(),
            r_hash: Sha256::from_byte_array([byte; 32]),
            expiry: Locktime::Blocks(500),
        };
        let states = [
            fresh(),
            fresh().pay(Who::Us, 1_000_000).unwrap(),
            fresh().pay(Who::Us, 7_777_777).unwrap(),
            fresh().pay(Who::Us, 300_000_000).unwrap(),
            fresh()
                .pay(Who::Us, 40_000_000)
                .unwrap()
                .add_htlc(Who::Us, htlc(3_000_000, 0))
                .unwrap(),
            fresh().mirror(),
        ];
        for cs in &states {
            for who in [Who::Us, Who::Them] {
                let s = spendable_msat(cs, who);
                if s > 0 {
                    assert!(cs.pay(who, s).is_ok(), "{cs:?} {who:?} {s}");
                    assert!(cs.add_htlc(who, htlc(s, 9)).is_ok(), "{cs:?} {who:?} {s}");
                }
                let over = s + 1;
                assert!(
                    cs.pay(who, over).is_err() || cs.add_htlc(who, htlc(over, 9)).is_err(),
                    "{cs:?} {who:?}: {over} is accepted too"
                );
            }
        }
    }
}
