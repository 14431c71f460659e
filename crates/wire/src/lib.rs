//! Packets of the peer channel protocol (proto2): encoding, checked decoding and the field-parity rule.
//!
//! `proto/peer.proto` is the contract. [`pb`] holds the types prost generates
//! from it; [`Packet`] is the checked domain form that the rest of potluck
//! uses. [`Packet::decode`] enforces what prost alone does not: required
//! fields, "exactly one" oneofs, enum ranges, and the seed's parity rule (an
//! unknown even field is an error at every nesting level, an unknown odd
//! field is ignored), then turns hashes, signatures and keys into their
//! domain types.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod error;
mod onion;
mod packet;
#[rustfmt::skip]
#[allow(missing_docs, clippy::all)]
pub mod pb;
mod schema;
mod types;

pub use error::{DecodeError, DecodeErrorKind};
pub use onion::Onion;
pub use packet::{
    decode_pkt, AnchorOffer, Authenticate, CloseChannel, CloseChannelComplete, DeclineReason,
    ErrorPacket, OpenAnchor, OpenChannel, OpenCommitSig, OpenComplete, Packet, Update,
    UpdateAccept, UpdateAddHtlc, UpdateComplete, UpdateDeclineHtlc, UpdateFulfillHtlc,
    UpdateRoutefailHtlc, UpdateSignature, UpdateTimedoutHtlc,
};
pub use types::{ChainPubkey, Funding, Locktime, Preimage, Sha256, Sha256d};

/// Re-exported so that users name the same secp256k1 types as this crate.
pub use secp256k1;
