//! On-chain resolution of a channel: recognising which transaction spent the
//! anchor, and the claims that follow (our delayed outputs, HTLCs with R or
//! after expiry, and the penalty on a revoked commitment).

use bitcoin::absolute::LockTime;
use bitcoin::{OutPoint, ScriptBuf, Sequence, Transaction};
use wire::Preimage;

use super::{
    delay_blocks_equivalent, Action, Channel, CommandError, Ctx, Established, Event, Resolution,
    RevokedCommitment, Stage, Step, Unclaimable,
};
use crate::funding::{Htlc, Who};
use crate::script::{cltv_value, htlc_offered_script, htlc_received_script, revocable_script};
use crate::tx::{
    commitment_number, p2wpkh, sweep_tx, Commitment, OutputKind, SweepInput, SweepWitness, TxError,
};

/// A broken internal invariant in an owner command or chain event.
fn invariant(what: &'static str) -> CommandError {
    debug_assert!(false, "channel invariant broken: {what}");
    CommandError::Invariant(what)
}

impl Channel {
    /// Broadcasts our latest commitment transaction (unilateral close). Once our own
    /// commitment is on chain, only re-sends it.
    ///
    /// After a cooperative close signed by both, sends that close again instead.
    ///
    /// # Errors
    /// No signed commitment yet; the close is signed by both but was not kept (a state
    /// saved before the signed close was); or their commitment or their revoked one
    /// spent the anchor.
    pub fn force_close(&mut self) -> Result<Vec<Action>, CommandError> {
        let state = self.state();
        let (ctx, stage) = self.split();
        let Stage::Established(e) = stage else {
            return Err(CommandError::WrongState(state));
        };
        // After their commitment, ours can never confirm, and taking it as the resolution
        // would drop the claims on what is on chain (an HTLC claimed with R after this
        // spent our commitment's outputs, which never exist). A close signed by both is
        // broadcast and re-sent until it confirms; it pays both at once and carries no
        // HTLC, so our commitment could only compete with it (and, once the close is
        // mined, would stay queued and turn the channel `on_chain` for good).
        if let (Step::CloseWaitAck | Step::Closed, Some(close)) = (&e.step, &e.signed_close) {
            return Ok(vec![Action::Broadcast(close.clone())]);
        }
        match &e.step {
            Step::CloseWaitAck
            | Step::Closed
            | Step::OnChain(Resolution::Penalty { .. })
            | Step::OnChain(Resolution::Unrecognised { .. })
            | Step::OnChain(Resolution::Commitment {
                owner: Who::Them, ..
            }) => return Err(CommandError::WrongState(state)),
            _ => {}
        }
        let tx = e.signed_commitment(&ctx)?;
        let mut next = (**e).clone();
        let mut actions = vec![Action::Broadcast(tx.clone())];
        actions.extend(next.on_commitment_seen(&ctx, &tx, None)?);
        **e = next;
        Ok(actions)
    }

    /// A transaction spending the anchor was seen on chain.
    ///
    /// Ours: claims follow. Theirs, current: we sweep what is ours. Theirs,
    /// revoked: a penalty transaction takes every output. The close: done.
    ///
    /// `revoked`: the [`RevokedCommitment`] archived under the number that `tx`
    /// encodes ([`crate::tx::commitment_number`]), if the node has one; without it a
    /// penalty takes every output except the HTLCs.
    ///
    /// # Errors
    /// A claim could not be built.
    pub fn spend_seen(
        &mut self,
        tx: &Transaction,
        revoked: Option<&RevokedCommitment>,
    ) -> Result<Vec<Action>, CommandError> {
        let (ctx, stage) = self.split();
        let Stage::Established(e) = stage else {
            return Ok(Vec::new());
        };
        if !tx
            .input
            .iter()
            .any(|i| i.previous_output == e.anchor.outpoint)
        {
            return Ok(Vec::new());
        }
        let mut next = (**e).clone();
        let actions = next.on_commitment_seen(&ctx, tx, revoked)?;
        **e = next;
        Ok(actions)
    }

    /// After a unilateral close, claims the HTLC output locked to `r`'s hash with R.
    pub(super) fn claim_with_r(&mut self, r: Preimage) -> Result<Vec<Action>, CommandError> {
        let state = self.state();
        let (ctx, stage) = self.split();
        let Stage::Established(e) = stage else {
            return Err(CommandError::WrongState(state));
        };
        let Step::OnChain(Resolution::Commitment { owner, commitment }) = &e.step else {
            return Err(CommandError::WrongState(state));
        };
        let (owner, commitment) = (*owner, commitment.clone());
        let mut next = (**e).clone();
        next.remember_r(r);
        let all = match owner {
            Who::Us => next.claim_own(&ctx, &commitment)?,
            Who::Them => next.claim_from_theirs(&ctx, &commitment)?,
        };
        // Only the claims that spend an HTLC output with this R.
        let h = r.hash();
        let wanted: Vec<u32> = commitment
            .outputs
            .iter()
            .enumerate()
            .filter(|(_, o)| match (owner, o.kind) {
                (Who::Us, OutputKind::HtlcReceived(x))
                | (Who::Them, OutputKind::HtlcOffered(x)) => x.r_hash == h,
                _ => false,
            })
            .map(|(i, _)| i as u32)
            .collect();
        if wanted.is_empty() {
            return Err(CommandError::UnknownPreimage);
        }
        let actions = all
            .into_iter()
            .filter(|a| {
                let tx = match a {
                    Action::Broadcast(tx) | Action::BroadcastLater { tx, .. } => tx,
                    _ => return false,
                };
                tx.input
                    .iter()
                    .any(|i| wanted.contains(&i.previous_output.vout))
            })
            .collect();
        **e = next;
        Ok(actions)
    }
}

impl Established {
    pub(super) fn on_commitment_seen(
        &mut self,
        ctx: &Ctx,
        tx: &Transaction,
        revoked: Option<&RevokedCommitment>,
    ) -> Result<Vec<Action>, CommandError> {
        let txid = tx.compute_txid();
        if let Step::OnChain(Resolution::Commitment { commitment, .. }) = &self.step {
            if commitment.tx.compute_txid() == txid {
                // Already handled (we broadcast it ourselves, or saw it before).
                return Ok(Vec::new());
            }
        }
        // Closing transaction?
        if tx.lock_time == LockTime::ZERO && commitment_number(tx).is_none() {
            self.step = Step::Closed;
            return Ok(vec![Action::Persist, Action::Notify(Event::Closed(txid))]);
        }
        let ours = self.our_commitment(ctx, &self.cstate, self.num)?;
        if ours.tx.compute_txid() == txid {
            let claims = self.claim_own(ctx, &ours)?;
            self.note_unclaimable(&claims);
            self.step = Step::OnChain(Resolution::Commitment {
                owner: Who::Us,
                commitment: ours,
            });
            let mut a = vec![
                Action::Persist,
                Action::Notify(Event::OnChain {
                    txid,
                    owner: Who::Us,
                }),
            ];
            a.extend(claims);
            return Ok(a);
        }
        // Every commitment of theirs we signed and they have not revoked.
        let mut candidates = vec![(self.cstate.clone(), self.their_rev, self.num)];
        match &self.step {
            Step::WaitComplete(s) => {
                let n = self
                    .num
                    .checked_sub(1)
                    .ok_or_else(|| invariant("WaitComplete follows an update: num ≥ 1"))?;
                candidates.push((s.their_prev.clone(), s.their_prev_rev, n));
            }
            // We signed their next commitment in `update_accept`.
            Step::WaitSignature(a) => {
                candidates.push((a.next.clone(), a.their_next_rev, self.num + 1));
            }
            _ => {}
        }
        for (c, rev, n) in candidates {
            let theirs = self.their_commitment(ctx, &c, n, &rev)?;
            if theirs.tx.compute_txid() == txid {
                let claims = self.claim_from_theirs(ctx, &theirs)?;
                self.note_unclaimable(&claims);
                self.step = Step::OnChain(Resolution::Commitment {
                    owner: Who::Them,
                    commitment: theirs,
                });
                let mut a = vec![
                    Action::Persist,
                    Action::Notify(Event::OnChain {
                        txid,
                        owner: Who::Them,
                    }),
                ];
                a.extend(claims);
                return Ok(a);
            }
        }
        // A revoked commitment of theirs?
        if let Some(n) = commitment_number(tx) {
            if let Some(pre) = self.their_secrets.get(n) {
                let htlcs = revoked
                    .filter(|r| r.commitment_number == n)
                    .map_or(&[][..], |r| &r.htlcs[..]);
                let penalty = self.penalty(ctx, tx, &pre, htlcs)?;
                self.step = Step::OnChain(Resolution::Penalty {
                    commitment_number: n,
                });
                return Ok(vec![
                    Action::Persist,
                    Action::Broadcast(penalty),
                    Action::Notify(Event::CheatDetected {
                        commitment_number: n,
                    }),
                ]);
            }
        }
        // Only transactions we signed can spend the anchor, and we watch every one of
        // them: this is lost state or a bug, and the operator must look at once. The
        // anchor is gone whatever it was: no update may be signed on it any more.
        self.step = Step::OnChain(Resolution::Unrecognised { txid });
        Ok(vec![
            Action::Persist,
            Action::Notify(Event::AnchorSpentUnrecognised { txid }),
        ])
    }

    /// Remembers the outputs `claims` reports as not worth claiming (for `listchannels`).
    fn note_unclaimable(&mut self, claims: &[Action]) {
        for a in claims {
            if let Action::Notify(Event::Unclaimable {
                outpoint,
                value,
                fee_sat,
            }) = a
            {
                if !self.unclaimable.iter().any(|u| u.outpoint == *outpoint) {
                    self.unclaimable.push(Unclaimable {
                        outpoint: *outpoint,
                        value: *value,
                        fee_sat: *fee_sat,
                    });
                }
            }
        }
    }

    /// Every output of their revoked commitment `tx`, to our final key.
    fn penalty(
        &self,
        ctx: &Ctx,
        tx: &Transaction,
        pre: &Preimage,
        htlcs: &[Htlc],
    ) -> Result<Transaction, CommandError> {
        let their_final = self.terms.their_final;
        let rev = pre.hash();
        let delay = self.terms.our_delay_csv;
        let txid = tx.compute_txid();
        let mut candidates: Vec<ScriptBuf> =
            vec![revocable_script(&rev, &ctx.our_final, delay, &their_final)];
        for h in htlcs {
            // An HTLC locked to the revocation hash itself cannot be taken with the
            // preimage (the offered script's OP_IF gets 2, the received one takes the R
            // branch): leave its output out rather than make the whole penalty invalid.
            if h.r_hash == rev {
                continue;
            }
            let Ok(e) = cltv_value(h.expiry) else {
                continue;
            };
            candidates.push(htlc_offered_script(
                &their_final,
                &ctx.our_final,
                e,
                delay,
                &rev,
                &h.r_hash,
            ));
            candidates.push(htlc_received_script(
                &their_final,
                &ctx.our_final,
                e,
                delay,
                &rev,
                &h.r_hash,
            ));
        }
        let ours_p2wpkh = p2wpkh(&ctx.our_final);
        let mut inputs = Vec::new();
        for (vout, out) in tx.output.iter().enumerate() {
            let outpoint = OutPoint {
                txid,
                vout: vout as u32,
            };
            let witness = if out.script_pubkey == ours_p2wpkh {
                SweepWitness::P2wpkh
            } else if let Some(s) = candidates
                .iter()
                .find(|s| s.to_p2wsh() == out.script_pubkey)
            {
                SweepWitness::Script {
                    witness_script: s.clone(),
                    secret: pre.0.to_vec(),
                }
            } else {
                continue;
            };
            let input = SweepInput {
                outpoint,
                value: out.value,
                witness,
                sequence: Sequence::ENABLE_RBF_NO_LOCKTIME,
                key: ctx.secrets.final_key,
            };
            // An output worth less than the fee its input adds would only lower what the
            // penalty recovers (and a peer could add many to price the penalty out).
            if out.value.to_sat() <= ctx.input_fee(&input) {
                continue;
            }
            inputs.push(input);
        }
        let fee = ctx.sweep_fee(&inputs);
        Ok(sweep_tx(
            &inputs,
            p2wpkh(&ctx.our_final),
            fee,
            LockTime::ZERO,
        )?)
    }

    /// Claims from our own commitment on chain: every output of ours, after our delay.
    fn claim_own(&self, ctx: &Ctx, c: &Commitment) -> Result<Vec<Action>, CommandError> {
        let their_delay_csv = self.terms.their_delay_csv;
        let txid = c.tx.compute_txid();
        let mut actions = Vec::new();
        for (vout, o) in c.outputs.iter().enumerate() {
            let (secret, lock) = match o.kind {
                OutputKind::ToOwner => (Vec::new(), 0),
                OutputKind::HtlcOffered(h) => (
                    Vec::new(),
                    // The commitment's script was built from this expiry, so it encodes.
                    cltv_value(h.expiry).map_err(|_| invariant("HTLC expiry encodable"))?,
                ),
                OutputKind::HtlcReceived(h) => {
                    match self.known_r.iter().find(|r| r.hash() == h.r_hash) {
                        Some(r) => (r.0.to_vec(), 0),
                        None => continue,
                    }
                }
                OutputKind::ToOther => continue,
            };
            let input = SweepInput {
                outpoint: OutPoint {
                    txid,
                    vout: vout as u32,
                },
                value: o.value,
                witness: SweepWitness::Script {
                    witness_script: o.witness_script.clone(),
                    secret,
                },
                sequence: Sequence::from_consensus(their_delay_csv),
                key: ctx.secrets.final_key,
            };
            let Some(tx) = claim(ctx, input, lock, &mut actions)? else {
                continue;
            };
            actions.push(Action::BroadcastLater {
                tx,
                csv_blocks: delay_blocks_equivalent(their_delay_csv),
                lock_time: lock,
            });
        }
        Ok(actions)
    }

    /// Claims from their valid commitment on chain: our direct output, their HTLCs
    /// with R, our HTLCs after expiry.
    fn claim_from_theirs(&self, ctx: &Ctx, c: &Commitment) -> Result<Vec<Action>, CommandError> {
        let txid = c.tx.compute_txid();
        let mut actions = Vec::new();
        for (vout, o) in c.outputs.iter().enumerate() {
            let outpoint = OutPoint {
                txid,
                vout: vout as u32,
            };
            let (witness, lock) = match o.kind {
                OutputKind::ToOther => (SweepWitness::P2wpkh, 0),
                // Their offered HTLC: ours with R.
                OutputKind::HtlcOffered(h) => {
                    match self.known_r.iter().find(|r| r.hash() == h.r_hash) {
                        Some(r) => (
                            SweepWitness::Script {
                                witness_script: o.witness_script.clone(),
                                secret: r.0.to_vec(),
                            },
                            0,
                        ),
                        None => continue,
                    }
                }
                // Our offered HTLC on their commitment: refund after expiry.
                OutputKind::HtlcReceived(h) => (
                    SweepWitness::Script {
                        witness_script: o.witness_script.clone(),
                        secret: Vec::new(),
                    },
                    cltv_value(h.expiry).map_err(|_| invariant("HTLC expiry encodable"))?,
                ),
                OutputKind::ToOwner => continue,
            };
            let input = SweepInput {
                outpoint,
                value: o.value,
                witness,
                sequence: Sequence::ENABLE_RBF_NO_LOCKTIME,
                key: ctx.secrets.final_key,
            };
            let Some(tx) = claim(ctx, input, lock, &mut actions)? else {
                continue;
            };
            if lock == 0 {
                actions.push(Action::Broadcast(tx));
            } else {
                actions.push(Action::BroadcastLater {
                    tx,
                    csv_blocks: 0,
                    lock_time: lock,
                });
            }
        }
        Ok(actions)
    }
}

/// Signs the claim of one output at the current fee rate; an output worth less than
/// that fee plus dust is reported in `actions` and left out (`None`), never an error
/// that would drop the claims of the other outputs.
fn claim(
    ctx: &Ctx,
    input: SweepInput,
    lock: u32,
    actions: &mut Vec<Action>,
) -> Result<Option<Transaction>, CommandError> {
    let fee = ctx.sweep_fee(std::slice::from_ref(&input));
    match sweep_tx(
        std::slice::from_ref(&input),
        p2wpkh(&ctx.our_final),
        fee,
        LockTime::from_consensus(lock),
    ) {
        Ok(tx) => Ok(Some(tx)),
        Err(TxError::FeeTooHigh { fee_sat, .. }) => {
            actions.push(Action::Notify(Event::Unclaimable {
                outpoint: input.outpoint,
                value: input.value,
                fee_sat,
            }));
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}
