//! The workflows: the engine (chain watcher and round lifecycle), users' payments, reading rounds back, the current-round cache and the live-update hub.

pub mod current;
pub mod engine;
pub mod fanout;
pub mod history;
pub mod leader;
pub mod payments;
pub mod stream;
