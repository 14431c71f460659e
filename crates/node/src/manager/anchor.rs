//! Watching the anchor a channel stands on: the pure verdict ([`AnchorWatch::observe`]) and
//! the manager's side that asks the chain and carries the verdict out.
//!
//! An acceptor's opening is abandoned when the peer's anchor pays elsewhere or stays
//! unseen for `anchor_wait_blocks`; a live channel whose anchor a reorganisation took
//! below `min_depth` is suspended until it is back, and ended when the anchor can never
//! confirm (a block double-spends its inputs, or it stays off the chain as long).

use bitcoin::OutPoint;
use channel::{Channel, State};
use wire::Packet;

use super::registry::{Abandoned, Slot, SlotInner};
use super::{states, Manager};
use crate::control_error::ControlError;

/// What the chain says about the anchor a channel stands on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Neither in the mempool nor on the best chain (not yet broadcast, never, or reorganised away).
    Missing,
    /// Pays exactly the agreed amount to the 2-of-2; confirmations on the best chain (0 = mempool).
    Good(u32),
    /// The transaction exists but that output does not back the channel.
    Bad(String),
}

/// Where the channel is when its anchor is observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Signed and waiting for the anchor's depth (`open_wait_complete`).
    Opening {
        /// Whether we built the anchor.
        we_fund: bool,
    },
    /// Past the opening and not over.
    Live {
        /// Confirmations the channel needs.
        min_depth: u32,
    },
}

/// Why a channel's anchor will never back it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AnchorEnd {
    /// Opening: the output does not pay the agreed amount to the 2-of-2.
    Mismatch(String),
    /// Opening: not seen for this many blocks.
    NeverSeen {
        /// `anchor_wait_blocks`.
        blocks: u32,
    },
    /// Live: a block holds a transaction spending the anchor's inputs.
    DoubleSpent,
    /// Live: off the best chain for this many blocks.
    OffChain {
        /// `anchor_wait_blocks`.
        blocks: u32,
    },
}

impl AnchorEnd {
    /// What the peer is told (`error{...}`) and the log says.
    pub(crate) fn message(&self, anchor: Option<bitcoin::Txid>) -> String {
        match self {
            AnchorEnd::Mismatch(why) => format!("Bad anchor: {why}"),
            AnchorEnd::NeverSeen { blocks } => format!(
                "Anchor {} not seen on chain for {blocks} blocks",
                anchor.map(|t| t.to_string()).unwrap_or_default(),
            ),
            AnchorEnd::DoubleSpent => {
                "Anchor double-spent: a block holds a transaction spending its inputs".to_owned()
            }
            AnchorEnd::OffChain { blocks } => {
                format!("Anchor off the best chain for {blocks} blocks")
            }
        }
    }
}

/// What to do about a channel after looking at its anchor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AnchorVerdict {
    /// Nothing yet (an anchor not seen so far, within the wait).
    Wait,
    /// Opening: the anchor backs the channel at this depth; tell the machine.
    Deep(u32),
    /// Opening, funder: our own anchor does not match the channel (a bug of ours; logged).
    OwnAnchorMismatch(String),
    /// The anchor will never back the channel: it ends (nothing to close on chain).
    End(AnchorEnd),
    /// Live at `min_depth`, as before.
    Live,
    /// Live again: back at `min_depth` after a suspension.
    Resumed {
        /// Confirmations now.
        confirmations: u32,
    },
    /// Below `min_depth`: no update until it is back.
    Suspended {
        /// Confirmations now (0: mempool or nowhere).
        confirmations: u32,
        /// Whether this observation suspended it (it was live before).
        newly: bool,
    },
}

/// What the node remembers of a channel's anchor between blocks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AnchorWatch {
    /// The height at which the anchor was first not found (cleared when it is found).
    missing_since: Option<u32>,
    /// A live channel whose anchor a reorganisation took below `min_depth`: its
    /// confirmations now. No update is proposed or accepted until it is back at depth.
    pub(crate) suspended: Option<u32>,
    /// The outputs the anchor spends (from the chain when it was seen), to recognise a
    /// transaction that double-spends it.
    pub(crate) inputs: Vec<OutPoint>,
    /// Height of the block holding a transaction that spends one of `inputs` and is not
    /// the anchor: the anchor can never confirm while that block stands.
    pub(crate) conflict: Option<u32>,
}

impl AnchorWatch {
    /// Judges what the chain `seen` of the anchor at `height`, remembering what the next
    /// observation needs; `wait_blocks` is how long an anchor may stay unseen.
    pub(crate) fn observe(
        &mut self,
        seen: &Seen,
        height: u32,
        phase: Phase,
        wait_blocks: u32,
    ) -> AnchorVerdict {
        let missing_too_long = |since: u32| height >= since.saturating_add(wait_blocks);
        let confirmations = match (phase, seen) {
            (_, Seen::Good(depth)) => {
                self.missing_since = None;
                *depth
            }
            (Phase::Opening { we_fund: false }, Seen::Bad(why)) => {
                return AnchorVerdict::End(AnchorEnd::Mismatch(why.clone()))
            }
            (Phase::Opening { we_fund: true }, Seen::Bad(why)) => {
                return AnchorVerdict::OwnAnchorMismatch(why.clone())
            }
            (Phase::Opening { we_fund: false }, Seen::Missing) => {
                let since = *self.missing_since.get_or_insert(height);
                return if missing_too_long(since) {
                    AnchorVerdict::End(AnchorEnd::NeverSeen {
                        blocks: wait_blocks,
                    })
                } else {
                    AnchorVerdict::Wait
                };
            }
            (Phase::Opening { we_fund: true }, Seen::Missing) => return AnchorVerdict::Wait,
            // Logged by the caller; the channel counts it as unconfirmed.
            (Phase::Live { .. }, Seen::Bad(_)) => 0,
            (Phase::Live { .. }, Seen::Missing) => {
                let since = *self.missing_since.get_or_insert(height);
                if self.conflict.is_some() {
                    return AnchorVerdict::End(AnchorEnd::DoubleSpent);
                }
                if missing_too_long(since) {
                    return AnchorVerdict::End(AnchorEnd::OffChain {
                        blocks: wait_blocks,
                    });
                }
                0
            }
        };
        match phase {
            Phase::Opening { .. } => AnchorVerdict::Deep(confirmations),
            Phase::Live { min_depth } if confirmations >= min_depth => {
                match self.suspended.take() {
                    Some(_) => AnchorVerdict::Resumed { confirmations },
                    None => AnchorVerdict::Live,
                }
            }
            Phase::Live { .. } => AnchorVerdict::Suspended {
                confirmations,
                newly: self.suspended.replace(confirmations).is_none(),
            },
        }
    }

    /// A reorganisation back to `fork` undid the blocks above it: a double-spend found in
    /// one of them no longer stands.
    pub(crate) fn rewound(&mut self, fork: u32) {
        if self.conflict.is_some_and(|h| h > fork) {
            self.conflict = None;
        }
    }
}

impl Manager {
    /// Checks the anchor against the chain: the claimed output must exist and pay exactly
    /// the agreed amount to the P2WSH 2-of-2 of both commit keys.
    ///
    /// # Errors
    /// The chain or the store could not be asked (try again later; nothing is decided).
    pub(crate) async fn check_anchor(
        &self,
        ch: &Channel,
    ) -> Result<Seen, crate::watcher::LookupError> {
        let Some((op, expected)) = ch.anchor_output() else {
            return Ok(Seen::Missing);
        };
        let mismatch = |value: bitcoin::Amount, script: &bitcoin::ScriptBuf| {
            Seen::Bad(format!(
                "output {op} pays {value} to {script}, not {} to the channel's 2-of-2",
                expected.value
            ))
        };
        let Some(status) = self.followed_transaction(op.txid).await? else {
            // An anchor confirmed before its block was recorded (a channel from a release
            // that needed -txindex): while unspent, `gettxout` shows it without the index.
            return Ok(match self.chain.unspent_output(op).await? {
                Some(out)
                    if out.value == expected.value
                        && out.script_pubkey == expected.script_pubkey =>
                {
                    Seen::Good(out.confirmations)
                }
                Some(out) => mismatch(out.value, &out.script_pubkey),
                None => Seen::Missing,
            });
        };
        Ok(match status.tx.output.get(op.vout as usize) {
            Some(out) if *out == expected => Seen::Good(status.confirmations),
            Some(out) => mismatch(out.value, &out.script_pubkey),
            None => Seen::Bad(format!("transaction {} has no output {}", op.txid, op.vout)),
        })
    }

    /// A transaction the node follows, through the store's record of its block.
    pub(crate) async fn followed_transaction(
        &self,
        txid: bitcoin::Txid,
    ) -> Result<Option<chain::TxStatus>, crate::watcher::LookupError> {
        crate::watcher::followed_transaction(&self.store, self.chain.as_ref(), txid).await
    }

    /// Looks at the anchor of a channel waiting for it (`open_wait_complete`) or live, and
    /// carries out the verdict: the depth goes to the machine (which says `open_complete`
    /// at `min_depth`), a live channel is suspended or resumed, a channel whose anchor will
    /// never back it ends.
    pub(crate) async fn watch_anchor(&self, slot: &Slot, inner: &mut SlotInner, height: u32) {
        let state = inner.channel.state();
        let phase = if state == State::OpenWaitComplete {
            Phase::Opening {
                we_fund: inner.channel.balances().is_some_and(|cs| cs.we_fund),
            }
        } else if states::is_running(state) {
            Phase::Live {
                min_depth: inner.channel.min_depth(),
            }
        } else {
            return;
        };
        let seen = match self.check_anchor(&inner.channel).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(peer = %slot.peer, channel = %slot.id, error = %crate::error_report::Causes(&e), "cannot check the anchor yet");
                return;
            }
        };
        if let Seen::Good(_) = seen {
            self.remember_anchor_inputs(inner).await;
        }
        if let (Phase::Live { .. }, Seen::Bad(why)) = (phase, &seen) {
            tracing::error!(peer = %slot.peer, channel = %slot.id, %why, "the anchor of a live channel no longer matches");
        }
        let wait = self.settings.anchor_wait_blocks;
        let verdict = inner.anchor.observe(&seen, height, phase, wait);
        self.apply_anchor_verdict(slot, inner, phase, verdict).await;
    }

    async fn apply_anchor_verdict(
        &self,
        slot: &Slot,
        inner: &mut SlotInner,
        phase: Phase,
        verdict: AnchorVerdict,
    ) {
        let (peer, id) = (slot.peer, slot.id);
        match verdict {
            AnchorVerdict::Wait | AnchorVerdict::Live => {}
            AnchorVerdict::Deep(depth) => {
                let actions = inner.channel.anchor_depth(depth);
                if !actions.is_empty() {
                    if let Err(e) = self.run_actions(slot, inner, actions).await {
                        tracing::error!(channel = %id, error = %crate::error_report::Causes(&e), "cannot go live");
                    }
                }
            }
            AnchorVerdict::OwnAnchorMismatch(why) => {
                tracing::error!(channel = %id, %why, "our own anchor does not match the channel");
            }
            AnchorVerdict::End(end) => {
                let why = end.message(inner.channel.anchor_outpoint().map(|o| o.txid));
                match phase {
                    Phase::Opening { .. } => self.abandon_opening(slot, inner, &why).await,
                    Phase::Live { .. } => self.end_unbacked(slot, inner, &why).await,
                }
            }
            AnchorVerdict::Resumed { confirmations } => {
                tracing::info!(%peer, channel = %id, confirmations, "anchor confirmed again; channel live");
                slot.changed.notify_waiters();
            }
            AnchorVerdict::Suspended {
                confirmations,
                newly: true,
            } => {
                let min_depth = inner.channel.min_depth();
                tracing::warn!(%peer, channel = %id, confirmations, min_depth, "anchor reorganised below min_depth; channel suspended");
            }
            AnchorVerdict::Suspended { newly: false, .. } => {}
        }
    }

    /// Ends a channel whose anchor will never be on chain (see [`AnchorWatch::observe`]).
    async fn end_unbacked(&self, slot: &Slot, inner: &mut SlotInner, why: &str) {
        tracing::warn!(peer = %slot.peer, channel = %slot.id, %why, "channel abandoned: its anchor can never confirm");
        // What was in flight falls back to the disk; nothing more is signed for it.
        inner.fall_back();
        self.abandon_opening(slot, inner, why).await;
        self.peers.kick(&slot.peer, why);
    }

    /// Forgets a channel whose anchor the peer funds and that will never back it: the peer
    /// is told why, the channel is marked abandoned on disk and leaves the registry.
    pub(crate) async fn abandon_opening(&self, slot: &Slot, inner: &mut SlotInner, why: &str) {
        tracing::warn!(peer = %slot.peer, channel = %slot.id, %why, "opening abandoned");
        let state = inner.channel.state();
        let kind = if state.is_opening() || state == State::OpenWaitComplete {
            Abandoned::Opening
        } else {
            Abandoned::Unbacked
        };
        self.forget_channel(slot, None, kind).await;
        if let Some(out) = inner.outbox.take() {
            // The error ends the session (it is the last packet written); a full queue
            // means the peer does not read, and it is dropped all the same.
            if out.try_send(Packet::error(why)).is_err() {
                self.peers.kick(&slot.peer, why);
            }
        }
        inner.complete_waiter(Err(ControlError::PeerGone(why.to_owned())));
        slot.changed.notify_waiters();
    }

    /// Marks a channel abandoned on disk and drops it from the registry (the watcher stops
    /// looking at its anchor). An opening that never went live also stops watching its final
    /// key: no transaction can pay it (the acceptor has no output in the funder's first
    /// commitment; a funder's unbroadcast anchor backs nothing), so strangers cannot make us
    /// watch keys without end. A live channel ended for an unbacked anchor keeps the watch:
    /// should that anchor ever confirm after all, the peer's commitment pays us there.
    pub(crate) async fn forget_channel(
        &self,
        slot: &Slot,
        anchor: Option<bitcoin::Txid>,
        kind: Abandoned,
    ) {
        if let Err(e) = self.store.abandon_channel(slot.id, anchor, kind).await {
            tracing::error!(channel = %slot.id, error = %crate::error_report::Causes(&e), "cannot abandon channel");
        }
        self.channels.remove(slot);
        if kind == Abandoned::Opening {
            self.wallet.unwatch_final_key(slot.id);
        }
    }

    /// Keeps the outputs the anchor spends, once, so that a double-spend of them is recognised
    /// in a block even after the anchor itself left the chain.
    async fn remember_anchor_inputs(&self, inner: &mut SlotInner) {
        if !inner.anchor.inputs.is_empty() {
            return;
        }
        if let Some(tx) = inner.channel.anchor_tx() {
            inner.anchor.inputs = tx.input.iter().map(|i| i.previous_output).collect();
            return;
        }
        let Some(op) = inner.channel.anchor_outpoint() else {
            return;
        };
        if let Ok(Some(status)) = self.followed_transaction(op.txid).await {
            inner.anchor.inputs = status.tx.input.iter().map(|i| i.previous_output).collect();
        }
    }

    /// Confirmations of the channel's anchor (0 if unknown or unconfirmed).
    pub(crate) async fn anchor_depth(&self, ch: &Channel) -> u32 {
        let Some(op) = ch.anchor_outpoint() else {
            return 0;
        };
        match self.followed_transaction(op.txid).await {
            Ok(Some(status)) => status.confirmations,
            _ => 0,
        }
    }

    /// Whether the channel's anchor is in the mempool (true when the chain cannot say).
    pub(crate) async fn anchor_in_mempool(&self, ch: &Channel) -> bool {
        match ch.anchor_outpoint() {
            Some(op) => self.chain.in_mempool(op.txid).await.unwrap_or(true),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: u32 = 144;
    const ACCEPTOR: Phase = Phase::Opening { we_fund: false };
    const FUNDER: Phase = Phase::Opening { we_fund: true };
    const LIVE: Phase = Phase::Live { min_depth: 3 };

    /// Observes each `(seen, height)` in turn and returns the verdicts.
    fn run(watch: &mut AnchorWatch, phase: Phase, steps: &[(Seen, u32)]) -> Vec<AnchorVerdict> {
        steps
            .iter()
            .map(|(seen, height)| watch.observe(seen, *height, phase, WAIT))
            .collect()
    }

    fn bad() -> Seen {
        Seen::Bad("output pays elsewhere".into())
    }

    #[test]
    fn an_opening_learns_its_depth_or_ends_on_a_bad_anchor() {
        use AnchorVerdict::*;
        let table: &[(Phase, Seen, AnchorVerdict)] = &[
            (ACCEPTOR, Seen::Good(0), Deep(0)),
            (ACCEPTOR, Seen::Good(3), Deep(3)),
            (FUNDER, Seen::Good(1), Deep(1)),
            (
                ACCEPTOR,
                bad(),
                End(AnchorEnd::Mismatch("output pays elsewhere".into())),
            ),
            (
                FUNDER,
                bad(),
                OwnAnchorMismatch("output pays elsewhere".into()),
            ),
            (ACCEPTOR, Seen::Missing, Wait),
            (FUNDER, Seen::Missing, Wait),
        ];
        for (phase, seen, verdict) in table {
            let mut watch = AnchorWatch::default();
            assert_eq!(
                &watch.observe(seen, 100, *phase, WAIT),
                verdict,
                "{phase:?} {seen:?}"
            );
        }
    }

    #[test]
    fn an_acceptor_gives_up_an_anchor_never_seen_after_the_wait_and_a_funder_never_does() {
        let mut watch = AnchorWatch::default();
        let steps = [
            (Seen::Missing, 100),
            (Seen::Missing, 100 + WAIT - 1),
            (Seen::Missing, 100 + WAIT),
        ];
        assert_eq!(
            run(&mut watch, ACCEPTOR, &steps),
            [
                AnchorVerdict::Wait,
                AnchorVerdict::Wait,
                AnchorVerdict::End(AnchorEnd::NeverSeen { blocks: WAIT })
            ]
        );
        let mut funder = AnchorWatch::default();
        let verdicts = run(&mut funder, FUNDER, &steps);
        assert!(
            verdicts.iter().all(|v| *v == AnchorVerdict::Wait),
            "{verdicts:?}"
        );
    }

    #[test]
    fn an_anchor_seen_in_between_starts_the_wait_again() {
        let mut watch = AnchorWatch::default();
        let steps = [
            (Seen::Missing, 100),
            (Seen::Good(0), 150),
            (Seen::Missing, 200),
            (Seen::Missing, 100 + WAIT),
            (Seen::Missing, 200 + WAIT),
        ];
        assert_eq!(
            run(&mut watch, ACCEPTOR, &steps),
            [
                AnchorVerdict::Wait,
                AnchorVerdict::Deep(0),
                AnchorVerdict::Wait,
                AnchorVerdict::Wait,
                AnchorVerdict::End(AnchorEnd::NeverSeen { blocks: WAIT })
            ]
        );
    }

    /// A reorganisation takes a live channel's anchor below `min_depth`: suspended (said
    /// once), and live again once it is back at depth.
    #[test]
    fn a_live_anchor_below_min_depth_suspends_the_channel_until_it_is_back() {
        let mut watch = AnchorWatch::default();
        let steps = [
            (Seen::Good(3), 100),
            (Seen::Good(1), 101),
            (Seen::Good(2), 102),
            (Seen::Good(3), 103),
            (Seen::Good(4), 104),
        ];
        assert_eq!(
            run(&mut watch, LIVE, &steps),
            [
                AnchorVerdict::Live,
                AnchorVerdict::Suspended {
                    confirmations: 1,
                    newly: true
                },
                AnchorVerdict::Suspended {
                    confirmations: 2,
                    newly: false
                },
                AnchorVerdict::Resumed { confirmations: 3 },
                AnchorVerdict::Live,
            ]
        );
        assert_eq!(watch.suspended, None);
    }

    #[test]
    fn a_live_anchor_that_stops_matching_counts_as_unconfirmed() {
        let mut watch = AnchorWatch::default();
        assert_eq!(
            watch.observe(&bad(), 100, LIVE, WAIT),
            AnchorVerdict::Suspended {
                confirmations: 0,
                newly: true
            }
        );
        assert_eq!(watch.suspended, Some(0));
    }

    #[test]
    fn a_live_anchor_gone_from_the_chain_is_suspended_then_ended_after_the_wait() {
        let mut watch = AnchorWatch::default();
        let steps = [
            (Seen::Missing, 100),
            (Seen::Missing, 100 + WAIT - 1),
            (Seen::Missing, 100 + WAIT),
        ];
        assert_eq!(
            run(&mut watch, LIVE, &steps),
            [
                AnchorVerdict::Suspended {
                    confirmations: 0,
                    newly: true
                },
                AnchorVerdict::Suspended {
                    confirmations: 0,
                    newly: false
                },
                AnchorVerdict::End(AnchorEnd::OffChain { blocks: WAIT }),
            ]
        );
    }

    /// A block holds a transaction spending the anchor's inputs: while the anchor is
    /// missing the channel ends at once; a reorganisation below that block forgets it.
    #[test]
    fn a_double_spent_anchor_ends_the_channel_unless_a_reorganisation_undid_the_spend() {
        let mut watch = AnchorWatch {
            conflict: Some(105),
            ..AnchorWatch::default()
        };
        // Still on chain (the double-spend lost): nothing ends.
        assert_eq!(
            watch.observe(&Seen::Good(5), 106, LIVE, WAIT),
            AnchorVerdict::Live
        );
        assert_eq!(
            watch.observe(&Seen::Missing, 107, LIVE, WAIT),
            AnchorVerdict::End(AnchorEnd::DoubleSpent)
        );
        watch.rewound(105);
        assert_eq!(
            watch.conflict,
            Some(105),
            "the fork is below the spend's block"
        );
        watch.rewound(104);
        assert_eq!(watch.conflict, None);
        assert_eq!(
            watch.observe(&Seen::Missing, 107, LIVE, WAIT),
            AnchorVerdict::Suspended {
                confirmations: 0,
                newly: true
            }
        );
    }

    #[test]
    fn each_end_tells_the_peer_why_in_the_words_of_docs_node_md() {
        let txid: bitcoin::Txid =
            "0000000000000000000000000000000000000000000000000000000000000001"
                .parse()
                .unwrap();
        assert_eq!(
            AnchorEnd::Mismatch("output x".into()).message(None),
            "Bad anchor: output x"
        );
        assert_eq!(
            AnchorEnd::NeverSeen { blocks: 144 }.message(Some(txid)),
            format!("Anchor {txid} not seen on chain for 144 blocks")
        );
        assert_eq!(
            AnchorEnd::DoubleSpent.message(Some(txid)),
            "Anchor double-spent: a block holds a transaction spending its inputs"
        );
        assert_eq!(
            AnchorEnd::OffChain { blocks: 6 }.message(None),
            "Anchor off the best chain for 6 blocks"
        );
    }
}
