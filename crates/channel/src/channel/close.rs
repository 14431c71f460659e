//! The cooperative close: `close_channel`, its completion and acknowledgement, and
//! saying it again after a lost session.

use wire::{CloseChannel, CloseChannelComplete, Packet};

use crate::tx::{finalize_anchor_spend, p2wpkh};

use super::errors::{ChannelError, CommandError};
use super::types::{Action, Event};
use super::{Channel, Ctx, Established, Stage, Step};

impl Channel {
    /// Starts a cooperative close (`close_channel`) with our configured close fee.
    ///
    /// # Errors
    /// Wrong state, HTLCs pending, or the fee is unaffordable.
    pub fn close(&mut self) -> Result<Vec<Action>, CommandError> {
        let state = self.state();
        let (ctx, stage) = self.split();
        let Stage::Established(e) = stage else {
            return Err(CommandError::WrongState(state));
        };
        if e.step != Step::Normal {
            return Err(CommandError::WrongState(state));
        }
        if !e.cstate.ours.htlcs.is_empty() || !e.cstate.theirs.htlcs.is_empty() {
            return Err(CommandError::HtlcsPending);
        }
        // A fair fee at our rate, brought into the range the peer accepts (one probe
        // gives the weight: a fee only ever drops an output, which makes it lighter).
        let probe = e.close_transaction(&ctx, 0)?;
        let (min_sat, max_sat) = ctx.close_fee_range(&probe, e.cstate.anchor_sat);
        if min_sat > max_sat {
            return Err(CommandError::BadCloseFee {
                fee_sat: ctx.fair_close_fee(&probe),
                min_sat,
                max_sat,
            });
        }
        let fee_sat = ctx.fair_close_fee(&probe).clamp(min_sat, max_sat);
        let tx = e.close_transaction(&ctx, fee_sat)?;
        let sig = e.sign(&ctx, &tx);
        e.step = Step::CloseWaitComplete { fee_sat };
        // The peer can complete and broadcast the close from here on: the channel must
        // never come back to `Normal`, even after a restart.
        Ok(vec![
            Action::Persist,
            Action::Send(Packet::Close(CloseChannel {
                sig,
                close_fee: fee_sat,
            })),
        ])
    }

    /// A new session with the peer is up (after a disconnect or a restart): what to
    /// send so that an exchange that survives a lost session goes on. After our
    /// `close_channel` the close may already be in the peer's hands: we never go back
    /// to `Normal`, and say `close_channel` again (the same fee and, RFC 6979 being
    /// deterministic, the same signature) so that the close completes.
    ///
    /// # Errors
    /// The close transaction cannot be rebuilt (a broken invariant).
    pub fn reconnected(&mut self) -> Result<Vec<Action>, CommandError> {
        let (ctx, stage) = self.split();
        let Stage::Established(e) = stage else {
            return Ok(Vec::new());
        };
        let Step::CloseWaitComplete { fee_sat } = e.step else {
            return Ok(Vec::new());
        };
        let tx = e.close_transaction(&ctx, fee_sat)?;
        let sig = e.sign(&ctx, &tx);
        // Already on disk; the Persist keeps the guarantee simple (no signature without one).
        Ok(vec![
            Action::Persist,
            Action::Send(Packet::Close(CloseChannel {
                sig,
                close_fee: fee_sat,
            })),
        ])
    }
}

pub(super) fn on_close(
    ctx: &Ctx,
    e: &mut Established,
    c: &CloseChannel,
) -> Result<Vec<Action>, ChannelError> {
    if !e.cstate.ours.htlcs.is_empty() || !e.cstate.theirs.htlcs.is_empty() {
        return Err(ChannelError::UnexpectedPacket("close"));
    }
    let mut tx = e
        .close_transaction(ctx, c.close_fee)
        .map_err(|err| ChannelError::BadClose(format!("close_fee {}: {err}", c.close_fee)))?;
    let (min_sat, max_sat) = ctx.close_fee_range(&tx, e.cstate.anchor_sat);
    if !(min_sat..=max_sat).contains(&c.close_fee) {
        return Err(ChannelError::BadClose(format!(
            "close_fee {} outside {min_sat}..={max_sat} sat (minimum relay fee, our share of the channel)",
            c.close_fee
        )));
    }
    // The fee is split like the commitment fee: a peer that owns little would make us
    // pay nearly all of a fee it names. Whatever the split, we pay at most one fair fee.
    let fair = ctx.fair_close_fee(&tx);
    let ours_out = tx
        .output
        .iter()
        .find(|o| o.script_pubkey == p2wpkh(&ctx.our_final))
        .map_or(0, |o| o.value.to_sat());
    let our_share = (e.cstate.ours.total_msat() / 1000).saturating_sub(ours_out);
    if our_share > fair {
        return Err(ChannelError::BadClose(format!(
            "close_fee {} would cost us {our_share} sat, more than a fair fee of {fair} sat",
            c.close_fee
        )));
    }
    e.check_sig(&tx, &c.sig, "close_channel.sig")?;
    let sig = e.sign(ctx, &tx);
    finalize_anchor_spend(
        &mut tx,
        &ctx.our_commit,
        &sig,
        &e.terms.their_commit,
        &c.sig,
    );
    e.step = Step::CloseWaitAck;
    e.signed_close = Some(tx.clone());
    Ok(vec![
        Action::Persist,
        Action::Broadcast(tx.clone()),
        Action::Send(Packet::CloseComplete(CloseChannelComplete { sig })),
        Action::Notify(Event::Closed(tx.compute_txid())),
    ])
}

pub(super) fn on_close_complete(
    ctx: &Ctx,
    e: &mut Established,
    c: &CloseChannelComplete,
    fee_sat: u64,
) -> Result<Vec<Action>, ChannelError> {
    let mut tx = e
        .close_transaction(ctx, fee_sat)
        .map_err(|err| ChannelError::BadClose(err.to_string()))?;
    e.check_sig(&tx, &c.sig, "close_channel_complete.sig")?;
    let sig = e.sign(ctx, &tx);
    finalize_anchor_spend(
        &mut tx,
        &ctx.our_commit,
        &sig,
        &e.terms.their_commit,
        &c.sig,
    );
    e.step = Step::Closed;
    e.signed_close = Some(tx.clone());
    Ok(vec![
        Action::Persist,
        Action::Send(Packet::CloseAck),
        Action::Broadcast(tx.clone()),
        Action::Notify(Event::Closed(tx.compute_txid())),
    ])
}

/// Their `close_channel` crossing ours: the side with priority keeps its own close.
pub(super) fn on_crossing_close(
    ctx: &Ctx,
    e: &mut Established,
    c: &CloseChannel,
) -> Result<Vec<Action>, ChannelError> {
    if e.high_priority {
        Ok(Vec::new())
    } else {
        on_close(ctx, e, c)
    }
}

/// Their `close_channel_ack`: the close is done on both sides.
pub(super) fn on_close_ack(e: &mut Established) -> Vec<Action> {
    e.step = Step::Closed;
    vec![Action::Persist]
}
