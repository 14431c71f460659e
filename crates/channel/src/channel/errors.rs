//! Why a packet is rejected ([`ChannelError`], wrapped in [`Rejected`]) and why an owner
//! command is refused ([`CommandError`]).

use wire::{Locktime, Packet};

use crate::funding::FundingError;
use crate::shachain::ShachainError;
use crate::tx::TxError;

use super::types::{State, TimeUnit};

/// Why a packet was rejected. Send [`Rejected::reply`], then hang up; the channel is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// The packet is not allowed in this state.
    #[error("Unexpected packet {0}")]
    UnexpectedPacket(&'static str),
    /// `open_channel` violates our limits.
    #[error("bad open_channel: {0}")]
    BadOpen(String),
    /// `close_channel` asks for a fee that the balances cannot pay.
    #[error("bad close_channel: {0}")]
    BadClose(String),
    /// The anchor does not match what was agreed.
    #[error("bad anchor: {0}")]
    BadAnchor(String),
    /// A signature does not verify.
    #[error("bad signature on {0}")]
    BadSignature(&'static str),
    /// A revocation preimage does not hash to the revocation hash sent earlier.
    #[error("revocation preimage does not match the revocation hash")]
    BadRevocationPreimage,
    /// A revocation preimage breaks the shachain.
    #[error(transparent)]
    Shachain(#[from] ShachainError),
    /// The update is not affordable or refers to nothing.
    #[error("update refused: {0}")]
    Funding(#[from] FundingError),
    /// An amount does not fit the wire's uint32 msat.
    #[error("amount {0} msat does not fit uint32")]
    AmountTooLarge(i128),
    /// `update.delta_msat` is positive: the proposer would take the receiver's money.
    #[error("update delta_msat {0} takes money from the receiver")]
    TakesFromReceiver(i64),
    /// `update_fulfill_htlc` carries an R that matches no HTLC we offered.
    #[error("no HTLC of ours matches this R")]
    UnknownPreimage,
    /// The HTLC has not expired yet.
    #[error("HTLC has not expired")]
    NotExpired,
    /// An HTLC's `r_hash` equals the revocation hash of a commitment that would hold it:
    /// its output could not be taken with the revocation preimage (docs/channel.md,
    /// "Revocation hashes and HTLC hashes").
    #[error("r_hash equals a revocation hash")]
    RevocationHashCollision,
    /// A delay or an HTLC expiry is not in the channel's time unit (docs/channel.md, "One
    /// time unit per channel"): a claim waiting for seconds that races a refund waiting
    /// for blocks has no winner we can predict.
    #[error("{what} {got:?} is not in {unit}, the unit of this channel (both delays and every HTLC expiry count in one unit)")]
    MixedTimeUnits {
        /// The field.
        what: &'static str,
        /// Its value.
        got: Locktime,
        /// The channel's unit.
        unit: TimeUnit,
    },
    /// A transaction could not be built.
    #[error(transparent)]
    Tx(#[from] TxError),
    /// An internal invariant does not hold (a bug, never the peer's doing).
    #[error("internal error: {0}")]
    Invariant(&'static str),
}

/// A rejected packet: send [`Rejected::reply`] (an `error` packet), then hang up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{error}")]
pub struct Rejected {
    /// What went wrong.
    #[source]
    pub error: ChannelError,
}

impl Rejected {
    /// The `error{problem}` packet for the peer, `problem` being the error's text.
    pub fn reply(&self) -> Packet {
        Packet::error(self.error.to_string())
    }
}

/// Why an owner command was refused; the channel is unchanged and nothing is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// The command is not possible in this state (e.g. an update is in flight: retry later).
    #[error("not possible in state {0:?}")]
    WrongState(State),
    /// The amount does not fit the wire's uint32 msat.
    #[error("amount {0} msat does not fit uint32")]
    AmountTooLarge(u64),
    /// Not affordable, or no such HTLC.
    #[error(transparent)]
    Funding(#[from] FundingError),
    /// The HTLC has not expired yet.
    #[error("HTLC has not expired")]
    NotExpired,
    /// The HTLC expiry is not usable (past, too far, or not encodable).
    #[error("bad HTLC expiry {0:?}")]
    BadExpiry(Locktime),
    /// The HTLC expiry is not in the channel's time unit (the unit of the delay that the
    /// receiver's claim with R waits for).
    #[error("HTLC {what} {got:?} is not in {unit}, the unit of this channel (both delays and every HTLC expiry count in one unit)")]
    MixedTimeUnits {
        /// The argument.
        what: &'static str,
        /// Its value.
        got: Locktime,
        /// The channel's unit.
        unit: TimeUnit,
    },
    /// The anchor transaction does not pay the 2-of-2.
    #[error("anchor transaction does not pay {0} sat to the 2-of-2")]
    BadAnchorTx(u64),
    /// No HTLC that we receive has this R.
    #[error("no HTLC matches this R")]
    UnknownPreimage,
    /// The HTLC offered to us has expired: R is not revealed (the peer can refund the
    /// HTLC on chain already, and would hold R as well).
    #[error("HTLC expired at {0:?}: too late to fulfil; R is not revealed")]
    HtlcExpired(Locktime),
    /// The HTLC offered to us expires too soon to claim it on chain with R should the peer
    /// stall the fulfil (within our claim delay plus half `htlc_claim_margin_blocks`): R is
    /// not revealed.
    #[error("HTLC expiring at {expiry:?} is too close to its expiry to fulfil: claiming it on chain with R needs {lead} {unit} before the expiry; R is not revealed")]
    TooLateToFulfill {
        /// The HTLC's expiry.
        expiry: Locktime,
        /// The delay of our claim with R plus half the margin, in `unit`.
        lead: u64,
        /// The expiry's unit.
        unit: TimeUnit,
    },
    /// HTLCs are pending: a cooperative close needs none.
    #[error("HTLCs pending")]
    HtlcsPending,
    /// A transaction could not be built.
    #[error(transparent)]
    Tx(#[from] TxError),
    /// Our own configuration is unusable (e.g. a delay that cannot be encoded).
    #[error("bad configuration: {0}")]
    BadConfig(String),
    /// The HTLC is below the dust limit: its output would not exist on chain.
    #[error("HTLC of {0} msat is below the dust limit")]
    BelowDust(u64),
    /// We already have the most HTLCs in flight that we allow.
    #[error("too many HTLCs in flight (at most {0})")]
    TooManyHtlcs(u16),
    /// The `r_hash` equals a revocation hash of either side: a commitment holding the
    /// HTLC could not be fully penalised (docs/channel.md).
    #[error("r_hash equals a revocation hash of this channel")]
    RevocationHashCollision,
    /// One more HTLC would make the commitments pay less than the minimum relay fee for
    /// their weight (the agreed commitment fee is an absolute amount): they could not
    /// reach the chain.
    #[error("commitment fee of {fee_sat} sat is below the minimum relay fee of a commitment with {htlcs} HTLCs ({min_sat} sat): no more HTLCs until some are settled")]
    CommitmentFeeTooLow {
        /// HTLCs in the commitment with the new one.
        htlcs: usize,
        /// The agreed commitment fee.
        fee_sat: u64,
        /// The minimum relay fee of that commitment.
        min_sat: u64,
    },
    /// No close fee fits: the minimum relay fee is above our share of this (tiny) channel.
    #[error("close fee {fee_sat} sat outside {min_sat}..={max_sat} sat")]
    BadCloseFee {
        /// The fee.
        fee_sat: u64,
        /// The minimum relay fee of the close transaction.
        min_sat: u64,
        /// The configured share of the channel.
        max_sat: u64,
    },
    /// An internal invariant does not hold (a bug).
    #[error("internal error: {0}")]
    Invariant(&'static str),
}
