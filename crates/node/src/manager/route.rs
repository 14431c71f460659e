//! Paying along a route (issue 30): `pay --route NODE,… R_HASH AMOUNT_MSAT` builds the
//! onion that tells each hop what to forward, and offers the first hop its HTLC. The
//! amounts and expiries come from the pure [`plan`], tested by the table below it.

use std::collections::HashMap;
use std::sync::Arc;

use bitcoin::hashes::Hash as _;
use secp256k1::{PublicKey, SecretKey};
use wire::{Locktime, Sha256};

use tokio::sync::oneshot;

use super::registry::{lock, Slot};
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

    /// [`Schedule::ASSUMED`] for a hop whose channels are configured like ours: its
    /// expiry gap is at least what its forwarding check demands to resolve on chain in
    /// time (`forward::check`: the on-chain blocks plus both its channels' delays), which
    /// with production delays (144 blocks) is far above the assumed 40.
    pub(crate) fn assumed_like(config: &channel::ChannelConfig) -> Schedule {
        let gap = super::forward::onchain_blocks(config)
            .saturating_add(delay_blocks(config).saturating_mul(2));
        Schedule {
            expiry_delta: Schedule::ASSUMED.expiry_delta.max(gap),
            ..Schedule::ASSUMED
        }
    }

    /// The fee for forwarding `out_msat`: `base + floor(out × per_millionth / 1,000,000)`
    /// msat, computed on the outgoing amount (BOLT 7's rule).
    pub(crate) fn fee(&self, out_msat: u64) -> u64 {
        let proportional = u128::from(out_msat) * u128::from(self.per_millionth) / 1_000_000;
        self.base_msat
            .saturating_add(u64::try_from(proportional).unwrap_or(u64::MAX))
    }
}

/// The HTLC each node of a route is offered, first hop first: the last receives
/// `amount_msat` until `final_expiry`; each earlier one that plus the fee and the expiry
/// delta of its own schedule, `forwarders[i]` being the schedule of the route's `i`-th
/// node (every node but the last forwards).
pub(crate) fn plan(
    amount_msat: u64,
    final_expiry: u32,
    forwarders: &[Schedule],
) -> Vec<(u64, u32)> {
    let mut out = vec![(amount_msat, final_expiry)];
    for schedule in forwarders.iter().rev() {
        let (amount, expiry) = out[out.len() - 1];
        out.push((
            amount.saturating_add(schedule.fee(amount)),
            expiry.saturating_add(schedule.expiry_delta),
        ));
    }
    out.reverse();
    out
}

/// The most a payment pays in fees: 0.5% of `amount_msat`, at least 5,000 msat (Core
/// Lightning's `maxfeepercent` and `exemptfee` defaults). A hop that names a dearer
/// schedule in its decline is not paid it.
pub(crate) fn max_fee_msat(amount_msat: u64) -> u64 {
    (amount_msat / 200).max(5_000)
}

impl Schedule {
    /// The schedule a hop named in its `insufficient_funds` decline: its fixed part in
    /// satoshi (the seed's smallest unit, rounded up by the hop), its proportional part in
    /// millionths; a part not sent, or negative, counts as none. The expiry delta is not
    /// carried: the assumed one stays.
    pub(crate) fn learnt(funding: &wire::Funding) -> Schedule {
        let fixed_sat = funding
            .fixed
            .and_then(|f| u64::try_from(f).ok())
            .unwrap_or(0);
        let per_millionth = funding
            .per_micro_unit
            .and_then(|p| u64::try_from(p).ok())
            .unwrap_or(0);
        Schedule {
            base_msat: fixed_sat.saturating_mul(1000),
            per_millionth,
            expiry_delta: Schedule::ASSUMED.expiry_delta,
        }
    }
}

/// Our channels' delay in blocks (a delay in time counted ten minutes a block, as the
/// channel counts across units).
fn delay_blocks(config: &channel::ChannelConfig) -> u32 {
    match config.delay {
        Locktime::Blocks(b) => b,
        Locktime::Seconds(s) => s.div_ceil(600),
    }
}

/// How a payment along a route ended, as far as its payer can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PaymentEnd {
    /// The first hop fulfilled our HTLC: the payee has the money, the hops their fees.
    Paid,
    /// Our HTLC came back (routefailed, or timed out): nothing moved.
    Failed,
}

/// A payment along a route, its first HTLC offered.
pub(crate) struct RoutedPayment {
    /// The first hop's channel.
    pub(crate) slot: Arc<Slot>,
    /// What the payee receives, in msat.
    pub(crate) amount_msat: u64,
    /// The fees the first HTLC carries for the hops, in msat.
    pub(crate) fee_msat: u64,
    /// 1, or 2 when the first hop declined the first with its schedule.
    pub(crate) attempts: u32,
    /// Told when the first HTLC ends (dropped if the node forgets it: a restart).
    pub(crate) end: oneshot::Receiver<PaymentEnd>,
}

/// The payments along a route waiting for their first HTLC to end, by its hash.
#[derive(Default)]
pub(crate) struct PaymentEnds {
    waiting: std::sync::Mutex<HashMap<Sha256, oneshot::Sender<PaymentEnd>>>,
}

impl Manager {
    /// `pay --route NODE,… R_HASH AMOUNT_MSAT`: the first node must be a peer with a
    /// channel; the last receives `amount_msat`. Returns once the first HTLC is offered
    /// (the payment then completes when the route fulfils it). When the first hop
    /// declines with `insufficient_funds`, its schedule is learnt and the payment tried
    /// once more with it (fee discovery without gossip); a second decline is the answer.
    pub(crate) async fn pay_route(
        &self,
        route: &[PublicKey],
        r_hash: Sha256,
        amount_msat: u64,
    ) -> Result<RoutedPayment, ControlError> {
        if route.is_empty() {
            return Err(ControlError::BadRoute("an empty route".into()));
        }
        let height = self.chain.tip().await.map_err(ControlError::Chain)?.height;
        // The final hop must be able to claim with R on chain before the expiry: a peer
        // configured like us demands our delay plus the claim margin (docs/channel.md);
        // twice the margin leaves the HTLC the blocks it takes to arrive.
        let config = &self.settings.channel;
        let final_expiry = height + delay_blocks(config) + 2 * config.htlc_claim_margin_blocks;
        let mut forwarders = vec![Schedule::assumed_like(config); route.len() - 1];
        let mut attempts = 1;
        loop {
            let amounts = plan(amount_msat, final_expiry, &forwarders);
            let (end_tx, end) = oneshot::channel();
            lock(&self.payment_ends.waiting).insert(r_hash, end_tx);
            let offered = self.offer_route(route, r_hash, &amounts).await;
            let fee_msat = amounts[0].0 - amount_msat;
            let declined = match offered {
                Ok(slot) => {
                    return Ok(RoutedPayment {
                        slot,
                        amount_msat,
                        fee_msat,
                        attempts,
                        end,
                    })
                }
                Err(e) => {
                    lock(&self.payment_ends.waiting).remove(&r_hash);
                    e
                }
            };
            // Only the first hop's decline names a schedule, and it is learnt once.
            let (peer, base_msat, per_millionth) = match declined {
                ControlError::FeeTooLow {
                    peer,
                    base_msat,
                    per_millionth,
                } if attempts == 1 && !forwarders.is_empty() => (peer, base_msat, per_millionth),
                other => return Err(other),
            };
            forwarders[0] = Schedule {
                base_msat,
                per_millionth,
                ..forwarders[0]
            };
            let retry_fee_msat = plan(amount_msat, final_expiry, &forwarders)[0].0 - amount_msat;
            let max = max_fee_msat(amount_msat);
            if retry_fee_msat > max {
                return Err(ControlError::FeeAboveMax {
                    peer,
                    fee_msat: retry_fee_msat,
                    max_fee_msat: max,
                });
            }
            tracing::info!(%peer, base_msat, per_millionth, fee_msat, retry_fee_msat, "the first hop declined our fee with its schedule; paying once more with it");
            attempts += 1;
        }
    }

    /// Builds the onion for `amounts` along `route` and offers the first hop its HTLC.
    async fn offer_route(
        &self,
        route: &[PublicKey],
        r_hash: Sha256,
        amounts: &[(u64, u32)],
    ) -> Result<Arc<Slot>, ControlError> {
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
            first_htlc_msat = amount,
            expiry,
            "paying along a route"
        );
        self.command(&route[0], command).await
    }

    /// Our payment's first HTLC, with hash `r_hash`, ended: its `pay --route` hears it.
    pub(super) fn payment_ended(&self, r_hash: &Sha256, end: PaymentEnd) {
        if let Some(tx) = lock(&self.payment_ends.waiting).remove(r_hash) {
            if tx.send(end).is_err() {
                tracing::debug!("the payer stopped waiting for the payment's end");
            }
        }
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
            let forwarders = vec![s; hops - 1];
            assert_eq!(&plan(*amount, 500, &forwarders), want, "{hops} hops");
        }
        // Each forwarder's own schedule: the first hop's fee is on what it forwards.
        let dear = Schedule {
            base_msat: 5_000,
            ..s
        };
        assert_eq!(
            plan(5_000_000, 500, &[dear, s]),
            vec![(5_007_000, 580), (5_001_500, 540), (5_000_000, 500)]
        );
        let huge = Schedule {
            base_msat: u64::MAX,
            per_millionth: u64::MAX,
            expiry_delta: u32::MAX,
        };
        assert_eq!(huge.fee(u64::MAX), u64::MAX, "saturates, never wraps");
    }

    #[test]
    fn a_declines_schedule_is_learnt_and_fees_are_capped() {
        let learnt = |fixed, per_micro_unit| {
            Schedule::learnt(&wire::Funding {
                fixed,
                per_micro_unit,
            })
        };
        let s = |base_msat, per_millionth| Schedule {
            base_msat,
            per_millionth,
            expiry_delta: 40,
        };
        assert_eq!(learnt(Some(5), Some(10)), s(5_000, 10));
        assert_eq!(learnt(None, None), s(0, 0), "parts not sent are none");
        assert_eq!(
            learnt(Some(-5), Some(-10)),
            s(0, 0),
            "negative parts are none"
        );
        assert_eq!(learnt(Some(i64::MAX), Some(i32::MAX)).base_msat, u64::MAX);
        // 0.5% of the amount, at least 5,000 msat.
        assert_eq!(max_fee_msat(0), 5_000);
        assert_eq!(max_fee_msat(2_000_000), 10_000);
        assert_eq!(max_fee_msat(1_000_000_000), 5_000_000);
    }
}
