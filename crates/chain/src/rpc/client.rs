//! `BitcoindRpc`: a JSON-RPC client for Bitcoin Core (and the development
//! chain), with cookie or user/password auth, HTTP keep-alive, per-request
//! time-outs, retries on transient errors, and typed errors carrying Core's
//! code and message.
//!
//! Responses are decoded into small serde structs holding only the fields
//! this project reads, named as in Core's RPC help (the shapes `corepc-types`
//! models); see `docs/chain.md` for why not `corepc-types` itself.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bitcoin::consensus::encode::{deserialize_hex, serialize_hex};
use bitcoin::{
    Amount, Block, BlockHash, Denomination, FeeRate, OutPoint, ScriptBuf, Transaction, Txid,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use super::codes;
use crate::api::{Chain, ChainError, ChainFuture, Tip, TxStatus, UnspentOutput};
use crate::tips::TipStream;

/// How the client authenticates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// Read `user:password` from Core's cookie file (re-read after a 401,
    /// since the cookie changes whenever the node restarts).
    Cookie(PathBuf),
    /// Fixed `rpcuser`/`rpcpassword`.
    UserPass(String, String),
}

/// Client settings.
#[derive(Debug, Clone)]
pub struct RpcConfig {
    /// `http://host:port/` (a `/wallet/<name>` path is kept).
    pub url: String,
    /// Credentials.
    pub auth: Auth,
    /// Time-out of one HTTP exchange.
    pub timeout: Duration,
    /// Extra attempts after a transient failure (connection error, time-out,
    /// HTTP 503, Core warming up), with doubling back-off from 100 ms.
    pub retries: u32,
    /// How often [`Chain::tips`] polls the best block.
    pub tip_poll: Duration,
}

impl RpcConfig {
    /// Defaults: 30 s time-out, 3 retries, 1 s tip polling.
    pub fn new(url: impl Into<String>, auth: Auth) -> Self {
        Self {
            url: url.into(),
            auth,
            timeout: Duration::from_secs(30),
            retries: 3,
            tip_poll: Duration::from_secs(1),
        }
    }
}

/// What went wrong with one RPC call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// Core answered with an error object.
    #[error("rpc error {code}: {message}")]
    Rpc {
        /// Core's error code (see [`super::codes`]).
        code: i32,
        /// Core's message.
        message: String,
    },
    /// HTTP 401/403: wrong credentials.
    #[error("rpc authentication failed (HTTP {0})")]
    Auth(u16),
    /// No answer in time.
    #[error("rpc request timed out after {0:?}")]
    Timeout(Duration),
    /// Connection refused/reset and other transport failures.
    #[error("rpc transport: {0}")]
    Transport(String),
    /// An HTTP status without a JSON-RPC body.
    #[error("rpc HTTP status {status}: {body}")]
    Http {
        /// Status code.
        status: u16,
        /// Start of the body.
        body: String,
    },
    /// A response that does not have the expected shape.
    #[error("rpc decode ({method}): {reason}")]
    Decode {
        /// The method called.
        method: String,
        /// What failed.
        reason: String,
    },
    /// Bad URL or unreadable cookie.
    #[error("rpc config: {0}")]
    Config(String),
}

impl RpcError {
    /// Whether retrying the same request may succeed.
    fn is_transient(&self) -> bool {
        match self {
            RpcError::Transport(_) | RpcError::Timeout(_) => true,
            RpcError::Http { status, .. } => *status == 503,
            RpcError::Rpc { code, .. } => *code == codes::RPC_IN_WARMUP,
            _ => false,
        }
    }
}

struct Inner {
    uri: hyper::Uri,
    config: RpcConfig,
    client: Client<HttpConnector, Full<Bytes>>,
    auth_header: std::sync::Mutex<Option<String>>,
    next_id: AtomicU64,
}

/// A Bitcoin Core JSON-RPC client; clones share one connection pool.
#[derive(Clone)]
pub struct BitcoindRpc {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for BitcoindRpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BitcoindRpc")
            .field("url", &self.inner.config.url)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    result: Value,
    #[serde(default)]
    error: Option<ErrorObject>,
}

#[derive(Deserialize)]
struct ErrorObject {
    code: i32,
    message: String,
}

/// `getblockchaininfo` (the fields used here).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct BlockchainInfo {
    /// `main`, `test`, `signet` or `regtest`.
    pub chain: String,
    /// Height of the active tip.
    pub blocks: u32,
    /// Hash of the active tip.
    #[serde(rename = "bestblockhash")]
    pub best_block_hash: BlockHash,
    /// Median time past of the tip.
    #[serde(rename = "mediantime")]
    pub median_time: u64,
    /// Whether the node is still syncing.
    #[serde(rename = "initialblockdownload")]
    pub initial_block_download: bool,
}

/// `getblockheader` verbose (the fields used here).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct BlockHeaderInfo {
    /// Block hash.
    pub hash: BlockHash,
    /// Depth in the active chain; -1 when not on it.
    pub confirmations: i64,
    /// Height.
    pub height: u32,
    /// Block time.
    pub time: u64,
    /// Median time past.
    #[serde(rename = "mediantime")]
    pub median_time: u64,
    /// Number of transactions.
    #[serde(rename = "nTx")]
    pub n_tx: u64,
    /// Parent, absent for genesis.
    #[serde(rename = "previousblockhash")]
    pub previous_block_hash: Option<BlockHash>,
}

/// One result of `testmempoolaccept`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct MempoolAcceptResult {
    /// The txid.
    pub txid: Txid,
    /// Whether it would be accepted.
    pub allowed: bool,
    /// Virtual size, when allowed.
    pub vsize: Option<u64>,
    /// Core's reject reason, when refused.
    #[serde(rename = "reject-reason")]
    pub reject_reason: Option<String>,
}

#[derive(Deserialize)]
struct RawTxVerbose {
    hex: String,
    #[serde(default)]
    confirmations: Option<u32>,
    #[serde(default)]
    blockhash: Option<BlockHash>,
}

#[derive(Deserialize)]
struct TxOutResult {
    confirmations: u32,
    value: f64,
    #[serde(rename = "scriptPubKey")]
    script_pubkey: ScriptPubKeyHex,
    coinbase: bool,
}

#[derive(Deserialize)]
struct ScriptPubKeyHex {
    hex: String,
}

#[derive(Deserialize)]
struct SmartFee {
    feerate: Option<f64>,
}

fn btc_to_amount(v: f64, method: &str) -> Result<Amount, RpcError> {
    Amount::from_str_in(&format!("{v:.8}"), Denomination::Bitcoin).map_err(|e| RpcError::Decode {
        method: method.into(),
        reason: e.to_string(),
    })
}

impl BitcoindRpc {
    /// A client for `config.url`. No request is made until the first call.
    ///
    /// # Errors
    /// [`RpcError::Config`] for a URL that is not `http://host:port/…`.
    pub fn new(config: RpcConfig) -> Result<Self, RpcError> {
        let uri: hyper::Uri = config
            .url
            .parse()
            .map_err(|e| RpcError::Config(format!("url {}: {e}", config.url)))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(RpcError::Config(format!(
                "url {} must be http://host:port/",
                config.url
            )));
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(config.timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Self {
            inner: Arc::new(Inner {
                uri,
                config,
                client,
                auth_header: std::sync::Mutex::new(None),
                next_id: AtomicU64::new(1),
            }),
        })
    }

    fn auth_header(&self, refresh: bool) -> Result<String, RpcError> {
        let mut cached = self
            .inner
            .auth_header
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let (Some(h), false) = (cached.as_ref(), refresh) {
            return Ok(h.clone());
        }
        let pair = match &self.inner.config.auth {
            Auth::UserPass(u, p) => format!("{u}:{p}"),
            Auth::Cookie(path) => std::fs::read_to_string(path)
                .map_err(|e| RpcError::Config(format!("cookie {}: {e}", path.display())))?
                .trim()
                .to_owned(),
        };
        let h = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        );
        *cached = Some(h.clone());
        Ok(h)
    }

    /// Calls `method` with positional `params` and decodes the result.
    ///
    /// # Errors
    /// See [`RpcError`]; transient failures are retried first.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        params: Value,
    ) -> Result<T, RpcError> {
        let value = self.call_value(method, params).await?;
        serde_json::from_value(value).map_err(|e| RpcError::Decode {
            method: method.into(),
            reason: e.to_string(),
        })
    }

    async fn call_value(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let mut attempt = 0;
        let mut refreshed = false;
        loop {
            match self.call_once(method, &params, false).await {
                Err(RpcError::Auth(_))
                    if !refreshed && matches!(self.inner.config.auth, Auth::Cookie(_)) =>
                {
                    // The node may have restarted with a new cookie.
                    refreshed = true;
                    self.auth_header(true)?;
                }
                Err(e) if e.is_transient() && attempt < self.inner.config.retries => {
                    let backoff = Duration::from_millis(100 << attempt.min(6));
                    tracing::debug!(method, error = %e, ?backoff, "rpc retry");
                    tokio::time::sleep(backoff).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn call_once(
        &self,
        method: &str,
        params: &Value,
        refresh: bool,
    ) -> Result<Value, RpcError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let body = json!({"jsonrpc": "1.0", "id": id, "method": method, "params": params});
        let request = hyper::Request::post(self.inner.uri.clone())
            .header(header::AUTHORIZATION, self.auth_header(refresh)?)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| RpcError::Config(e.to_string()))?;
        let timeout = self.inner.config.timeout;
        let exchange = async {
            let response = self
                .inner
                .client
                .request(request)
                .await
                .map_err(|e| RpcError::Transport(format!("{e:?}")))?;
            let status = response.status().as_u16();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| RpcError::Transport(e.to_string()))?
                .to_bytes();
            Ok::<_, RpcError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| RpcError::Timeout(timeout))??;
        if status == 401 || status == 403 {
            return Err(RpcError::Auth(status));
        }
        // Core answers errors of JSON-RPC 1.0 calls with HTTP 500/404 and a JSON body.
        let envelope: Envelope = match serde_json::from_slice(&bytes) {
            Ok(e) => e,
            Err(_) => {
                let text = String::from_utf8_lossy(&bytes);
                return Err(RpcError::Http {
                    status,
                    body: text.chars().take(200).collect(),
                });
            }
        };
        if let Some(err) = envelope.error {
            return Err(RpcError::Rpc {
                code: err.code,
                message: err.message,
            });
        }
        Ok(envelope.result)
    }

    /// `getblockchaininfo`.
    ///
    /// # Errors
    /// See [`RpcError`].
    pub async fn get_blockchain_info(&self) -> Result<BlockchainInfo, RpcError> {
        self.call("getblockchaininfo", json!([])).await
    }

    /// `getblockcount`.
    ///
    /// # Errors
    /// See [`RpcError`].
    pub async fn get_block_count(&self) -> Result<u32, RpcError> {
        self.call("getblockcount", json!([])).await
    }

    /// `getbestblockhash`.
    ///
    /// # Errors
    /// See [`RpcError`].
    pub async fn get_best_block_hash(&self) -> Result<BlockHash, RpcError> {
        self.call("getbestblockhash", json!([])).await
    }

    /// `getblockhash height`.
    ///
    /// # Errors
    /// -8 `Block height out of range` above the tip.
    pub async fn get_block_hash(&self, height: u32) -> Result<BlockHash, RpcError> {
        self.call("getblockhash", json!([height])).await
    }

    /// `getblock hash 0`, decoded.
    ///
    /// # Errors
    /// -5 `Block not found`.
    pub async fn get_block(&self, hash: &BlockHash) -> Result<Block, RpcError> {
        let hex: String = self.call("getblock", json!([hash, 0])).await?;
        deserialize_hex(&hex).map_err(|e| RpcError::Decode {
            method: "getblock".into(),
            reason: e.to_string(),
        })
    }

    /// `getblock hash verbosity` as raw JSON (1: txids, 2: decoded transactions).
    ///
    /// # Errors
    /// -5 `Block not found`.
    pub async fn get_block_verbose(
        &self,
        hash: &BlockHash,
        verbosity: u8,
    ) -> Result<Value, RpcError> {
        self.call("getblock", json!([hash, verbosity])).await
    }

    /// `getblockheader hash true`.
    ///
    /// # Errors
    /// -5 `Block not found`.
    pub async fn get_block_header_info(
        &self,
        hash: &BlockHash,
    ) -> Result<BlockHeaderInfo, RpcError> {
        self.call("getblockheader", json!([hash, true])).await
    }

    /// `getrawtransaction txid` decoded; `None` for -5 (unknown; Core needs
    /// `-txindex` for confirmed transactions that are not the node's wallet's).
    ///
    /// # Errors
    /// See [`RpcError`].
    pub async fn get_raw_transaction(&self, txid: &Txid) -> Result<Option<Transaction>, RpcError> {
        match self
            .call::<String>("getrawtransaction", json!([txid, false]))
            .await
        {
            Ok(hex) => deserialize_hex(&hex)
                .map(Some)
                .map_err(|e| RpcError::Decode {
                    method: "getrawtransaction".into(),
                    reason: e.to_string(),
                }),
            Err(RpcError::Rpc {
                code: codes::RPC_INVALID_ADDRESS_OR_KEY,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `sendrawtransaction hex`.
    ///
    /// # Errors
    /// Core's -25/-26/-27 with the reject reason as [`RpcError::Rpc`].
    pub async fn send_raw_transaction(&self, tx: &Transaction) -> Result<Txid, RpcError> {
        self.call("sendrawtransaction", json!([serialize_hex(tx)]))
            .await
    }

    /// `testmempoolaccept [hex…]`.
    ///
    /// # Errors
    /// See [`RpcError`].
    pub async fn test_mempool_accept(
        &self,
        txs: &[Transaction],
    ) -> Result<Vec<MempoolAcceptResult>, RpcError> {
        let hexes: Vec<String> = txs.iter().map(serialize_hex).collect();
        self.call("testmempoolaccept", json!([hexes])).await
    }

    /// `getrawmempool`.
    ///
    /// # Errors
    /// See [`RpcError`].
    pub async fn get_raw_mempool(&self) -> Result<Vec<Txid>, RpcError> {
        self.call("getrawmempool", json!([])).await
    }

    /// `generatetoaddress n address` (regtest and the development chain).
    ///
    /// # Errors
    /// -5 for an invalid address.
    pub async fn generate_to_address(
        &self,
        n: u32,
        address: &bitcoin::Address,
    ) -> Result<Vec<BlockHash>, RpcError> {
        self.call("generatetoaddress", json!([n, address.to_string()]))
            .await
    }

    /// `invalidateblock hash`.
    ///
    /// # Errors
    /// -5 `Block not found`.
    pub async fn invalidate_block(&self, hash: &BlockHash) -> Result<(), RpcError> {
        self.call::<Value>("invalidateblock", json!([hash]))
            .await
            .map(|_| ())
    }

    /// `reconsiderblock hash`.
    ///
    /// # Errors
    /// -5 `Block not found`.
    pub async fn reconsider_block(&self, hash: &BlockHash) -> Result<(), RpcError> {
        self.call::<Value>("reconsiderblock", json!([hash]))
            .await
            .map(|_| ())
    }

    /// `sendtoaddress address amount`: Core's wallet, or the development chain's faucet.
    ///
    /// # Errors
    /// -6 `Insufficient funds`, -5 invalid address.
    pub async fn send_to_address(
        &self,
        address: &bitcoin::Address,
        amount: Amount,
    ) -> Result<Txid, RpcError> {
        self.call(
            "sendtoaddress",
            json!([address.to_string(), amount.to_btc()]),
        )
        .await
    }

    /// `stop`.
    ///
    /// # Errors
    /// See [`RpcError`].
    pub async fn stop(&self) -> Result<String, RpcError> {
        self.call("stop", json!([])).await
    }
}

fn to_chain(e: RpcError) -> ChainError {
    match e {
        RpcError::Rpc { code, message }
            if code == codes::RPC_VERIFY_ERROR
                || code == codes::RPC_VERIFY_REJECTED
                || code == codes::RPC_VERIFY_ALREADY_IN_CHAIN =>
        {
            ChainError::Rejected {
                code,
                reason: message,
            }
        }
        RpcError::Rpc { code, message } if code == codes::RPC_INVALID_ADDRESS_OR_KEY => {
            ChainError::NotFound(message)
        }
        RpcError::Rpc { code, message } => ChainError::Node { code, message },
        other => ChainError::Unavailable(other.to_string()),
    }
}

impl Chain for BitcoindRpc {
    fn tip(&self) -> ChainFuture<'_, Tip> {
        Box::pin(async move {
            let info = self.get_blockchain_info().await.map_err(to_chain)?;
            Ok(Tip {
                height: info.blocks,
                hash: info.best_block_hash,
            })
        })
    }

    fn block_hash(&self, height: u32) -> ChainFuture<'_, Option<BlockHash>> {
        Box::pin(async move {
            match self.get_block_hash(height).await {
                Ok(h) => Ok(Some(h)),
                Err(RpcError::Rpc {
                    code: codes::RPC_INVALID_PARAMETER,
                    ..
                }) => Ok(None),
                Err(e) => Err(to_chain(e)),
            }
        })
    }

    fn block(&self, hash: BlockHash) -> ChainFuture<'_, Block> {
        Box::pin(async move { self.get_block(&hash).await.map_err(to_chain) })
    }

    fn transaction(&self, txid: Txid) -> ChainFuture<'_, Option<TxStatus>> {
        Box::pin(async move {
            match self
                .call::<RawTxVerbose>("getrawtransaction", json!([txid, true]))
                .await
            {
                Ok(r) => {
                    let tx = deserialize_hex(&r.hex)
                        .map_err(|e| ChainError::Unavailable(e.to_string()))?;
                    Ok(Some(TxStatus {
                        tx,
                        confirmations: r.confirmations.unwrap_or(0),
                        block_hash: r.blockhash,
                    }))
                }
                Err(RpcError::Rpc {
                    code: codes::RPC_INVALID_ADDRESS_OR_KEY,
                    ..
                }) => Ok(None),
                Err(e) => Err(to_chain(e)),
            }
        })
    }

    fn broadcast(&self, tx: Transaction) -> ChainFuture<'_, Txid> {
        Box::pin(async move { self.send_raw_transaction(&tx).await.map_err(to_chain) })
    }

    fn in_mempool(&self, txid: Txid) -> ChainFuture<'_, bool> {
        Box::pin(async move {
            match self.call::<Value>("getmempoolentry", json!([txid])).await {
                Ok(_) => Ok(true),
                Err(RpcError::Rpc {
                    code: codes::RPC_INVALID_ADDRESS_OR_KEY,
                    ..
                }) => Ok(false),
                Err(e) => Err(to_chain(e)),
            }
        })
    }

    fn unspent_output(&self, outpoint: OutPoint) -> ChainFuture<'_, Option<UnspentOutput>> {
        Box::pin(async move {
            let r: Option<TxOutResult> = self
                .call("gettxout", json!([outpoint.txid, outpoint.vout, true]))
                .await
                .map_err(to_chain)?;
            let Some(r) = r else { return Ok(None) };
            let value = btc_to_amount(r.value, "gettxout").map_err(to_chain)?;
            let script = hex::decode(&r.script_pubkey.hex)
                .map_err(|e| ChainError::Unavailable(e.to_string()))?;
            Ok(Some(UnspentOutput {
                value,
                script_pubkey: ScriptBuf::from_bytes(script),
                confirmations: r.confirmations,
                coinbase: r.coinbase,
            }))
        })
    }

    fn estimate_fee(&self, target_blocks: u16) -> ChainFuture<'_, Option<FeeRate>> {
        Box::pin(async move {
            let r: SmartFee = self
                .call("estimatesmartfee", json!([target_blocks.max(1)]))
                .await
                .map_err(to_chain)?;
            let Some(btc_per_kvb) = r.feerate else {
                return Ok(None);
            };
            let per_kvb = btc_to_amount(btc_per_kvb, "estimatesmartfee").map_err(to_chain)?;
            // sat/kvB → sat/kwu: divide by 4.
            Ok(Some(FeeRate::from_sat_per_kwu(per_kvb.to_sat() / 4)))
        })
    }

    fn tips(&self) -> TipStream {
        TipStream::poll(Arc::new(self.clone()), self.inner.config.tip_poll)
    }
}
