//! What the development chain's JSON-RPC tests share: a chain on a free port with a
//! cookie-authenticated client, a test wallet, and a funded coin of it.
#![allow(dead_code)]

use std::time::Duration;

use bitcoin::{Address, Amount, Network, OutPoint, Transaction};
use chain::{Auth, BitcoindRpc, Chain, DevChain, DevChainConfig, RpcConfig, RunningDevChain};
use wallet::{KeyPath, SpendableOutput, Wallet};

/// A development chain in `dir` with its RPC on a free port, and a client of it.
pub async fn start(dir: &std::path::Path) -> (RunningDevChain, BitcoindRpc) {
    let mut config = DevChainConfig::new(dir);
    config.rpc_bind = Some("127.0.0.1:0".parse().unwrap());
    let running = DevChain::start(config).await.unwrap();
    let mut rpc = RpcConfig::new(
        running.rpc_url().unwrap(),
        Auth::Cookie(running.cookie.clone().unwrap()),
    );
    rpc.timeout = Duration::from_secs(20);
    (running, BitcoindRpc::new(rpc).unwrap())
}

/// The wallet whose coins the tests spend.
pub fn wallet() -> Wallet {
    Wallet::from_seed(&[9u8; 32], Network::Regtest).unwrap()
}

/// Where mined blocks pay (another wallet's address).
pub fn miner() -> Address {
    Wallet::from_seed(&[3u8; 32], Network::Regtest)
        .unwrap()
        .derive_address(0, 0)
        .unwrap()
}

/// Pays `amount` from the faucet to `path` and mines it.
pub async fn fund(c: &BitcoindRpc, w: &Wallet, path: KeyPath, amount: Amount) -> SpendableOutput {
    let address = w.derive(path).unwrap().address;
    let txid = c.send_to_address(&address, amount).await.unwrap();
    c.generate_to_address(1, &miner()).await.unwrap();
    let tx = c.transaction(txid).await.unwrap().unwrap().tx;
    output_to(&tx, path, w)
}

/// The output of `tx` paying `path`'s address.
pub fn output_to(tx: &Transaction, path: KeyPath, w: &Wallet) -> SpendableOutput {
    let script = w.derive(path).unwrap().address.script_pubkey();
    let vout = tx
        .output
        .iter()
        .position(|o| o.script_pubkey == script)
        .unwrap();
    SpendableOutput {
        outpoint: OutPoint {
            txid: tx.compute_txid(),
            vout: vout as u32,
        },
        txout: tx.output[vout].clone(),
        path,
    }
}
