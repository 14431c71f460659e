//! BOLT 4 Sphinx onions for multi-hop HTLCs: build one for a route, peel one layer, read a hop's payload.
//!
//! Sans-IO like `wire` and `channel`: bytes and keys in, bytes out; the
//! session key is an argument (no RNG), and nothing here reads a clock. The
//! packet itself is [`wire::Onion`], the fixed-size field of
//! `update_add_htlc`; this crate gives its bytes meaning. It is a crate of its
//! own rather than a module of `wire` so that the codec stays free of stream
//! ciphers and the channel state machine, which only carries the onion, does
//! not depend on how it is opened (docs/onion.md).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod payload;
mod sphinx;

pub use payload::{
    HopPayload, PayloadError, TLV_AMOUNT, TLV_EXPIRY_BLOCKS, TLV_EXPIRY_SECONDS, TLV_NEXT_NODE,
};
pub use sphinx::{
    build, peel, BuildError, Built, Hop, Next, PeelError, Peeled, HOP_PAYLOADS_LEN, VERSION,
};
