//! The `potluck` binary: argument parsing and wiring only.

mod chain_cmd;
mod cli_cmd;
mod node_cmd;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

mod serve_cmd;

/// potluck: a payment-channel node and a round-based custodial wallet.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Decode a peer-protocol packet given as hex and print it.
    DecodePacket {
        /// The protobuf-encoded `pkt` (a frame's plaintext), as hex.
        hex: String,
    },
    /// Run the development chain (regtest rules) with a bitcoind-style JSON-RPC server.
    Chain(chain_cmd::ChainArgs),
    /// Run the round-based custodial wallet HTTP service.
    Serve(Box<serve_cmd::ServeArgs>),
    /// Run a payment-channel node: peers over the encrypted v3 session, a JSON-RPC control API.
    Node(node_cmd::NodeArgs),
    /// Call a running node's control API (getinfo, connect, listpeers, disconnect, stop).
    Cli(cli_cmd::CliArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::DecodePacket { hex } => {
            let bytes = hex::decode(hex.trim()).context("the packet is not valid hex")?;
            let packet = wire::Packet::decode(&bytes).context("the packet does not decode")?;
            println!("{} ({}): {packet:#?}", packet.name(), packet.case());
            Ok(())
        }
        Command::Chain(args) => chain_cmd::run(args),
        Command::Serve(args) => serve_cmd::run(*args),
        Command::Node(args) => node_cmd::run(args),
        Command::Cli(args) => cli_cmd::run(args),
    }
}

/// Logs go to stderr, filtered by `POTLUCK_LOG`, else `RUST_LOG` (default info); an installed subscriber is kept.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("POTLUCK_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Resolves on SIGTERM (never on platforms without it).
async fn terminate() {
    #[cfg(unix)]
    if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        s.recv().await;
        return;
    }
    std::future::pending::<()>().await
}
