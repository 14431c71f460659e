//! The channel's time and fee rules, computed from our limits and the chain's height:
//! when an HTLC expiry leaves room for a claim, when a claim is due, and what closes,
//! commitments and sweeps must pay.

use bitcoin::Transaction;
use wire::{Locktime, Preimage, Sha256};

use crate::funding::Htlc;
use crate::script::cltv_value;
use crate::tx::{close_weight, commitment_weight_bound, sweep_weight, Commitment, SweepInput};

use super::types::TimeUnit;
use super::{delay_in, Ctx};

impl Ctx<'_> {
    pub(super) fn our_rev_hash(&self, n: u64) -> Sha256 {
        self.preimages
            .revocation_hash(&self.secrets.revocation_seed, n)
    }

    pub(super) fn our_preimage(&self, n: u64) -> Preimage {
        self.preimages.preimage(&self.secrets.revocation_seed, n)
    }

    pub(super) fn expired(&self, h: &Htlc, now: u64) -> bool {
        match h.expiry {
            Locktime::Blocks(b) => self.height >= b,
            Locktime::Seconds(t) => now >= u64::from(t),
        }
    }

    pub(super) fn expiry_acceptable(&self, expiry: Locktime, now: u64) -> bool {
        if cltv_value(expiry).is_err() {
            return false;
        }
        let max = u64::from(self.config.max_htlc_expiry_blocks);
        match expiry {
            Locktime::Blocks(b) => b > self.height && u64::from(b) <= u64::from(self.height) + max,
            Locktime::Seconds(t) => u64::from(t) > now && u64::from(t) <= now + max * 600,
        }
    }

    /// Whether an HTLC that the receiver claims with R under `claim_delay_csv` leaves it
    /// room to do so on chain: its expiry is at least the delay plus our margin away,
    /// counted in the expiry's unit (the channel's: see [`TimeUnit`]).
    pub(super) fn expiry_leaves_claim_room(
        &self,
        expiry: Locktime,
        claim_delay_csv: u32,
        now: u64,
    ) -> bool {
        let delay = delay_in(TimeUnit::of(expiry), claim_delay_csv);
        let margin = u64::from(self.config.htlc_claim_margin_blocks);
        match expiry {
            Locktime::Blocks(b) => u64::from(b) >= u64::from(self.height) + delay + margin,
            // The margin is configured in blocks: ten minutes each.
            Locktime::Seconds(t) => u64::from(t) >= now + delay + margin * 600,
        }
    }

    /// Whether the peer's HTLC expiring at `expiry` passes our expiry checks at this
    /// context's height: a usable expiry in the channel's unit, not too far, and room for
    /// our claim with R under `claim_delay_csv`. The add handler's rule and
    /// [`super::Channel::add_expiry_passes_at`]'s are this one.
    pub(super) fn their_expiry_passes(
        &self,
        expiry: Locktime,
        claim_delay_csv: u32,
        now: u64,
    ) -> bool {
        self.check_expiry_unit(expiry, claim_delay_csv).is_ok()
            && self.expiry_acceptable(expiry, now)
            && self.expiry_leaves_claim_room(expiry, claim_delay_csv, now)
    }

    /// Whether the claim deadline of an HTLC offered to us has come: its expiry is within
    /// the delay our claim with R waits for (`claim_delay_csv`) plus half our margin. From
    /// then on R is not revealed off chain ([`Channel::fulfill_htlc`]), and a known R is
    /// claimed on chain ([`Channel::deadlines`]): acceptance demanded the whole margin, so
    /// the peer had half of it to take the fulfil; the other half is for our commitment
    /// and claim to confirm before its refund path opens at the expiry.
    ///
    /// [`Channel::fulfill_htlc`]: super::Channel::fulfill_htlc
    /// [`Channel::deadlines`]: super::Channel::deadlines
    pub(super) fn claim_deadline_passed(
        &self,
        expiry: Locktime,
        claim_delay_csv: u32,
        now: u64,
    ) -> bool {
        let lead = self.claim_lead(expiry, claim_delay_csv);
        match expiry {
            Locktime::Blocks(b) => u64::from(self.height) + lead >= u64::from(b),
            Locktime::Seconds(t) => now + lead >= u64::from(t),
        }
    }

    /// How long before `expiry` an HTLC offered to us is due on chain (see
    /// [`Ctx::claim_deadline_passed`]), in the expiry's unit (a margin block counts 600 s).
    pub(super) fn claim_lead(&self, expiry: Locktime, claim_delay_csv: u32) -> u64 {
        let delay = delay_in(TimeUnit::of(expiry), claim_delay_csv);
        let half = u64::from(self.config.htlc_claim_margin_blocks.div_ceil(2));
        match expiry {
            Locktime::Blocks(_) => delay + half,
            Locktime::Seconds(_) => delay + half * 600,
        }
    }

    /// Refuses an expiry that is not in the unit of the delay its receiver's claim with R
    /// waits for (`claim_delay_csv`; one unit per channel: both delays share it).
    pub(super) fn check_expiry_unit(
        &self,
        expiry: Locktime,
        claim_delay_csv: u32,
    ) -> Result<(), TimeUnit> {
        let unit = TimeUnit::of_csv(claim_delay_csv);
        if TimeUnit::of(expiry) == unit {
            Ok(())
        } else {
            Err(unit)
        }
    }

    /// The close fee range: the minimum relay fee of `tx`, and our share of the capacity.
    pub(super) fn close_fee_range(&self, tx: &Transaction, anchor_sat: u64) -> (u64, u64) {
        let min = (close_weight(tx) * self.config.min_relay_feerate_sat_per_kw).div_ceil(1000);
        let max = anchor_sat.saturating_mul(self.config.max_close_fee_permille) / 1000;
        (min, max)
    }

    /// A fair fee for the close `tx`: our fee rate (never below the relay minimum) × its
    /// signed weight. We propose it, and never pay more than it of any close.
    pub(super) fn fair_close_fee(&self, tx: &Transaction) -> u64 {
        let rate = self
            .config
            .sweep_feerate_sat_per_kw
            .max(self.config.min_relay_feerate_sat_per_kw);
        (close_weight(tx) * rate).div_ceil(1000)
    }

    /// The least fee that relays a commitment like `c` whatever the later payments: the
    /// minimum relay fee rate times [`commitment_weight_bound`].
    pub(super) fn commitment_min_fee(&self, c: &Commitment) -> u64 {
        (commitment_weight_bound(c) * self.config.min_relay_feerate_sat_per_kw).div_ceil(1000)
    }

    pub(super) fn sweep_fee(&self, inputs: &[SweepInput]) -> u64 {
        sweep_weight(inputs) * self.config.sweep_feerate_sat_per_kw / 1000
    }

    /// What one more input adds to a sweep's fee.
    pub(super) fn input_fee(&self, input: &SweepInput) -> u64 {
        let alone = sweep_weight(std::slice::from_ref(input)) - sweep_weight(&[]);
        (alone * self.config.sweep_feerate_sat_per_kw).div_ceil(1000)
    }
}
