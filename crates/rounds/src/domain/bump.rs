//! The service's fee bumps as pure functions: what a replacement of a stuck withdrawal or payout may pay (the policy's cap and share of the amount), and the replacement itself (the old transaction with one output paying the extra fee).
//!
//! The fee itself is `chain::bump::replacement_fee`, the one rule the node
//! uses for its claims too (docs/chain.md, "Fee bumping").

use bitcoin::{Amount, FeeRate, Transaction};

/// When and how far the service bumps its stuck withdrawals and payouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BumpPolicy {
    /// Blocks a version stays unconfirmed before it is replaced (0: never).
    pub after_blocks: u32,
    /// The highest fee rate a replacement pays.
    pub max_fee_rate: FeeRate,
    /// The largest share (percent) of the transfer's amount its fee may take.
    pub max_fee_percent: u32,
}

impl Default for BumpPolicy {
    /// 3 blocks (about half an hour), 100 sat/vB, 10 % of the amount.
    fn default() -> Self {
        Self {
            after_blocks: 3,
            max_fee_rate: FeeRate::from_sat_per_vb_u32(100),
            max_fee_percent: 10,
        }
    }
}

/// Why no replacement could be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BumpBuildError {
    /// The output that pays the extra fee is not in the transaction.
    #[error("output {vout} is not in the transaction")]
    NoSuchOutput {
        /// The output asked for.
        vout: u32,
    },
    /// That output would be left below its dust threshold.
    #[error("the extra fee of {extra_sats} sats would leave output {vout} below dust")]
    WouldBeDust {
        /// The output.
        vout: u32,
        /// The fee added.
        extra_sats: u64,
    },
    /// The new fee is not above the old one.
    #[error("a replacement must pay more than {old_fee_sats} sats")]
    NotHigher {
        /// The old fee.
        old_fee_sats: u64,
    },
}

impl BumpPolicy {
    /// The most a transaction of `vsize` moving `amount` may pay in fees:
    /// the cap rate, the share of the amount, and what `absorbing` (the
    /// output that pays the extra) can give above its `dust` threshold on
    /// top of the `old_fee`, whichever is least.
    pub fn budget(
        &self,
        vsize: u64,
        amount: Amount,
        old_fee: Amount,
        absorbing: Amount,
        dust: Amount,
    ) -> Amount {
        let by_rate = self.max_fee_rate.fee_vb(vsize).unwrap_or(Amount::MAX_MONEY);
        let by_share = Amount::from_sat(
            amount
                .to_sat()
                .saturating_mul(u64::from(self.max_fee_percent))
                / 100,
        );
        let by_output = old_fee + absorbing.checked_sub(dust).unwrap_or(Amount::ZERO);
        by_rate.min(by_share).min(by_output)
    }
}

/// `old` paying `new_fee` instead of `old_fee`: output `vout` gives the
/// difference; inputs, other outputs, version and lock time stay (so it
/// conflicts with `old` on every input: a BIP125 replacement). Unsigned:
/// the witnesses are cleared for the caller to sign again.
///
/// # Errors
/// [`BumpBuildError`].
pub fn replacement(
    old: &Transaction,
    vout: u32,
    old_fee: Amount,
    new_fee: Amount,
    dust: Amount,
) -> Result<Transaction, BumpBuildError> {
    let extra = new_fee
        .checked_sub(old_fee)
        .filter(|e| *e > Amount::ZERO)
        .ok_or(BumpBuildError::NotHigher {
            old_fee_sats: old_fee.to_sat(),
        })?;
    let mut tx = old.clone();
    let out = tx
        .output
        .get_mut(vout as usize)
        .ok_or(BumpBuildError::NoSuchOutput { vout })?;
    out.value =
        out.value
            .checked_sub(extra)
            .filter(|v| *v >= dust)
            .ok_or(BumpBuildError::WouldBeDust {
                vout,
                extra_sats: extra.to_sat(),
            })?;
    for input in &mut tx.input {
        input.witness.clear();
    }
    Ok(tx)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use bitcoin::absolute::LockTime;
    use bitcoin::transaction::Version;
    use bitcoin::{OutPoint, ScriptBuf, Sequence, TxIn, TxOut, Witness};

    fn sat(n: u64) -> Amount {
        Amount::from_sat(n)
    }

    fn tx() -> Transaction {
        Transaction {
            version: Version::TWO,
            lock_time: LockTime::from_height(120).unwrap(),
            input: vec![TxIn {
                previous_output: OutPoint::null(),
                script_sig: ScriptBuf::new(),
                sequence: Sequence::ENABLE_RBF_NO_LOCKTIME,
                witness: Witness::from_slice(&[[1u8; 72].as_slice(), [2u8; 33].as_slice()]),
            }],
            output: vec![
                TxOut {
                    value: sat(50_000),
                    script_pubkey: ScriptBuf::new(),
                },
                TxOut {
                    value: sat(9_000),
                    script_pubkey: ScriptBuf::new(),
                },
            ],
        }
    }

    #[test]
    fn the_budget_is_the_least_of_cap_share_and_what_the_output_gives() {
        let p = BumpPolicy {
            after_blocks: 3,
            max_fee_rate: FeeRate::from_sat_per_vb_u32(100),
            max_fee_percent: 10,
        };
        // (vsize, amount, old fee, absorbing, dust) → budget
        let cases = [
            // The share of the amount: 10 % of 50,000.
            (141, 50_000, 282, 40_000, 294, 5_000),
            // The cap rate: 100 sat/vB × 141.
            (141, 1_000_000, 282, 400_000, 294, 14_100),
            // The output: old fee + what it holds above dust.
            (141, 1_000_000, 282, 1_294, 294, 1_282),
            // An output already at dust gives nothing more.
            (141, 1_000_000, 282, 294, 294, 282),
        ];
        for (vsize, amount, old, absorbing, dust, want) in cases {
            assert_eq!(
                p.budget(vsize, sat(amount), sat(old), sat(absorbing), sat(dust)),
                sat(want),
                "{vsize} {amount} {old} {absorbing} {dust}"
            );
        }
    }

    #[test]
    fn a_replacement_takes_the_extra_fee_from_one_output_only() {
        let old = tx();
        let new = replacement(&old, 1, sat(300), sat(1_000), sat(294)).unwrap();
        assert_eq!(new.output[0], old.output[0]);
        assert_eq!(new.output[1].value, sat(8_300));
        assert_eq!(new.input[0].previous_output, old.input[0].previous_output);
        assert_eq!(new.input[0].sequence, Sequence::ENABLE_RBF_NO_LOCKTIME);
        assert!(
            new.input[0].witness.is_empty(),
            "signed again by the caller"
        );
        assert_eq!(new.lock_time, old.lock_time);
        assert_eq!(
            replacement(&old, 1, sat(300), sat(9_100), sat(294)),
            Err(BumpBuildError::WouldBeDust {
                vout: 1,
                extra_sats: 8_800
            })
        );
        assert_eq!(
            replacement(&old, 1, sat(300), sat(300), sat(294)),
            Err(BumpBuildError::NotHigher { old_fee_sats: 300 })
        );
        assert_eq!(
            replacement(&old, 2, sat(300), sat(400), sat(294)),
            Err(BumpBuildError::NoSuchOutput { vout: 2 })
        );
    }
}
