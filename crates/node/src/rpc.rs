//! The control API: JSON-RPC over HTTP `POST /`, Basic auth with the cookie, as Bitcoin Core does.
//!
//! Requests may be JSON-RPC 2.0 (`"jsonrpc": "2.0"`, errors in a 200
//! response) or Core-style 1.0 (errors with HTTP 500), so that both generic
//! JSON-RPC clients and bitcoind-style ones (`potluck cli`) work.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine as _;
use serde_json::{json, Value};
use subtle::ConstantTimeEq as _;

use bitcoin::hashes::Hash as _;
use wire::{Preimage, Sha256};

use crate::channels::Command;
use crate::control_error::ControlError;
use crate::identity::COOKIE_USER;
use crate::NodeState;

/// JSON-RPC error codes: the protocol's own here, one per failure kind of a call in
/// [`crate::control_error::codes`] (all listed in docs/node.md).
mod codes {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub use crate::control_error::codes::{CHAIN_ERROR, DATABASE_ERROR, NOT_CONNECTED};
}

/// A method's failure: a code and a message for the caller.
#[derive(Debug)]
pub(crate) struct RpcFailure {
    code: i64,
    message: String,
}

impl From<ControlError> for RpcFailure {
    fn from(e: ControlError) -> Self {
        RpcFailure::new(e.code(), e.to_string())
    }
}

impl From<crate::store::StoreError> for RpcFailure {
    fn from(e: crate::store::StoreError) -> Self {
        RpcFailure::new(codes::DATABASE_ERROR, e.to_string())
    }
}

impl RpcFailure {
    fn new(code: i64, message: impl Into<String>) -> Self {
        RpcFailure {
            code,
            message: message.into(),
        }
    }
}

pub(crate) fn router(state: Arc<NodeState>) -> Router {
    Router::new().route("/", post(handle)).with_state(state)
}

fn authorized(state: &NodeState, headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Some(encoded) = value.strip_prefix("Basic ") else {
        return false;
    };
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
        return false;
    };
    let expected = format!("{COOKIE_USER}:{}", state.cookie_password);
    // Constant time, so that the cookie cannot be guessed byte by byte.
    decoded.ct_eq(expected.as_bytes()).into()
}

async fn handle(State(state): State<Arc<NodeState>>, headers: HeaderMap, body: Bytes) -> Response {
    if !authorized(&state, &headers) {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Basic realm=\"potluck node\"")],
        )
            .into_response();
    }
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return reply(
                true,
                Value::Null,
                Err(RpcFailure::new(
                    codes::PARSE_ERROR,
                    format!("Parse error: {e}"),
                )),
            )
        }
    };
    let v2 = request.get("jsonrpc").and_then(Value::as_str) == Some("2.0");
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let Some(method) = request.get("method").and_then(Value::as_str) else {
        return reply(
            v2,
            id,
            Err(RpcFailure::new(
                codes::INVALID_REQUEST,
                "Invalid request: no method",
            )),
        );
    };
    let params = match request.get("params") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(_) => {
            return reply(
                v2,
                id,
                Err(RpcFailure::new(
                    codes::INVALID_PARAMS,
                    "params must be an array",
                )),
            )
        }
    };
    tracing::debug!(method, "control rpc");
    let result = dispatch(&state, method, &params).await;
    reply(v2, id, result)
}

fn reply(v2: bool, id: Value, result: Result<Value, RpcFailure>) -> Response {
    match (v2, result) {
        (true, Ok(result)) => {
            Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
        }
        (true, Err(e)) => Json(json!({
            "jsonrpc": "2.0", "id": id, "error": {"code": e.code, "message": e.message}
        }))
        .into_response(),
        (false, Ok(result)) => {
            Json(json!({"result": result, "error": null, "id": id})).into_response()
        }
        (false, Err(e)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(
                json!({"result": null, "error": {"code": e.code, "message": e.message}, "id": id}),
            ),
        )
            .into_response(),
    }
}

fn param_str<'a>(params: &'a [Value], index: usize, name: &str) -> Result<&'a str, RpcFailure> {
    params
        .get(index)
        .and_then(Value::as_str)
        .ok_or_else(|| RpcFailure::new(codes::INVALID_PARAMS, format!("missing {name}")))
}

fn param_u64(params: &[Value], index: usize, name: &str) -> Result<u64, RpcFailure> {
    let v = params
        .get(index)
        .ok_or_else(|| RpcFailure::new(codes::INVALID_PARAMS, format!("missing {name}")))?;
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .ok_or_else(|| {
            RpcFailure::new(
                codes::INVALID_PARAMS,
                format!("{name} must be a non-negative integer, got {v}"),
            )
        })
}

fn param_peer(params: &[Value], index: usize) -> Result<secp256k1::PublicKey, RpcFailure> {
    let id = param_str(params, index, "PEER_ID")?;
    id.parse()
        .map_err(|_| RpcFailure::new(codes::INVALID_PARAMS, format!("not a node id: {id}")))
}

fn param_32(params: &[Value], index: usize, name: &str) -> Result<[u8; 32], RpcFailure> {
    let s = param_str(params, index, name)?;
    let bytes = hex::decode(s)
        .ok()
        .filter(|b| b.len() == 32)
        .ok_or_else(|| {
            RpcFailure::new(
                codes::INVALID_PARAMS,
                format!("{name} must be 32 bytes of hex (64 characters)"),
            )
        })?;
    let mut out = [0u8; 32];
    out.copy_from_slice(&bytes);
    Ok(out)
}

async fn dispatch(
    state: &Arc<NodeState>,
    method: &str,
    params: &[Value],
) -> Result<Value, RpcFailure> {
    match method {
        "getinfo" => {
            let tip = state
                .chain
                .tip()
                .await
                .map_err(|e| RpcFailure::new(codes::CHAIN_ERROR, format!("chain: {e}")))?;
            let mut open = 0u64;
            let mut our_msat = 0u64;
            let mut htlcs = 0usize;
            let mut suspended = 0u64;
            let all = state.channels.all();
            for slot in &all {
                let inner = slot.lock().await;
                let st = inner.channel.state();
                if !matches!(st, channel::State::Closed | channel::State::OnChain) {
                    open += 1;
                    suspended += u64::from(inner.suspended.is_some());
                    if let Some(cs) = inner.channel.balances() {
                        our_msat += cs.ours.pay_msat + cs.ours.fee_msat;
                        htlcs += cs.ours.htlcs.len() + cs.theirs.htlcs.len();
                    }
                }
            }
            let wallet_sat = state
                .store
                .outputs(true)
                .await
                .map(|o| o.iter().map(|o| o.amount_sat).sum::<u64>())?;
            Ok(json!({
                "node_id": state.node_id.to_string(),
                "listen": state.p2p_addr.to_string(),
                "network": state.network.to_string(),
                "block_height": tip.height,
                "channels": all.len(),
                "open_channels": open,
                "suspended_channels": suspended,
                "watched_scripts": state.watched_scripts(),
                "open_channel_balance_msat": our_msat,
                "pending_htlcs": htlcs,
                "wallet_sat": wallet_sat,
            }))
        }
        "connect" => {
            let target = param_str(params, 0, "HOST:PORT")?;
            let addr = tokio::net::lookup_host(target)
                .await
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| {
                    RpcFailure::new(codes::INVALID_PARAMS, format!("cannot resolve {target}"))
                })?;
            let node_id = state.connect(addr).await?;
            Ok(json!({ "node_id": node_id.to_string() }))
        }
        "listpeers" => {
            let mut peers = Vec::new();
            for p in state.peers.list() {
                let channel_state = match state.channels.latest(&p.node_id) {
                    Some(slot) => Value::from(crate::channels::state_name(
                        slot.lock().await.channel.state(),
                    )),
                    None => Value::Null,
                };
                peers.push(json!({
                    "node_id": p.node_id.to_string(),
                    "address": p.address.to_string(),
                    "connected": p.connected,
                    "channel_state": channel_state,
                }));
            }
            Ok(json!({ "peers": peers }))
        }
        "disconnect" => {
            let id = param_str(params, 0, "PEER_ID")?;
            let node_id: secp256k1::PublicKey = id.parse().map_err(|_| {
                RpcFailure::new(codes::INVALID_PARAMS, format!("not a node id: {id}"))
            })?;
            if state
                .peers
                .disconnect(&node_id, "Disconnected by operator")
                .await
            {
                Ok(json!({}))
            } else {
                Err(RpcFailure::new(
                    codes::NOT_CONNECTED,
                    format!("not connected to {id}"),
                ))
            }
        }
        "newaddr" => {
            let address = state.new_address().await?;
            Ok(json!({ "address": address }))
        }
        "listfunds" => Ok(state.list_funds().await?),
        "open" => {
            let peer = param_peer(params, 0)?;
            let amount = param_u64(params, 1, "AMOUNT_SAT")?;
            if amount == 0 {
                return Err(RpcFailure::new(
                    codes::INVALID_PARAMS,
                    "AMOUNT_SAT must be positive",
                ));
            }
            state
                .open_channel(&peer, amount)
                .await
                .map_err(RpcFailure::from)
        }
        "pay" => {
            let peer = param_peer(params, 0)?;
            let amount = param_u64(params, 1, "AMOUNT_MSAT")?;
            if amount == 0 {
                return Err(RpcFailure::new(
                    codes::INVALID_PARAMS,
                    "AMOUNT_MSAT must be positive",
                ));
            }
            state
                .channel_command(&peer, Command::Pay(amount))
                .await
                .map_err(RpcFailure::from)
        }
        "newhtlc" => {
            let peer = param_peer(params, 0)?;
            let amount_msat = param_u64(params, 1, "AMOUNT_MSAT")?;
            if amount_msat == 0 {
                return Err(RpcFailure::new(
                    codes::INVALID_PARAMS,
                    "AMOUNT_MSAT must be positive",
                ));
            }
            let r_hash = Sha256::from_byte_array(param_32(params, 2, "R_HASH")?);
            let expiry = param_u64(params, 3, "EXPIRY")?;
            let expiry = u32::try_from(expiry)
                .ok()
                .filter(|e| *e < 500_000_000)
                .ok_or_else(|| {
                    RpcFailure::new(
                        codes::INVALID_PARAMS,
                        "EXPIRY must be a block height below 500000000",
                    )
                })?;
            state
                .channel_command(
                    &peer,
                    Command::AddHtlc {
                        amount_msat,
                        r_hash,
                        expiry,
                    },
                )
                .await
                .map_err(RpcFailure::from)
        }
        "fulfillhtlc" => {
            let peer = param_peer(params, 0)?;
            let r = Preimage(param_32(params, 1, "R")?);
            state
                .channel_command(&peer, Command::Fulfill(r))
                .await
                .map_err(RpcFailure::from)
        }
        "failhtlc" => {
            let peer = param_peer(params, 0)?;
            let r_hash = Sha256::from_byte_array(param_32(params, 1, "R_HASH")?);
            state
                .channel_command(&peer, Command::Fail(r_hash))
                .await
                .map_err(RpcFailure::from)
        }
        "close" => {
            let peer = param_peer(params, 0)?;
            let command = match params.get(1) {
                None => Command::Close,
                Some(v) if v.as_str() == Some("force") || v.as_bool() == Some(true) => {
                    Command::ForceClose
                }
                Some(v) => {
                    return Err(RpcFailure::new(
                        codes::INVALID_PARAMS,
                        format!("second argument of close must be \"force\", got {v}"),
                    ))
                }
            };
            state
                .channel_command(&peer, command)
                .await
                .map_err(RpcFailure::from)
        }
        "listchannels" => {
            let mut channels = Vec::new();
            for slot in state.channels.all() {
                channels.push(slot.to_json().await);
            }
            Ok(json!({ "channels": channels }))
        }
        #[cfg(feature = "test-hooks")]
        "dev-broadcast-revoked" => {
            let peer = param_peer(params, 0)?;
            state
                .broadcast_revoked(&peer)
                .await
                .map_err(RpcFailure::from)
        }
        "help" => crate::rpc_help::answer(params)
            .map(Value::from)
            .map_err(|e| RpcFailure::new(codes::INVALID_PARAMS, e.to_string())),
        "stop" => {
            state.request_shutdown();
            Ok(json!("potluck node stopping"))
        }
        other => Err(RpcFailure::new(
            codes::METHOD_NOT_FOUND,
            crate::rpc_help::unknown_method(other),
        )),
    }
}

/// The address the control API is bound to, for logs.
pub(crate) fn describe(addr: SocketAddr) -> String {
    format!("http://{addr}/")
}
