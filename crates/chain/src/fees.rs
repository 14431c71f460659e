//! The fee policy every estimate goes through: a floor that relays and
//! confirms, a ceiling that caps a runaway estimate, and the fallback used
//! when the node has no estimate at all.
//!
//! Why a floor of our own. Bitcoin Core 30 lowered `-minrelaytxfee` and
//! `-incrementalrelayfee` to 100 sat/kvB (0.1 sat/vB), so a fresh node's
//! `getmempoolinfo.mempoolminfee` is 0.000001 BTC/kvB. A transaction built at
//! that rate relays through upgraded nodes but is refused by every node still
//! on the old 1 sat/vB default and by miners that kept it; it may never
//! confirm. Core Lightning and LND both keep a floor of 253 sat/kw (just over
//! 1 sat/vB) whatever the node reports. The default floor here is 1 sat/vB
//! for the same reason.

use bitcoin::FeeRate;

/// Why a fee policy or a fee rate given on the command line is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FeePolicyError {
    /// The floor is above the ceiling.
    #[error("the fee floor ({floor} sat/kvB) is above the fee ceiling ({ceiling} sat/kvB)")]
    FloorAboveCeiling {
        /// The floor in sat/kvB.
        floor: u64,
        /// The ceiling in sat/kvB.
        ceiling: u64,
    },
    /// The fallback is outside `floor..=ceiling`.
    #[error("the fee fallback ({fallback} sat/kvB) is outside floor..=ceiling ({floor}..={ceiling} sat/kvB)")]
    FallbackOutOfRange {
        /// The fallback in sat/kvB.
        fallback: u64,
        /// The floor in sat/kvB.
        floor: u64,
        /// The ceiling in sat/kvB.
        ceiling: u64,
    },
    /// A fee rate that is not a decimal number of sat/vB with at most three
    /// decimals (1 sat/kvB is the finest rate Core expresses).
    #[error(
        "fee rate {0:?} is not a number of sat/vB with at most 3 decimals (e.g. 1, 0.5, 2.25)"
    )]
    BadRate(String),
}

/// The bounds every fee estimate is held to (see the module docs).
///
/// An estimate becomes `max(floor, mempoolminfee, estimate)`, capped by
/// `ceiling`; without an estimate, `max(fallback, mempoolminfee)`, capped
/// by `ceiling`. Build it with [`FeePolicy::new`] (which checks
/// `floor <= fallback <= ceiling`) or take [`FeePolicy::default`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FeePolicy {
    floor: FeeRate,
    ceiling: FeeRate,
    fallback: FeeRate,
}

impl FeePolicy {
    /// Default floor: 1 sat/vB (Core's `-minrelaytxfee` before version 30,
    /// still the floor of Core Lightning and LND).
    pub const DEFAULT_FLOOR: FeeRate = FeeRate::from_sat_per_kwu(250);
    /// Default fallback when the node has no estimate: 2 sat/vB, the rate
    /// `docs/node.md` and `docs/chain.md` promise (and the rounds service's
    /// default `fee_rate_sat_vb`).
    pub const DEFAULT_FALLBACK: FeeRate = FeeRate::from_sat_per_kwu(500);
    /// Default ceiling: 500 sat/vB. Above mainnet's next-block rates
    /// outside brief spikes (such as the April 2024 halving block), and 20
    /// times below Core's `maxfeerate` (10,000 sat/vB), so a broken
    /// estimate cannot burn a large share of a small transaction's value.
    pub const DEFAULT_CEILING: FeeRate = FeeRate::from_sat_per_kwu(125_000);

    /// A policy with the given bounds.
    ///
    /// # Errors
    /// [`FeePolicyError::FloorAboveCeiling`] or
    /// [`FeePolicyError::FallbackOutOfRange`].
    pub fn new(
        floor: FeeRate,
        ceiling: FeeRate,
        fallback: FeeRate,
    ) -> Result<Self, FeePolicyError> {
        let kvb = |r: FeeRate| r.to_sat_per_kwu() * 4;
        if floor > ceiling {
            return Err(FeePolicyError::FloorAboveCeiling {
                floor: kvb(floor),
                ceiling: kvb(ceiling),
            });
        }
        if fallback < floor || fallback > ceiling {
            return Err(FeePolicyError::FallbackOutOfRange {
                fallback: kvb(fallback),
                floor: kvb(floor),
                ceiling: kvb(ceiling),
            });
        }
        Ok(Self {
            floor,
            ceiling,
            fallback,
        })
    }

    /// The least rate any estimate gives.
    pub fn floor(&self) -> FeeRate {
        self.floor
    }

    /// The most any estimate gives.
    pub fn ceiling(&self) -> FeeRate {
        self.ceiling
    }

    /// The rate used when the node has no estimate.
    pub fn fallback(&self) -> FeeRate {
        self.fallback
    }

    /// The rate to build at, from the node's `estimate` (`None`: the node
    /// has none) and its current `mempool_min` (`getmempoolinfo.mempoolminfee`,
    /// `None` if unknown): never below the floor or the mempool's minimum,
    /// never above the ceiling.
    pub fn apply(&self, estimate: Option<FeeRate>, mempool_min: Option<FeeRate>) -> FeeRate {
        let base = match estimate {
            Some(rate) => rate.max(self.floor),
            None => self.fallback,
        };
        base.max(mempool_min.unwrap_or(FeeRate::ZERO))
            .min(self.ceiling)
    }
}

impl Default for FeePolicy {
    /// Floor 1 sat/vB, fallback 2 sat/vB, ceiling 500 sat/vB.
    fn default() -> Self {
        Self {
            floor: Self::DEFAULT_FLOOR,
            ceiling: Self::DEFAULT_CEILING,
            fallback: Self::DEFAULT_FALLBACK,
        }
    }
}

/// Parses a fee rate in sat/vB with at most three decimals (`"1"`, `"0.1"`,
/// `"2.25"`) exactly: 0.001 sat/vB is 1 sat/kvB, Core's finest unit. The
/// result is rounded up to whole sat/kwu (0.1 sat/vB = 100 sat/kvB = 25
/// sat/kwu exactly; 0.001 sat/vB becomes 1 sat/kwu), so a rate never
/// pays less than asked.
///
/// # Errors
/// [`FeePolicyError::BadRate`] for anything else (negative, more decimals,
/// not a number, absurdly large).
pub fn parse_sat_per_vb(text: &str) -> Result<FeeRate, FeePolicyError> {
    let bad = || FeePolicyError::BadRate(text.to_owned());
    let t = text.trim();
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    if whole.is_empty() && frac.is_empty()
        || frac.len() > 3
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad())?
    };
    let frac_kvb: u64 = format!("{frac:0<3}").parse().map_err(|_| bad())?;
    let sat_per_kvb = whole
        .checked_mul(1_000)
        .and_then(|w| w.checked_add(frac_kvb))
        .ok_or_else(bad)?;
    Ok(FeeRate::from_sat_per_kwu(sat_per_kvb.div_ceil(4)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vb(n: u64) -> FeeRate {
        FeeRate::from_sat_per_kwu(n * 250)
    }

    #[test]
    fn estimates_are_bounded_and_the_fallback_applies_without_one() {
        let p = FeePolicy::default();
        let tenth = FeeRate::from_sat_per_kwu(25);
        // Core 30 without data: no estimate, mempoolminfee 0.1 sat/vB.
        assert_eq!(p.apply(None, Some(tenth)), vb(2));
        assert_eq!(p.apply(None, None), vb(2));
        // An estimate below the floor is raised to it.
        assert_eq!(p.apply(Some(tenth), Some(tenth)), vb(1));
        // A full mempool's minimum wins over estimate, floor and fallback.
        assert_eq!(p.apply(Some(vb(3)), Some(vb(7))), vb(7));
        assert_eq!(p.apply(None, Some(vb(7))), vb(7));
        // The ceiling caps everything.
        assert_eq!(p.apply(Some(vb(900)), None), vb(500));
        assert_eq!(p.apply(None, Some(vb(900))), vb(500));
        assert_eq!(p.apply(Some(vb(40)), Some(tenth)), vb(40));
    }

    #[test]
    fn bounds_are_checked() {
        assert!(matches!(
            FeePolicy::new(vb(5), vb(4), vb(4)),
            Err(FeePolicyError::FloorAboveCeiling {
                floor: 5_000,
                ceiling: 4_000
            })
        ));
        assert!(matches!(
            FeePolicy::new(vb(2), vb(4), vb(1)),
            Err(FeePolicyError::FallbackOutOfRange { .. })
        ));
        let p = FeePolicy::new(vb(1), vb(1), vb(1)).unwrap();
        assert_eq!(p.apply(Some(vb(50)), None), vb(1));
    }

    #[test]
    fn rates_parse_exactly() {
        assert_eq!(
            parse_sat_per_vb("1").unwrap(),
            FeeRate::from_sat_per_kwu(250)
        );
        assert_eq!(
            parse_sat_per_vb("0.1").unwrap(),
            FeeRate::from_sat_per_kwu(25)
        );
        assert_eq!(
            parse_sat_per_vb(".5").unwrap(),
            FeeRate::from_sat_per_kwu(125)
        );
        assert_eq!(
            parse_sat_per_vb("2.25").unwrap(),
            FeeRate::from_sat_per_kwu(563)
        );
        assert_eq!(
            parse_sat_per_vb("0.001").unwrap(),
            FeeRate::from_sat_per_kwu(1)
        );
        assert_eq!(
            parse_sat_per_vb("500").unwrap(),
            FeeRate::from_sat_per_kwu(125_000)
        );
        for bad in [
            "",
            ".",
            "-1",
            "1e3",
            "0.0001",
            "abc",
            "1.2.3",
            "99999999999999999999",
        ] {
            assert!(parse_sat_per_vb(bad).is_err(), "{bad}");
        }
    }
}
