//! Balance arithmetic of a channel (PROTOCOL-NOTES §8): who owns what in msat,
//! how the commitment fee is split, and how updates and HTLCs move money.

use wire::{Locktime, Sha256};

/// One hash-locked payment, offered by the side that holds it in [`Side::htlcs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Htlc {
    /// Amount in msat (fits the wire's uint32).
    pub amount_msat: u32,
    /// SHA256 of the payment preimage R.
    #[serde(serialize_with = "crate::stored_hex::sha256")]
    pub r_hash: Sha256,
    /// Absolute expiry.
    pub expiry: Locktime,
}

/// One side's money in a commitment.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Side {
    /// Paid to this side, in msat, after its share of the fee.
    pub pay_msat: u64,
    /// This side's share of the fee, in msat.
    pub fee_msat: u64,
    /// HTLCs offered by this side.
    pub htlcs: Vec<Htlc>,
}

impl Side {
    /// Balance before fees: what this side owns outside its HTLCs.
    pub fn total_msat(&self) -> u64 {
        self.pay_msat + self.fee_msat
    }

    /// Sum of this side's offered HTLCs.
    pub fn htlc_msat(&self) -> u64 {
        self.htlcs.iter().map(|h| u64::from(h.amount_msat)).sum()
    }
}

/// The money of a commitment, from one side's point of view ("ours"/"theirs").
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CState {
    /// The anchor amount in satoshis.
    pub anchor_sat: u64,
    /// The commitment fee in satoshis (the smaller of both offers).
    pub fee_sat: u64,
    /// Whether we created the anchor (and pay whatever the non-funder cannot).
    pub we_fund: bool,
    /// Our side.
    pub ours: Side,
    /// Their side.
    pub theirs: Side,
}

/// Which side of a [`CState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Who {
    /// The local node.
    Us,
    /// The counterparty.
    Them,
}

impl Who {
    /// The other side.
    pub fn other(self) -> Who {
        match self {
            Who::Us => Who::Them,
            Who::Them => Who::Us,
        }
    }
}

/// Why a balance change is impossible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FundingError {
    /// The paying side does not own enough (including its share of the fee).
    #[error("insufficient funds: {needed_msat} msat needed, {available_msat} msat available")]
    InsufficientFunds {
        /// What the change would take from the payer, in msat.
        needed_msat: u64,
        /// What the payer owns, in msat.
        available_msat: u64,
    },
    /// The funder cannot pay the fee left to it.
    #[error("the funder cannot pay the fee")]
    FeeUnaffordable,
    /// No HTLC with this hash exists on the given side.
    #[error("no such HTLC")]
    NoSuchHtlc,
    /// An HTLC with this hash already exists.
    #[error("duplicate HTLC hash")]
    DuplicateHtlc,
    /// The anchor is too small for the fee.
    #[error("anchor amount does not cover the fee")]
    AnchorTooSmall,
}

/// Splits `fee_msat` between funder and non-funder totals (PROTOCOL-NOTES §8):
/// the non-funder pays `fee − fee/2` if it can, else — unless it is the paying
/// side of this change — all it has; the funder pays the rest.
///
/// Returns `(funder_pay, funder_fee, nonfunder_pay, nonfunder_fee)`.
pub fn split_fee(
    funder_total_msat: u64,
    nonfunder_total_msat: u64,
    nonfunder_paying: bool,
    fee_msat: u64,
) -> Result<(u64, u64, u64, u64), FundingError> {
    let mut nonfunder_fee = fee_msat - fee_msat / 2;
    if nonfunder_total_msat < nonfunder_fee {
        if nonfunder_paying {
            return Err(FundingError::InsufficientFunds {
                needed_msat: nonfunder_fee,
                available_msat: nonfunder_total_msat,
            });
        }
        nonfunder_fee = nonfunder_total_msat;
    }
    let funder_fee = fee_msat - nonfunder_fee;
    if funder_total_msat < funder_fee {
        return Err(FundingError::FeeUnaffordable);
    }
    Ok((
        funder_total_msat - funder_fee,
        funder_fee,
        nonfunder_total_msat - nonfunder_fee,
        nonfunder_fee,
    ))
}

/// A payer who can afford `amount_msat` but not its fee share afterwards needs both:
/// report the whole requirement, not only the fee share.
fn with_amount(e: FundingError, amount_msat: u64, payer_total_msat: u64) -> FundingError {
    match e {
        FundingError::InsufficientFunds { needed_msat, .. } => FundingError::InsufficientFunds {
            needed_msat: amount_msat.saturating_add(needed_msat),
            available_msat: payer_total_msat,
        },
        other => other,
    }
}

impl CState {
    /// The initial state: the funder owns the anchor minus the whole fee.
    ///
    /// # Errors
    /// [`FundingError::AnchorTooSmall`] if the anchor cannot pay the fee.
    pub fn initial(anchor_sat: u64, fee_sat: u64, we_fund: bool) -> Result<CState, FundingError> {
        let mut c = CState {
            anchor_sat,
            fee_sat,
            we_fund,
            ours: Side::default(),
            theirs: Side::default(),
        };
        let total = anchor_sat
            .checked_mul(1000)
            .ok_or(FundingError::AnchorTooSmall)?;
        c.rebalance(total, 0, false)
            .map_err(|_| FundingError::AnchorTooSmall)?;
        Ok(c)
    }

    /// Sets totals (`funder_total`, `nonfunder_total`) and re-splits the fee.
    fn rebalance(
        &mut self,
        funder_total: u64,
        nonfunder_total: u64,
        nonfunder_paying: bool,
    ) -> Result<(), FundingError> {
        let fee_msat = self
            .fee_sat
            .checked_mul(1000)
            .ok_or(FundingError::FeeUnaffordable)?;
        let (fp, ff, np, nff) =
            split_fee(funder_total, nonfunder_total, nonfunder_paying, fee_msat)?;
        let (funder, nonfunder) = if self.we_fund {
            (&mut self.ours, &mut self.theirs)
        } else {
            (&mut self.theirs, &mut self.ours)
        };
        funder.pay_msat = fp;
        funder.fee_msat = ff;
        nonfunder.pay_msat = np;
        nonfunder.fee_msat = nff;
        Ok(())
    }

    /// The side of `who`.
    pub fn side(&self, who: Who) -> &Side {
        match who {
            Who::Us => &self.ours,
            Who::Them => &self.theirs,
        }
    }

    fn side_mut(&mut self, who: Who) -> &mut Side {
        match who {
            Who::Us => &mut self.ours,
            Who::Them => &mut self.theirs,
        }
    }

    fn funder(&self) -> Who {
        if self.we_fund {
            Who::Us
        } else {
            Who::Them
        }
    }

    /// Applies new totals and re-splits the fee; `payer` is the side whose total dropped.
    fn apply_totals(
        &self,
        us_total: u64,
        them_total: u64,
        payer: Option<Who>,
    ) -> Result<CState, FundingError> {
        let mut next = self.clone();
        let funder = self.funder();
        let (f, n) = match funder {
            Who::Us => (us_total, them_total),
            Who::Them => (them_total, us_total),
        };
        next.rebalance(f, n, payer == Some(funder.other()))?;
        Ok(next)
    }

    /// `from` pays `amount_msat` directly to the other side.
    ///
    /// # Errors
    /// The payer cannot afford it (including its fee share).
    pub fn pay(&self, from: Who, amount_msat: u64) -> Result<CState, FundingError> {
        let payer_total = self.side(from).total_msat();
        if amount_msat > payer_total {
            return Err(FundingError::InsufficientFunds {
                needed_msat: amount_msat,
                available_msat: payer_total,
            });
        }
        let (mut us, mut them) = (self.ours.total_msat(), self.theirs.total_msat());
        match from {
            Who::Us => {
                us -= amount_msat;
                them += amount_msat;
            }
            Who::Them => {
                them -= amount_msat;
                us += amount_msat;
            }
        }
        self.apply_totals(us, them, Some(from))
            .map_err(|e| with_amount(e, amount_msat, payer_total))
    }

    /// `from` offers `htlc`: its amount leaves `from`'s balance.
    ///
    /// # Errors
    /// Duplicate hash, or the offerer cannot afford it.
    pub fn add_htlc(&self, from: Who, htlc: Htlc) -> Result<CState, FundingError> {
        if self.find_htlc(&htlc.r_hash).is_some() {
            return Err(FundingError::DuplicateHtlc);
        }
        let amount = u64::from(htlc.amount_msat);
        let payer_total = self.side(from).total_msat();
        if amount > payer_total {
            return Err(FundingError::InsufficientFunds {
                needed_msat: amount,
                available_msat: payer_total,
            });
        }
        let (mut us, mut them) = (self.ours.total_msat(), self.theirs.total_msat());
        match from {
            Who::Us => us -= amount,
            Who::Them => them -= amount,
        }
        let mut next = self
            .apply_totals(us, them, Some(from))
            .map_err(|e| with_amount(e, amount, payer_total))?;
        next.side_mut(from).htlcs.push(htlc);
        Ok(next)
    }

    /// Which side offered the HTLC with this hash, if any.
    pub fn find_htlc(&self, r_hash: &Sha256) -> Option<(Who, Htlc)> {
        for who in [Who::Us, Who::Them] {
            if let Some(h) = self.side(who).htlcs.iter().find(|h| &h.r_hash == r_hash) {
                return Some((who, *h));
            }
        }
        None
    }

    /// Removes the HTLC offered by `offerer`; `fulfilled` pays it to the other side, else back.
    ///
    /// # Errors
    /// [`FundingError::NoSuchHtlc`].
    pub fn remove_htlc(
        &self,
        offerer: Who,
        r_hash: &Sha256,
        fulfilled: bool,
    ) -> Result<CState, FundingError> {
        let pos = self
            .side(offerer)
            .htlcs
            .iter()
            .position(|h| &h.r_hash == r_hash)
            .ok_or(FundingError::NoSuchHtlc)?;
        let amount = u64::from(self.side(offerer).htlcs[pos].amount_msat);
        let (mut us, mut them) = (self.ours.total_msat(), self.theirs.total_msat());
        let to = if fulfilled { offerer.other() } else { offerer };
        match to {
            Who::Us => us += amount,
            Who::Them => them += amount,
        }
        let mut next = self.apply_totals(us, them, None)?;
        next.side_mut(offerer).htlcs.remove(pos);
        Ok(next)
    }

    /// The same state seen from the other side.
    pub fn mirror(&self) -> CState {
        CState {
            anchor_sat: self.anchor_sat,
            fee_sat: self.fee_sat,
            we_fund: !self.we_fund,
            ours: self.theirs.clone(),
            theirs: self.ours.clone(),
        }
    }

    /// Everything in msat: must always equal `anchor_sat × 1000`.
    pub fn sum_msat(&self) -> u64 {
        self.ours.total_msat()
            + self.theirs.total_msat()
            + self.ours.htlc_msat()
            + self.theirs.htlc_msat()
    }

    /// Close amounts `(ours_sat, theirs_sat)` after splitting `close_fee_sat` the same way.
    ///
    /// # Errors
    /// HTLCs are pending, or the fee cannot be paid.
    pub fn close_amounts(&self, close_fee_sat: u64) -> Result<(u64, u64), FundingError> {
        if !self.ours.htlcs.is_empty() || !self.theirs.htlcs.is_empty() {
            return Err(FundingError::NoSuchHtlc);
        }
        let mut c = self.clone();
        c.fee_sat = close_fee_sat;
        let next = c.apply_totals(self.ours.total_msat(), self.theirs.total_msat(), None)?;
        Ok((next.ours.pay_msat / 1000, next.theirs.pay_msat / 1000))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin_hashes::Hash;

    #[test]
    fn reference_commit_tx_arithmetic() {
        // packets_and_encodings.json → commit_tx: anchor 999999 sat, fee 50000 sat,
        // A funds, then A adds an HTLC of 1000000 msat.
        let v: serde_json::Value = serde_json::from_str(include_str!(
            "../../../../shared/vectors/packets_and_encodings.json"
        ))
        .unwrap();
        let c = &v["commit_tx"];
        let a = CState::initial(999_999, 50_000, true).unwrap();
        assert_eq!(a.ours.pay_msat, 949_999_000);
        let htlc = Htlc {
            amount_msat: 1_000_000,
            r_hash: Sha256::hash(b"r"),
            expiry: Locktime::Seconds(1_500_000_000),
        };
        let a = a.add_htlc(Who::Us, htlc).unwrap();
        assert_eq!(a.ours.pay_msat, c["a_pay_msat"].as_u64().unwrap());
        assert_eq!(a.ours.fee_msat, c["a_fee_msat"].as_u64().unwrap());
        assert_eq!(a.theirs.pay_msat, c["b_pay_msat"].as_u64().unwrap());
        assert_eq!(a.theirs.fee_msat, c["b_fee_msat"].as_u64().unwrap());
        assert_eq!(a.sum_msat(), 999_999_000);
        // The close vector: to_us 939999, to_them 50000 is a 60000 sat fee split after a
        // 50000 sat payment... check our split gives the non-funder half when it can.
        let paid = CState::initial(1_000_000, 10_000, true)
            .unwrap()
            .pay(Who::Us, 100_000_000)
            .unwrap();
        assert_eq!(paid.theirs.fee_msat, 5_000_000);
        assert_eq!(paid.theirs.pay_msat, 95_000_000);
        assert_eq!(paid.ours.pay_msat, 1_000_000_000 - 100_000_000 - 5_000_000);
        assert_eq!(paid.close_amounts(2_000).unwrap(), (899_000, 99_000));
    }

    #[test]
    fn nonfunder_paying_must_afford_half_fee() {
        let c = CState::initial(1_000_000, 10_000, true).unwrap();
        let c = c.pay(Who::Us, 6_000_000).unwrap();
        // Them: total 6_000_000, pays fee share 5_000_000 → pay 1_000_000.
        assert_eq!(c.theirs.pay_msat, 1_000_000);
        // Paying 2_000_000 would leave 4_000_000 < 5_000_000 half fee: refused.
        assert!(matches!(
            c.pay(Who::Them, 2_000_000),
            Err(FundingError::InsufficientFunds { .. })
        ));
        assert!(c.pay(Who::Them, 1_000_000).is_ok());
        assert!(c.pay(Who::Them, 7_000_000).is_err());
    }

    #[test]
    fn htlc_fulfil_and_fail_move_money() {
        let c = CState::initial(1_000_000, 10_000, false).unwrap();
        assert_eq!(c.theirs.pay_msat, 990_000_000);
        let h = Htlc {
            amount_msat: 50_000_000,
            r_hash: Sha256::hash(b"x"),
            expiry: Locktime::Blocks(100),
        };
        let c1 = c.add_htlc(Who::Them, h).unwrap();
        assert_eq!(c1.sum_msat(), 1_000_000_000);
        assert_eq!(c1.add_htlc(Who::Them, h), Err(FundingError::DuplicateHtlc));
        let ok = c1.remove_htlc(Who::Them, &h.r_hash, true).unwrap();
        assert_eq!(ok.ours.total_msat(), 50_000_000);
        let back = c1.remove_htlc(Who::Them, &h.r_hash, false).unwrap();
        assert_eq!(back, c);
        assert_eq!(
            c1.remove_htlc(Who::Us, &h.r_hash, true),
            Err(FundingError::NoSuchHtlc)
        );
        assert_eq!(c1.mirror().mirror(), c1);
    }
}
