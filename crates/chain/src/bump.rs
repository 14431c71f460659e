//! Fee bumping by replacement (BIP125), one rule for everything potluck
//! re-signs while it waits for a confirmation: the node's claims and
//! penalties, and the service's stuck withdrawals and payouts.
//!
//! Each block a transaction stays unconfirmed, its replacement pays the
//! larger of the chain's current estimate and a geometric step above the old
//! fee (so a few blocks reach a rising market), and never less than BIP125
//! rule 4 asks (the old fee plus the incremental relay fee for the new
//! size). The caller's budget caps it: a claim may spend part of what it
//! recovers, a penalty all of it but dust (docs/chain.md, "Fee bumping").

use bitcoin::{Amount, FeeRate};

/// The geometric step of each replacement, in percent of the old fee.
pub const STEP_PERCENT: u64 = 125;

/// What a replacement is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replacement {
    /// The fee of the version that did not confirm.
    pub old_fee: Amount,
    /// The virtual size of the replacement at its largest signatures (a re-signed
    /// signature may come out longer than the old one).
    pub vsize: u64,
    /// The chain's estimate now.
    pub target: FeeRate,
    /// The relay policy's incremental fee rate (Bitcoin Core `-incrementalrelayfee`).
    pub incremental: FeeRate,
    /// The most this transaction may pay.
    pub budget: Amount,
}

/// The fee of the next replacement, or `None` when the budget does not allow one that
/// relays (the last version stays: it is the best we will pay).
pub fn replacement_fee(r: &Replacement) -> Option<Amount> {
    let at = |rate: FeeRate| rate.fee_vb(r.vsize).unwrap_or(Amount::MAX_MONEY);
    let least = r.old_fee.checked_add(at(r.incremental))?;
    let step = Amount::from_sat(r.old_fee.to_sat().saturating_mul(STEP_PERCENT) / 100);
    let wanted = at(r.target).max(least).max(step);
    let fee = wanted.min(r.budget);
    (fee >= least).then_some(fee)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sat(n: u64) -> Amount {
        Amount::from_sat(n)
    }

    fn vb(n: u64) -> FeeRate {
        FeeRate::from_sat_per_vb(n).unwrap_or(FeeRate::MAX)
    }

    #[test]
    fn replacement_fees_follow_the_market_step_up_and_stop_at_the_budget() {
        // (old fee, vsize, estimate, budget) → next fee
        let cases: &[(u64, u64, u64, u64, Option<u64>)] = &[
            // The market moved: pay the estimate.
            (110, 110, 20, 100_000, Some(2_200)),
            // The market did not move: a 25 % step (above rule 4's +110).
            (1_000, 110, 1, 100_000, Some(1_250)),
            // A small fee: rule 4 (old + 1 sat/vB × size) is more than the step.
            (110, 110, 1, 100_000, Some(220)),
            // The budget caps the estimate.
            (110, 110, 50, 3_000, Some(3_000)),
            // The budget leaves no replacement that relays.
            (2_950, 110, 50, 3_000, None),
            (3_000, 110, 50, 3_000, None),
        ];
        for &(old, vsize, est, budget, want) in cases {
            let got = replacement_fee(&Replacement {
                old_fee: sat(old),
                vsize,
                target: vb(est),
                incremental: vb(1),
                budget: sat(budget),
            });
            assert_eq!(got, want.map(sat), "old {old}, est {est}, budget {budget}");
        }
    }

    #[test]
    fn repeated_replacements_reach_any_market_within_a_few_blocks() {
        let mut fee = sat(110);
        let mut blocks = 0;
        while fee < sat(110 * 30) {
            fee = replacement_fee(&Replacement {
                old_fee: fee,
                vsize: 110,
                target: vb(1),
                incremental: vb(1),
                budget: sat(1_000_000),
            })
            .unwrap();
            blocks += 1;
        }
        assert!(blocks <= 16, "{blocks} blocks to reach 30 sat/vB");
    }
}
