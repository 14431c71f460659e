//! The rules of the service without IO: round and transfer states, the draw, building and signing payments, settings and their diff, addresses, time formatting.
//!
//! Nothing here imports axum, sqlx or tokio; every module is unit-tested
//! without a database.

pub mod address;
pub mod audit;
pub mod bump;
pub mod draw;
pub mod ledger;
pub mod lockout;
pub mod money;
pub mod phase;
pub mod round;
pub mod settings;
pub mod spend;
pub mod time;
pub mod transfer;
pub mod txid_json;
