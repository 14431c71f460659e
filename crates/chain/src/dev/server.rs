//! The development chain's JSON-RPC server: Bitcoin Core's method names,
//! parameter orders, result shapes, error codes and HTTP behaviour
//! (Basic auth, HTTP 500 for errors of JSON-RPC 1.0 requests, 404 for unknown methods).

use std::str::FromStr;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use base64::Engine as _;
use bitcoin::consensus::encode::{deserialize_hex, serialize_hex};
use bitcoin::{Amount, BlockHash, Denomination, FeeRate, Network, OutPoint, Transaction, Txid};
use serde_json::{json, Map, Value};
use tokio::sync::watch;

use super::{json as shapes, DevChain, DevChainError};
use crate::rpc::codes::*;

/// An RPC error: Core's code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcFailure {
    /// Core's error code.
    pub code: i32,
    /// Message.
    pub message: String,
}

fn fail(code: i32, message: impl Into<String>) -> RpcFailure {
    RpcFailure {
        code,
        message: message.into(),
    }
}

#[derive(Clone)]
struct ServerState {
    chain: DevChain,
    /// `Basic base64(user:password)`.
    expected_auth: String,
    shutdown: watch::Sender<bool>,
}

/// The axum router serving JSON-RPC on `POST /` (and `/wallet/<name>`, as Core).
pub fn router(
    chain: DevChain,
    user: &str,
    password: &str,
    shutdown: watch::Sender<bool>,
) -> Router {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let state = ServerState {
        chain,
        expected_auth: format!("Basic {token}"),
        shutdown,
    };
    Router::new()
        .route("/", post(handle))
        .route("/wallet/{name}", post(handle))
        .with_state(state)
}

fn authorized(headers: &HeaderMap, expected: &str) -> bool {
    let Some(got) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    // Constant-time comparison: the cookie is a secret.
    let (a, b) = (got.as_bytes(), expected.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Largest request body read (Core's `MAX_SIZE`, 32 MiB: room for a block in hex).
pub const MAX_BODY_BYTES: usize = 32 << 20;
/// Most requests in one batch.
pub const MAX_BATCH: usize = 1_000;

async fn handle(
    State(st): State<ServerState>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    // Credentials first: an unauthenticated client never gets us to buffer
    // its body, whatever Content-Length it announces.
    if !authorized(&headers, &st.expected_auth) {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Basic realm=\"jsonrpc\"")],
        )
            .into_response();
    }
    let body: Bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => return StatusCode::PAYLOAD_TOO_LARGE.into_response(),
    };
    let st2 = st.clone();
    // Handlers take the chain lock and may mine; keep them off the async workers.
    let result = tokio::task::spawn_blocking(move || process(&st2, &body)).await;
    match result {
        Ok((status, body)) => json_response(status, &body),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Parses a request body (single or batch) and runs it.
fn process(st: &ServerState, body: &[u8]) -> (StatusCode, Value) {
    let request: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(_) => {
            let e = fail(RPC_PARSE_ERROR, "Parse error");
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                error_body(&e, Value::Null, false),
            );
        }
    };
    match request {
        Value::Array(batch) if batch.len() > MAX_BATCH => {
            let e = fail(
                RPC_INVALID_REQUEST,
                format!(
                    "batch of {} requests exceeds the limit of {MAX_BATCH}",
                    batch.len()
                ),
            );
            (StatusCode::BAD_REQUEST, error_body(&e, Value::Null, false))
        }
        Value::Array(batch) => {
            let replies: Vec<Value> = batch.into_iter().map(|r| handle_one(st, r).1).collect();
            (StatusCode::OK, Value::Array(replies))
        }
        single => handle_one(st, single),
    }
}

/// Runs one authenticated request body as the server would and returns the
/// HTTP status and the reply (for fuzzing and tests; `stop` has no effect).
pub fn handle_body(chain: &DevChain, body: &[u8]) -> (u16, Value) {
    let (shutdown, _) = watch::channel(false);
    let st = ServerState {
        chain: chain.clone(),
        expected_auth: String::new(),
        shutdown,
    };
    let (status, reply) = process(&st, body);
    (status.as_u16(), reply)
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut text = body.to_string();
    text.push('\n');
    (status, [(header::CONTENT_TYPE, "application/json")], text).into_response()
}

fn handle_one(st: &ServerState, request: Value) -> (StatusCode, Value) {
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let v2 = request.get("jsonrpc").and_then(Value::as_str) == Some("2.0");
    let Some(method) = request.get("method").and_then(Value::as_str) else {
        let e = fail(RPC_INVALID_REQUEST, "Method must be a string");
        return (StatusCode::BAD_REQUEST, error_body(&e, id, v2));
    };
    let params = match request.get("params") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(Value::Object(o)) => named_to_positional(method, o),
        Some(_) => {
            let e = fail(RPC_INVALID_REQUEST, "Params must be an array or object");
            return (StatusCode::BAD_REQUEST, error_body(&e, id, v2));
        }
    };
    match dispatch(st, method, &params) {
        Ok(result) => {
            let body = if v2 {
                json!({"jsonrpc": "2.0", "result": result, "id": id})
            } else {
                json!({"result": result, "error": null, "id": id})
            };
            (StatusCode::OK, body)
        }
        Err(e) => {
            let status = if v2 {
                StatusCode::OK
            } else if e.code == RPC_METHOD_NOT_FOUND {
                StatusCode::NOT_FOUND
            } else {
                StatusCode::INTERNAL_SERVER_ERROR
            };
            (status, error_body(&e, id, v2))
        }
    }
}

fn error_body(e: &RpcFailure, id: Value, v2: bool) -> Value {
    let err = json!({"code": e.code, "message": e.message});
    if v2 {
        json!({"jsonrpc": "2.0", "error": err, "id": id})
    } else {
        json!({"result": null, "error": err, "id": id})
    }
}

/// Parameter names of each method, in Core's order, for named-parameter calls.
fn param_names(method: &str) -> &'static [&'static str] {
    match method {
        "getblockhash" => &["height"],
        "getblock" => &["blockhash", "verbosity"],
        "getblockheader" => &["blockhash", "verbose"],
        "getrawtransaction" => &["txid", "verbose", "blockhash"],
        "getindexinfo" => &["index_name"],
        "sendrawtransaction" => &["hexstring", "maxfeerate"],
        "testmempoolaccept" => &["rawtxs", "maxfeerate"],
        "getrawmempool" => &["verbose"],
        "getmempoolentry" => &["txid"],
        "gettxout" => &["txid", "n", "include_mempool"],
        "estimatesmartfee" => &["conf_target", "estimate_mode"],
        "generatetoaddress" => &["nblocks", "address", "maxtries"],
        "invalidateblock" | "reconsiderblock" => &["blockhash"],
        "sendtoaddress" => &["address", "amount"],
        "generateblock" => &["output", "transactions", "submit"],
        "prioritisetransaction" => &["txid", "dummy", "fee_delta"],
        "setminingfeerate" => &["sat_per_vb"],
        _ => &[],
    }
}

fn named_to_positional(method: &str, o: &Map<String, Value>) -> Vec<Value> {
    let names = param_names(method);
    let last = names
        .iter()
        .rposition(|n| o.contains_key(*n))
        .map_or(0, |i| i + 1);
    names[..last]
        .iter()
        .map(|n| o.get(*n).cloned().unwrap_or(Value::Null))
        .collect()
}

fn arg(params: &[Value], i: usize) -> Option<&Value> {
    params.get(i).filter(|v| !v.is_null())
}

fn req_str<'a>(params: &'a [Value], i: usize, name: &str) -> Result<&'a str, RpcFailure> {
    match arg(params, i) {
        Some(Value::String(s)) => Ok(s),
        Some(v) => Err(fail(
            RPC_TYPE_ERROR,
            format!(
                "JSON value of type {} for field {name} is not of expected type string",
                type_name(v)
            ),
        )),
        None => Err(fail(
            RPC_MISC_ERROR,
            format!("missing required parameter {name}"),
        )),
    }
}

fn req_i64(params: &[Value], i: usize, name: &str) -> Result<i64, RpcFailure> {
    match arg(params, i) {
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| fail(RPC_TYPE_ERROR, format!("{name} is not an integer"))),
        Some(v) => Err(fail(
            RPC_TYPE_ERROR,
            format!(
                "JSON value of type {} for field {name} is not of expected type number",
                type_name(v)
            ),
        )),
        None => Err(fail(
            RPC_MISC_ERROR,
            format!("missing required parameter {name}"),
        )),
    }
}

/// Core accepts `true`/`false` and integers for verbosity flags.
fn opt_level(params: &[Value], i: usize, default: i64) -> Result<i64, RpcFailure> {
    match arg(params, i) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(i64::from(*b)),
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| fail(RPC_TYPE_ERROR, "verbosity must be an integer")),
        Some(v) => Err(fail(
            RPC_TYPE_ERROR,
            format!(
                "JSON value of type {} is not of expected type number",
                type_name(v)
            ),
        )),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn parse_hash<T: FromStr>(s: &str, name: &str) -> Result<T, RpcFailure> {
    if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(fail(
            RPC_INVALID_PARAMETER,
            format!("{name} must be of length 64 (not {}, for '{s}')", s.len()),
        ));
    }
    s.parse().map_err(|_| {
        fail(
            RPC_INVALID_PARAMETER,
            format!("{name} must be hexadecimal string (not '{s}')"),
        )
    })
}

fn btc_amount(v: &Value) -> Result<Amount, RpcFailure> {
    let text = match v {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        _ => return Err(fail(RPC_TYPE_ERROR, "Amount is not a number or string")),
    };
    Amount::from_str_in(&text, Denomination::Bitcoin)
        .map_err(|_| fail(RPC_TYPE_ERROR, "Invalid amount"))
}

/// `maxfeerate` in BTC/kvB; 0 disables the check; default 0.10.
fn max_fee_rate(params: &[Value], i: usize) -> Result<Option<FeeRate>, RpcFailure> {
    let amount = match arg(params, i) {
        None => return Ok(Some(super::DEFAULT_MAX_FEE_RATE)),
        Some(v) => btc_amount(v)?,
    };
    if amount == Amount::ZERO {
        return Ok(None);
    }
    Ok(Some(FeeRate::from_sat_per_kwu(amount.to_sat() / 4)))
}

fn decode_tx(hex: &str) -> Result<Transaction, RpcFailure> {
    deserialize_hex::<Transaction>(hex).map_err(|_| {
        fail(
            RPC_DESERIALIZATION_ERROR,
            "TX decode failed. Make sure the tx has at least one input.",
        )
    })
}

fn address_script(s: &str) -> Result<bitcoin::ScriptBuf, RpcFailure> {
    wallet::validate_address(s, Network::Regtest)
        .map(|a| a.script_pubkey())
        .map_err(|_| fail(RPC_INVALID_ADDRESS_OR_KEY, "Error: Invalid address"))
}

fn block_not_found() -> RpcFailure {
    fail(RPC_INVALID_ADDRESS_OR_KEY, "Block not found")
}

/// Runs one method.
///
/// # Errors
/// Core's code and message.
fn dispatch(st: &ServerState, method: &str, p: &[Value]) -> Result<Value, RpcFailure> {
    let chain = &st.chain;
    if chain.warming_up() {
        return Err(fail(RPC_IN_WARMUP, "Loading block index…"));
    }
    match method {
        "getindexinfo" => {
            if !chain.txindex() {
                return Ok(json!({}));
            }
            let name = arg(p, 0).and_then(Value::as_str);
            if name.is_some_and(|n| n != "txindex") {
                return Ok(json!({}));
            }
            let h = chain.height();
            Ok(json!({"txindex": {"synced": true, "best_block_height": h}}))
        }
        "getmempoolinfo" => Ok(chain.with_state(|s| {
            let entries = s.mempool_entries();
            let total_fee: Amount = entries.iter().map(|e| e.fee).sum();
            let kvb = |r: FeeRate| shapes::btc(Amount::from_sat(r.to_sat_per_kwu() * 4));
            json!({
                "loaded": true,
                "size": entries.len(),
                "bytes": s.mempool_vbytes(),
                "usage": s.mempool_vbytes(),
                "total_fee": shapes::btc(total_fee),
                "maxmempool": super::state::DEFAULT_MAX_MEMPOOL_VBYTES,
                "mempoolminfee": kvb(s.mempool_min_fee()),
                "minrelaytxfee": kvb(s.min_relay_fee()),
                "incrementalrelayfee": kvb(s.incremental_relay_fee()),
                "unbroadcastcount": 0,
                "fullrbf": s.full_rbf(),
            })
        })),
        "getblockchaininfo" => {
            let size_on_disk = chain.size_on_disk();
            Ok(chain.with_state(|s| {
                let tip = s
                    .entry(&s.tip_hash())
                    .map(|e| e.block.header.time)
                    .unwrap_or(0);
                json!({
                    "chain": "regtest",
                    "blocks": s.height(),
                    "headers": s.height(),
                    "bestblockhash": s.tip_hash().to_string(),
                    "difficulty": shapes::REGTEST_DIFFICULTY,
                    "time": tip,
                    "mediantime": s.median_time_past(s.height()),
                    "verificationprogress": 1,
                    "initialblockdownload": false,
                    "chainwork": shapes::chainwork(s.height()),
                    "size_on_disk": size_on_disk,
                    "pruned": false,
                    "warnings": [],
                })
            }))
        }
        "getblockcount" => Ok(json!(chain.height())),
        "getbestblockhash" => Ok(json!(chain.with_state(|s| s.tip_hash().to_string()))),
        "getblockhash" => {
            let h = req_i64(p, 0, "height")?;
            let hash = u32::try_from(h)
                .ok()
                .and_then(|h| chain.with_state(|s| s.hash_at(h)));
            hash.map(|h| json!(h.to_string()))
                .ok_or_else(|| fail(RPC_INVALID_PARAMETER, "Block height out of range"))
        }
        "getblockheader" => {
            let hash: BlockHash = parse_hash(req_str(p, 0, "blockhash")?, "hash")?;
            let verbose = opt_level(p, 1, 1)? != 0;
            chain.with_state(|s| {
                let e = s.entry(&hash).ok_or_else(block_not_found)?;
                Ok(if verbose {
                    Value::Object(shapes::header(s, e))
                } else {
                    json!(serialize_hex(&e.block.header))
                })
            })
        }
        "getblock" => {
            let hash: BlockHash = parse_hash(req_str(p, 0, "blockhash")?, "blockhash")?;
            let verbosity = opt_level(p, 1, 1)?;
            chain.with_state(|s| {
                let e = s.entry(&hash).ok_or_else(block_not_found)?;
                Ok(match verbosity {
                    0 => json!(serialize_hex(&*e.block)),
                    1 => shapes::block(s, e, 1),
                    _ => shapes::block(s, e, 2),
                })
            })
        }
        "getrawtransaction" => {
            let txid: Txid = parse_hash(req_str(p, 0, "txid")?, "parameter 1")?;
            let verbose = opt_level(p, 1, 0)? != 0;
            let hint: Option<BlockHash> = match arg(p, 2) {
                Some(v) => Some(parse_hash(v.as_str().unwrap_or_default(), "parameter 3")?),
                None => None,
            };
            let txindex = chain.txindex();
            chain.with_state(|s| {
                if let Some(hash) = hint {
                    // Core: look in that block only, and say whether it is active.
                    let entry = s.entry(&hash).ok_or_else(|| {
                        fail(RPC_INVALID_ADDRESS_OR_KEY, "Block hash not found")
                    })?;
                    let tx = entry
                        .block
                        .txdata
                        .iter()
                        .find(|t| t.compute_txid() == txid)
                        .ok_or_else(|| {
                            fail(
                                RPC_INVALID_ADDRESS_OR_KEY,
                                "No such transaction found in the provided block. Use gettransaction for wallet transactions.",
                            )
                        })?;
                    if !verbose {
                        return Ok(json!(serialize_hex(tx)));
                    }
                    let active = s.is_active(&hash);
                    let mut m = Map::new();
                    m.insert("in_active_chain".into(), json!(active));
                    m.extend(shapes::transaction(tx));
                    m.insert("hex".into(), json!(serialize_hex(tx)));
                    m.insert("blockhash".into(), json!(hash.to_string()));
                    let confirmations = if active { s.height() - entry.height + 1 } else { 0 };
                    m.insert("confirmations".into(), json!(confirmations));
                    m.insert("time".into(), json!(entry.block.header.time));
                    m.insert("blocktime".into(), json!(entry.block.header.time));
                    return Ok(Value::Object(m));
                }
                let not_found = || {
                    if txindex {
                        fail(RPC_INVALID_ADDRESS_OR_KEY, "No such mempool or blockchain transaction. Use gettransaction for wallet transactions.")
                    } else {
                        fail(RPC_INVALID_ADDRESS_OR_KEY, "No such mempool transaction. Use -txindex or provide a block hash to enable blockchain transaction queries. Use gettransaction for wallet transactions.")
                    }
                };
                if let Some(e) = s.mempool_entry(&txid) {
                    return Ok(if verbose {
                        let mut m = shapes::transaction(&e.tx);
                        m.insert("hex".into(), json!(serialize_hex(&e.tx)));
                        Value::Object(m)
                    } else {
                        json!(serialize_hex(&e.tx))
                    });
                }
                if !txindex {
                    return Err(not_found());
                }
                let (hash, pos) = s.tx_location(&txid).ok_or_else(not_found)?;
                let entry = s.entry(&hash).ok_or_else(not_found)?;
                let tx = entry.block.txdata.get(pos).ok_or_else(not_found)?;
                if !verbose {
                    return Ok(json!(serialize_hex(tx)));
                }
                let mut m = shapes::transaction(tx);
                m.insert("hex".into(), json!(serialize_hex(tx)));
                m.insert("blockhash".into(), json!(hash.to_string()));
                m.insert("confirmations".into(), json!(s.height() - entry.height + 1));
                m.insert("time".into(), json!(entry.block.header.time));
                m.insert("blocktime".into(), json!(entry.block.header.time));
                Ok(Value::Object(m))
            })
        }
        "sendrawtransaction" => {
            let tx = decode_tx(req_str(p, 0, "hexstring")?)?;
            let max = max_fee_rate(p, 1)?;
            match chain.send_raw(&tx, max) {
                Ok(txid) => Ok(json!(txid.to_string())),
                Err(DevChainError::Tx(r)) => {
                    let message = if r.reason == "max-fee-exceeded" {
                        "Fee exceeds maximum configured by user (e.g. -maxtxfee, maxfeerate)"
                            .to_owned()
                    } else {
                        r.reason
                    };
                    Err(fail(r.kind.code(), message))
                }
                Err(e) => Err(fail(RPC_DATABASE_ERROR, e.to_string())),
            }
        }
        "testmempoolaccept" => {
            let Some(Value::Array(raw)) = arg(p, 0) else {
                return Err(fail(RPC_TYPE_ERROR, "rawtxs must be an array"));
            };
            let max = max_fee_rate(p, 1)?;
            let mut out = Vec::with_capacity(raw.len());
            for v in raw {
                let tx = decode_tx(v.as_str().unwrap_or_default())?;
                let mut m = Map::new();
                m.insert("txid".into(), json!(tx.compute_txid().to_string()));
                m.insert("wtxid".into(), json!(tx.compute_wtxid().to_string()));
                match chain.test_accept(&tx, max) {
                    Ok(a) => {
                        m.insert("allowed".into(), json!(true));
                        m.insert("vsize".into(), json!(a.vsize));
                        m.insert("fees".into(), json!({"base": shapes::btc(a.fee)}));
                    }
                    Err(r) => {
                        // Core: the reason alone, and with its debug part.
                        m.insert("allowed".into(), json!(false));
                        m.insert("reject-reason".into(), json!(r.reject_reason()));
                        m.insert("reject-details".into(), json!(r.reason));
                    }
                }
                out.push(Value::Object(m));
            }
            Ok(json!(out))
        }
        "getrawmempool" => {
            let verbose = opt_level(p, 0, 0)? != 0;
            Ok(chain.with_state(|s| {
                let entries = s.mempool_entries();
                if verbose {
                    let m: Map<String, Value> = entries
                        .iter()
                        .map(|e| (e.tx.compute_txid().to_string(), mempool_entry_json(s, e)))
                        .collect();
                    Value::Object(m)
                } else {
                    json!(entries
                        .iter()
                        .map(|e| e.tx.compute_txid().to_string())
                        .collect::<Vec<_>>())
                }
            }))
        }
        "getmempoolentry" => {
            let txid: Txid = parse_hash(req_str(p, 0, "txid")?, "txid")?;
            chain.with_state(|s| {
                s.mempool_entry(&txid)
                    .map(|e| mempool_entry_json(s, e))
                    .ok_or_else(|| fail(RPC_INVALID_ADDRESS_OR_KEY, "Transaction not in mempool"))
            })
        }
        "gettxout" => {
            let txid: Txid = parse_hash(req_str(p, 0, "txid")?, "txid")?;
            let n = u32::try_from(req_i64(p, 1, "n")?)
                .map_err(|_| fail(RPC_INVALID_PARAMETER, "Invalid n"))?;
            let include_mempool = !matches!(arg(p, 2), Some(Value::Bool(false)));
            let op = OutPoint { txid, vout: n };
            Ok(chain.with_state(|s| {
                let coin = if include_mempool {
                    s.mempool_coin(&op)
                } else {
                    s.utxo(&op).cloned()
                };
                let Some(coin) = coin else { return Value::Null };
                let confirmations = if s.utxo(&op).is_some() {
                    s.height() - coin.height + 1
                } else {
                    0
                };
                json!({
                    "bestblock": s.tip_hash().to_string(),
                    "confirmations": confirmations,
                    "value": shapes::btc(coin.txout.value),
                    "scriptPubKey": shapes::script_pubkey(&coin.txout.script_pubkey),
                    "coinbase": coin.coinbase,
                })
            }))
        }
        "estimatesmartfee" => {
            let target = req_i64(p, 0, "conf_target")?;
            if !(1..=1008).contains(&target) {
                return Err(fail(
                    RPC_INVALID_PARAMETER,
                    "Invalid conf_target, must be between 1 and 1008",
                ));
            }
            let Some(rate) = chain.raw_fee_estimate() else {
                // A fresh Core without enough blocks seen.
                return Ok(
                    json!({"errors": ["Insufficient data or no feerate found"], "blocks": 0}),
                );
            };
            // Core answers a target of 1 for 2, so do we.
            let btc_per_kvb = Amount::from_sat(rate.to_sat_per_kwu() * 4);
            Ok(json!({"feerate": shapes::btc(btc_per_kvb), "blocks": target.max(2)}))
        }
        "generatetoaddress" => {
            let n = req_i64(p, 0, "nblocks")?;
            let script = address_script(req_str(p, 1, "address")?)?;
            let n = u32::try_from(n)
                .map_err(|_| fail(RPC_INVALID_PARAMETER, "nblocks must be non-negative"))?;
            if n > super::MAX_GENERATE {
                return Err(fail(
                    RPC_INVALID_PARAMETER,
                    format!("nblocks must be at most {}", super::MAX_GENERATE),
                ));
            }
            let hashes = chain
                .mine(n, &script)
                .map_err(|e| fail(RPC_MISC_ERROR, e.to_string()))?;
            Ok(json!(hashes
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()))
        }
        "invalidateblock" | "reconsiderblock" => {
            let hash: BlockHash = parse_hash(req_str(p, 0, "blockhash")?, "blockhash")?;
            let r = if method == "invalidateblock" {
                chain.invalidate(hash)
            } else {
                chain.reconsider(hash)
            };
            match r {
                Ok(()) => Ok(Value::Null),
                Err(DevChainError::NotFound(_)) => Err(block_not_found()),
                Err(e) => Err(fail(RPC_DATABASE_ERROR, e.to_string())),
            }
        }
        "sendtoaddress" => {
            let script = address_script(req_str(p, 0, "address")?)?;
            let amount = btc_amount(
                arg(p, 1)
                    .ok_or_else(|| fail(RPC_MISC_ERROR, "missing required parameter amount"))?,
            )?;
            if amount == Amount::ZERO {
                return Err(fail(RPC_TYPE_ERROR, "Invalid amount for send"));
            }
            match chain.faucet(&script, amount) {
                Ok(txid) => Ok(json!(txid.to_string())),
                Err(DevChainError::InsufficientFunds(_)) => {
                    Err(fail(RPC_WALLET_INSUFFICIENT_FUNDS, "Insufficient funds"))
                }
                Err(DevChainError::Tx(r)) => Err(fail(r.kind.code(), r.reason)),
                Err(e) => Err(fail(RPC_MISC_ERROR, e.to_string())),
            }
        }
        "generateblock" => {
            let output = req_str(p, 0, "output")?;
            let script = wallet::validate_address(output, Network::Regtest)
                .map(|a| a.script_pubkey())
                // Core also takes a descriptor here; this chain only addresses.
                .map_err(|_| {
                    fail(
                        RPC_INVALID_ADDRESS_OR_KEY,
                        "Error: Invalid address or descriptor",
                    )
                })?;
            let items = match arg(p, 1) {
                Some(Value::Array(items)) => items,
                other => {
                    return Err(fail(
                        RPC_TYPE_ERROR,
                        format!(
                            "JSON value of type {} for field transactions is not of expected type array",
                            other.map_or("null", type_name)
                        ),
                    ))
                }
            };
            let submit = match arg(p, 2) {
                None => true,
                Some(Value::Bool(b)) => *b,
                Some(v) => {
                    return Err(fail(
                        RPC_TYPE_ERROR,
                        format!(
                            "JSON value of type {} for field submit is not of expected type bool",
                            type_name(v)
                        ),
                    ))
                }
            };
            let mut txs = Vec::with_capacity(items.len());
            for item in items {
                let text = item.as_str().unwrap_or_default();
                // Core: a txid names a mempool transaction, anything else is raw hex.
                let as_txid = (text.len() == 64)
                    .then(|| text.parse::<Txid>().ok())
                    .flatten();
                if let Some(txid) = as_txid {
                    let tx = chain
                        .with_state(|s| s.mempool_entry(&txid).map(|e| e.tx.clone()))
                        .ok_or_else(|| {
                            fail(
                                RPC_INVALID_ADDRESS_OR_KEY,
                                format!("Transaction {txid} not in mempool."),
                            )
                        })?;
                    txs.push(tx);
                } else {
                    let tx = deserialize_hex::<Transaction>(text).map_err(|_| {
                        fail(
                            RPC_DESERIALIZATION_ERROR,
                            format!("Transaction decode failed for {text}"),
                        )
                    })?;
                    txs.push(tx);
                }
            }
            match chain.generate_block(&script, txs, submit) {
                Ok(block) if submit => Ok(json!({"hash": block.block_hash().to_string()})),
                Ok(block) => Ok(json!({
                    "hash": block.block_hash().to_string(),
                    "hex": serialize_hex(&block),
                })),
                Err(DevChainError::Block(reason)) => Err(fail(
                    RPC_VERIFY_ERROR,
                    format!("TestBlockValidity failed: {reason}"),
                )),
                Err(e) => Err(fail(RPC_MISC_ERROR, e.to_string())),
            }
        }
        "prioritisetransaction" => {
            let txid: Txid = parse_hash(req_str(p, 0, "txid")?, "txid")?;
            let dummy_zero = match arg(p, 1) {
                None => true,
                Some(Value::Number(n)) => n.as_f64() == Some(0.0),
                Some(_) => false,
            };
            if !dummy_zero {
                return Err(fail(
                    RPC_INVALID_PARAMETER,
                    "Priority is no longer supported, dummy argument to prioritisetransaction must be 0.",
                ));
            }
            let delta = req_i64(p, 2, "fee_delta")?;
            chain.prioritise_transaction(txid, delta);
            Ok(json!(true))
        }
        "setminingfeerate" => {
            // Not Core: switches the fee-market mode (see docs/chain.md).
            let threshold = match arg(p, 0) {
                None => None,
                Some(Value::Number(n)) => {
                    let rate = crate::fees::parse_sat_per_vb(&n.to_string())
                        .map_err(|e| fail(RPC_INVALID_PARAMETER, e.to_string()))?;
                    (rate > FeeRate::ZERO).then_some(rate)
                }
                Some(v) => {
                    return Err(fail(
                        RPC_TYPE_ERROR,
                        format!(
                        "JSON value of type {} for field sat_per_vb is not of expected type number",
                        type_name(v)
                    ),
                    ))
                }
            };
            chain.set_mining_min_fee(threshold);
            Ok(json!({
                "mining_min_fee_sat_vb": threshold.map(|r| r.to_sat_per_kwu() as f64 * 4.0 / 1000.0),
            }))
        }
        "getnetworkinfo" => {
            let kvb = |r: FeeRate| shapes::btc(Amount::from_sat(r.to_sat_per_kwu() * 4));
            let (relay, incremental) =
                chain.with_state(|s| (s.min_relay_fee(), s.incremental_relay_fee()));
            // Core's reachability table; the development chain has no P2P,
            // so it answers as a node with no connections and no proxy.
            let networks: Vec<Value> = [
                ("ipv4", false),
                ("ipv6", false),
                ("onion", true),
                ("i2p", true),
                ("cjdns", true),
            ]
            .iter()
            .map(|(name, limited)| {
                json!({
                    "name": name,
                    "limited": limited,
                    "reachable": !limited,
                    "proxy": "",
                    "proxy_randomize_credentials": false,
                })
            })
            .collect();
            Ok(json!({
                "version": shapes::CORE_VERSION,
                "subversion": "/potluck-devchain:0.1.0/",
                "protocolversion": 70016,
                "localservices": format!("{:016x}", shapes::LOCAL_SERVICES),
                "localservicesnames": ["NETWORK", "WITNESS", "NETWORK_LIMITED", "P2P_V2"],
                "localrelay": true,
                "timeoffset": 0,
                "networkactive": true,
                "connections": 0,
                "connections_in": 0,
                "connections_out": 0,
                "networks": networks,
                "relayfee": kvb(relay),
                "incrementalfee": kvb(incremental),
                "localaddresses": [],
                "warnings": [],
            }))
        }
        "uptime" => Ok(json!(chain.uptime().as_secs())),
        "stop" => {
            let _ = st.shutdown.send(true);
            Ok(json!("Bitcoin Core stopping"))
        }
        _ => Err(fail(RPC_METHOD_NOT_FOUND, "Method not found")),
    }
}

fn mempool_entry_json(s: &super::state::ChainState, e: &super::state::MempoolEntry) -> Value {
    let txid = e.tx.compute_txid();
    // Core's package statistics count the transaction itself.
    // Package fees are modified fees (with `prioritisetransaction` deltas), as Core's.
    let modified = |t: &Txid, x: &super::state::MempoolEntry| s.modified_fee_sat(t, x);
    let sum = |ids: &[Txid]| {
        ids.iter()
            .filter_map(|t| s.mempool_entry(t).map(|x| (t, x)))
            .fold((e.vsize, modified(&txid, e)), |(v, f), (t, x)| {
                (v + x.vsize, f.saturating_add(modified(t, x)))
            })
    };
    let btc_signed = |sat: i64| {
        let magnitude = shapes::btc(Amount::from_sat(sat.unsigned_abs()));
        if sat < 0 {
            json!(-magnitude.as_f64().unwrap_or(0.0))
        } else {
            magnitude
        }
    };
    let ancestors = s.mempool_ancestors(&txid, false);
    let descendants = s.mempool_descendants(&txid, false);
    let (ancestor_size, ancestor_fees) = sum(&ancestors);
    let (descendant_size, descendant_fees) = sum(&descendants);
    let ids = |v: Vec<Txid>| v.iter().map(ToString::to_string).collect::<Vec<_>>();
    json!({
        "vsize": e.vsize,
        "weight": e.tx.weight().to_wu(),
        "time": e.time,
        "height": e.height,
        "descendantcount": descendants.len() + 1,
        "descendantsize": descendant_size,
        "ancestorcount": ancestors.len() + 1,
        "ancestorsize": ancestor_size,
        "wtxid": e.tx.compute_wtxid().to_string(),
        "fees": {
            "base": shapes::btc(e.fee),
            "modified": btc_signed(modified(&txid, e)),
            "ancestor": btc_signed(ancestor_fees),
            "descendant": btc_signed(descendant_fees),
        },
        "depends": ids(s.mempool_ancestors(&txid, true)),
        "spentby": ids(s.mempool_descendants(&txid, true)),
        // Core reports the BIP125 signal (its own or an ancestor's), even
        // though full RBF replaces any transaction.
        "bip125-replaceable": e.tx.input.iter().any(|i| i.sequence.is_rbf())
            || s.mempool_ancestors(&txid, false).iter().filter_map(|t| s.mempool_entry(t)).any(|a| a.tx.input.iter().any(|i| i.sequence.is_rbf())),
        "unbroadcast": false,
    })
}
