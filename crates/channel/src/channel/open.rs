//! Opening a channel: `open_channel` both ways, the anchor, the first signatures and
//! `open_complete` once the anchor is deep enough.

use bitcoin::{Amount, OutPoint, Transaction};
use wire::{AnchorOffer, OpenAnchor, OpenChannel, OpenCommitSig, OpenComplete, Packet};

use crate::funding::CState;
use crate::script::{anchor_script, csv_value};
use crate::shachain::RevocationSecrets;
use crate::tx::sign_anchor_spend;

use super::commitments::their_commitment;
use super::errors::{ChannelError, CommandError};
use super::types::{Action, AnchorRole, Event, TimeUnit};
use super::{
    delay_blocks_equivalent, invariant, sha256d_to_txid, txid_to_sha256d, AnchorInfo, Channel,
    Established, Stage, Step, Terms, Unsigned,
};

impl Channel {
    fn anchor_offer(&self) -> AnchorOffer {
        match self.role {
            AnchorRole::Fund { .. } => AnchorOffer::WillCreateAnchor,
            AnchorRole::Accept => AnchorOffer::WontCreateAnchor,
        }
    }

    /// Sends our `open_channel`. Call once the session is up.
    ///
    /// # Errors
    /// [`CommandError::WrongState`] unless the channel is new; [`CommandError::BadConfig`]
    /// if our configured delay cannot be expressed.
    pub fn start(&mut self) -> Result<Vec<Action>, CommandError> {
        if self.stage != Stage::Init {
            return Err(CommandError::WrongState(self.state()));
        }
        csv_value(self.config.delay).map_err(|e| CommandError::BadConfig(e.to_string()))?;
        self.stage = Stage::OpenWaitOpen;
        let ctx = self.ctx();
        Ok(vec![Action::Send(Packet::Open(OpenChannel {
            delay: self.config.delay,
            revocation_hash: ctx.our_rev_hash(0),
            commit_key: wire::ChainPubkey::new(self.our_commit),
            final_key: wire::ChainPubkey::new(self.our_final),
            anch: self.anchor_offer(),
            min_depth: Some(self.config.min_depth),
            commitment_fee: self.config.commitment_fee_sat,
        }))])
    }

    /// Funder: the anchor transaction `tx` pays the 2-of-2 at output `vout`.
    /// Signs the peer's first commitment and sends `open_anchor`.
    ///
    /// # Errors
    /// Wrong state, or the output does not pay the agreed script and amount.
    pub fn anchor_created(
        &mut self,
        tx: Transaction,
        vout: u32,
    ) -> Result<Vec<Action>, CommandError> {
        let (AnchorRole::Fund { anchor_sat }, Stage::OpenWaitAnchorTx { terms, their_rev }) =
            (self.role, &self.stage)
        else {
            return Err(CommandError::WrongState(self.state()));
        };
        let (terms, their_rev) = (*terms, *their_rev);
        let script = anchor_script(&self.our_commit, &terms.their_commit);
        let ok = tx.output.get(vout as usize).is_some_and(|o| {
            o.script_pubkey == script.to_p2wsh() && o.value == Amount::from_sat(anchor_sat)
        });
        if !ok {
            return Err(CommandError::BadAnchorTx(anchor_sat));
        }
        let outpoint = OutPoint {
            txid: tx.compute_txid(),
            vout,
        };
        let anchor = AnchorInfo {
            outpoint,
            amount: Amount::from_sat(anchor_sat),
            script,
        };
        let cs = CState::initial(anchor_sat, terms.fee_sat, true)?;
        let ctx = self.ctx();
        let theirs = their_commitment(&ctx, &terms, &anchor, &cs, 0, &their_rev)?;
        let sig = sign_anchor_spend(
            &theirs.tx,
            &anchor.script,
            anchor.amount,
            &self.secrets.commit_key,
        );
        self.stage = Stage::OpenWaitCommitSig(Box::new(Unsigned {
            terms,
            anchor,
            anchor_tx: tx,
            cstate: cs,
            their_rev,
        }));
        Ok(vec![
            Action::Persist,
            Action::Send(Packet::OpenAnchor(OpenAnchor {
                txid: txid_to_sha256d(&outpoint.txid),
                output_index: vout,
                amount: anchor_sat,
                commit_sig: sig,
            })),
        ])
    }

    /// The anchor has `depth` confirmations.
    pub fn anchor_depth(&mut self, depth: u32) -> Vec<Action> {
        let min_depth = self.config.min_depth;
        let Stage::Established(e) = &mut self.stage else {
            return Vec::new();
        };
        let Step::OpenWaitComplete { sent, got } = &mut e.step else {
            return Vec::new();
        };
        if *sent || depth < min_depth {
            return Vec::new();
        }
        *sent = true;
        let mut actions = vec![Action::Send(Packet::OpenComplete(OpenComplete::default()))];
        if *got {
            e.step = Step::Normal;
            actions.push(Action::Persist);
            actions.push(Action::Notify(Event::Live));
        }
        actions
    }

    pub(super) fn on_open(&mut self, o: &OpenChannel) -> Result<Vec<Action>, ChannelError> {
        if o.anch == self.anchor_offer() {
            return Err(ChannelError::BadOpen(match o.anch {
                AnchorOffer::WillCreateAnchor => "both sides offer the anchor".into(),
                AnchorOffer::WontCreateAnchor => "neither side offers the anchor".into(),
            }));
        }
        let their_delay_csv =
            csv_value(o.delay).map_err(|e| ChannelError::BadOpen(e.to_string()))?;
        // One time unit per channel: our claims under their delay race refunds at expiries
        // in the unit of our own delay, and the other way round.
        let unit = TimeUnit::of(self.config.delay);
        if TimeUnit::of(o.delay) != unit {
            return Err(ChannelError::MixedTimeUnits {
                what: "open_channel.delay",
                got: o.delay,
                unit,
            });
        }
        if delay_blocks_equivalent(their_delay_csv) > self.config.max_delay_blocks {
            return Err(ChannelError::BadOpen(format!(
                "delay {:?} above our maximum",
                o.delay
            )));
        }
        if o.min_depth() > self.config.max_their_min_depth {
            return Err(ChannelError::BadOpen(format!(
                "min_depth {} too large",
                o.min_depth()
            )));
        }
        if o.commitment_fee < self.config.min_commitment_fee_sat {
            return Err(ChannelError::BadOpen(format!(
                "commitment_fee {} too small",
                o.commitment_fee
            )));
        }
        // `start` refused a delay that cannot be encoded, so this holds.
        let our_delay_csv =
            csv_value(self.config.delay).map_err(|_| invariant("our delay checked by start"))?;
        let terms = Terms {
            their_commit: o.commit_key.public_key(),
            their_final: o.final_key.public_key(),
            their_delay_csv,
            our_delay_csv,
            fee_sat: self.config.commitment_fee_sat.min(o.commitment_fee),
        };
        let their_rev = o.revocation_hash;
        match self.role {
            AnchorRole::Fund { anchor_sat } => {
                if anchor_sat <= terms.fee_sat {
                    return Err(ChannelError::BadOpen(
                        "our anchor does not cover the fee".into(),
                    ));
                }
                self.stage = Stage::OpenWaitAnchorTx { terms, their_rev };
                let script = anchor_script(&self.our_commit, &terms.their_commit);
                Ok(vec![Action::Notify(Event::AnchorNeeded {
                    script_pubkey: script.to_p2wsh(),
                    amount: Amount::from_sat(anchor_sat),
                })])
            }
            AnchorRole::Accept => {
                self.stage = Stage::OpenWaitAnchor { terms, their_rev };
                Ok(Vec::new())
            }
        }
    }

    pub(super) fn on_open_anchor(&mut self, a: &OpenAnchor) -> Result<Vec<Action>, ChannelError> {
        let Stage::OpenWaitAnchor { terms, their_rev } = self.stage else {
            return Err(ChannelError::UnexpectedPacket("open_anchor"));
        };
        let cs = CState::initial(a.amount, terms.fee_sat, false).map_err(|_| {
            ChannelError::BadAnchor(format!("amount {} does not cover the fee", a.amount))
        })?;
        let outpoint = OutPoint {
            txid: sha256d_to_txid(&a.txid),
            vout: a.output_index,
        };
        let anchor = AnchorInfo {
            outpoint,
            amount: Amount::from_sat(a.amount),
            script: anchor_script(&self.our_commit, &terms.their_commit),
        };
        let mut e = Established {
            terms,
            anchor,
            anchor_tx: None,
            num: 0,
            cstate: cs,
            their_rev,
            their_sig: a.commit_sig,
            their_secrets: RevocationSecrets::new(),
            high_priority: matches!(self.role, AnchorRole::Fund { .. }),
            known_r: Vec::new(),
            unclaimable: Vec::new(),
            signed_close: None,
            onions: Vec::new(),
            step: Step::OpenWaitComplete {
                sent: false,
                got: false,
            },
        };
        let ctx = self.ctx();
        let ours = e.our_commitment(&ctx, &e.cstate, 0)?;
        e.check_sig(&ours.tx, &a.commit_sig, "open_anchor.commit_sig")?;
        let theirs = e.their_commitment(&ctx, &e.cstate, 0, &their_rev)?;
        let sig = e.sign(&ctx, &theirs.tx);
        e.their_sig = a.commit_sig;
        self.stage = Stage::Established(Box::new(e));
        Ok(vec![
            Action::Persist,
            Action::Send(Packet::OpenCommitSig(OpenCommitSig { sig })),
            Action::WatchOutput(outpoint),
        ])
    }

    pub(super) fn on_open_commit_sig(
        &mut self,
        s: &OpenCommitSig,
    ) -> Result<Vec<Action>, ChannelError> {
        let Stage::OpenWaitCommitSig(u) = &self.stage else {
            return Err(ChannelError::UnexpectedPacket("open_commit_sig"));
        };
        let u = (**u).clone();
        let e = Established {
            terms: u.terms,
            anchor: u.anchor,
            anchor_tx: Some(u.anchor_tx.clone()),
            num: 0,
            cstate: u.cstate,
            their_rev: u.their_rev,
            their_sig: s.sig,
            their_secrets: RevocationSecrets::new(),
            high_priority: matches!(self.role, AnchorRole::Fund { .. }),
            known_r: Vec::new(),
            unclaimable: Vec::new(),
            signed_close: None,
            onions: Vec::new(),
            step: Step::OpenWaitComplete {
                sent: false,
                got: false,
            },
        };
        let ours = e.our_commitment(&self.ctx(), &e.cstate, 0)?;
        e.check_sig(&ours.tx, &s.sig, "open_commit_sig")?;
        let outpoint = e.anchor.outpoint;
        self.stage = Stage::Established(Box::new(e));
        Ok(vec![
            Action::Persist,
            Action::Broadcast(u.anchor_tx),
            Action::WatchOutput(outpoint),
        ])
    }
}

/// Their `open_complete` (`sent`: whether ours went out already, the anchor being deep
/// enough): live once both are said.
pub(super) fn on_open_complete(e: &mut Established, sent: bool) -> Vec<Action> {
    if sent {
        e.step = Step::Normal;
        vec![Action::Persist, Action::Notify(Event::Live)]
    } else {
        e.step = Step::OpenWaitComplete {
            sent: false,
            got: true,
        };
        Vec::new()
    }
}
