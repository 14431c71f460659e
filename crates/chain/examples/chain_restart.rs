//! Figures of issue 14: how long the development chain takes to reopen a
//! data directory of 100,000 blocks (replaying every block into the UTXO
//! set), and the process's memory afterwards.
//!
//! Run: `cargo run --release -p potluck-chain --example chain_restart [BLOCKS] [DIR]`
//! (a DIR that already holds the blocks is reused, so the mining is paid once).

use std::time::Instant;

use chain::DevChain;

/// `VmRSS` and `VmHWM` (peak) of this process in kB, from `/proc/self/status`.
fn rss_kb() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let blocks: u32 = args.next().map_or(Ok(100_000), |a| a.parse())?;
    let tmp = tempfile::tempdir()?;
    let dir = args
        .next()
        .map_or_else(|| tmp.path().to_owned(), Into::into);
    let (rss_start, _) = rss_kb();
    let t0 = Instant::now();
    let mut chain = DevChain::open(&dir)?;
    let mut open_s = t0.elapsed().as_secs_f64();
    let have = chain.height();
    if have < blocks {
        // Build the chain once; measure the reopen in a later run (this
        // process's heap then still holds the mining's memory).
        let t0 = Instant::now();
        let script = chain.faucet_script().to_owned();
        let mut left = blocks - have;
        while left > 0 {
            let n = left.min(chain::dev::MAX_GENERATE);
            chain.mine(n, &script)?;
            left -= n;
        }
        eprintln!(
            "mined {} blocks in {:.1} s; run again on the same DIR to measure a cold reopen",
            blocks - have,
            t0.elapsed().as_secs_f64()
        );
        drop(chain);
        let t0 = Instant::now();
        chain = DevChain::open(&dir)?;
        open_s = t0.elapsed().as_secs_f64();
    }
    let (rss, hwm) = rss_kb();
    println!("| measurement | value |");
    println!("|---|---|");
    println!("| blocks | {} |", chain.height());
    println!(
        "| blocks.dat | {:.1} MB |",
        chain.size_on_disk() as f64 / 1e6
    );
    println!("| open (read, checksum, replay into the UTXO set) | {open_s:.2} s |");
    println!(
        "| RSS after opening | {:.0} MB (at process start: {:.0} MB; peak {:.0} MB) |",
        rss as f64 / 1024.0,
        rss_start as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    Ok(())
}
