//! Paying along a route (issue 30): `pay --route NODE,… R_HASH AMOUNT_MSAT` builds the
//! onion that tells each hop what to forward, and offers the first hop its HTLC. The
//! amounts and expiries come from the pure [`plan`], tested by the table below it.

use std::sync::Arc;

use bitcoin::hashes::Hash as _;
use secp256k1::{PublicKey, SecretKey};
use wire::{Locktime, Sha256};

use super::registry::Slot;
use super::Manager;
use crate::control_error::ControlError;

/// A hop's fee schedule and expiry delta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Schedule {
    /// The fixed part of the fee, in millisatoshi.
    pub(crate) base_msat: u64,
    /// The proportional part: millionths of the amount forwarded.
    pub(crate) per_millionth: u64,
    /// Blocks the hop keeps between the expiry it receives and the one it offers.
    pub(crate) expiry_delta: u32,
}

impl Schedule {
    /// What a hop with this schedule assumes of every other hop until it learns better
    /// (there is no gossip): 1,000 msat plus 10 millionths, 40 blocks (BOLT 7 style
    /// figures, Core Lightning's default fee).
    pub(crate) const ASSUMED: Schedule = Schedule {
        base_msat: 1_000,
        per_millionth: 10,
        expiry_delta: 40,
    };

    /// The fee for forwarding `out_msat`: `base + floor(out × per_millionth / 1,000,000)`
    /// msat, computed on the outgoing amount (BOLT 7's rule).
    pub(crate) fn fee(&self, out_msat: u64) -> u64 {
        let proportional = u128::from(out_msat) * u128::from(self.per_millionth) / 1_000_000;
        self.base_msat
            .saturating_add(u64::try_from(proportional).unwrap_or(u64::MAX))
    }
}

/// The HTLC each hop of a route of `hops` nodes is offered, first hop first: the last
/// receives `amount_msat` until `final_expiry`; each earlier one that plus the fee and
/// the expiry delta of the hop after it, by `schedule`.
pub(crate) fn plan(
    hops: usize,
    amount_msat: u64,
    final_expiry: u32,
    schedule: &Schedule,
) -> Vec<(u64, u32)> {
    let mut out = vec![(amount_msat, final_expiry)];
    for _ in 1..hops {
        let (amount, expiry) = out[out.len() - 1];
        out.push((
            amount.saturating_add(schedule.fee(amount)),
            expiry.saturating_add(schedule.expiry_delta),
        ));
    }
    out.reverse();
    out
}

impl Manager {
    /// `pay --route NODE,… R_HASH AMOUNT_MSAT`: the first node must be a peer with a
    /// channel; the last receives `amount_msat`. Returns the first hop's channel once the
    /// HTLC is offered (the payment then completes when the route fulfils it).
    pub(crate) async fn pay_route(
        &self,
        route: &[PublicKey],
        r_hash: Sha256,
        amount_msat: u64,
    ) -> Result<Arc<Slot>, ControlError> {
        let first = *route
            .first()
            .ok_or_else(|| ControlError::BadRoute("an empty route".into()))?;
        let height = self.chain.tip().await.map_err(ControlError::Chain)?.height;
        // The final hop must be able to claim with R on chain before the expiry: a peer
        // configured like us demands our delay plus the claim margin (docs/channel.md);
        // twice the margin leaves the HTLC the blocks it takes to arrive.
        let config = &self.settings.channel;
        let delay = match config.delay {
            Locktime::Blocks(b) => b,
            Locktime::Seconds(s) => s.div_ceil(600),
        };
        let final_expiry = height + delay + 2 * config.htlc_claim_margin_blocks;
        let amounts = plan(route.len(), amount_msat, final_expiry, &Schedule::ASSUMED);
        let payloads: Vec<Vec<u8>> = (0..route.len())
            .map(|i| {
                let (amount, expiry) = amounts.get(i + 1).copied().unwrap_or(amounts[i]);
                onion::HopPayload {
                    amount_msat: u32::try_from(amount).unwrap_or(u32::MAX),
                    expiry: Locktime::Blocks(expiry),
                    next_node: route.get(i + 1).copied(),
                }
                .encode()
            })
            .collect();
        let hops: Vec<onion::Hop<'_>> = route
            .iter()
            .zip(&payloads)
            .map(|(node_id, payload)| onion::Hop {
                node_id: *node_id,
                payload,
            })
            .collect();
        let mut session = [0u8; 32];
        getrandom::fill(&mut session)
            .map_err(|e| ControlError::Internal(format!("no randomness: {e}")))?;
        let session = SecretKey::from_slice(&session)
            .map_err(|e| ControlError::Internal(format!("session key: {e}")))?;
        let built = onion::build(
            &super::invoice::SECP,
            &session,
            &hops,
            r_hash.as_byte_array(),
        )
        .map_err(|e| ControlError::BadRoute(e.to_string()))?;
        let (amount, expiry) = amounts[0];
        let command = super::Command::AddRoutedHtlc {
            amount_msat: amount,
            r_hash,
            expiry,
            onion: built.packet,
        };
        tracing::info!(
            hops = route.len(),
            amount_msat,
            first_htlc_msat = amount,
            expiry,
            "paying along a route"
        );
        self.command(&first, command).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fees_and_expiries_along_a_route() {
        let s = Schedule {
            base_msat: 1_000,
            per_millionth: 100,
            expiry_delta: 40,
        };
        // fee = 1,000 + floor(out × 100 / 1,000,000), on the outgoing amount.
        assert_eq!(s.fee(0), 1_000);
        assert_eq!(s.fee(9_999), 1_000);
        assert_eq!(s.fee(10_000), 1_001);
        assert_eq!(s.fee(5_000_000), 1_500);
        // (hops, amount, the HTLC offered to each hop: msat and expiry).
        type Row = (usize, u64, Vec<(u64, u32)>);
        let table: &[Row] = &[
            (1, 5_000_000, vec![(5_000_000, 500)]),
            (2, 5_000_000, vec![(5_001_500, 540), (5_000_000, 500)]),
            // The second hop's fee is on what it forwards, 5,001,500: 1,500 (floor of 500.15).
            (
                3,
                5_000_000,
                vec![(5_003_000, 580), (5_001_500, 540), (5_000_000, 500)],
            ),
        ];
        for (hops, amount, want) in table {
            assert_eq!(&plan(*hops, *amount, 500, &s), want, "{hops} hops");
        }
        let huge = Schedule {
            base_msat: u64::MAX,
            per_millionth: u64::MAX,
            expiry_delta: u32::MAX,
        };
        assert_eq!(huge.fee(u64::MAX), u64::MAX, "saturates, never wraps");
    }
}
