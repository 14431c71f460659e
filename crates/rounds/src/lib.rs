//! The round-based custodial wallet HTTP service (seed 001): accounts, sessions, login throttle, registration quota, admin, audit, rounds and the live stream.
//!
//! Entry point: [`Application::build`] with a [`Config`], then
//! [`Application::run_until_stopped`].

pub mod accounts;
pub mod address;
pub mod admin;
pub mod app;
pub mod auth;
pub mod client_ip;
pub mod config;
pub mod current;
pub mod dashboard;
pub mod draw;
pub mod engine;
pub mod error;
pub mod ledger;
pub mod metrics;
pub mod money_api;
pub mod password;
pub mod quota;
pub mod rounds_api;
pub mod spend;
pub mod store;
pub mod stream;
pub mod throttle;
pub mod time;
pub mod token;

pub use app::{Application, StartupError};
pub use config::{ChainSource, Config};
