//! `bitcoincore-rpc`, the typed client many Rust services use against
//! Bitcoin Core, works against the development chain: every typed call the
//! services would make decodes, with Core's types and meanings (issue 31:
//! its `getnetworkinfo` failed on missing `localservices`, `networks`,
//! `localaddresses`, `timeoffset`, and `uptime` was always 0).

// A failed unwrap is how a test reports failure.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bitcoin::Amount;
use bitcoincore_rpc::{Auth, Client, RpcApi};
use chain::{DevChain, DevChainConfig};

#[tokio::test(flavor = "multi_thread")]
async fn bitcoincore_rpc_typed_calls_decode() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = DevChainConfig::new(dir.path());
    config.rpc_bind = Some("127.0.0.1:0".parse().unwrap());
    let node = DevChain::start(config).await.unwrap();
    let url = node.rpc_url().unwrap();
    let cookie = node.cookie.clone().unwrap();
    let faucet_to = wallet::Wallet::from_seed(&[4u8; 32], bitcoin::Network::Regtest)
        .unwrap()
        .derive_address(0, 0)
        .unwrap();
    let txid = node
        .chain
        .faucet(&faucet_to.script_pubkey(), Amount::from_sat(50_000))
        .unwrap();
    // `uptime` counts real seconds since the chain started.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let chain = node.chain.clone();
    // The client is blocking: run it off the runtime's workers.
    tokio::task::spawn_blocking(move || {
        let c = Client::new(&url, Auth::CookieFile(cookie)).unwrap();

        let net = c.get_network_info().unwrap();
        assert_eq!(net.version, 300_000);
        assert_eq!(net.protocol_version, 70016);
        assert_eq!(net.local_services, "0000000000000c09");
        assert!(net.local_relay && net.network_active);
        assert_eq!(
            (net.connections, net.connections_in, net.connections_out),
            (0, Some(0), Some(0))
        );
        assert_eq!(net.time_offset, 0);
        assert_eq!(
            net.networks
                .iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>(),
            ["ipv4", "ipv6", "onion", "i2p", "cjdns"]
        );
        assert!(net.networks[0].reachable && !net.networks[0].limited);
        assert!(!net.networks[2].reachable && net.networks[2].limited);
        assert_eq!(net.relay_fee, Amount::from_sat(100));
        assert_eq!(net.incremental_fee, Amount::from_sat(100));
        assert!(net.local_addresses.is_empty());

        let info = c.get_blockchain_info().unwrap();
        assert_eq!(info.chain, bitcoin::Network::Regtest);
        assert_eq!(info.blocks, u64::from(chain.height()));
        assert!(!info.initial_block_download);

        let pool = c.get_mempool_info().unwrap();
        assert_eq!(pool.size, 1);
        assert_eq!(pool.mempool_min_fee, Amount::from_sat(100));
        assert_eq!(pool.min_relay_tx_fee, Amount::from_sat(100));
        assert_eq!(pool.incremental_relay_fee, Some(Amount::from_sat(100)));

        let mempool_tx = c.get_raw_transaction(&txid, None).unwrap();
        assert_eq!(mempool_tx.compute_txid(), txid);

        let fee = c.estimate_smart_fee(6, None).unwrap();
        assert_eq!(fee.fee_rate, Some(Amount::from_sat(100)));
        chain.set_fee_estimates(false);
        let none = c.estimate_smart_fee(6, None).unwrap();
        assert_eq!(none.fee_rate, None);
        assert_eq!(
            none.errors,
            Some(vec!["Insufficient data or no feerate found".to_owned()])
        );

        let hash = c.generate_to_address(1, &faucet_to).unwrap().pop().unwrap();
        let block = c.get_block(&hash).unwrap();
        assert!(block.txdata.iter().any(|t| t.compute_txid() == txid));
        let confirmed = c.get_raw_transaction(&txid, Some(&hash)).unwrap();
        assert_eq!(confirmed.compute_txid(), txid);

        let up = c.uptime().unwrap();
        assert!(up >= 1, "uptime {up} s after more than a second");
        assert!(up < 600, "uptime {up} s");
    })
    .await
    .unwrap();
    node.shutdown().await;
}
