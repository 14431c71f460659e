//! The `potluck` binary: argument parsing and wiring only.

#![warn(clippy::unwrap_used)]

mod chain_cmd;
mod chain_flags;
mod cli_cmd;
mod fee_flags;
mod node_cmd;
mod serve_cmd;

use std::future::Future;
use std::num::NonZeroUsize;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc: a busy node allocates and frees small objects for
/// every packet, write and control call, and glibc's free lists were 7 % of its CPU
/// (docs/node.md, "Performance notes").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// potluck: a payment-channel node and a round-based custodial wallet.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Log lines on stderr: `text` (colours only on a terminal) or `json` (one object per line, for log shippers).
    #[arg(long, global = true, env = "POTLUCK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
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
    Node(Box<node_cmd::NodeArgs>),
    /// Call a running node's control API (`potluck cli help` lists its methods), or with
    /// --chain the development chain's JSON-RPC (faucet, mining).
    Cli(cli_cmd::CliArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let log = cli.log_format;
    match cli.command {
        Command::DecodePacket { hex } => {
            let bytes = hex::decode(hex.trim()).context("the packet is not valid hex")?;
            let packet = wire::Packet::decode(&bytes).context("the packet does not decode")?;
            println!("{} ({}): {packet:#?}", packet.name(), packet.case());
            Ok(())
        }
        Command::Chain(args) => run_until_stopped(log, None, |stop| chain_cmd::run(args, stop)),
        Command::Serve(args) => run_until_stopped(log, None, |stop| serve_cmd::run(*args, stop)),
        Command::Node(args) => {
            let threads = args.runtime_threads;
            run_until_stopped(log, Some(threads), |stop| node_cmd::run(*args, stop))
        }
        // The exit status tells scripts what failed (see `potluck cli --help`).
        Command::Cli(args) => std::process::exit(runtime(None)?.block_on(cli_cmd::run(args))),
    }
}

/// The async runtime of every subcommand: `threads` workers, else one per core.
fn runtime(threads: Option<NonZeroUsize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = match threads {
        // One thread: every task on the thread that waits for the service, with none of
        // the multi-thread scheduler's hand-offs (docs/node.md, "Threads").
        Some(n) if n.get() == 1 => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n.get());
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    builder
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// A long-running subcommand: logging, the runtime and the stop signals are set up here,
/// once for all of them, and the signals registered before `service` prints anything.
fn run_until_stopped<F, Fut>(
    log: LogFormat,
    threads: Option<NonZeroUsize>,
    service: F,
) -> anyhow::Result<()>
where
    F: FnOnce(StopSignals) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    init_logging(log);
    runtime(threads)?.block_on(async move {
        let signals = StopSignals::register()?;
        service(signals).await
    })
}

/// Logs go to stderr, filtered by `POTLUCK_LOG`, else `RUST_LOG` (default info),
/// as text (ANSI colours only when stderr is a terminal) or JSON
/// (`--log-format json`); an installed subscriber is kept.
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_env("POTLUCK_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // Only one subscriber per process; a second call keeps the first (tests).
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder.json().with_current_span(true).try_init(),
    };
}

/// SIGINT and SIGTERM, registered when created. A handler that is only
/// installed when its future is first polled leaves a window after the
/// start-up line in which a supervisor's SIGTERM takes the default action and
/// kills the process without its graceful shutdown; so every long-running
/// subcommand registers these before it prints anything.
struct StopSignals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Installs the handlers (inside the runtime).
    fn register() -> anyhow::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Self {
                interrupt: signal(SignalKind::interrupt())
                    .context("installing the SIGINT handler")?,
                terminate: signal(SignalKind::terminate())
                    .context("installing the SIGTERM handler")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// Resolves at the first SIGINT or SIGTERM.
    async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}
