//! Forwarding policy (issue 30): before the channel accepts an HTLC whose onion names a
//! next hop, the node checks that it could forward it — a live channel to that node with
//! room, the fee its schedule asks, its expiry delta — and otherwise declines it
//! (`update_decline_htlc`: `cannot_route`, or `insufficient_funds` carrying the schedule).
//! The policy is the pure [`check`], tested by the table below it; the manager's side
//! reads the downstream channel and hands the channel its veto.

use channel::{Htlc, State, Who};
use secp256k1::PublicKey;
use wire::{DeclineReason, Funding, Locktime, Packet};

use super::route::Schedule;
use super::Manager;

/// What the node knows of its channel to the next hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Downstream {
    /// Live: `normal` or updating, anchor confirmed, session up.
    pub(crate) live: bool,
    /// The most one new HTLC of ours can carry now (`sides::spendable_msat`).
    pub(crate) spendable_msat: u64,
    /// The channel's capacity (its anchor).
    pub(crate) capacity_msat: u64,
    /// Forwards still `offered` on it, and the sum of their outgoing amounts.
    pub(crate) forwards: usize,
    /// The sum of those forwards' outgoing amounts.
    pub(crate) forwards_msat: u64,
    /// The delay the next hop imposes on our outputs, in blocks: once the channel is on
    /// chain, it may claim our HTLC with R until our refund, which waits for it, confirms.
    pub(crate) claim_delay_blocks: u32,
}

/// Bounds against a peer that holds forwarded HTLCs until their expiry (docs/node.md,
/// "Forwarding policy"): each caps what such a peer can lock of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// The furthest an incoming HTLC to forward may expire above the tip, in blocks
    /// (`--max-expiry-blocks`).
    pub(crate) max_expiry_blocks: u32,
    /// Forwards in flight on one outgoing channel (`--max-forwarded-htlcs-per-channel`).
    pub(crate) max_per_channel: usize,
    /// Forwards in flight in all (`--max-forwarded-htlcs`).
    pub(crate) max_total: usize,
    /// The percentage of an outgoing channel's capacity that forwards in flight on it may
    /// lock (`--max-forward-share-percent`).
    pub(crate) max_share_percent: u8,
    /// The blocks a forward needs between its two expiries to resolve on chain in time,
    /// beside both channels' delays ([`onchain_blocks`]).
    pub(crate) onchain_blocks: u32,
}

/// The blocks a forward needs between its incoming and outgoing expiries to resolve on
/// chain in time, beside the delays both peers impose on our outputs (docs/node.md,
/// "Forwarding on chain"): our refund deadline after the outgoing expiry
/// (`force_close_after_expiry_blocks`), one block for our commitment to confirm, and the
/// lead our claim deadline keeps before the incoming expiry (half the claim margin). The
/// least `--expiry-delta` the node accepts.
pub(crate) fn onchain_blocks(config: &channel::ChannelConfig) -> u32 {
    config
        .force_close_after_expiry_blocks
        .saturating_add(1)
        .saturating_add(config.htlc_claim_margin_blocks.div_ceil(2))
}

impl Limits {
    /// The defaults (docs/node.md gives the reason for each).
    pub(crate) const DEFAULT: Limits = Limits {
        max_expiry_blocks: 2016,
        max_per_channel: 30,
        max_total: 483,
        max_share_percent: 50,
        onchain_blocks: 10,
    };
}

/// What the node holds now, beside the downstream channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Load {
    /// The chain's height.
    pub(crate) tip: u32,
    /// Forwards still `offered`, on every channel.
    pub(crate) forwards: usize,
    /// The delay the peer offering the HTLC imposes on our outputs, in blocks: our claim
    /// with R on our own commitment waits for it.
    pub(crate) upstream_claim_delay_blocks: u32,
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
    /// The incoming expiry is not our delta beyond the outgoing one, or too close to it to
    /// resolve on chain in time with both channels' delays.
    ExpiryTooClose,
    /// The incoming HTLC expires further above the tip than `--max-expiry-blocks`.
    ExpiryTooFar,
    /// The outgoing channel carries `--max-forwarded-htlcs-per-channel` forwards already.
    TooManyOnChannel,
    /// The node carries `--max-forwarded-htlcs` forwards already.
    TooManyForwards,
    /// The forward would lock more of the outgoing channel than
    /// `--max-forward-share-percent`.
    ShareExceeded,
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
/// channel to the next node), by our `schedule` and `limits`, with `load` in flight.
pub(crate) fn check(
    incoming: &Htlc,
    payload: &onion::HopPayload,
    (schedule, limits): (&Schedule, &Limits),
    load: Load,
    downstream: Option<Downstream>,
) -> Result<(), Refusal> {
    let out = u64::from(payload.amount_msat);
    let Some(down) = downstream.filter(|d| d.live) else {
        return Err(Refusal::NoChannel);
    };
    if load.forwards >= limits.max_total {
        return Err(Refusal::TooManyForwards);
    }
    if down.forwards >= limits.max_per_channel {
        return Err(Refusal::TooManyOnChannel);
    }
    let share = u128::from(down.capacity_msat) * u128::from(limits.max_share_percent) / 100;
    if u128::from(down.forwards_msat) + u128::from(out) > share {
        return Err(Refusal::ShareExceeded);
    }
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
    // The next hop may claim with R until our refund confirms, and we must then claim
    // upstream before its expiry: both channels' delays count on top of our margins.
    let needed = limits
        .onchain_blocks
        .saturating_add(down.claim_delay_blocks)
        .saturating_add(load.upstream_claim_delay_blocks)
        .max(schedule.expiry_delta);
    if room.is_none_or(|r| r < needed) {
        return Err(Refusal::ExpiryTooClose);
    }
    // An expiry in seconds is never forwarded (the outgoing one must be in blocks), so
    // only blocks are bounded here.
    if let Locktime::Blocks(i) = incoming.expiry {
        if i.saturating_sub(load.tip) > limits.max_expiry_blocks {
            return Err(Refusal::ExpiryTooFar);
        }
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
        tip: Option<u32>,
    ) -> Option<DeclineReason> {
        let Packet::UpdateAddHtlc(add) = pkt else {
            return None;
        };
        let onion = add.onion.as_ref()?;
        let (payload, next, _) = self.forward_plan(onion, &add.r_hash)?;
        let mut tip = tip.unwrap_or(0);
        let downstream = match self.channels.active(&next).await {
            Some(slot) if next != *peer => {
                let inner = slot.lock().await;
                // The chain did not answer in time: the height the watcher last gave.
                tip = tip.max(inner.channel.height());
                let live = matches!(
                    inner.channel.state(),
                    State::Normal | State::WaitAccept | State::WaitSignature | State::WaitComplete
                ) && inner.outbox.is_some()
                    && inner.anchor.suspended.is_none();
                let balances = inner.channel.balances();
                let spendable_msat =
                    balances.map_or(0, |cs| crate::sides::spendable_msat(cs, Who::Us));
                let capacity_msat = balances.map_or(0, |cs| cs.anchor_sat.saturating_mul(1000));
                let claim_delay_blocks = inner.channel.claim_delay_blocks().unwrap_or(0);
                drop(inner);
                let (forwards, forwards_msat) = self.forwards_in_flight(Some(slot.id));
                Some(Downstream {
                    live,
                    spendable_msat,
                    capacity_msat,
                    forwards,
                    forwards_msat,
                    claim_delay_blocks,
                })
            }
            _ => None,
        };
        // The channel the HTLC comes in on (its lock is not held yet).
        let upstream_claim_delay_blocks = match self.channels.active(peer).await {
            Some(slot) => slot.lock().await.channel.claim_delay_blocks().unwrap_or(0),
            None => 0,
        };
        let load = Load {
            tip,
            forwards: self.forwards_in_flight(None).0,
            upstream_claim_delay_blocks,
        };
        let incoming = Htlc {
            amount_msat: add.amount_msat,
            r_hash: add.r_hash,
            expiry: add.expiry,
        };
        let policy = (&self.settings.forward, &self.settings.forward_limits);
        match check(&incoming, &payload, policy, load, downstream) {
            Ok(()) => None,
            Err(refusal) => {
                tracing::info!(%peer, next = %next, ?refusal, "declining an HTLC to forward");
                Some(refusal.decline(policy.0))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bitcoin::hashes::Hash as _;
    use wire::Sha256;

    use super::*;

    const S: Schedule = Schedule {
        base_msat: 1_000,
        per_millionth: 100,
        expiry_delta: 40,
    };

    const L: Limits = Limits {
        max_expiry_blocks: 100,
        max_per_channel: 3,
        max_total: 5,
        max_share_percent: 50,
        onchain_blocks: 10,
    };

    /// The tip of the table's chain.
    const TIP: u32 = 500;

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
        let open = Downstream {
            live: true,
            spendable_msat: 10_000_000,
            capacity_msat: 20_000_000,
            forwards: 0,
            forwards_msat: 0,
            claim_delay_blocks: 6,
        };
        let room = Some(open);
        let dead = Some(Downstream {
            live: false,
            ..open
        });
        let small = Some(Downstream {
            spendable_msat: 4_999_999,
            ..open
        });
        // Two forwards of 2,500,000 in flight: one more of 5,000,000 locks 10,000,000,
        // half of 20,000,000 exactly.
        let half = Some(Downstream {
            forwards: 2,
            forwards_msat: 5_000_000,
            ..open
        });
        let over_half = Some(Downstream {
            forwards: 2,
            forwards_msat: 5_000_001,
            ..open
        });
        let two_on_it = Some(Downstream {
            forwards: 2,
            ..open
        });
        let three_on_it = Some(Downstream {
            forwards: 3,
            ..open
        });
        // The next hop's delay of 30 and ours upstream of 6, beside 10 blocks: 46 > 40.
        let slow = Some(Downstream {
            claim_delay_blocks: 30,
            ..open
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
            ("expiry at the furthest we accept", 5_001_500, 600, 5_000_000, 500, room, Ok(())),
            ("expiry one block beyond it", 5_001_500, 601, 5_000_000, 500, room, Err(ExpiryTooFar)),
            ("one below the channel's bound", 5_001_500, 540, 5_000_000, 500, two_on_it, Ok(())),
            ("at the channel's bound", 5_001_500, 540, 5_000_000, 500, three_on_it, Err(TooManyOnChannel)),
            ("half the channel locked exactly", 5_001_500, 540, 5_000_000, 500, half, Ok(())),
            ("one msat over half", 5_001_500, 540, 5_000_000, 500, over_half, Err(ShareExceeded)),
            ("delays above the delta: the delta is not enough", 5_001_500, 545, 5_000_000, 500, slow, Err(ExpiryTooClose)),
            ("delays above the delta met exactly", 5_001_500, 546, 5_000_000, 500, slow, Ok(())),
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
            let load = Load {
                tip: TIP,
                forwards: 4,
                upstream_claim_delay_blocks: 6,
            };
            assert_eq!(
                &check(&incoming, &payload, (&S, &L), load, *down),
                want,
                "{case}"
            );
        }
    }

    #[test]
    fn the_bound_on_forwards_in_all() {
        let incoming = Htlc {
            amount_msat: 5_001_500,
            r_hash: Sha256::from_byte_array([1; 32]),
            expiry: Locktime::Blocks(540),
        };
        let payload = onion::HopPayload {
            amount_msat: 5_000_000,
            expiry: Locktime::Blocks(500),
            next_node: None,
        };
        let down = Some(Downstream {
            live: true,
            spendable_msat: 10_000_000,
            capacity_msat: 20_000_000,
            forwards: 0,
            forwards_msat: 0,
            claim_delay_blocks: 6,
        });
        let at = |forwards| {
            check(
                &incoming,
                &payload,
                (&S, &L),
                Load {
                    tip: TIP,
                    forwards,
                    upstream_claim_delay_blocks: 6,
                },
                down,
            )
        };
        assert_eq!(at(4), Ok(()), "one below the bound");
        assert_eq!(at(5), Err(Refusal::TooManyForwards), "at the bound");
    }

    #[test]
    fn the_onchain_floor_is_the_refund_deadline_a_block_and_half_the_claim_margin() {
        let config = channel::ChannelConfig::default();
        assert_eq!(onchain_blocks(&config), 6 + 1 + 3);
        assert_eq!(onchain_blocks(&config), Limits::DEFAULT.onchain_blocks);
        assert_eq!(onchain_blocks(&config), crate::MIN_EXPIRY_DELTA);
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
        for r in [
            Refusal::NoChannel,
            Refusal::NoRoom,
            Refusal::ExpiryTooClose,
            Refusal::ExpiryTooFar,
            Refusal::TooManyOnChannel,
            Refusal::TooManyForwards,
            Refusal::ShareExceeded,
        ] {
            assert_eq!(r.decline(&s), DeclineReason::CannotRoute(true));
        }
    }
}
