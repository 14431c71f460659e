//! The workflows: accounts, the operator's requests, users' payments (the cashier over the one payment workflow), the engine (chain watcher and round lifecycle), reading rounds back, the current-round cache, the live-update hub and readiness.
//!
//! Services own their store handle; the HTTP layer calls them and never the
//! store. The plain records a service returns (store rows such as
//! [`history::RoundDetail`]) and [`StoreError`] pass through unchanged and are
//! re-exported by the service that returns them.

pub mod accounts;
pub mod admin;
pub mod bump;
pub mod cashier;
pub mod current;
pub mod engine;
pub mod fanout;
pub mod health;
pub mod history;
pub mod leader;
pub mod limits;
pub mod payments;
pub mod stream;

pub use crate::store::StoreError;
