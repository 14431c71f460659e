//! Checked packets: the domain form of `pkt` that the session and channel layers use.

use prost::Message as _;
use secp256k1::ecdsa::Signature;

use crate::error::{DecodeError, DecodeErrorKind};
use crate::onion::Onion;
use crate::pb::{self, pkt::Pkt};
use crate::schema;
use crate::types::{ChainPubkey, Funding, Locktime, Preimage, Sha256, Sha256d};

pub use crate::pb::AnchorOffer;

/// `authenticate`: the sender's node key and its signature of our session key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authenticate {
    /// The sender's node public key.
    pub node_id: ChainPubkey,
    /// ECDSA by the node key over SHA256d(the receiver's session public key).
    pub session_sig: Signature,
}

/// `open_channel`: the sender's channel parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenChannel {
    /// Relative lock on outputs paying the sender.
    pub delay: Locktime,
    /// Revokes the sender's first commitment transaction.
    pub revocation_hash: Sha256,
    /// The sender's key in the anchor's 2-of-2.
    pub commit_key: ChainPubkey,
    /// The key that the sender's outputs pay to.
    pub final_key: ChainPubkey,
    /// Whether the sender creates the anchor.
    pub anch: AnchorOffer,
    /// Confirmations the sender requires on the anchor; `None` when absent (default 0).
    pub min_depth: Option<u32>,
    /// Fee the sender wants on commitment transactions, in satoshis.
    pub commitment_fee: u64,
}

impl OpenChannel {
    /// `min_depth` with its proto default applied.
    pub fn min_depth(&self) -> u32 {
        self.min_depth.unwrap_or(0)
    }
}

/// `open_anchor`: the anchor's outpoint and amount, with the signature of the receiver's first commitment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenAnchor {
    /// The anchor transaction id, internal byte order.
    pub txid: Sha256d,
    /// The output paying into the 2-of-2.
    pub output_index: u32,
    /// Its value in satoshis.
    pub amount: u64,
    /// Signature of the receiver's initial commitment transaction.
    pub commit_sig: Signature,
}

/// `open_commit_sig`: signature of the receiver's initial commitment transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenCommitSig {
    /// The signature.
    pub sig: Signature,
}

/// `open_complete`: the anchor reached the sender's required depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenComplete {
    /// The block the anchor went into, if the sender says.
    pub blockid: Option<Sha256d>,
}

/// `update`: a direct payment of `delta_msat` to the sender (negative: from the sender).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Update {
    /// Revokes the sender's new commitment later.
    pub revocation_hash: Sha256,
    /// Change of the sender's balance, in millisatoshis.
    pub delta_msat: i64,
}

/// `update_add_htlc`: a new hash-locked payment from the sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateAddHtlc {
    /// Revokes the sender's new commitment later.
    pub revocation_hash: Sha256,
    /// The HTLC amount.
    pub amount_msat: u32,
    /// SHA256 of R.
    pub r_hash: Sha256,
    /// Absolute expiry.
    pub expiry: Locktime,
    /// Where the payment goes on from the receiver; `None`: it ends there (an
    /// add from a peer that does not know the field, or a direct payment).
    pub onion: Option<Onion>,
}

/// Why an HTLC was declined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeclineReason {
    /// The funding that would be needed.
    InsufficientFunds(Funding),
    /// The payment cannot be routed.
    CannotRoute(bool),
}

/// `update_decline_htlc`: refuses an `update_add_htlc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateDeclineHtlc {
    /// The reason, if given.
    pub reason: Option<DeclineReason>,
}

/// `update_fulfill_htlc`: settles an HTLC with its R value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateFulfillHtlc {
    /// Revokes the sender's new commitment later.
    pub revocation_hash: Sha256,
    /// The R value.
    pub r: Preimage,
}

/// `update_timedout_htlc`: removes the sender's expired HTLC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateTimedoutHtlc {
    /// Revokes the sender's new commitment later.
    pub revocation_hash: Sha256,
    /// Identifies the HTLC.
    pub r_hash: Sha256,
}

/// `update_routefail_htlc`: removes the receiver's HTLC because routing failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateRoutefailHtlc {
    /// Revokes the sender's new commitment later.
    pub revocation_hash: Sha256,
    /// Identifies the HTLC.
    pub r_hash: Sha256,
}

/// `update_accept`: signs the proposer's new commitment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateAccept {
    /// Signature of the receiver's new commitment transaction.
    pub sig: Signature,
    /// Revokes the sender's new commitment later.
    pub revocation_hash: Sha256,
}

/// `update_signature`: signs the acceptor's new commitment and revokes the old one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateSignature {
    /// Signature of the receiver's new commitment transaction.
    pub sig: Signature,
    /// Opens the revocation hash of the sender's previous commitment.
    pub revocation_preimage: Preimage,
}

/// `update_complete`: revokes the sender's previous commitment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateComplete {
    /// Opens the revocation hash of the sender's previous commitment.
    pub revocation_preimage: Preimage,
}

/// `close_channel`: starts a cooperative close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseChannel {
    /// Signature of the close transaction.
    pub sig: Signature,
    /// Its fee in satoshis.
    pub close_fee: u64,
}

/// `close_channel_complete`: the other signature of the close transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseChannelComplete {
    /// Signature of the close transaction.
    pub sig: Signature,
}

/// `error`: the sender is about to hang up.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ErrorPacket {
    /// Diagnostic text, if any.
    pub problem: Option<String>,
}

/// One packet: the checked content of a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    /// `auth` (50).
    Auth(Authenticate),
    /// `open` (20).
    Open(OpenChannel),
    /// `open_anchor` (21).
    OpenAnchor(OpenAnchor),
    /// `open_commit_sig` (22).
    OpenCommitSig(OpenCommitSig),
    /// `open_complete` (23).
    OpenComplete(OpenComplete),
    /// `update` (1).
    Update(Update),
    /// `update_add_htlc` (2).
    UpdateAddHtlc(UpdateAddHtlc),
    /// `update_accept` (3).
    UpdateAccept(UpdateAccept),
    /// `update_signature` (4).
    UpdateSignature(UpdateSignature),
    /// `update_complete` (5).
    UpdateComplete(UpdateComplete),
    /// `update_decline_htlc` (6).
    UpdateDeclineHtlc(UpdateDeclineHtlc),
    /// `update_fulfill_htlc` (7).
    UpdateFulfillHtlc(UpdateFulfillHtlc),
    /// `update_timedout_htlc` (8).
    UpdateTimedoutHtlc(UpdateTimedoutHtlc),
    /// `update_routefail_htlc` (9).
    UpdateRoutefailHtlc(UpdateRoutefailHtlc),
    /// `close` (30).
    Close(CloseChannel),
    /// `close_complete` (31).
    CloseComplete(CloseChannelComplete),
    /// `close_ack` (32).
    CloseAck,
    /// `error` (40).
    Error(ErrorPacket),
}

impl Packet {
    /// Decodes and checks a frame's plaintext.
    ///
    /// # Errors
    /// Any violation of the proto2 rules or the seed's parity rule, and any
    /// key, signature or value that is not valid for its domain type.
    pub fn decode(buf: &[u8]) -> Result<Packet, DecodeError> {
        let pkt = decode_pkt(buf)?;
        Packet::try_from(&pkt)
    }

    /// Encodes the packet as a frame's plaintext.
    pub fn encode(&self) -> Vec<u8> {
        pb::Pkt::from(self).encode_to_vec()
    }

    /// The `pkt` field name, as the seed and error texts use it.
    pub fn name(&self) -> &'static str {
        match self {
            Packet::Auth(_) => "auth",
            Packet::Open(_) => "open",
            Packet::OpenAnchor(_) => "open_anchor",
            Packet::OpenCommitSig(_) => "open_commit_sig",
            Packet::OpenComplete(_) => "open_complete",
            Packet::Update(_) => "update",
            Packet::UpdateAddHtlc(_) => "update_add_htlc",
            Packet::UpdateAccept(_) => "update_accept",
            Packet::UpdateSignature(_) => "update_signature",
            Packet::UpdateComplete(_) => "update_complete",
            Packet::UpdateDeclineHtlc(_) => "update_decline_htlc",
            Packet::UpdateFulfillHtlc(_) => "update_fulfill_htlc",
            Packet::UpdateTimedoutHtlc(_) => "update_timedout_htlc",
            Packet::UpdateRoutefailHtlc(_) => "update_routefail_htlc",
            Packet::Close(_) => "close",
            Packet::CloseComplete(_) => "close_complete",
            Packet::CloseAck => "close_ack",
            Packet::Error(_) => "error",
        }
    }

    /// The `pkt` oneof field number.
    pub fn case(&self) -> u32 {
        match self {
            Packet::Auth(_) => 50,
            Packet::Open(_) => 20,
            Packet::OpenAnchor(_) => 21,
            Packet::OpenCommitSig(_) => 22,
            Packet::OpenComplete(_) => 23,
            Packet::Update(_) => 1,
            Packet::UpdateAddHtlc(_) => 2,
            Packet::UpdateAccept(_) => 3,
            Packet::UpdateSignature(_) => 4,
            Packet::UpdateComplete(_) => 5,
            Packet::UpdateDeclineHtlc(_) => 6,
            Packet::UpdateFulfillHtlc(_) => 7,
            Packet::UpdateTimedoutHtlc(_) => 8,
            Packet::UpdateRoutefailHtlc(_) => 9,
            Packet::Close(_) => 30,
            Packet::CloseComplete(_) => 31,
            Packet::CloseAck => 32,
            Packet::Error(_) => 40,
        }
    }

    /// An `error` packet with the given problem text.
    pub fn error(problem: impl Into<String>) -> Packet {
        Packet::Error(ErrorPacket {
            problem: Some(problem.into()),
        })
    }
}

/// Decodes a frame's plaintext into the generated type after the proto2 and parity checks.
///
/// This is the wire-level half of [`Packet::decode`]: no curve arithmetic.
///
/// # Errors
/// Any violation of the proto2 rules or the seed's parity rule.
pub fn decode_pkt(buf: &[u8]) -> Result<pb::Pkt, DecodeError> {
    schema::check(buf, &schema::PKT)?;
    pb::Pkt::decode(buf).map_err(|e| DecodeErrorKind::Protobuf(e.to_string()).into())
}

/// Wraps a domain conversion error with the field it happened in.
fn at<T>(
    outer: &'static str,
    field: &'static str,
    r: Result<T, DecodeErrorKind>,
) -> Result<T, DecodeError> {
    r.map_err(|k| DecodeError::from(k).within(field).within(outer))
}

fn sig(
    outer: &'static str,
    field: &'static str,
    s: &pb::Signature,
) -> Result<Signature, DecodeError> {
    at(outer, field, Signature::try_from(s))
}

fn key(
    outer: &'static str,
    field: &'static str,
    k: &pb::ChainPubkey,
) -> Result<ChainPubkey, DecodeError> {
    at(outer, field, ChainPubkey::try_from(k))
}

impl TryFrom<&pb::Pkt> for Packet {
    type Error = DecodeError;

    fn try_from(pkt: &pb::Pkt) -> Result<Self, DecodeError> {
        let Some(inner) = &pkt.pkt else {
            return Err(DecodeErrorKind::OneofEmpty {
                message: "pkt",
                oneof: "pkt",
            }
            .into());
        };
        Ok(match inner {
            Pkt::Auth(a) => Packet::Auth(Authenticate {
                node_id: key("auth", "node_id", &a.node_id)?,
                session_sig: sig("auth", "session_sig", &a.session_sig)?,
            }),
            Pkt::Open(o) => Packet::Open(OpenChannel {
                delay: at("open", "delay", Locktime::try_from(&o.delay))?,
                revocation_hash: Sha256::from(&o.revocation_hash),
                commit_key: key("open", "commit_key", &o.commit_key)?,
                final_key: key("open", "final_key", &o.final_key)?,
                anch: at(
                    "open",
                    "anch",
                    AnchorOffer::try_from(o.anch).map_err(|_| DecodeErrorKind::InvalidEnum {
                        message: "open_channel",
                        field: "anch",
                        value: i64::from(o.anch),
                    }),
                )?,
                min_depth: o.min_depth,
                commitment_fee: o.commitment_fee,
            }),
            Pkt::OpenAnchor(o) => Packet::OpenAnchor(OpenAnchor {
                txid: Sha256d::from(&o.txid),
                output_index: o.output_index,
                amount: o.amount,
                commit_sig: sig("open_anchor", "commit_sig", &o.commit_sig)?,
            }),
            Pkt::OpenCommitSig(o) => Packet::OpenCommitSig(OpenCommitSig {
                sig: sig("open_commit_sig", "sig", &o.sig)?,
            }),
            Pkt::OpenComplete(o) => Packet::OpenComplete(OpenComplete {
                blockid: o.blockid.as_ref().map(Sha256d::from),
            }),
            Pkt::Update(u) => Packet::Update(Update {
                revocation_hash: Sha256::from(&u.revocation_hash),
                delta_msat: u.delta_msat,
            }),
            Pkt::UpdateAddHtlc(u) => Packet::UpdateAddHtlc(UpdateAddHtlc {
                revocation_hash: Sha256::from(&u.revocation_hash),
                amount_msat: u.amount_msat,
                r_hash: Sha256::from(&u.r_hash),
                expiry: at("update_add_htlc", "expiry", Locktime::try_from(&u.expiry))?,
                onion: u
                    .onion
                    .as_deref()
                    .map(|o| at("update_add_htlc", "onion", Onion::try_from(o)))
                    .transpose()?,
            }),
            Pkt::UpdateAccept(u) => Packet::UpdateAccept(UpdateAccept {
                sig: sig("update_accept", "sig", &u.sig)?,
                revocation_hash: Sha256::from(&u.revocation_hash),
            }),
            Pkt::UpdateSignature(u) => Packet::UpdateSignature(UpdateSignature {
                sig: sig("update_signature", "sig", &u.sig)?,
                revocation_preimage: Preimage::from(&u.revocation_preimage),
            }),
            Pkt::UpdateComplete(u) => Packet::UpdateComplete(UpdateComplete {
                revocation_preimage: Preimage::from(&u.revocation_preimage),
            }),
            Pkt::UpdateDeclineHtlc(u) => Packet::UpdateDeclineHtlc(UpdateDeclineHtlc {
                reason: u.reason.map(|r| match r {
                    pb::update_decline_htlc::Reason::InsufficientFunds(f) => {
                        DeclineReason::InsufficientFunds(Funding::from(&f))
                    }
                    pb::update_decline_htlc::Reason::CannotRoute(b) => {
                        DeclineReason::CannotRoute(b)
                    }
                }),
            }),
            Pkt::UpdateFulfillHtlc(u) => Packet::UpdateFulfillHtlc(UpdateFulfillHtlc {
                revocation_hash: Sha256::from(&u.revocation_hash),
                r: Preimage::from(&u.r),
            }),
            Pkt::UpdateTimedoutHtlc(u) => Packet::UpdateTimedoutHtlc(UpdateTimedoutHtlc {
                revocation_hash: Sha256::from(&u.revocation_hash),
                r_hash: Sha256::from(&u.r_hash),
            }),
            Pkt::UpdateRoutefailHtlc(u) => Packet::UpdateRoutefailHtlc(UpdateRoutefailHtlc {
                revocation_hash: Sha256::from(&u.revocation_hash),
                r_hash: Sha256::from(&u.r_hash),
            }),
            Pkt::Close(c) => Packet::Close(CloseChannel {
                sig: sig("close", "sig", &c.sig)?,
                close_fee: c.close_fee,
            }),
            Pkt::CloseComplete(c) => Packet::CloseComplete(CloseChannelComplete {
                sig: sig("close_complete", "sig", &c.sig)?,
            }),
            Pkt::CloseAck(_) => Packet::CloseAck,
            Pkt::Error(e) => Packet::Error(ErrorPacket {
                problem: e.problem.clone(),
            }),
        })
    }
}

impl From<&Packet> for pb::Pkt {
    fn from(p: &Packet) -> Self {
        let inner = match p {
            Packet::Auth(a) => Pkt::Auth(pb::Authenticate {
                node_id: (&a.node_id).into(),
                session_sig: (&a.session_sig).into(),
            }),
            Packet::Open(o) => Pkt::Open(pb::OpenChannel {
                delay: o.delay.into(),
                revocation_hash: o.revocation_hash.into(),
                commit_key: (&o.commit_key).into(),
                final_key: (&o.final_key).into(),
                anch: o.anch as i32,
                min_depth: o.min_depth,
                commitment_fee: o.commitment_fee,
            }),
            Packet::OpenAnchor(o) => Pkt::OpenAnchor(pb::OpenAnchor {
                txid: o.txid.into(),
                output_index: o.output_index,
                amount: o.amount,
                commit_sig: (&o.commit_sig).into(),
            }),
            Packet::OpenCommitSig(o) => Pkt::OpenCommitSig(pb::OpenCommitSig {
                sig: (&o.sig).into(),
            }),
            Packet::OpenComplete(o) => Pkt::OpenComplete(pb::OpenComplete {
                blockid: o.blockid.map(Into::into),
            }),
            Packet::Update(u) => Pkt::Update(pb::Update {
                revocation_hash: u.revocation_hash.into(),
                delta_msat: u.delta_msat,
            }),
            Packet::UpdateAddHtlc(u) => Pkt::UpdateAddHtlc(pb::UpdateAddHtlc {
                revocation_hash: u.revocation_hash.into(),
                amount_msat: u.amount_msat,
                r_hash: u.r_hash.into(),
                expiry: u.expiry.into(),
                onion: u.onion.as_ref().map(|o| o.as_bytes().to_vec()),
            }),
            Packet::UpdateAccept(u) => Pkt::UpdateAccept(pb::UpdateAccept {
                sig: (&u.sig).into(),
                revocation_hash: u.revocation_hash.into(),
            }),
            Packet::UpdateSignature(u) => Pkt::UpdateSignature(pb::UpdateSignature {
                sig: (&u.sig).into(),
                revocation_preimage: u.revocation_preimage.into(),
            }),
            Packet::UpdateComplete(u) => Pkt::UpdateComplete(pb::UpdateComplete {
                revocation_preimage: u.revocation_preimage.into(),
            }),
            Packet::UpdateDeclineHtlc(u) => Pkt::UpdateDeclineHtlc(pb::UpdateDeclineHtlc {
                reason: u.reason.map(|r| match r {
                    DeclineReason::InsufficientFunds(f) => {
                        pb::update_decline_htlc::Reason::InsufficientFunds(f.into())
                    }
                    DeclineReason::CannotRoute(b) => {
                        pb::update_decline_htlc::Reason::CannotRoute(b)
                    }
                }),
            }),
            Packet::UpdateFulfillHtlc(u) => Pkt::UpdateFulfillHtlc(pb::UpdateFulfillHtlc {
                revocation_hash: u.revocation_hash.into(),
                r: u.r.into(),
            }),
            Packet::UpdateTimedoutHtlc(u) => Pkt::UpdateTimedoutHtlc(pb::UpdateTimedoutHtlc {
                revocation_hash: u.revocation_hash.into(),
                r_hash: u.r_hash.into(),
            }),
            Packet::UpdateRoutefailHtlc(u) => Pkt::UpdateRoutefailHtlc(pb::UpdateRoutefailHtlc {
                revocation_hash: u.revocation_hash.into(),
                r_hash: u.r_hash.into(),
            }),
            Packet::Close(c) => Pkt::Close(pb::CloseChannel {
                sig: (&c.sig).into(),
                close_fee: c.close_fee,
            }),
            Packet::CloseComplete(c) => Pkt::CloseComplete(pb::CloseChannelComplete {
                sig: (&c.sig).into(),
            }),
            Packet::CloseAck => Pkt::CloseAck(pb::CloseChannelAck {}),
            Packet::Error(e) => Pkt::Error(pb::Error {
                problem: e.problem.clone(),
            }),
        };
        pb::Pkt { pkt: Some(inner) }
    }
}
