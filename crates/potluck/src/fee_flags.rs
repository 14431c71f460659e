//! The fee policy flags shared by `potluck serve` and `potluck node`: the floor,
//! ceiling and fallback every fee estimate is held to (`chain::FeePolicy`).

use bitcoin::FeeRate;
use chain::fees::parse_sat_per_vb;
use chain::FeePolicy;

/// Fee policy flags (each also `POTLUCK_<FLAG>`); rates in sat/vB with at most 3 decimals.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Fee policy")]
pub struct FeeFlags {
    /// Least fee rate of every transaction built, sat/vB: an estimate (or the node's
    /// mempoolminfee) below it is raised to it. Bitcoin Core 30 relays from 0.1 sat/vB, but
    /// nodes and miners on the older 1 sat/vB default refuse such transactions.
    #[arg(long, env = "POTLUCK_FEE_FLOOR_SAT_VB", default_value = "1", value_parser = parse_sat_per_vb)]
    pub fee_floor_sat_vb: FeeRate,
    /// Most any fee estimate gives, sat/vB (caps a runaway estimate).
    #[arg(long, env = "POTLUCK_FEE_CEILING_SAT_VB", default_value = "500", value_parser = parse_sat_per_vb)]
    pub fee_ceiling_sat_vb: FeeRate,
    /// Fee rate when the Bitcoin node has no estimate (a fresh node: "Insufficient data"), sat/vB.
    #[arg(long, env = "POTLUCK_FEE_FALLBACK_SAT_VB", default_value = "2", value_parser = parse_sat_per_vb)]
    pub fee_fallback_sat_vb: FeeRate,
}

impl FeeFlags {
    /// The policy these flags describe.
    ///
    /// # Errors
    /// A floor above the ceiling, or a fallback outside them.
    pub fn policy(&self) -> Result<FeePolicy, chain::FeePolicyError> {
        FeePolicy::new(
            self.fee_floor_sat_vb,
            self.fee_ceiling_sat_vb,
            self.fee_fallback_sat_vb,
        )
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        fees: FeeFlags,
    }

    #[test]
    fn defaults_are_the_documented_policy_and_bounds_are_checked() {
        let w = Wrapper::try_parse_from(["x"]).unwrap();
        assert_eq!(w.fees.policy().unwrap(), FeePolicy::default());
        let w = Wrapper::try_parse_from([
            "x",
            "--fee-floor-sat-vb",
            "0.5",
            "--fee-fallback-sat-vb",
            "3.25",
            "--fee-ceiling-sat-vb",
            "100",
        ])
        .unwrap();
        let p = w.fees.policy().unwrap();
        assert_eq!(
            (p.floor(), p.fallback(), p.ceiling()),
            (
                FeeRate::from_sat_per_kwu(125),
                FeeRate::from_sat_per_kwu(813),
                FeeRate::from_sat_per_kwu(25_000)
            )
        );
        let w = Wrapper::try_parse_from(["x", "--fee-floor-sat-vb", "3"]).unwrap();
        assert!(
            w.fees.policy().is_err(),
            "a floor above the fallback is refused"
        );
        assert!(Wrapper::try_parse_from(["x", "--fee-floor-sat-vb", "-1"]).is_err());
        assert!(Wrapper::try_parse_from(["x", "--fee-ceiling-sat-vb", "1.0001"]).is_err());
    }
}
