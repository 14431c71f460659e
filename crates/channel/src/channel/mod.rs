//! The sans-IO channel state machine (PROTOCOL-NOTES §6).
//!
//! A [`Channel`] is driven by three kinds of input, each a method call that
//! returns the [`Action`]s the caller must perform, in order:
//! - packets from the peer: [`Channel::handle_packet`];
//! - owner commands: [`Channel::start`], [`Channel::anchor_created`],
//!   [`Channel::pay`], [`Channel::add_htlc`], [`Channel::fulfill_htlc`],
//!   [`Channel::routefail_htlc`], [`Channel::timeout_htlc`], [`Channel::close`],
//!   [`Channel::force_close`];
//! - chain events: [`Channel::anchor_depth`], [`Channel::block_height`],
//!   [`Channel::spend_seen`].
//!
//! Time (`now`, unix seconds) and chain height come in as arguments; keys and
//! the revocation seed come in at construction. Nothing here does IO. A call
//! that fails leaves the channel exactly as it was: handlers check everything
//! that can fail before they change anything.
//!
//! This file holds the channel and its data-carrying state, the queries and the
//! packet dispatch; each concern has its file: `types` (the public vocabulary),
//! `errors`, `open`, `update`, `close`, `onchain` (after the anchor is spent),
//! `commitments` (the transactions we sign), `rules` (time and fee rules) and
//! `legacy` (snapshots of version 0).

mod close;
mod commitments;
mod errors;
mod legacy;
mod onchain;
mod open;
mod rules;
mod types;
mod update;

pub use errors::{ChannelError, CommandError, Rejected};
pub use legacy::{ChannelV0, Migrated, MigrationError};
pub use types::{
    Action, AnchorRole, Change, ChannelConfig, ChannelSecrets, Deadlines, Event, RevokedCommitment,
    State, TimeUnit, Unclaimable,
};
pub use update::apply_change;

use bitcoin::hashes::Hash as _;
use bitcoin::{Amount, OutPoint, ScriptBuf, Transaction, Txid};
use secp256k1::{ecdsa::Signature, PublicKey};
use wire::{DeclineReason, Locktime, Onion, Packet, Preimage, Sha256, Sha256d};

use crate::funding::{CState, Htlc, Who};
use crate::shachain::{RevocationSecrets, SeedPreimages};
use crate::tx::{p2wpkh, secp, Commitment, TxError, DUST_LIMIT_SAT};

use close::{on_close, on_close_ack, on_close_complete, on_crossing_close};
use open::on_open_complete;
use update::{
    is_proposal, on_accept, on_complete, on_crossing_proposal, on_decline, on_proposal,
    on_signature,
};

/// The terms both `open_channel`s fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Terms {
    #[serde(serialize_with = "crate::stored_hex::public_key")]
    their_commit: PublicKey,
    #[serde(serialize_with = "crate::stored_hex::public_key")]
    their_final: PublicKey,
    /// The delay they impose on our outputs (BIP68 encoding).
    their_delay_csv: u32,
    /// The delay we impose on theirs (BIP68 encoding of our `config.delay`).
    our_delay_csv: u32,
    /// The commitment fee: the smaller of both offers.
    fee_sat: u64,
}

/// The anchor output.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct AnchorInfo {
    #[serde(serialize_with = "crate::stored_hex::outpoint")]
    outpoint: OutPoint,
    amount: Amount,
    #[serde(serialize_with = "crate::stored_hex::script")]
    script: ScriptBuf,
}

/// Funder: `open_anchor` sent, the peer's signature on our first commitment not yet received.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Unsigned {
    terms: Terms,
    anchor: AnchorInfo,
    anchor_tx: Transaction,
    cstate: CState,
    their_rev: Sha256,
}

/// Our proposal, sent and not yet answered.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Proposal {
    change: Change,
    next: CState,
}

/// Their proposal, accepted (we signed their next commitment); waiting for their signature.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Accepted {
    change: Change,
    next: CState,
    /// Their revocation hash for their next commitment (the one we signed).
    #[serde(serialize_with = "crate::stored_hex::sha256")]
    their_next_rev: Sha256,
    /// Our own proposal that lost the simultaneous-proposal race, to propose again afterwards.
    deferred: Option<Change>,
}

/// Our proposal, committed on our side; waiting for their revocation of the previous state.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Signed {
    change: Change,
    /// Their previous commitment, still valid until they revoke it.
    their_prev: CState,
    #[serde(serialize_with = "crate::stored_hex::sha256")]
    their_prev_rev: Sha256,
}

/// The route an HTLC carries (`update_add_htlc.onion`), kept beside the HTLC: ours while
/// we propose it (a deferred proposal is sent again with it), theirs while the HTLC is in
/// our commitment (the node forwards it, also after a restart).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct HtlcOnion {
    #[serde(serialize_with = "crate::stored_hex::sha256")]
    r_hash: Sha256,
    onion: Onion,
}

/// How the channel ended on chain.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Resolution {
    /// A valid commitment (ours or theirs) is on chain; claims follow.
    Commitment { owner: Who, commitment: Commitment },
    /// Their revoked commitment is on chain and our penalty took every output.
    Penalty { commitment_number: u64 },
    /// Something we do not recognise spent the anchor: nothing to claim, no more updates.
    Unrecognised {
        #[serde(serialize_with = "crate::stored_hex::txid")]
        txid: Txid,
    },
}

/// Where a funded channel is in its life.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Step {
    /// Waiting for the anchor depth (`sent`: our `open_complete`) and the peer's `open_complete` (`got`).
    OpenWaitComplete {
        sent: bool,
        got: bool,
    },
    Normal,
    WaitAccept(Proposal),
    WaitSignature(Accepted),
    WaitComplete(Signed),
    /// We sent `close_channel` with this fee.
    CloseWaitComplete {
        fee_sat: u64,
    },
    /// We sent `close_channel_complete`.
    CloseWaitAck,
    Closed,
    OnChain(Resolution),
}

/// A channel whose first commitments are signed both ways.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Established {
    terms: Terms,
    anchor: AnchorInfo,
    /// The anchor transaction, if we created it.
    anchor_tx: Option<Transaction>,
    /// Number of both sides' current commitments.
    num: u64,
    cstate: CState,
    #[serde(serialize_with = "crate::stored_hex::sha256")]
    their_rev: Sha256,
    /// Their signature on our current commitment.
    #[serde(serialize_with = "crate::stored_hex::signature")]
    their_sig: Signature,
    their_secrets: RevocationSecrets,
    high_priority: bool,
    /// R of every HTLC still in a commitment that can reach the chain (pruned after each update).
    #[serde(with = "crate::stored_hex::preimages")]
    known_r: Vec<Preimage>,
    /// Outputs of ours on the commitment on chain that are worth less than their claim's fee.
    #[serde(default)]
    unclaimable: Vec<Unclaimable>,
    /// The cooperative close signed by both, saved before it is broadcast: a crash in
    /// between must not leave a channel that can neither close nor update.
    #[serde(default)]
    signed_close: Option<Transaction>,
    /// Onions of our HTLC being proposed and of the peer's HTLCs in our commitment. A
    /// snapshot from before them reads as empty. Always written: a binary snapshot
    /// (version 4) has no field names, so a field left out would shift every later one.
    #[serde(default)]
    onions: Vec<HtlcOnion>,
    step: Step,
}

/// The channel's state; each variant carries exactly the data that exists in it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Stage {
    Init,
    OpenWaitOpen,
    /// Funder: waiting for the owner's anchor transaction.
    OpenWaitAnchorTx {
        terms: Terms,
        their_rev: Sha256,
    },
    /// Acceptor: waiting for `open_anchor`.
    OpenWaitAnchor {
        terms: Terms,
        their_rev: Sha256,
    },
    OpenWaitCommitSig(Box<Unsigned>),
    Established(Box<Established>),
}

/// One payment channel: see the module documentation for the calls and their order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Channel {
    config: ChannelConfig,
    secrets: ChannelSecrets,
    #[serde(serialize_with = "crate::stored_hex::public_key")]
    our_commit: PublicKey,
    #[serde(serialize_with = "crate::stored_hex::public_key")]
    our_final: PublicKey,
    role: AnchorRole,
    height: u32,
    stage: Stage,
    /// Our preimages of the current and next commitments, derived once per commitment
    /// rather than at every use (derived from `secrets`: not part of the snapshot).
    #[serde(skip)]
    preimages: SeedPreimages,
}

/// What never changes for a channel: our keys and limits, borrowed beside the mutable stage.
struct Ctx<'a> {
    config: &'a ChannelConfig,
    secrets: &'a ChannelSecrets,
    preimages: &'a SeedPreimages,
    our_commit: PublicKey,
    our_final: PublicKey,
    height: u32,
}

fn sha256d_to_txid(h: &Sha256d) -> Txid {
    Txid::from_byte_array(h.to_byte_array())
}

fn txid_to_sha256d(t: &Txid) -> Sha256d {
    Sha256d::from_byte_array(t.to_byte_array())
}

fn delay_blocks_equivalent(csv: u32) -> u32 {
    if csv & (1 << 22) != 0 {
        // 512-second units; count ten minutes a block.
        ((csv & 0xffff) * 512).div_ceil(600)
    } else {
        csv
    }
}

/// The BIP68 delay `csv` counted in `unit`: exactly in its own unit (512 s per BIP68
/// unit); across units, which only channels opened before one unit was required can
/// hold, ten minutes a block.
fn delay_in(unit: TimeUnit, csv: u32) -> u64 {
    match (TimeUnit::of_csv(csv), unit) {
        (TimeUnit::Blocks, TimeUnit::Blocks) => u64::from(csv),
        (TimeUnit::Blocks, TimeUnit::Seconds) => u64::from(csv) * 600,
        (TimeUnit::Seconds, TimeUnit::Seconds) => u64::from(csv & 0xffff) * 512,
        (TimeUnit::Seconds, TimeUnit::Blocks) => u64::from(delay_blocks_equivalent(csv)),
    }
}

/// A broken internal invariant: reported as an error (never a panic in release builds).
fn invariant(what: &'static str) -> ChannelError {
    debug_assert!(false, "channel invariant broken: {what}");
    ChannelError::Invariant(what)
}

impl Step {
    /// Moves the step's data out, leaving `Normal` until the caller sets the next step.
    fn take(&mut self) -> Step {
        std::mem::replace(self, Step::Normal)
    }

    fn kind(&self) -> State {
        match self {
            Step::OpenWaitComplete { .. } => State::OpenWaitComplete,
            Step::Normal => State::Normal,
            Step::WaitAccept(_) => State::WaitAccept,
            Step::WaitSignature(_) => State::WaitSignature,
            Step::WaitComplete(_) => State::WaitComplete,
            Step::CloseWaitComplete { .. } => State::CloseWaitComplete,
            Step::CloseWaitAck => State::CloseWaitAck,
            Step::Closed => State::Closed,
            Step::OnChain(_) => State::OnChain,
        }
    }
}

impl Channel {
    /// A new channel; call [`Channel::start`] to send our `open_channel`.
    pub fn new(config: ChannelConfig, secrets: ChannelSecrets, role: AnchorRole) -> Channel {
        let our_commit = PublicKey::from_secret_key(secp(), &secrets.commit_key);
        let our_final = PublicKey::from_secret_key(secp(), &secrets.final_key);
        Channel {
            config,
            secrets,
            our_commit,
            our_final,
            role,
            height: 0,
            stage: Stage::Init,
            preimages: SeedPreimages::default(),
        }
    }

    /// Our keys and limits beside the mutable stage (disjoint borrows), with our
    /// preimages of the current and next commitments at hand: every update uses them.
    fn split(&mut self) -> (Ctx<'_>, &mut Stage) {
        let Channel {
            config,
            secrets,
            our_commit,
            our_final,
            height,
            stage,
            preimages,
            ..
        } = self;
        if let Stage::Established(e) = stage {
            preimages.prepare(&secrets.revocation_seed, e.num);
        }
        (
            Ctx {
                config,
                secrets,
                preimages,
                our_commit: *our_commit,
                our_final: *our_final,
                height: *height,
            },
            stage,
        )
    }

    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            config: &self.config,
            secrets: &self.secrets,
            preimages: &self.preimages,
            our_commit: self.our_commit,
            our_final: self.our_final,
            height: self.height,
        }
    }

    fn established(&self) -> Option<&Established> {
        match &self.stage {
            Stage::Established(e) => Some(e),
            _ => None,
        }
    }

    /// Confirmations of the anchor this channel waits for before it goes live (ours).
    pub fn min_depth(&self) -> u32 {
        self.config.min_depth
    }

    /// The coarse state.
    pub fn state(&self) -> State {
        match &self.stage {
            Stage::Init => State::Init,
            Stage::OpenWaitOpen => State::OpenWaitOpen,
            Stage::OpenWaitAnchorTx { .. } => State::OpenWaitAnchorTx,
            Stage::OpenWaitAnchor { .. } => State::OpenWaitAnchor,
            Stage::OpenWaitCommitSig(_) => State::OpenWaitCommitSig,
            Stage::Established(e) => e.step.kind(),
        }
    }

    /// The current committed balances, seen from us (once the anchor is known).
    pub fn balances(&self) -> Option<&CState> {
        match &self.stage {
            Stage::OpenWaitCommitSig(u) => Some(&u.cstate),
            Stage::Established(e) => Some(&e.cstate),
            _ => None,
        }
    }

    /// The number of both sides' current commitment transactions.
    pub fn commitment_number(&self) -> u64 {
        self.established().map_or(0, |e| e.num)
    }

    /// Whether we win simultaneous proposals now.
    pub fn has_priority(&self) -> bool {
        match self.established() {
            Some(e) => e.high_priority,
            None => matches!(self.role, AnchorRole::Fund { .. }),
        }
    }

    /// Sets the fee rate (sat per 1000 weight units) of our claims, penalties and the fair
    /// close fee: the node passes the chain's current estimate, floor applied.
    pub fn set_fee_rate(&mut self, sat_per_kw: u64) {
        self.config.sweep_feerate_sat_per_kw = sat_per_kw;
    }

    /// The most a claim or penalty of this channel spending outputs worth `value` may pay
    /// in fees when it is bumped: a penalty all of it but dust (the peer would take it
    /// all otherwise), any other claim half (what LND's sweeper budgets by default).
    pub fn sweep_budget(&self, value: Amount) -> Amount {
        let penalty = self
            .established()
            .is_some_and(|e| matches!(e.step, Step::OnChain(Resolution::Penalty { .. })));
        if penalty {
            value
                .checked_sub(Amount::from_sat(DUST_LIMIT_SAT))
                .unwrap_or(Amount::ZERO)
        } else {
            value / 2
        }
    }

    /// Re-signs `tx`, a claim or penalty of this channel still unconfirmed, to pay `fee_sat`
    /// (a BIP125 replacement; `values`: the outputs it spends, in input order).
    ///
    /// # Errors
    /// `tx` does not pay our final key, is not a sweep, or cannot pay the fee.
    pub fn bump_sweep(
        &self,
        tx: &Transaction,
        values: &[Amount],
        fee_sat: u64,
    ) -> Result<Transaction, CommandError> {
        let ours = p2wpkh(&self.our_final);
        if tx.output.len() != 1 || tx.output[0].script_pubkey != ours {
            return Err(CommandError::Tx(TxError::NotASweep));
        }
        Ok(crate::tx::resign_sweep(
            tx,
            values,
            &self.secrets.final_key,
            fee_sat,
        )?)
    }

    /// The fee rate set by [`Channel::set_fee_rate`] (or the configured one).
    pub fn fee_rate(&self) -> u64 {
        self.config.sweep_feerate_sat_per_kw
    }

    /// The cooperative close signed by both sides, once there is one (re-broadcast it
    /// until it confirms, also after a restart).
    pub fn signed_close(&self) -> Option<&Transaction> {
        self.established().and_then(|e| e.signed_close.as_ref())
    }

    /// Our outputs on chain left unclaimed because their claim would cost more than they hold.
    pub fn unclaimable(&self) -> &[Unclaimable] {
        self.established().map_or(&[], |e| &e.unclaimable[..])
    }

    /// Once a valid commitment (ours or theirs) is on chain: the outputs of the HTLCs we
    /// offered in it, with each HTLC. `None` before that, and after a close, a penalty or
    /// an unrecognised spend of the anchor. An HTLC we offered that has no output here
    /// (not in that commitment, or left out as dust) can never be claimed with R on chain.
    pub fn offered_htlc_outputs_on_chain(&self) -> Option<Vec<(OutPoint, Htlc)>> {
        let e = self.established()?;
        let Step::OnChain(Resolution::Commitment { owner, commitment }) = &e.step else {
            return None;
        };
        let txid = commitment.tx.compute_txid();
        let ours = commitment
            .outputs
            .iter()
            .enumerate()
            .filter_map(|(vout, o)| {
                let h = match (owner, o.kind) {
                    (Who::Us, crate::tx::OutputKind::HtlcOffered(h))
                    | (Who::Them, crate::tx::OutputKind::HtlcReceived(h)) => h,
                    _ => return None,
                };
                let vout = u32::try_from(vout).ok()?;
                Some((OutPoint { txid, vout }, h))
            });
        Some(ours.collect())
    }

    /// The delay the peer imposes on our outputs (our claims on our own commitment wait for
    /// it), in blocks (a delay in time counted ten minutes a block); `None` before the
    /// terms are agreed.
    pub fn claim_delay_blocks(&self) -> Option<u32> {
        self.established()
            .map(|e| delay_blocks_equivalent(e.terms.their_delay_csv))
    }

    /// The Rs this channel claims HTLCs offered to us with, should a commitment reach the chain.
    pub fn known_preimages(&self) -> &[Preimage] {
        self.established().map_or(&[], |e| &e.known_r)
    }

    /// Remembers `r` if an HTLC the peer offered us with its hash is in our current
    /// commitments, e.g. one we revealed in an update that a lost session undid: the peer
    /// has R, so we must be able to claim the HTLC on chain with it before it expires.
    /// Returns whether `r` is new to the channel.
    pub fn remember_preimage(&mut self, r: Preimage) -> bool {
        let Stage::Established(e) = &mut self.stage else {
            return false;
        };
        if e.known_r.contains(&r) || !matches!(e.cstate.find_htlc(&r.hash()), Some((Who::Them, _)))
        {
            return false;
        }
        e.remember_r(r);
        true
    }

    /// The onion the peer sent with its HTLC `r_hash`, while that HTLC is in our
    /// commitment; `None` for an HTLC without one (a payment that ends here).
    pub fn htlc_onion(&self, r_hash: &Sha256) -> Option<&Onion> {
        let e = self.established()?;
        if !matches!(e.cstate.find_htlc(r_hash), Some((Who::Them, _))) {
            return None;
        }
        e.onion_of(r_hash)
    }

    /// Slots used by the peer's revocation preimages (O(log n)).
    pub fn revocation_slots(&self) -> usize {
        self.established().map_or(0, |e| e.their_secrets.slots())
    }

    /// The anchor outpoint, once known.
    pub fn anchor_outpoint(&self) -> Option<OutPoint> {
        match &self.stage {
            Stage::OpenWaitCommitSig(u) => Some(u.anchor.outpoint),
            Stage::Established(e) => Some(e.anchor.outpoint),
            _ => None,
        }
    }

    /// The anchor transaction, if we created it (the funder re-broadcasts it after a restart).
    pub fn anchor_tx(&self) -> Option<&Transaction> {
        match &self.stage {
            Stage::OpenWaitCommitSig(u) => Some(&u.anchor_tx),
            Stage::Established(e) => e.anchor_tx.as_ref(),
            _ => None,
        }
    }

    /// The anchor output the channel stands on, once known: where it is and what it must
    /// pay (exactly the agreed amount to the P2WSH 2-of-2 of both commit keys).
    pub fn anchor_output(&self) -> Option<(OutPoint, bitcoin::TxOut)> {
        let a = match &self.stage {
            Stage::OpenWaitCommitSig(u) => &u.anchor,
            Stage::Established(e) => &e.anchor,
            _ => return None,
        };
        Some((
            a.outpoint,
            bitcoin::TxOut {
                value: a.amount,
                script_pubkey: a.script.to_p2wsh(),
            },
        ))
    }

    /// Our current commitment transaction, fully signed (what [`Channel::force_close`] broadcasts).
    pub fn signed_commitment(&self) -> Option<Transaction> {
        self.established()?.signed_commitment(&self.ctx()).ok()
    }

    /// HTLCs whose deadline has come, in whatever state the channel is (an update in
    /// flight, a close under way): if not empty, the node closes on chain
    /// ([`Channel::force_close`]), whose claims refund our expired HTLCs after their
    /// expiry and take the incoming ones with R. Uses the last [`Channel::block_height`]
    /// and `now` (unix seconds) for expiries in seconds. Empty once on chain or closed.
    pub fn deadlines(&self, now: u64) -> Deadlines {
        let Some(e) = self.established() else {
            return Deadlines::default();
        };
        // Every commitment that can still reach the chain, with its HTLCs.
        let mut live: Vec<&CState> = vec![&e.cstate];
        match &e.step {
            Step::WaitSignature(a) => live.push(&a.next),
            Step::WaitComplete(s) => live.push(&s.their_prev),
            Step::OnChain(_) | Step::Closed => return Deadlines::default(),
            _ => {}
        }
        let past = |expiry: Locktime, blocks: i64| -> bool {
            // True when `height + blocks ≥ expiry` (seconds: 600 s a block).
            match expiry {
                Locktime::Blocks(b) => i64::from(self.height) + blocks >= i64::from(b),
                Locktime::Seconds(t) => now as i64 + blocks * 600 >= i64::from(t),
            }
        };
        let after = i64::from(self.config.force_close_after_expiry_blocks);
        let ctx = self.ctx();
        let mut d = Deadlines::default();
        for cs in live {
            for h in &cs.ours.htlcs {
                if past(h.expiry, -after) && !d.refund.contains(h) {
                    d.refund.push(*h);
                }
            }
            for h in &cs.theirs.htlcs {
                let known = e.known_r.iter().any(|r| r.hash() == h.r_hash);
                let due = ctx.claim_deadline_passed(h.expiry, e.terms.their_delay_csv, now);
                if known && due && !d.claim.contains(h) {
                    d.claim.push(*h);
                }
            }
        }
        d
    }

    /// The block height the channel last heard of.
    pub fn height(&self) -> u32 {
        self.height
    }

    /// Whether the peer's `update_add_htlc` expiring at `expiry` would pass our expiry
    /// checks were the chain at `height` (the rules [`Channel::handle_packet`] applies at the
    /// channel's height); `false` before the channel is established. For a given expiry the
    /// heights that pass form one interval (each check bounds the height from one side), so
    /// passing at two heights means passing at every height between them.
    pub fn add_expiry_passes_at(&self, expiry: Locktime, height: u32, now: u64) -> bool {
        let Some(e) = self.established() else {
            return false;
        };
        let ctx = Ctx {
            height,
            ..self.ctx()
        };
        ctx.their_expiry_passes(expiry, e.terms.their_delay_csv, now)
    }

    /// The chain's height changed.
    pub fn block_height(&mut self, height: u32) -> Vec<Action> {
        self.height = height;
        Vec::new()
    }

    /// Handles one packet from the peer.
    ///
    /// # Errors
    /// [`Rejected`]: send its `reply`, then hang up. The channel is unchanged.
    pub fn handle_packet(&mut self, pkt: &Packet, now: u64) -> Result<Vec<Action>, Rejected> {
        // Every handler checks everything that can fail before it changes anything, so a
        // rejected packet leaves no trace without copying the channel per packet
        // (tests/adversarial.rs compares snapshots before and after every rejection).
        self.on_packet(pkt, now, None)
            .map_err(|error| Rejected { error })
    }

    /// As [`Channel::handle_packet`], the owner declining the peer's `update_add_htlc`
    /// with `veto` where the channel would accept it (the node's forwarding policy: the
    /// onion names a next hop it cannot reach, or leaves it too small a fee). The decline
    /// changes nothing, as the channel's own declines; a crossing proposal of ours is
    /// proposed again as after any decline. Other packets are handled as usual.
    ///
    /// # Errors
    /// As [`Channel::handle_packet`].
    pub fn handle_packet_declining(
        &mut self,
        pkt: &Packet,
        now: u64,
        veto: DeclineReason,
    ) -> Result<Vec<Action>, Rejected> {
        self.on_packet(pkt, now, Some(veto))
            .map_err(|error| Rejected { error })
    }

    fn on_packet(
        &mut self,
        pkt: &Packet,
        now: u64,
        veto: Option<DeclineReason>,
    ) -> Result<Vec<Action>, ChannelError> {
        if let Packet::Error(e) = pkt {
            return Ok(vec![Action::Notify(Event::PeerError(
                e.problem.clone().unwrap_or_default(),
            ))]);
        }
        let unexpected = || ChannelError::UnexpectedPacket(pkt.name());
        match (&self.stage, pkt) {
            (Stage::OpenWaitOpen, Packet::Open(o)) => return self.on_open(o),
            (Stage::OpenWaitAnchor { .. }, Packet::OpenAnchor(a)) => return self.on_open_anchor(a),
            (Stage::OpenWaitCommitSig(_), Packet::OpenCommitSig(s)) => {
                return self.on_open_commit_sig(s)
            }
            (Stage::Established(_), _) => {}
            _ => return Err(unexpected()),
        }
        let (ctx, stage) = self.split();
        let Stage::Established(e) = stage else {
            return Err(invariant("established stage checked above"));
        };
        let e: &mut Established = e;
        match (&e.step, pkt) {
            (Step::OpenWaitComplete { sent, got: false }, Packet::OpenComplete(_)) => {
                let sent = *sent;
                Ok(on_open_complete(e, sent))
            }
            (Step::Normal, p) if is_proposal(p) => on_proposal(&ctx, e, p, now, None, veto),
            (Step::WaitAccept(mine), p) if is_proposal(p) => {
                let mine = mine.change;
                on_crossing_proposal(&ctx, e, p, now, mine, veto)
            }
            (Step::WaitAccept(_), Packet::UpdateAccept(a)) => on_accept(&ctx, e, a),
            (Step::WaitAccept(_), Packet::UpdateDeclineHtlc(d)) => on_decline(e, d),
            (Step::WaitSignature(_), Packet::UpdateSignature(s)) => on_signature(&ctx, e, s),
            (Step::WaitComplete(_), Packet::UpdateComplete(c)) => on_complete(&ctx, e, c),
            (Step::Normal, Packet::Close(c)) => on_close(&ctx, e, c),
            (Step::CloseWaitComplete { .. }, Packet::Close(c)) => on_crossing_close(&ctx, e, c),
            (Step::CloseWaitComplete { fee_sat }, Packet::CloseComplete(c)) => {
                let fee_sat = *fee_sat;
                on_close_complete(&ctx, e, c, fee_sat)
            }
            (Step::CloseWaitAck, Packet::CloseAck) => Ok(on_close_ack(e)),
            _ => Err(unexpected()),
        }
    }
}
