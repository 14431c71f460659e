//! The encrypted, authenticated peer session, version 3: a sans-IO core and a thin tokio transport.
//!
//! The core ([`Handshake`], [`Sealer`], [`Opener`], [`keys`]) takes bytes and
//! keys as arguments and returns bytes; it owns no socket, clock or random
//! source. [`connect`] and [`accept`] run it over TCP and yield a [`Session`]
//! that sends and receives checked [`wire::Packet`]s. The byte-level rules
//! are those of `shared/PROTOCOL-NOTES.md` §1–§4; `docs/session.md` sums them up.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod frame;
mod handshake;
pub mod keys;
mod transport;

pub use frame::{
    padded_len, FrameError, OpenedFrame, Opener, SealError, Sealer, HEADER_LEN, MAX_PAYLOAD,
};
pub use handshake::{Established, Handshake, HandshakeError, Progress, HELLO};
pub use keys::{DirectionKeys, SessionKeys, SESSION_KEY_LEN};
pub use transport::{
    accept, connect, handshake_over, handshake_with, Config, Session, SessionError, SessionReader,
    SessionWriter,
};
