//! Updates: our proposals (pay, add, fulfil, fail, time out an HTLC), the peer's, and
//! the accept, signature and complete exchange that commits both sides and revokes the
//! previous commitments.

use wire::{
    DeclineReason, Funding, Locktime, Onion, Packet, Preimage, Sha256, Update, UpdateAccept,
    UpdateAddHtlc, UpdateComplete, UpdateDeclineHtlc, UpdateFulfillHtlc, UpdateRoutefailHtlc,
    UpdateSignature, UpdateTimedoutHtlc,
};

use crate::funding::{CState, FundingError, Htlc, Who};
use crate::tx::{check_commitment, DUST_LIMIT_SAT};

use super::errors::{ChannelError, CommandError};
use super::types::{Action, Change, Event, RevokedCommitment, TimeUnit};
use super::{
    invariant, Accepted, Channel, Ctx, Established, HtlcOnion, Proposal, Signed, Stage, Step,
};

impl Channel {
    /// Pays `amount_msat` directly to the peer (`update`).
    ///
    /// # Errors
    /// Wrong state (an update in flight: retry after it), too large, or unaffordable.
    pub fn pay(&mut self, amount_msat: u64) -> Result<Vec<Action>, CommandError> {
        let amount_msat =
            u32::try_from(amount_msat).map_err(|_| CommandError::AmountTooLarge(amount_msat))?;
        self.propose(Change::Pay { amount_msat }, None)
    }

    /// Offers an HTLC of `amount_msat` locked to `r_hash` until `expiry` (`update_add_htlc`).
    ///
    /// # Errors
    /// Wrong state, too large, unaffordable, duplicate hash, or an unusable expiry.
    pub fn add_htlc(
        &mut self,
        amount_msat: u64,
        r_hash: Sha256,
        expiry: Locktime,
        now: u64,
    ) -> Result<Vec<Action>, CommandError> {
        self.add_htlc_with_onion(amount_msat, r_hash, expiry, None, now)
    }

    /// As [`Channel::add_htlc`], the packet carrying `onion` (field 5) when there is one:
    /// the route the peer is to forward the payment along (docs/onion.md). The onion is
    /// kept until the peer answers, so that a proposal deferred by a crossing one is sent
    /// again with it.
    ///
    /// # Errors
    /// As [`Channel::add_htlc`].
    pub fn add_htlc_with_onion(
        &mut self,
        amount_msat: u64,
        r_hash: Sha256,
        expiry: Locktime,
        onion: Option<Onion>,
        now: u64,
    ) -> Result<Vec<Action>, CommandError> {
        let amount_msat =
            u32::try_from(amount_msat).map_err(|_| CommandError::AmountTooLarge(amount_msat))?;
        if u64::from(amount_msat) < DUST_LIMIT_SAT * 1000 {
            return Err(CommandError::BelowDust(u64::from(amount_msat)));
        }
        let e = self.established_or_wrong_state()?;
        let ctx = self.ctx();
        ctx.check_expiry_unit(expiry, e.terms.our_delay_csv)
            .map_err(|unit| CommandError::MixedTimeUnits {
                what: "expiry",
                got: expiry,
                unit,
            })?;
        // The receiver claims with R under the delay we impose on it: a potluck peer
        // declines an HTLC that leaves it no room, so do not offer one.
        if !ctx.expiry_acceptable(expiry, now)
            || !ctx.expiry_leaves_claim_room(expiry, e.terms.our_delay_csv, now)
        {
            return Err(CommandError::BadExpiry(expiry));
        }
        if e.cstate.ours.htlcs.len() >= usize::from(self.config.max_htlcs_in_flight) {
            return Err(CommandError::TooManyHtlcs(self.config.max_htlcs_in_flight));
        }
        if e.collides_with_revocation(&ctx, &r_hash) {
            return Err(CommandError::RevocationHashCollision);
        }
        let actions = self.propose(
            Change::AddHtlc(Htlc {
                amount_msat,
                r_hash,
                expiry,
            }),
            onion.as_ref(),
        )?;
        if let (Some(onion), Stage::Established(e)) = (onion, &mut self.stage) {
            e.keep_onion(r_hash, onion);
        }
        Ok(actions)
    }

    /// Fulfills an HTLC offered to us with its R (`update_fulfill_htlc`). After a
    /// unilateral close, claims the HTLC output on chain with R instead. `now` (unix
    /// seconds) and the last [`Channel::block_height`] tell whether it is still time.
    ///
    /// # Errors
    /// Wrong state; no HTLC offered to us has this R; or it is too late to reveal R:
    /// [`CommandError::HtlcExpired`], or [`CommandError::TooLateToFulfill`] once the HTLC
    /// is within our claim delay plus half the margin of its expiry (where
    /// [`Channel::deadlines`] would send it on chain): a peer that took R and stalled the
    /// update could then refund the HTLC on chain before our claim with R confirms.
    pub fn fulfill_htlc(&mut self, r: Preimage, now: u64) -> Result<Vec<Action>, CommandError> {
        let e = self.established_or_wrong_state()?;
        if matches!(e.step, Step::OnChain(_)) {
            return self.claim_with_r(r);
        }
        match e.cstate.find_htlc(&r.hash()) {
            Some((Who::Them, h)) => {
                let ctx = self.ctx();
                if ctx.expired(&h, now) {
                    return Err(CommandError::HtlcExpired(h.expiry));
                }
                if ctx.claim_deadline_passed(h.expiry, e.terms.their_delay_csv, now) {
                    return Err(CommandError::TooLateToFulfill {
                        expiry: h.expiry,
                        lead: ctx.claim_lead(h.expiry, e.terms.their_delay_csv),
                        unit: TimeUnit::of(h.expiry),
                    });
                }
                self.propose(Change::Fulfill(r), None)
            }
            _ => Err(CommandError::UnknownPreimage),
        }
    }

    /// Fails an HTLC offered to us because it cannot be routed (`update_routefail_htlc`).
    ///
    /// # Errors
    /// Wrong state or no such HTLC.
    pub fn routefail_htlc(&mut self, r_hash: Sha256) -> Result<Vec<Action>, CommandError> {
        match self.established_or_wrong_state()?.cstate.find_htlc(&r_hash) {
            Some((Who::Them, _)) => self.propose(Change::Routefail(r_hash), None),
            _ => Err(CommandError::Funding(FundingError::NoSuchHtlc)),
        }
    }

    /// Removes our expired HTLC (`update_timedout_htlc`).
    ///
    /// # Errors
    /// Wrong state, no such HTLC, or not yet expired.
    pub fn timeout_htlc(&mut self, r_hash: Sha256, now: u64) -> Result<Vec<Action>, CommandError> {
        match self.established_or_wrong_state()?.cstate.find_htlc(&r_hash) {
            Some((Who::Us, h)) => {
                if !self.ctx().expired(&h, now) {
                    return Err(CommandError::NotExpired);
                }
                self.propose(Change::Timedout(r_hash), None)
            }
            _ => Err(CommandError::Funding(FundingError::NoSuchHtlc)),
        }
    }

    fn established_or_wrong_state(&self) -> Result<&Established, CommandError> {
        self.established()
            .ok_or(CommandError::WrongState(self.state()))
    }

    fn propose(
        &mut self,
        change: Change,
        onion: Option<&Onion>,
    ) -> Result<Vec<Action>, CommandError> {
        let state = self.state();
        let (ctx, stage) = self.split();
        let Stage::Established(e) = stage else {
            return Err(CommandError::WrongState(state));
        };
        propose(&ctx, e, change, onion)
    }
}

/// Proposes `change`; an HTLC goes with `onion`, or else the onion kept for its hash
/// (a deferred proposal sent again).
pub(super) fn propose(
    ctx: &Ctx,
    e: &mut Established,
    change: Change,
    onion: Option<&Onion>,
) -> Result<Vec<Action>, CommandError> {
    if e.step != Step::Normal {
        return Err(CommandError::WrongState(e.step.kind()));
    }
    let next = apply_change(&e.cstate, Who::Us, &change)?;
    // Make sure our new commitment can be built (expiry encodable); it is built when
    // the peer's signature on it arrives.
    check_commitment(&next)?;
    if let Change::AddHtlc(_) = change {
        // One more HTLC output, and the agreed fee is an absolute amount: the commitment
        // must still relay. Both sides' commitments have the same outputs in the bound
        // (a P2WSH and a P2WPKH balance, one P2WSH per HTLC): ours stands for both.
        let ours = e.our_commitment(ctx, &next, e.num + 1)?;
        let min_sat = ctx.commitment_min_fee(&ours);
        if next.fee_sat < min_sat {
            return Err(CommandError::CommitmentFeeTooLow {
                htlcs: next.ours.htlcs.len() + next.theirs.htlcs.len(),
                fee_sat: next.fee_sat,
                min_sat,
            });
        }
    }
    let onion = match change {
        Change::AddHtlc(h) => onion.or_else(|| e.onion_of(&h.r_hash)).cloned(),
        _ => None,
    };
    let pkt = proposal_packet(&change, ctx.our_rev_hash(e.num + 1), onion);
    if let Change::Fulfill(r) = change {
        // Their commitments keep the HTLC until they revoke them: R claims it on chain.
        e.remember_r(r);
    }
    e.step = Step::WaitAccept(Proposal { change, next });
    Ok(vec![Action::Send(pkt)])
}

/// Their `update_add_htlc`, checked: the HTLC, or the decline to answer with (a decline
/// changes nothing; an error ends the session).
fn their_htlc(
    ctx: &Ctx,
    e: &Established,
    a: &UpdateAddHtlc,
    now: u64,
) -> Result<Result<Htlc, Action>, ChannelError> {
    let htlc = Htlc {
        amount_msat: a.amount_msat,
        r_hash: a.r_hash,
        expiry: a.expiry,
    };
    ctx.check_expiry_unit(a.expiry, e.terms.their_delay_csv)
        .map_err(|unit| ChannelError::MixedTimeUnits {
            what: "update_add_htlc.expiry",
            got: a.expiry,
            unit,
        })?;
    // We claim it with R under the delay they impose on us: it must leave us room.
    if !ctx.their_expiry_passes(a.expiry, e.terms.their_delay_csv, now)
        || u64::from(a.amount_msat) < DUST_LIMIT_SAT * 1000
        || e.cstate.theirs.htlcs.len() >= usize::from(ctx.config.max_htlcs_in_flight)
    {
        return Ok(Err(decline_cannot_route()));
    }
    match e.cstate.add_htlc(Who::Them, htlc) {
        Err(FundingError::InsufficientFunds { needed_msat, .. }) => {
            return Ok(Err(decline_funds(needed_msat)));
        }
        Err(FundingError::FeeUnaffordable) => {
            let need =
                u64::from(htlc.amount_msat).saturating_add(e.cstate.fee_sat.saturating_mul(1000));
            return Ok(Err(decline_funds(need)));
        }
        _ => {}
    }
    Ok(Ok(htlc))
}

/// Their proposal `p` crossing ours (`mine`, in `WaitAccept`): the side with priority
/// keeps its own; the other defers its own, answers theirs, and proposes again after.
pub(super) fn on_crossing_proposal(
    ctx: &Ctx,
    e: &mut Established,
    p: &Packet,
    now: u64,
    mine: Change,
    veto: Option<DeclineReason>,
) -> Result<Vec<Action>, ChannelError> {
    if e.high_priority {
        // We win: the peer abandons its proposal and answers ours.
        return Ok(Vec::new());
    }
    let mut actions = on_proposal(ctx, e, p, now, Some(mine), veto)?;
    actions.insert(0, Action::Notify(Event::ProposalDeferred(mine)));
    if matches!(e.step, Step::WaitAccept(_)) {
        e.step = Step::Normal;
        // We declined their proposal: no update will complete to carry our
        // deferred one, so propose it again now (once), or say why not.
        actions.extend(repropose(ctx, e, mine));
        e.prune_onions();
    }
    Ok(actions)
}

/// Their proposal `p` in `Normal`: accept (sign their next commitment), or decline an HTLC
/// (also with the owner's `veto`, once the HTLC passed our own checks).
pub(super) fn on_proposal(
    ctx: &Ctx,
    e: &mut Established,
    p: &Packet,
    now: u64,
    deferred: Option<Change>,
    veto: Option<DeclineReason>,
) -> Result<Vec<Action>, ChannelError> {
    let (change, their_next_rev) = match p {
        Packet::Update(u) => {
            if u.delta_msat > 0 {
                return Err(ChannelError::TakesFromReceiver(u.delta_msat));
            }
            let amount = u.delta_msat.unsigned_abs();
            let amount_msat = u32::try_from(amount)
                .map_err(|_| ChannelError::AmountTooLarge(-i128::from(u.delta_msat)))?;
            (Change::Pay { amount_msat }, u.revocation_hash)
        }
        Packet::UpdateAddHtlc(a) => match (their_htlc(ctx, e, a, now)?, veto) {
            (Ok(htlc), None) => (Change::AddHtlc(htlc), a.revocation_hash),
            (Ok(_), Some(reason)) => return Ok(vec![decline(reason)]),
            (Err(decline), _) => return Ok(vec![decline]),
        },
        Packet::UpdateFulfillHtlc(f) => {
            match e.cstate.find_htlc(&f.r.hash()) {
                Some((Who::Us, _)) => {}
                _ => return Err(ChannelError::UnknownPreimage),
            }
            (Change::Fulfill(f.r), f.revocation_hash)
        }
        Packet::UpdateTimedoutHtlc(t) => {
            let h = e
                .cstate
                .find_htlc(&t.r_hash)
                .ok_or(FundingError::NoSuchHtlc)?;
            if !ctx.expired(&h.1, now) {
                return Err(ChannelError::NotExpired);
            }
            (Change::Timedout(t.r_hash), t.revocation_hash)
        }
        Packet::UpdateRoutefailHtlc(r) => {
            match e.cstate.find_htlc(&r.r_hash) {
                Some((Who::Us, _)) => {}
                _ => return Err(ChannelError::Funding(FundingError::NoSuchHtlc)),
            }
            (Change::Routefail(r.r_hash), r.revocation_hash)
        }
        _ => return Err(ChannelError::UnexpectedPacket(p.name())),
    };
    let next = apply_change(&e.cstate, Who::Them, &change)?;
    // An HTLC locked to a revocation hash of a commitment holding it makes that output
    // unspendable by the penalty (the revocation branch then takes the R branch or an
    // OP_IF with 2): refuse it, whether the HTLC or the hash is the new part.
    let revs = [
        their_next_rev,
        e.their_rev,
        ctx.our_rev_hash(e.num),
        ctx.our_rev_hash(e.num + 1),
    ];
    if holds_collision(&next, &revs) {
        return Err(ChannelError::RevocationHashCollision);
    }
    // Our next commitment holds the same HTLCs as theirs: building theirs checked that
    // ours can be built too.
    let theirs = e.their_commitment(ctx, &next, e.num + 1, &their_next_rev)?;
    // Their HTLC must not take the commitments below the minimum relay fee either (as
    // ours in `propose`): decline it, like any HTLC the channel cannot carry.
    if matches!(change, Change::AddHtlc(_)) && next.fee_sat < ctx.commitment_min_fee(&theirs) {
        return Ok(vec![decline_cannot_route()]);
    }
    let sig = e.sign(ctx, &theirs.tx);
    if let Change::Fulfill(r) = change {
        e.remember_r(r);
    }
    if let (Change::AddHtlc(h), Packet::UpdateAddHtlc(a)) = (change, p) {
        // Kept with the state that holds the HTLC: persisted before our accept leaves,
        // so the node can forward it also after a restart.
        if let Some(onion) = &a.onion {
            e.keep_onion(h.r_hash, onion.clone());
        }
    }
    e.step = Step::WaitSignature(Accepted {
        change,
        next,
        their_next_rev,
        deferred,
    });
    // The peer can broadcast its next commitment with this signature: persist the state
    // that watches for it before the signature leaves.
    Ok(vec![
        Action::Persist,
        Action::Send(Packet::UpdateAccept(UpdateAccept {
            sig,
            revocation_hash: ctx.our_rev_hash(e.num + 1),
        })),
    ])
}

pub(super) fn on_decline(
    e: &mut Established,
    d: &UpdateDeclineHtlc,
) -> Result<Vec<Action>, ChannelError> {
    let Step::WaitAccept(p) = &e.step else {
        return Err(invariant("decline handled in WaitAccept only"));
    };
    let Change::AddHtlc(h) = p.change else {
        return Err(ChannelError::UnexpectedPacket("update_decline_htlc"));
    };
    e.step = Step::Normal;
    e.prune_onions();
    Ok(vec![Action::Notify(Event::Declined {
        r_hash: h.r_hash,
        reason: d.reason,
    })])
}

pub(super) fn on_accept(
    ctx: &Ctx,
    e: &mut Established,
    a: &UpdateAccept,
) -> Result<Vec<Action>, ChannelError> {
    let Step::WaitAccept(p) = &e.step else {
        return Err(invariant("accept handled in WaitAccept only"));
    };
    let n = e.num + 1;
    if holds_collision(&p.next, &[a.revocation_hash]) {
        return Err(ChannelError::RevocationHashCollision);
    }
    let ours = e.our_commitment(ctx, &p.next, n)?;
    e.check_sig(&ours.tx, &a.sig, "update_accept.sig")?;
    let theirs = e.their_commitment(ctx, &p.next, n, &a.revocation_hash)?;
    let sig = e.sign(ctx, &theirs.tx);
    let preimage = ctx.our_preimage(e.num);
    // Checked: the proposal moves into the new state instead of being copied.
    let Step::WaitAccept(p) = e.step.take() else {
        return Err(invariant("accept handled in WaitAccept only"));
    };
    let their_prev = std::mem::replace(&mut e.cstate, p.next);
    let their_prev_rev = std::mem::replace(&mut e.their_rev, a.revocation_hash);
    e.their_sig = a.sig;
    e.num = n;
    e.step = Step::WaitComplete(Signed {
        change: p.change,
        their_prev,
        their_prev_rev,
    });
    Ok(vec![
        Action::Persist,
        Action::Send(Packet::UpdateSignature(UpdateSignature {
            sig,
            revocation_preimage: preimage,
        })),
    ])
}

/// Whether an HTLC of `cs` (either side's) is locked to one of the revocation hashes `revs`.
fn holds_collision(cs: &CState, revs: &[Sha256]) -> bool {
    cs.ours
        .htlcs
        .iter()
        .chain(&cs.theirs.htlcs)
        .any(|h| revs.contains(&h.r_hash))
}

/// Checks that `pre` is their revocation preimage for commitment `n`, whose hash they sent as `rev`.
fn check_their_preimage(
    e: &Established,
    n: u64,
    rev: &Sha256,
    pre: &Preimage,
) -> Result<(), ChannelError> {
    if &pre.hash() != rev {
        return Err(ChannelError::BadRevocationPreimage);
    }
    e.their_secrets.check(n, pre)?;
    Ok(())
}

pub(super) fn on_signature(
    ctx: &Ctx,
    e: &mut Established,
    s: &UpdateSignature,
) -> Result<Vec<Action>, ChannelError> {
    let Step::WaitSignature(p) = &e.step else {
        return Err(invariant("signature handled in WaitSignature only"));
    };
    let n = e.num + 1;
    let ours = e.our_commitment(ctx, &p.next, n)?;
    e.check_sig(&ours.tx, &s.sig, "update_signature.sig")?;
    check_their_preimage(e, e.num, &e.their_rev, &s.revocation_preimage)?;
    e.their_secrets.insert(e.num, &s.revocation_preimage)?;
    // Checked: what they accepted moves into the new state instead of being copied.
    let Step::WaitSignature(p) = e.step.take() else {
        return Err(invariant("signature handled in WaitSignature only"));
    };
    // Their commitment `num` (our current state) is revoked now.
    let preimage = ctx.our_preimage(e.num);
    let revoked = std::mem::replace(&mut e.cstate, p.next);
    let archive = archive(e.num, revoked);
    e.their_rev = p.their_next_rev;
    e.their_sig = s.sig;
    e.num = n;
    let mut actions: Vec<Action> = archive.into_iter().collect();
    actions.extend([
        Action::Persist,
        Action::Send(Packet::UpdateComplete(UpdateComplete {
            revocation_preimage: preimage,
        })),
    ]);
    actions.extend(finish_update(ctx, e, Who::Them, p.change, p.deferred));
    Ok(actions)
}

pub(super) fn on_complete(
    ctx: &Ctx,
    e: &mut Established,
    c: &UpdateComplete,
) -> Result<Vec<Action>, ChannelError> {
    let Step::WaitComplete(p) = &e.step else {
        return Err(invariant("complete handled in WaitComplete only"));
    };
    let n = e
        .num
        .checked_sub(1)
        .ok_or_else(|| invariant("WaitComplete follows an update: num ≥ 1"))?;
    check_their_preimage(e, n, &p.their_prev_rev, &c.revocation_preimage)?;
    e.their_secrets.insert(n, &c.revocation_preimage)?;
    // Checked: their previous commitment moves into the archive record, not copied.
    let Step::WaitComplete(p) = e.step.take() else {
        return Err(invariant("complete handled in WaitComplete only"));
    };
    let mut actions: Vec<Action> = archive(n, p.their_prev).into_iter().collect();
    actions.push(Action::Persist);
    actions.extend(finish_update(ctx, e, Who::Us, p.change, None));
    Ok(actions)
}

/// Common end of an update: toggle priority, notify, re-propose a deferred change.
fn finish_update(
    ctx: &Ctx,
    e: &mut Established,
    by: Who,
    change: Change,
    deferred: Option<Change>,
) -> Vec<Action> {
    e.high_priority = !e.high_priority;
    e.step = Step::Normal;
    e.prune_known_r();
    let mut actions = vec![Action::Notify(Event::UpdateCompleted { by, change })];
    if let Some(change) = deferred {
        actions.extend(repropose(ctx, e, change));
    }
    e.prune_onions();
    actions
}

/// The record of their revoked commitment `n` (balances `cs`, seen from us), if it held
/// HTLCs: ours, then theirs. Takes the revoked state, which the channel drops anyway.
fn archive(n: u64, cs: CState) -> Option<Action> {
    let mut htlcs = cs.ours.htlcs;
    htlcs.extend(cs.theirs.htlcs);
    (!htlcs.is_empty()).then_some(Action::Archive(RevokedCommitment {
        commitment_number: n,
        htlcs,
    }))
}

/// Proposes a deferred change again, or drops it with [`Event::ProposalDropped`]: either
/// way the command that started it gets its answer (`UpdateCompleted`, `Declined` or this).
pub(super) fn repropose(ctx: &Ctx, e: &mut Established, change: Change) -> Vec<Action> {
    match propose(ctx, e, change, None) {
        Ok(a) => a,
        Err(err) => vec![Action::Notify(Event::ProposalDropped {
            change,
            error: err.to_string(),
        })],
    }
}

/// `update_decline_htlc` with `reason`.
fn decline(reason: DeclineReason) -> Action {
    Action::Send(Packet::UpdateDeclineHtlc(UpdateDeclineHtlc {
        reason: Some(reason),
    }))
}

/// `update_decline_htlc{cannot_route}`: an HTLC the channel cannot carry.
fn decline_cannot_route() -> Action {
    decline(DeclineReason::CannotRoute(true))
}

/// `update_decline_htlc{insufficient_funds}` with the funding (in satoshis, rounded up) that would be needed.
fn decline_funds(needed_msat: u64) -> Action {
    Action::Send(Packet::UpdateDeclineHtlc(UpdateDeclineHtlc {
        reason: Some(DeclineReason::InsufficientFunds(Funding {
            fixed: Some(i64::try_from(needed_msat.div_ceil(1000)).unwrap_or(i64::MAX)),
            per_micro_unit: None,
        })),
    }))
}

/// Whether a packet is one of the five proposals.
pub(super) fn is_proposal(p: &Packet) -> bool {
    matches!(
        p,
        Packet::Update(_)
            | Packet::UpdateAddHtlc(_)
            | Packet::UpdateFulfillHtlc(_)
            | Packet::UpdateTimedoutHtlc(_)
            | Packet::UpdateRoutefailHtlc(_)
    )
}

/// The packet that proposes `change` with our next revocation hash (and an HTLC's onion).
fn proposal_packet(change: &Change, rev: Sha256, onion: Option<Onion>) -> Packet {
    match *change {
        Change::Pay { amount_msat } => Packet::Update(Update {
            revocation_hash: rev,
            delta_msat: -i64::from(amount_msat),
        }),
        Change::AddHtlc(h) => Packet::UpdateAddHtlc(UpdateAddHtlc {
            revocation_hash: rev,
            amount_msat: h.amount_msat,
            r_hash: h.r_hash,
            expiry: h.expiry,
            onion,
        }),
        Change::Fulfill(r) => Packet::UpdateFulfillHtlc(UpdateFulfillHtlc {
            revocation_hash: rev,
            r,
        }),
        Change::Timedout(r_hash) => Packet::UpdateTimedoutHtlc(UpdateTimedoutHtlc {
            revocation_hash: rev,
            r_hash,
        }),
        Change::Routefail(r_hash) => Packet::UpdateRoutefailHtlc(UpdateRoutefailHtlc {
            revocation_hash: rev,
            r_hash,
        }),
    }
}

impl Established {
    /// The onion kept for the HTLC `r_hash`, ours or theirs.
    pub(super) fn onion_of(&self, r_hash: &Sha256) -> Option<&Onion> {
        self.onions
            .iter()
            .find(|o| o.r_hash == *r_hash)
            .map(|o| &o.onion)
    }

    /// Keeps `onion` for the HTLC `r_hash` (replacing any kept under that hash).
    fn keep_onion(&mut self, r_hash: Sha256, onion: Onion) {
        self.onions.retain(|o| o.r_hash != r_hash);
        self.onions.push(HtlcOnion { r_hash, onion });
    }

    /// Forgets the onions no longer needed: kept are those of the peer's HTLCs in our
    /// current commitment and of our HTLC being proposed.
    pub(super) fn prune_onions(&mut self) {
        if self.onions.is_empty() {
            return;
        }
        let proposing = match &self.step {
            Step::WaitAccept(p) => match p.change {
                Change::AddHtlc(h) => Some(h.r_hash),
                _ => None,
            },
            _ => None,
        };
        let cs = &self.cstate;
        self.onions.retain(|o| {
            Some(o.r_hash) == proposing || matches!(cs.find_htlc(&o.r_hash), Some((Who::Them, _)))
        });
    }
}

/// Applies `change` proposed by `by` to `cs`.
///
/// # Errors
/// Unaffordable, or no such HTLC on the right side.
pub fn apply_change(cs: &CState, by: Who, change: &Change) -> Result<CState, FundingError> {
    match change {
        Change::Pay { amount_msat } => cs.pay(by, u64::from(*amount_msat)),
        Change::AddHtlc(h) => cs.add_htlc(by, *h),
        Change::Fulfill(r) => cs.remove_htlc(by.other(), &r.hash(), true),
        Change::Routefail(h) => cs.remove_htlc(by.other(), h, false),
        Change::Timedout(h) => {
            let (offerer, _) = cs.find_htlc(h).ok_or(FundingError::NoSuchHtlc)?;
            cs.remove_htlc(offerer, h, false)
        }
    }
}
