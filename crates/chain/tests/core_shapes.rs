//! The development chain's RPC answers parse into `corepc-types`' model of
//! Bitcoin Core 28 and convert to its typed model: evidence that the shapes
//! are Core's, field for field, not only what our own client reads.

// A failed unwrap is how a test reports failure.
#![allow(clippy::unwrap_used)]

use bitcoin::{Amount, Network};
use chain::{Auth, BitcoindRpc, Chain, DevChain, DevChainConfig, RpcConfig};
use corepc_types::v28;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

async fn call<T: DeserializeOwned>(c: &BitcoindRpc, method: &str, params: Value) -> T {
    let raw: Value = c.call(method, params.clone()).await.unwrap();
    match serde_json::from_value::<T>(raw.clone()) {
        Ok(t) => t,
        Err(e) => panic!("{method} {params}: {e}\n{raw:#}"),
    }
}

#[tokio::test]
async fn answers_have_bitcoin_core_28_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = DevChainConfig::new(dir.path());
    config.rpc_bind = Some("127.0.0.1:0".parse().unwrap());
    let node = DevChain::start(config).await.unwrap();
    let c = BitcoindRpc::new(RpcConfig::new(
        node.rpc_url().unwrap(),
        Auth::Cookie(node.cookie.clone().unwrap()),
    ))
    .unwrap();
    let w = wallet::Wallet::from_seed(&[1u8; 32], Network::Regtest).unwrap();
    let address = w.derive_address(0, 0).unwrap();

    let info: v28::GetBlockchainInfo = call(&c, "getblockchaininfo", json!([])).await;
    let info = info.into_model().unwrap();
    assert_eq!(info.chain, Network::Regtest);
    assert_eq!(info.blocks, 101);

    let txid: v28::SendToAddress =
        call(&c, "sendtoaddress", json!([address.to_string(), 0.001])).await;
    let txid = txid.into_model().unwrap().txid;
    let entry: v28::GetMempoolEntry = call(&c, "getmempoolentry", json!([txid.to_string()])).await;
    // The faucet's signature is ground to a low R, and its S is 32 bytes but one time in
    // 256: the size is read from the transaction itself, not fixed at 141.
    let tx = c.transaction(txid).await.unwrap().unwrap().tx;
    assert!((140..=141).contains(&tx.vsize()), "{}", tx.vsize());
    assert_eq!(entry.into_model().unwrap().0.vsize, Some(tx.vsize() as u32));
    let mempool: v28::GetRawMempool = call(&c, "getrawmempool", json!([])).await;
    assert_eq!(mempool.into_model().unwrap().0, vec![txid]);
    let mempool: v28::GetRawMempoolVerbose = call(&c, "getrawmempool", json!([true])).await;
    assert_eq!(mempool.into_model().unwrap().0.len(), 1);

    let generated: v28::GenerateToAddress =
        call(&c, "generatetoaddress", json!([1, address.to_string()])).await;
    let hash = generated.into_model().unwrap().0[0];
    let count: v28::GetBlockCount = call(&c, "getblockcount", json!([])).await;
    assert_eq!(count.0, 102);
    let best: v28::GetBestBlockHash = call(&c, "getbestblockhash", json!([])).await;
    assert_eq!(best.into_model().unwrap().0, hash);
    let by_height: v28::GetBlockHash = call(&c, "getblockhash", json!([102])).await;
    assert_eq!(by_height.into_model().unwrap().0, hash);

    let header: v28::GetBlockHeaderVerbose =
        call(&c, "getblockheader", json!([hash.to_string()])).await;
    let header = header.into_model().unwrap();
    assert_eq!((header.hash, header.height, header.n_tx), (hash, 102, 2));
    let header: v28::GetBlockHeader =
        call(&c, "getblockheader", json!([hash.to_string(), false])).await;
    assert_eq!(header.block_header().unwrap().block_hash(), hash);
    let block: v28::GetBlockVerboseZero = call(&c, "getblock", json!([hash.to_string(), 0])).await;
    assert_eq!(block.block().unwrap().block_hash(), hash);
    let block: v28::GetBlockVerboseOne = call(&c, "getblock", json!([hash.to_string(), 1])).await;
    let block = block.into_model().unwrap();
    assert_eq!(block.tx[1], txid);

    let raw: v28::GetRawTransactionVerbose =
        call(&c, "getrawtransaction", json!([txid.to_string(), true])).await;
    let raw = raw.into_model().unwrap();
    assert_eq!((raw.block_hash, raw.confirmations), (Some(hash), Some(1)));
    let vout = raw
        .transaction
        .output
        .iter()
        .position(|o| o.script_pubkey == address.script_pubkey())
        .unwrap();
    let out: v28::GetTxOut = call(&c, "gettxout", json!([txid.to_string(), vout])).await;
    let out = out.into_model().unwrap();
    assert_eq!(out.tx_out.value, Amount::from_sat(100_000));
    assert_eq!(out.address, Some(address.as_unchecked().clone()));

    let fee: v28::EstimateSmartFee = call(&c, "estimatesmartfee", json!([6])).await;
    assert!(fee.into_model().unwrap().fee_rate.is_some());
    let accept: v28::TestMempoolAccept = call(
        &c,
        "testmempoolaccept",
        json!([[bitcoin::consensus::encode::serialize_hex(&raw.transaction)]]),
    )
    .await;
    let accept = accept.into_model().unwrap();
    assert!(!accept.results[0].allowed);
    node.shutdown().await;
}
