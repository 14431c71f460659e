//! Forwarding policy (issue 30): before the channel accepts an HTLC whose onion names a
//! next hop, the node checks that it could forward it — a live channel to that node with
//! room, the fee its schedule asks, its expiry delta — and otherwise declines it
//! (`update_decline_htlc`: `cannot_route`, or `insufficient_funds` carrying the schedule).
//! The policy is the pure [`check`], tested by the table below it; the manager's side
//! reads the downstream channel and hands the channel its veto.

use channel::{Htlc, State, Who};
use secp256k1::PublicKey;
use wire::{DeclineReason, Funding, Locktime, Packet, Sha256};

use super::route::Schedule;
use super::Manager;

/// What the node knows of its channel to the next hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Downstream {
    /// Live: `normal` or updating, anchor confirmed, session up.
    pub(crate) live: bool,
    /// The most one new HTLC of ours can carry now (`sides::spendable_msat`).
    pub(crate) spendable_msat: u64,
}

/// Why an HTLC to forward is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No channel with the next node (or it is not live).
    NoChannel,
    /// The channel to the next node cannot carry the amount.
    NoRoom,
    /// The incoming HTLC leaves less than our fee for the amount to forward.
    FeeTooLow {
        /// Our fee for it.
        fee_msat: u64,
    },
    /// The incoming expiry is not our delta beyond the outgoing one.
    ExpiryTooClose,
}

impl Refusal {
    /// The decline that tells the peer: `insufficient_funds` with our schedule for a low
    /// fee (the fixed part in satoshi, the seed's smallest unit, rounded up; the
    /// proportional part in millionths), `cannot_route` otherwise.
    pub(crate) fn decline(self, schedule: &Schedule) -> DeclineReason {
        match self {
            Refusal::FeeTooLow { .. } => DeclineReason::InsufficientFunds(Funding {
                fixed: Some(i64::try_from(schedule.base_msat.div_ceil(1000)).unwrap_or(i64::MAX)),
                per_micro_unit: Some(i32::try_from(schedule.per_millionth).unwrap_or(i32::MAX)),
            }),
            _ => DeclineReason::CannotRoute(true),
        }
    }
}

/// Whether `incoming` may be forwarded as `payload` says, over `downstream` (none: no
/// channel to the next node), by our `schedule`.
pub(crate) fn check(
    incoming: &Htlc,
    payload: &onion::HopPayload,
    schedule: &Schedule,
    downstream: Option<Downstream>,
) -> Result<(), Refusal> {
    let out = u64::from(payload.amount_msat);
    let Some(down) = downstream.filter(|d| d.live) else {
        return Err(Refusal::NoChannel);
    };
    if down.spendable_msat < out {
        return Err(Refusal::NoRoom);
    }
    let fee_msat = schedule.fee(out);
    if u64::from(incoming.amount_msat) < out.saturating_add(fee_msat) {
        return Err(Refusal::FeeTooLow { fee_msat });
    }
    let room = match (incoming.expiry, payload.expiry) {
        (Locktime::Blocks(i), Locktime::Blocks(o)) => i.checked_sub(o),
        // Seconds: 600 a block, as the channel counts across units.
        (Locktime::Seconds(i), Locktime::Seconds(o)) => i.checked_sub(o).map(|s| s / 600),
        _ => None,
    };
    if room.is_none_or(|r| r < schedule.expiry_delta) {
        return Err(Refusal::ExpiryTooClose);
    }
    Ok(())
}

impl Manager {
    /// The decline for the peer's `update_add_htlc` `pkt` when its onion names a next hop
    /// we will not forward to; `None` for any other packet, an HTLC that ends here, an
    /// onion that does not open (failed back once accepted) and an HTLC we would forward.
    /// Reads the downstream channel under its own lock, before the caller takes the
    /// upstream one: no two channel locks are ever held at once.
    pub(crate) async fn forward_veto(
        &self,
        peer: &PublicKey,
        pkt: &Packet,
    ) -> Option<DeclineReason> {
        let Packet::UpdateAddHtlc(add) = pkt else {
            return None;
        };
        let onion = add.onion.as_ref()?;
        let (payload, next) = self.forward_payload(onion, &add.r_hash)?;
        let downstream = match self.channels.active(&next).await {
            Some(slot) if next != *peer => {
                let inner = slot.lock().await;
                let live = matches!(
                    inner.channel.state(),
                    State::Normal | State::WaitAccept | State::WaitSignature | State::WaitComplete
                ) && inner.outbox.is_some()
                    && inner.anchor.suspended.is_none();
                let spendable_msat = inner
                    .channel
                    .balances()
                    .map_or(0, |cs| crate::sides::spendable_msat(cs, Who::Us));
                Some(Downstream {
                    live,
                    spendable_msat,
                })
            }
            _ => None,
        };
        let incoming = Htlc {
            amount_msat: add.amount_msat,
            r_hash: add.r_hash,
            expiry: add.expiry,
        };
        let schedule = &self.settings.forward;
        match check(&incoming, &payload, schedule, downstream) {
            Ok(()) => None,
            Err(refusal) => {
                tracing::info!(%peer, next = %next, ?refusal, "declining an HTLC to forward");
                Some(refusal.decline(schedule))
            }
        }
    }

    /// Our payload and the next node of an onion that names one.
    fn forward_payload(
        &self,
        onion: &wire::Onion,
        r_hash: &Sha256,
    ) -> Option<(onion::HopPayload, PublicKey)> {
        use bitcoin::hashes::Hash as _;
        let peeled = onion::peel(
            &super::invoice::SECP,
            &self.node_key,
            onion,
            r_hash.as_byte_array(),
        )
        .ok()?;
        let onion::Next::Forward(_) = peeled.next else {
            return None;
        };
        let payload = onion::HopPayload::decode(&peeled.payload).ok()?;
        let next = payload.next_node?;
        Some((payload, next))
    }
}

#[cfg(test)]
mod tests {
    use bitcoin::hashes::Hash as _;

    use super::*;

    const S: Schedule = Schedule {
        base_msat: 1_000,
        per_millionth: 100,
        expiry_delta: 40,
    };

    /// (case, incoming msat, incoming expiry, outgoing msat, outgoing expiry, downstream, verdict).
    type Row = (
        &'static str,
        u32,
        u32,
        u32,
        u32,
        Option<Downstream>,
        Result<(), Refusal>,
    );

    #[test]
    fn the_forwarding_policy() {
        use Refusal::*;
        let room = Some(Downstream {
            live: true,
            spendable_msat: 10_000_000,
        });
        let dead = Some(Downstream {
            live: false,
            spendable_msat: 10_000_000,
        });
        let small = Some(Downstream {
            live: true,
            spendable_msat: 4_999_999,
        });
        // Fee for 5,000,000 msat: 1,000 + floor(5,000,000 × 100 / 1,000,000) = 1,500.
        #[rustfmt::skip]
        let table: &[Row] = &[
            ("fee and delta met exactly", 5_001_500, 540, 5_000_000, 500, room, Ok(())),
            ("more fee and delta than asked", 5_100_000, 600, 5_000_000, 500, room, Ok(())),
            ("one msat short of the fee", 5_001_499, 540, 5_000_000, 500, room, Err(FeeTooLow { fee_msat: 1_500 })),
            ("one block short of the delta", 5_001_500, 539, 5_000_000, 500, room, Err(ExpiryTooClose)),
            ("outgoing expiry after the incoming", 5_001_500, 400, 5_000_000, 500, room, Err(ExpiryTooClose)),
            ("no channel to the next node", 5_001_500, 540, 5_000_000, 500, None, Err(NoChannel)),
            ("a channel that is not live", 5_001_500, 540, 5_000_000, 500, dead, Err(NoChannel)),
            ("no room for the amount", 5_001_500, 540, 5_000_000, 500, small, Err(NoRoom)),
        ];
        for (case, in_msat, in_exp, out_msat, out_exp, down, want) in table {
            let incoming = Htlc {
                amount_msat: *in_msat,
                r_hash: Sha256::from_byte_array([1; 32]),
                expiry: Locktime::Blocks(*in_exp),
            };
            let payload = onion::HopPayload {
                amount_msat: *out_msat,
                expiry: Locktime::Blocks(*out_exp),
                next_node: None,
            };
            assert_eq!(&check(&incoming, &payload, &S, *down), want, "{case}");
        }
    }

    #[test]
    fn a_low_fee_is_declined_with_our_schedule_and_the_rest_as_cannot_route() {
        let s = Schedule {
            base_msat: 1_500,
            per_millionth: 7,
            expiry_delta: 40,
        };
        assert_eq!(
            Refusal::FeeTooLow { fee_msat: 9 }.decline(&s),
            DeclineReason::InsufficientFunds(Funding {
                fixed: Some(2),
                per_micro_unit: Some(7)
            })
        );
        for r in [Refusal::NoChannel, Refusal::NoRoom, Refusal::ExpiryTooClose] {
            assert_eq!(r.decline(&s), DeclineReason::CannotRoute(true));
        }
    }
}
