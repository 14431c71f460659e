//! Sans-IO payment channels: the channel state machine of the peer protocol
//! and the segwit transactions it signs (DESIGN.md §3, PROTOCOL-NOTES §6–§8).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![warn(missing_docs)]

pub mod channel;
pub mod funding;
pub mod script;
pub mod shachain;
pub mod stored_hex;
pub mod tx;

pub use channel::{
    apply_change, Action, AnchorRole, Change, Channel, ChannelConfig, ChannelError, ChannelSecrets,
    ChannelV0, CommandError, Deadlines, Event, Migrated, MigrationError, Rejected,
    RevokedCommitment, State, TimeUnit, Unclaimable,
};
pub use funding::{CState, Htlc, Side, Who};
pub use shachain::RevocationSecrets;
