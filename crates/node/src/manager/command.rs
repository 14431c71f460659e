//! The owner's entry points: `open` a channel, and the commands on it (`pay`, HTLCs,
//! `close`). Each returns once its exchange with the peer completed.

use std::sync::Arc;
use std::time::Duration;

use channel::{AnchorRole, CommandError, State};
use secp256k1::PublicKey;
use tokio::sync::oneshot;
use wire::{Locktime, Preimage, Sha256};

use super::registry::{Slot, SlotInner, WaitKind};
use super::{unix_now, Manager};
use crate::control_error::ControlError;

/// What a new channel must hold beyond the commitment fee (a usable, non-dust balance).
const MIN_OWN_SAT: u64 = 1_000;

/// A channel command from the control API.
#[derive(Debug, Clone)]
pub(crate) enum Command {
    /// Pay the peer this many msat.
    Pay(u64),
    /// Offer an HTLC expiring at a block height.
    AddHtlc {
        amount_msat: u64,
        r_hash: Sha256,
        expiry: u32,
    },
    /// Offer an HTLC expiring at a block height, with the onion of its route (field 5).
    AddRoutedHtlc {
        amount_msat: u64,
        r_hash: Sha256,
        expiry: u32,
        onion: wire::Onion,
    },
    /// Take an HTLC offered to us with its R.
    Fulfill(Preimage),
    /// Refuse an HTLC offered to us.
    Fail(Sha256),
    /// Close cooperatively.
    Close,
    /// Broadcast our latest commitment (no peer needed).
    ForceClose,
}

/// Whether a command went through, or waits for the update in flight.
enum Attempt {
    /// Proposed (or done on chain): wait for this answer.
    Proposed(oneshot::Receiver<Result<(), ControlError>>),
    /// An update is in flight: try again once it finished.
    Busy,
}

impl Manager {
    /// `open PEER AMOUNT_SAT`: we fund the anchor; returns the channel once it is broadcast.
    pub(crate) async fn open(
        &self,
        peer: &PublicKey,
        amount_sat: u64,
    ) -> Result<Arc<Slot>, ControlError> {
        if !self.peers.is_connected(peer) {
            return Err(ControlError::NotConnected(*peer));
        }
        let fee_sat = self.settings.channel.commitment_fee_sat;
        let min = fee_sat + MIN_OWN_SAT;
        if amount_sat < min {
            return Err(ControlError::ChannelTooSmall {
                amount_sat,
                min_sat: min,
                fee_sat,
                own_sat: MIN_OWN_SAT,
            });
        }
        // Before the openings lock: it asks the chain for a fee estimate, and a slow
        // chain must not hold the peers' own openings.
        self.wallet.check_anchor_affordable(amount_sat).await?;
        let listing = self.openings.lock().await;
        if self.channels.active(peer).await.is_some() {
            return Err(ControlError::ChannelExists(*peer));
        }
        let role = AnchorRole::Fund {
            anchor_sat: amount_sat,
        };
        let slot = self.new_channel(peer, role).await?;
        // Listed now: a later opening with this peer finds it.
        drop(listing);
        let rx = {
            let mut inner = slot.lock().await;
            inner.outbox = self.peers.outbox(peer);
            let actions = inner.channel.start()?;
            let (tx, rx) = oneshot::channel();
            inner.waiter = Some((WaitKind::Open, tx));
            self.run_actions(&slot, &mut inner, actions).await?;
            rx
        };
        let waited = wait_for(rx, self.settings.command_timeout).await;
        if matches!(waited, Err(ControlError::Timeout(_)))
            && slot.lock().await.channel.state().is_opening()
        {
            // A peer that stalls the opening would keep it (and the wallet outputs a built
            // anchor reserved) as long as it keeps the session: drop the session, and the
            // lost-session rules abandon the opening and free the outputs.
            tracing::warn!(%peer, channel = %slot.id, "opening not completed in time; dropping the session");
            self.peers.kick(peer, "Open timed out");
        }
        waited?;
        Ok(slot)
    }

    /// An owner command on the peer's channel; returns the channel once the exchange completed.
    pub(crate) async fn command(
        &self,
        peer: &PublicKey,
        command: Command,
    ) -> Result<Arc<Slot>, ControlError> {
        let slot = self
            .channels
            .active(peer)
            .await
            .or_else(|| self.channels.latest(peer))
            .ok_or(ControlError::NoChannel(*peer))?;
        let deadline = tokio::time::Instant::now() + self.settings.command_timeout;
        let rx = loop {
            let changed = slot.changed.notified();
            if let Attempt::Proposed(rx) = self.attempt(&slot, &command).await? {
                break rx;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(ControlError::Timeout("the update in flight"));
            }
        };
        wait_for(rx, self.settings.command_timeout).await?;
        Ok(slot)
    }

    /// Feeds `command` to the channel once, under its lock.
    async fn attempt(&self, slot: &Slot, command: &Command) -> Result<Attempt, ControlError> {
        let mut inner = slot.lock().await;
        if let Some(confirmations) = inner.anchor.suspended {
            if !matches!(command, Command::Close | Command::ForceClose) {
                return Err(ControlError::AnchorUnconfirmed {
                    confirmations,
                    min_depth: inner.channel.min_depth(),
                });
            }
        }
        let ch = &mut inner.channel;
        let result = match command {
            Command::Pay(msat) => ch.pay(*msat),
            Command::AddHtlc {
                amount_msat,
                r_hash,
                expiry,
            } => ch.add_htlc(*amount_msat, *r_hash, Locktime::Blocks(*expiry), unix_now()),
            Command::AddRoutedHtlc {
                amount_msat,
                r_hash,
                expiry,
                onion,
            } => ch.add_htlc_with_onion(
                *amount_msat,
                *r_hash,
                Locktime::Blocks(*expiry),
                Some(onion.clone()),
                unix_now(),
            ),
            Command::Fulfill(r) => ch.fulfill_htlc(*r, unix_now()),
            Command::Fail(h) => ch.routefail_htlc(*h),
            Command::Close => ch.close(),
            Command::ForceClose => ch.force_close(),
        };
        let actions = match result {
            Ok(actions) => actions,
            // An update is in flight: wait for it to finish, then try again.
            Err(CommandError::WrongState(
                State::WaitAccept | State::WaitSignature | State::WaitComplete,
            )) => return Ok(Attempt::Busy),
            Err(e) => return Err(e.into()),
        };
        let on_chain = inner.channel.state() == State::OnChain;
        if inner.outbox.is_none() && !on_chain {
            return Err(self
                .undo_unsent(slot, &mut inner, command, &slot.peer)
                .await);
        }
        let (tx, rx) = oneshot::channel();
        if on_chain {
            // Nothing to wait for: the receiver is right here.
            if tx.send(Ok(())).is_err() {
                return Err(ControlError::Internal("answer lost".into()));
            }
        } else {
            let kind = match command {
                Command::Close => WaitKind::Close,
                _ => WaitKind::Update,
            };
            inner.waiter = Some((kind, tx));
        }
        // A force close broadcasts our commitment here, first among the actions, so that
        // the caller hears a refusal (issue 28: a commitment below the relay fee was
        // answered with success).
        let (actions, refused) = match command {
            Command::ForceClose => self.broadcast_commitment_first(slot.id, actions).await,
            _ => (actions, None),
        };
        if let Err(e) = self.run_actions(slot, &mut inner, actions).await {
            // Nothing after the failed write left; start over from the disk.
            inner.fall_back();
            inner.waiter = None;
            self.peers.kick(&slot.peer, "Internal error");
            return Err(e.into());
        }
        match refused {
            Some(e) => Err(e),
            None => Ok(Attempt::Proposed(rx)),
        }
    }

    /// A command the machine took while the peer is away: nothing was sent and nothing may
    /// be half-done, so it is undone; returns the caller's error.
    async fn undo_unsent(
        &self,
        slot: &Slot,
        inner: &mut SlotInner,
        command: &Command,
        peer: &PublicKey,
    ) -> ControlError {
        inner.fall_back();
        let Command::Fulfill(r) = command else {
            return ControlError::NotConnected(*peer);
        };
        // The owner has released R (its payer upstream may already hold it, and the peer
        // may have read it in an update a crash undid): forgetting it here would let the
        // peer time the HTLC out on chain. Kept, the deadline claims it with R.
        if inner.channel.remember_preimage(*r) {
            if let Err(e) = self.persist(slot, inner, &[]).await {
                return e.into();
            }
        }
        ControlError::NotConnectedKeepingR(*peer)
    }
}

/// Waits for a control call's answer, at most `timeout`.
async fn wait_for(
    rx: oneshot::Receiver<Result<(), ControlError>>,
    timeout: Duration,
) -> Result<(), ControlError> {
    match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(ControlError::PeerGone("the channel went away".into())),
        Err(_) => Err(ControlError::Timeout("the peer")),
    }
}
