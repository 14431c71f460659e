//! The payment-channel node's process tests: `potluck node`, `potluck cli`,
//! `potluck chain` and `potluck decode-packet` as real processes, one test
//! crate with a module per subject. What is tested is the process itself
//! (restart after `kill -9`, the TCP accept path, the command line and its
//! exit codes); the node's policies are tested in process in crates/node.

#[path = "../support/mod.rs"]
mod support;

mod attacks;
mod chain_cli;
mod chain_crash;
mod channels;
mod cli;
mod decode_packet;
mod forward_crash;
mod invoices;
