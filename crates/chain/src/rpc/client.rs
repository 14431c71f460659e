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
use secrecy::ExposeSecret as _;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use super::codes;
use crate::api::{Chain, ChainError, ChainFuture, Tip, TxStatus, UnspentOutput};
use crate::fees::FeePolicy;
use crate::tips::TipStream;

/// How the client authenticates (`Debug` never shows the password).
#[derive(Debug, Clone)]
pub enum Auth {
    /// Read `user:password` from Core's cookie file (re-read after a 401,
    /// since the cookie changes whenever the node restarts).
    Cookie(PathBuf),
    /// Fixed `rpcuser`/`rpcpassword`.
    UserPass(String, secrecy::SecretString),
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
    /// Extra attempts after a transient failure, with doubling back-off from
    /// 100 ms. A connection that could not be made is retried for every
    /// method (the request never left); a time-out, a reset or HTTP 503 only
    /// for methods that are safe to repeat (see [`BitcoindRpc::is_repeatable`]).
    pub retries: u32,
    /// How long to wait out Core's -28 "warming up" (loading the block index,
    /// verifying blocks …) before giving up with [`RpcError::Rpc`] -28.
    /// Each wait is logged at warn.
    pub warmup_wait: Duration,
    /// Also retry calls that may move money (`sendtoaddress`,
    /// `generatetoaddress` …) after an ambiguous failure. Off by default: a
    /// time-out does not say whether the node acted.
    pub retry_money_moving_calls: bool,
    /// How often [`Chain::tips`] polls the best block.
    pub tip_poll: Duration,
    /// The bounds [`Chain::estimate_fee`] holds Core's estimates to.
    pub fee_policy: FeePolicy,
}

impl RpcConfig {
    /// Defaults: 30 s time-out, 3 retries, warm-up waited out for up to
    /// 10 minutes, no retry of money-moving calls, 1 s tip polling, the
    /// default [`FeePolicy`].
    pub fn new(url: impl Into<String>, auth: Auth) -> Self {
        Self {
            url: url.into(),
            auth,
            timeout: Duration::from_secs(30),
            retries: 3,
            warmup_wait: Duration::from_secs(600),
            retry_money_moving_calls: false,
            tip_poll: Duration::from_secs(1),
            fee_policy: FeePolicy::default(),
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
    /// Reset, broken connection and other transport failures after the
    /// request may have been sent.
    #[error("rpc transport: {0}")]
    Transport(String),
    /// The connection could not be made: the request was never sent.
    #[error("rpc connect: {0}")]
    Connect(String),
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
    /// The node does not fit the service: another chain than `--network`,
    /// pruned below what is needed, or an index missing.
    #[error("bitcoin node unsuitable: {0}")]
    Unsuitable(String),
}

impl RpcError {
    /// Whether the same request may succeed later, and whether it surely
    /// never reached the node (then even a money-moving call may be repeated).
    fn retry_kind(&self) -> Option<bool> {
        match self {
            RpcError::Connect(_) => Some(true),
            RpcError::Transport(_) | RpcError::Timeout(_) => Some(false),
            // Core's work queue is full: the request was refused, not run.
            RpcError::Http { status, .. } if *status == 503 => Some(true),
            _ => None,
        }
    }

    /// Core's -28: still loading the block index or verifying blocks.
    pub fn is_warming_up(&self) -> bool {
        matches!(self, RpcError::Rpc { code, .. } if *code == codes::RPC_IN_WARMUP)
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
    /// Height of the best header chain the node knows (Core always sends
    /// it; absent, the node is taken to know no more than its tip).
    #[serde(default)]
    pub headers: Option<u32>,
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
    #[serde(default)]
    in_active_chain: Option<bool>,
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

#[derive(Deserialize)]
struct MempoolInfo {
    #[serde(rename = "mempoolminfee")]
    mempool_min_fee: Option<f64>,
}

/// Core's `estimatesmartfee` accepts targets 1…1008 (`-8` otherwise) and
/// answers 1 as 2; clamp instead of failing.
pub fn clamp_conf_target(target_blocks: u16) -> u16 {
    target_blocks.clamp(1, 1008)
}

/// sat/kvB → sat/kwu (1 vB = 4 wu), rounded up so a transaction built at the
/// result never pays less than the estimate (rounding down turned 1,001
/// sat/kvB into 250 sat/kwu = 1,000 sat/kvB, below the relay floor).
pub fn fee_rate_from_sat_per_kvb(sat_per_kvb: u64) -> FeeRate {
    FeeRate::from_sat_per_kwu(sat_per_kvb.div_ceil(4))
}

/// What [`BitcoindRpc::check_node`] found out about the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCheck {
    /// Core's chain name (`main`, `test`, `testnet4`, `signet`, `regtest`).
    pub chain: String,
    /// Height of the tip.
    pub blocks: u32,
    /// Lowest height whose blocks are stored, when the node is pruned.
    pub prune_height: Option<u32>,
    /// Whether `-txindex` is on and synced.
    pub txindex: bool,
}

/// Core's `chain` name of `network` in `getblockchaininfo`.
pub fn core_chain_name(network: bitcoin::Network) -> &'static str {
    match network {
        bitcoin::Network::Bitcoin => "main",
        bitcoin::Network::Testnet => "test",
        bitcoin::Network::Signet => "signet",
        bitcoin::Network::Regtest => "regtest",
        // `Network` is non-exhaustive (testnet4 …): Core names them as
        // rust-bitcoin's `CoreRpcChain` would; unknown ones never match.
        _ => "unknown",
    }
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
            Auth::UserPass(u, p) => format!("{u}:{}", p.expose_secret()),
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

    /// Whether `method` may be sent twice without doing twice what it does:
    /// reads, and `sendrawtransaction` (the same transaction is accepted
    /// once; Core answers the second time with success or -27). Calls that
    /// create transactions or blocks, or stop the node, are not.
    pub fn is_repeatable(method: &str) -> bool {
        !matches!(
            method,
            "sendtoaddress"
                | "sendmany"
                | "send"
                | "sendall"
                | "bumpfee"
                | "psbtbumpfee"
                | "generatetoaddress"
                | "generatetodescriptor"
                | "generateblock"
                | "submitblock"
                | "stop"
        )
    }

    async fn call_value(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let config = &self.inner.config;
        let mut attempt = 0;
        let mut refreshed = false;
        let mut warming_since: Option<tokio::time::Instant> = None;
        loop {
            match self.call_once(method, &params, false).await {
                Err(RpcError::Auth(_)) if !refreshed && matches!(config.auth, Auth::Cookie(_)) => {
                    // The node may have restarted with a new cookie.
                    refreshed = true;
                    self.auth_header(true)?;
                }
                Err(e) if e.is_warming_up() => {
                    // Core refuses every call while loading: nothing ran, so
                    // waiting is safe for any method.
                    let since = *warming_since.get_or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() >= config.warmup_wait {
                        return Err(e);
                    }
                    tracing::warn!(method, error = %e, waited = ?since.elapsed(), "bitcoin node is warming up; waiting");
                    tokio::time::sleep(Duration::from_secs(1).min(config.warmup_wait)).await;
                }
                Err(e) => match e.retry_kind() {
                    Some(not_sent)
                        if attempt < config.retries
                            && (not_sent
                                || config.retry_money_moving_calls
                                || Self::is_repeatable(method)) =>
                    {
                        let backoff = Duration::from_millis(100 << attempt.min(6));
                        tracing::debug!(method, error = %e, ?backoff, "rpc retry");
                        tokio::time::sleep(backoff).await;
                        attempt += 1;
                    }
                    _ => return Err(e),
                },
                ok => return ok,
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
            let response = self.inner.client.request(request).await.map_err(|e| {
                if e.is_connect() {
                    RpcError::Connect(format!("{e:?}"))
                } else {
                    RpcError::Transport(format!("{e:?}"))
                }
            })?;
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

    /// Checks at start that the node fits: its chain is `network`, and a
    /// pruned node still has blocks from `needed_from` (the first height the
    /// service must scan; `None` = only new blocks). Waits out warm-up.
    ///
    /// # Errors
    /// [`RpcError::Unsuitable`] with a message for the operator, or the
    /// failure of the calls.
    pub async fn check_node(
        &self,
        network: bitcoin::Network,
        needed_from: Option<u32>,
    ) -> Result<NodeCheck, RpcError> {
        #[derive(Deserialize)]
        struct Info {
            chain: String,
            blocks: u32,
            #[serde(default)]
            pruned: bool,
            #[serde(default)]
            pruneheight: Option<u32>,
        }
        let info: Info = self.call("getblockchaininfo", json!([])).await?;
        let expected = core_chain_name(network);
        if info.chain != expected {
            return Err(RpcError::Unsuitable(format!(
                "the node at {} is on chain \"{}\" but --network is {network} (Core calls it \"{expected}\")",
                self.inner.config.url, info.chain
            )));
        }
        let prune_height = info.pruned.then_some(info.pruneheight.unwrap_or(0));
        if let (Some(pruned_below), Some(needed)) = (prune_height, needed_from) {
            if needed < pruned_below {
                return Err(RpcError::Unsuitable(format!(
                    "the node is pruned below height {pruned_below}, but blocks from height {needed} are needed; \
                     restart it without -prune (or with a larger -prune) and let it re-download"
                )));
            }
        }
        // `getindexinfo` (Core 0.21+): an empty object when no index runs.
        let txindex = match self.call::<Value>("getindexinfo", json!(["txindex"])).await {
            Ok(v) => v
                .get("txindex")
                .and_then(|t| t.get("synced"))
                .and_then(Value::as_bool)
                .unwrap_or(false),
            Err(RpcError::Rpc { code, .. }) if code == codes::RPC_METHOD_NOT_FOUND => false,
            Err(e) => return Err(e),
        };
        Ok(NodeCheck {
            chain: info.chain,
            blocks: info.blocks,
            prune_height,
            txindex,
        })
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
            ChainError::rejected(code, message)
        }
        RpcError::Rpc { code, message } if code == codes::RPC_IN_WARMUP => {
            ChainError::Unavailable(format!("bitcoin node warming up: {message}"))
        }
        RpcError::Rpc { code, message } if code == codes::RPC_INVALID_ADDRESS_OR_KEY => {
            ChainError::NotFound(message)
        }
        RpcError::Rpc { code, message } => ChainError::Node { code, message },
        other => ChainError::Unavailable(other.to_string()),
    }
}

impl BitcoindRpc {
    /// `gettxout`: with `include_mempool`, mempool spends count as spent.
    async fn txout(
        &self,
        outpoint: OutPoint,
        include_mempool: bool,
    ) -> Result<Option<UnspentOutput>, ChainError> {
        let r: Option<TxOutResult> = self
            .call(
                "gettxout",
                json!([outpoint.txid, outpoint.vout, include_mempool]),
            )
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

    fn height(&self) -> ChainFuture<'_, u32> {
        Box::pin(async move { self.get_block_count().await.map_err(to_chain) })
    }

    fn sync_state(&self) -> ChainFuture<'_, crate::api::SyncState> {
        Box::pin(async move {
            let info = self.get_blockchain_info().await.map_err(to_chain)?;
            Ok(crate::api::SyncState {
                tip: Tip {
                    height: info.blocks,
                    hash: info.best_block_hash,
                },
                headers: info.headers.unwrap_or(info.blocks),
                initial_block_download: info.initial_block_download,
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
        Box::pin(self.txout(outpoint, true))
    }

    fn confirmed_output(&self, outpoint: OutPoint) -> ChainFuture<'_, Option<UnspentOutput>> {
        Box::pin(self.txout(outpoint, false))
    }

    fn estimate_fee(&self, target_blocks: u16) -> ChainFuture<'_, FeeRate> {
        Box::pin(async move {
            let target = clamp_conf_target(target_blocks);
            let r: SmartFee = self
                .call("estimatesmartfee", json!([target]))
                .await
                .map_err(to_chain)?;
            // Without an estimate (a fresh node: `errors: ["Insufficient
            // data or no feerate found"]`) the policy's fallback applies; the
            // mempool's minimum is only a lower bound: on Core 30 it is 0.1
            // sat/vB, which many nodes and miners still refuse.
            let estimate = r
                .feerate
                .map(|btc| btc_to_amount(btc, "estimatesmartfee"))
                .transpose()
                .map_err(to_chain)?
                .map(|a| fee_rate_from_sat_per_kvb(a.to_sat()));
            let info: MempoolInfo = self
                .call("getmempoolinfo", json!([]))
                .await
                .map_err(to_chain)?;
            let mempool_min = info
                .mempool_min_fee
                .map(|btc| btc_to_amount(btc, "getmempoolinfo"))
                .transpose()
                .map_err(to_chain)?
                .map(|a| fee_rate_from_sat_per_kvb(a.to_sat()));
            Ok(self.inner.config.fee_policy.apply(estimate, mempool_min))
        })
    }

    fn fee_policy(&self) -> FeePolicy {
        self.inner.config.fee_policy
    }

    fn transaction_in_block(
        &self,
        txid: Txid,
        hint: BlockHash,
    ) -> ChainFuture<'_, Option<TxStatus>> {
        Box::pin(async move {
            match self
                .call::<RawTxVerbose>("getrawtransaction", json!([txid, true, hint]))
                .await
            {
                Ok(r) => {
                    let tx = deserialize_hex(&r.hex)
                        .map_err(|e| ChainError::Unavailable(e.to_string()))?;
                    // Core reports `in_active_chain`; a hint on a stale
                    // branch means "not confirmed" for the caller.
                    if r.in_active_chain == Some(false) {
                        return Ok(None);
                    }
                    Ok(Some(TxStatus {
                        tx,
                        confirmations: r.confirmations.unwrap_or(0),
                        block_hash: r.blockhash.or(Some(hint)),
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

    fn tips(&self) -> TipStream {
        TipStream::poll(Arc::new(self.clone()), self.inner.config.tip_poll)
    }

    fn median_time_past(&self) -> ChainFuture<'_, u32> {
        Box::pin(async move {
            let info = self.get_blockchain_info().await.map_err(to_chain)?;
            // A time that does not fit nLockTime's u32 (after 2106) has passed every lock.
            Ok(u32::try_from(info.median_time).unwrap_or(u32::MAX))
        })
    }
}
