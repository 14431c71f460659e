//! The `potluck` binary: argument parsing and wiring only.

mod chain_cmd;

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
    }
}
