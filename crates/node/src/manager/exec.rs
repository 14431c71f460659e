//! The manager's only IO: performing a channel's actions in order (persist, send,
//! broadcast, queue claims, archive revoked commitments), handling its events, and
//! completing the control call that waits on it.

use std::collections::VecDeque;

use bitcoin::Transaction;
use channel::{Action, Event, Who};
use tokio::sync::mpsc;
use wire::Packet;

use bitcoin::hashes::Hash as _;

use super::registry::{Slot, SlotInner, WaitKind};
use super::route::PaymentEnd;
use super::Manager;
use crate::control_error::ControlError;
use crate::store::{ChannelId, ForwardState, StoreError};

/// Why a channel's actions stopped (nothing after the failed one was performed).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ExecError {
    /// A persist, a queued claim or an archived record could not be written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The machine refused what the node fed it back (a funded anchor).
    #[error(transparent)]
    Channel(#[from] channel::CommandError),
}

impl Manager {
    /// Performs `actions` in order; stops at the first failed persist (nothing after it may leave).
    pub(crate) async fn run_actions(
        &self,
        slot: &Slot,
        inner: &mut SlotInner,
        actions: Vec<Action>,
    ) -> Result<(), ExecError> {
        let mut queue: VecDeque<Action> = actions.into();
        let mut persisted = false;
        // Records of the peer's revoked commitments, written in the same commit as the
        // Persist that drops them from the channel (one fsync, not two).
        let mut archive: Vec<channel::RevokedCommitment> = Vec::new();
        loop {
            let Some(action) = queue.pop_front() else {
                // The channel is idle: an incoming HTLC that an invoice or its onion
                // settles is proposed now (one per update; the next after it completes).
                match self.next_settlement(slot, inner).await? {
                    Some(more) => {
                        queue.extend(more);
                        continue;
                    }
                    None => break,
                }
            };
            // A signature we give away lets the peer broadcast (or complete) a transaction:
            // the state that knows about it is on disk before it leaves, whatever the machine
            // asked (a `close_channel` carries no Persist of its own). After a restart or a
            // lost session the channel then resumes from a state that refuses updates and
            // watches for that transaction.
            let action = match action {
                Action::Send(pkt) if carries_signature(&pkt) && !persisted => {
                    queue.push_front(Action::Send(pkt));
                    Action::Persist
                }
                other => other,
            };
            match action {
                Action::Persist => {
                    persisted = true;
                    self.persist(slot, inner, &archive).await?;
                    archive.clear();
                }
                Action::Send(pkt) => {
                    tracing::debug!(peer = %slot.peer, packet = pkt.name(), "send");
                    self.deliver(slot, inner, pkt);
                }
                Action::Broadcast(tx) => {
                    self.broadcast(slot.id, &tx).await;
                }
                Action::BroadcastLater {
                    tx,
                    csv_blocks,
                    lock_time,
                } => {
                    // A claim that is not on disk is lost at the next restart: the
                    // caller must see this fail (the watcher retries the block).
                    self.store
                        .queue_broadcast(slot.id, &tx, csv_blocks, lock_time)
                        .await
                        .inspect_err(|e| {
                            tracing::error!(peer = %slot.peer, channel = %slot.id, error = %crate::error_report::Causes(e), "cannot queue a claim");
                        })?;
                    tracing::info!(peer = %slot.peer, txid = %tx.compute_txid(), csv_blocks, lock_time, "claim queued");
                }
                Action::Archive(record) => {
                    // Durable no later than the Persist that follows and drops it from the
                    // channel: both go in one commit.
                    archive.push(record);
                }
                Action::WatchOutput(op) => {
                    tracing::debug!(peer = %slot.peer, anchor = %op, "watching anchor");
                }
                Action::Notify(event) => {
                    let more = self.on_event(slot, inner, event).await?;
                    for a in more.into_iter().rev() {
                        queue.push_front(a);
                    }
                }
            }
        }
        // No Persist followed (the machine always sends one; keep the records anyway).
        for record in &archive {
            self.store.save_revoked(slot.id, record).await?;
        }
        // An open completes once the anchor is out.
        if matches!(inner.waiter, Some((WaitKind::Open, _))) && !inner.channel.state().is_opening()
        {
            inner.complete_waiter(Ok(()));
        }
        slot.changed.notify_waiters();
        Ok(())
    }

    /// Writes the channel (with `archive` in the same commit) and makes it the fallback.
    pub(crate) async fn persist(
        &self,
        slot: &Slot,
        inner: &mut SlotInner,
        archive: &[channel::RevokedCommitment],
    ) -> Result<(), StoreError> {
        self.store
            .save_channel(slot.id, &inner.channel, archive)
            .await
            .inspect_err(|e| {
                tracing::error!(peer = %slot.peer, channel = %slot.id, error = %crate::error_report::Causes(e), "persist failed");
            })?;
        inner.persisted = inner.channel.clone();
        #[cfg(feature = "test-hooks")]
        if self.settings.cheat_enabled {
            if let Some(tx) = inner.channel.signed_commitment() {
                let num = inner.channel.commitment_number();
                // Only the test-only cheat reads it: a failure costs that test, not money.
                if let Err(e) = self.store.save_revoked_for_tests(slot.id, num, &tx).await {
                    tracing::warn!(channel = %slot.id, error = %crate::error_report::Causes(&e), "cannot keep a commitment for the cheat");
                }
            }
        }
        Ok(())
    }

    /// Queues a packet for the peer without ever waiting: a peer that does not read its
    /// packets is dropped instead (a lost packet cannot be re-sent in this protocol), so the
    /// channel lock, the watcher, the control API and other peers never stall behind it.
    pub(crate) fn deliver(&self, slot: &Slot, inner: &mut SlotInner, pkt: Packet) {
        let Some(out) = &inner.outbox else {
            return;
        };
        match out.try_send(pkt) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!(peer = %slot.peer, "peer does not read its packets; disconnecting");
                inner.outbox = None;
                self.peers.kick(&slot.peer, "Too slow");
            }
            Err(mpsc::error::TrySendError::Closed(_)) => inner.outbox = None,
        }
    }

    /// Queues `tx` (so it is retried until it confirms, also after a restart) and sends it
    /// now; a refusal is logged, the queue re-sends it at every block whatever the answer.
    pub(crate) async fn broadcast(&self, channel_id: ChannelId, tx: &Transaction) {
        if let Err(e) = self.broadcast_checked(channel_id, tx).await {
            tracing::debug!(channel = %channel_id, error = %crate::error_report::Causes(&e), "broadcast to be retried");
        }
    }

    /// As `broadcast`, with the chain's refusal, if any (`Ok` when the
    /// transaction is in the mempool or a block, new or already known).
    pub(crate) async fn broadcast_checked(
        &self,
        channel_id: ChannelId,
        tx: &Transaction,
    ) -> Result<(), chain::ChainError> {
        let txid = tx.compute_txid();
        if let Err(e) = self.store.queue_broadcast(channel_id, tx, 0, 0).await {
            tracing::error!(%txid, error = %crate::error_report::Causes(&e), "cannot queue a broadcast");
        }
        // Whatever the refusal, the queue keeps the transaction and re-sends
        // it at every block until it confirms or a conflict confirms
        // (`watcher`): a refusal is never read as "the money is back".
        match self.chain.broadcast(tx.clone()).await {
            Ok(_) => tracing::info!(channel = %channel_id, %txid, "broadcast"),
            Err(e) if e.is_already_known() => {
                tracing::info!(channel = %channel_id, %txid, "broadcast: already in the mempool or a block")
            }
            Err(e) if e.is_transient() || e.is_inputs_spent() || e.is_conflict() => {
                tracing::info!(channel = %channel_id, %txid, error = %crate::error_report::Causes(&e), "broadcast refused for now; retried at every block");
                return Err(e);
            }
            Err(e) => {
                tracing::warn!(channel = %channel_id, %txid, error = %crate::error_report::Causes(&e), "broadcast refused");
                return Err(e);
            }
        }
        Ok(())
    }

    /// For `close PEER force`: broadcasts the first transaction of `actions` (the
    /// commitment, which [`channel::Channel::force_close`] lists first) and returns the other
    /// actions, with the chain's refusal as the error for the caller.
    pub(crate) async fn broadcast_commitment_first(
        &self,
        channel_id: ChannelId,
        actions: Vec<Action>,
    ) -> (Vec<Action>, Option<ControlError>) {
        let mut rest = VecDeque::from(actions);
        let Some(Action::Broadcast(tx)) = rest.front().cloned() else {
            return (rest.into(), None);
        };
        rest.pop_front();
        let refused = self
            .broadcast_checked(channel_id, &tx)
            .await
            .err()
            .map(|reason| ControlError::CommitmentRefused {
                txid: tx.compute_txid(),
                reason,
            });
        (rest.into(), refused)
    }

    /// What the machine tells its owner: logged, and the waiting control call completed.
    async fn on_event(
        &self,
        slot: &Slot,
        inner: &mut SlotInner,
        event: Event,
    ) -> Result<Vec<Action>, ExecError> {
        let (peer, id) = (slot.peer, slot.id);
        match event {
            Event::AnchorNeeded {
                script_pubkey,
                amount,
            } => match self.wallet.fund_anchor(id, script_pubkey, amount).await {
                Ok((tx, vout)) => return Ok(inner.channel.anchor_created(tx, vout)?),
                Err(e) => {
                    tracing::warn!(%peer, error = %crate::error_report::Causes(&e), "cannot fund the anchor");
                    inner.complete_waiter(Err(e.into()));
                    self.deliver(slot, inner, Packet::error("Cannot fund the anchor"));
                }
            },
            Event::Live => tracing::info!(%peer, channel = %id, "channel live"),
            Event::UpdateCompleted { by, change } => {
                tracing::info!(%peer, channel = %id, ?by, ?change, num = inner.channel.commitment_number(), "update completed");
                #[cfg(any(test, feature = "test-hooks"))]
                self.crash_after_update(id, by, &change).await;
                match (by, change) {
                    (Who::Us, channel::Change::Fulfill(r)) => self.fulfilled(&r).await?,
                    // A forward of ours ended downstream: its upstream HTLC follows; or a
                    // payment of ours along a route ended.
                    (Who::Them, channel::Change::Fulfill(r)) => {
                        self.payment_ended(&r.hash(), PaymentEnd::Paid);
                        self.forward_ended(id, r.hash(), ForwardState::Fulfilled(r))
                            .await?;
                    }
                    (Who::Them, channel::Change::Routefail(h))
                    | (Who::Us, channel::Change::Timedout(h)) => {
                        self.payment_ended(&h, PaymentEnd::Failed);
                        self.forward_ended(id, h, ForwardState::Failed).await?;
                    }
                    _ => {}
                }
                if by == Who::Us && matches!(inner.waiter, Some((WaitKind::Update, _))) {
                    inner.complete_waiter(Ok(()));
                }
            }
            Event::Declined { r_hash, reason } => {
                tracing::info!(%peer, ?reason, "HTLC declined");
                self.forward_ended(id, r_hash, ForwardState::Failed).await?;
                let answer = match reason {
                    // The schedule it named: `pay --route` retries once with it.
                    Some(wire::DeclineReason::InsufficientFunds(funding)) => {
                        let learnt = super::route::Schedule::learnt(&funding);
                        ControlError::FeeTooLow {
                            peer,
                            base_msat: learnt.base_msat,
                            per_millionth: learnt.per_millionth,
                        }
                    }
                    _ => ControlError::Declined(format!(
                        "peer declined HTLC {}: {reason:?}",
                        hex::encode(r_hash.as_byte_array())
                    )),
                };
                inner.complete_waiter(Err(answer));
            }
            Event::ProposalDeferred(change) => {
                tracing::info!(%peer, ?change, "our proposal deferred to the peer's");
            }
            Event::ProposalDropped { change, error } => {
                tracing::info!(%peer, ?change, %error, "deferred proposal dropped");
                inner.complete_waiter(Err(ControlError::Declined(format!(
                    "proposal dropped: {error}"
                ))));
            }
            Event::PeerError(problem) => tracing::info!(%peer, %problem, "peer sent error"),
            Event::Closed(txid) => {
                tracing::info!(%peer, channel = %id, %txid, "channel closed");
                if matches!(inner.waiter, Some((WaitKind::Close, _))) {
                    inner.complete_waiter(Ok(()));
                }
            }
            Event::CheatDetected { commitment_number } => {
                tracing::warn!(%peer, channel = %id, commitment_number, "peer broadcast a revoked commitment; penalty broadcast");
            }
            Event::Unclaimable {
                outpoint,
                value,
                fee_sat,
            } => {
                tracing::warn!(%peer, channel = %id, %outpoint, value_sat = value.to_sat(), claim_fee_sat = fee_sat, "an output of ours is worth less than its claim; left unclaimed");
            }
            Event::AnchorSpentUnrecognised { txid } => {
                tracing::error!(%peer, channel = %id, %txid, "the anchor was spent by a transaction this channel does not recognise");
            }
            Event::OnChain { txid, owner } => {
                tracing::info!(%peer, channel = %id, %txid, ?owner, "commitment on chain");
                inner.complete_waiter(Err(ControlError::ClosedOnChain));
            }
        }
        Ok(Vec::new())
    }
}

/// Packets that hand the peer a signature of ours on a transaction spending the anchor.
fn carries_signature(pkt: &Packet) -> bool {
    matches!(
        pkt,
        Packet::OpenAnchor(_)
            | Packet::OpenCommitSig(_)
            | Packet::UpdateAccept(_)
            | Packet::UpdateSignature(_)
            | Packet::Close(_)
            | Packet::CloseComplete(_)
    )
}
