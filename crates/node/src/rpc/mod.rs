//! The control API: JSON-RPC over HTTP `POST /`, Basic auth with the cookie, as Bitcoin Core does.
//!
//! Requests may be JSON-RPC 2.0 (`"jsonrpc": "2.0"`, errors in a 200
//! response) or Core-style 1.0 (errors with HTTP 500), so that both generic
//! JSON-RPC clients and bitcoind-style ones (`potluck cli`) work.

mod error;
mod method;
mod views;

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
use tokio::net::TcpListener;

use crate::identity::COOKIE_USER;
use crate::node::Node;
use error::{codes, RpcFailure};
#[cfg(test)]
pub(crate) use method::MethodName;
use method::{Answer, Method};

/// Serves the control API on `listener` until the node shuts down.
pub(crate) async fn serve(node: Arc<Node>, listener: TcpListener) {
    let mut shutdown = node.shutdown.subscribe();
    let app = router(node);
    // Answers are small and each call waits for its answer: no Nagle delay on them.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %crate::error_report::Causes(&e), "control connection keeps Nagle");
        }
    });
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            // An error means the node is gone: stop all the same.
            let _gone = shutdown.wait_for(|stop| *stop).await;
        })
        .await;
    if let Err(e) = served {
        tracing::error!(error = %crate::error_report::Causes(&e), "control API stopped");
    }
}

pub(crate) fn router(node: Arc<Node>) -> Router {
    Router::new().route("/", post(handle)).with_state(node)
}

fn authorized(node: &Node, headers: &HeaderMap) -> bool {
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
    let expected = format!("{COOKIE_USER}:{}", node.cookie_password);
    // Constant time, so that the cookie cannot be guessed byte by byte.
    decoded.ct_eq(expected.as_bytes()).into()
}

/// A request's envelope: its version, id, method and params.
struct Request {
    v2: bool,
    id: Value,
    method: String,
    params: Vec<Value>,
}

/// Reads the JSON-RPC envelope; `Err` carries the version and id to answer with.
fn envelope(body: &[u8]) -> Result<Request, (bool, Value, RpcFailure)> {
    let request: Value = serde_json::from_slice(body).map_err(|e| {
        let failure = RpcFailure::new(codes::PARSE_ERROR, format!("Parse error: {e}"));
        (true, Value::Null, failure)
    })?;
    let v2 = request.get("jsonrpc").and_then(Value::as_str) == Some("2.0");
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let Some(method) = request.get("method").and_then(Value::as_str) else {
        let failure = RpcFailure::new(codes::INVALID_REQUEST, "Invalid request: no method");
        return Err((v2, id, failure));
    };
    let params = match request.get("params") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(_) => {
            return Err((v2, id, RpcFailure::params("params must be an array")));
        }
    };
    Ok(Request {
        v2,
        id,
        method: method.to_owned(),
        params,
    })
}

async fn handle(State(node): State<Arc<Node>>, headers: HeaderMap, body: Bytes) -> Response {
    if !authorized(&node, &headers) {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Basic realm=\"potluck node\"")],
        )
            .into_response();
    }
    let request = match envelope(&body) {
        Ok(r) => r,
        Err((v2, id, failure)) => return reply(v2, id, Err(failure)),
    };
    tracing::debug!(method = request.method, "control rpc");
    let known = |id: &[u8; 33]| node.manager.channels.known_peer(id);
    let result = match Method::parse(&request.method, &request.params, &known) {
        Ok(method) => method.apply(&node).await,
        Err(e) => Err(e),
    };
    reply(request.v2, request.id, result)
}

fn reply(v2: bool, id: Value, result: Result<Answer, RpcFailure>) -> Response {
    match (v2, result) {
        (_, Ok(Answer::Rendered(text))) => rendered(v2, &id, &text),
        (true, Ok(Answer::Value(result))) => {
            Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
        }
        (true, Err(e)) => Json(json!({
            "jsonrpc": "2.0", "id": id, "error": {"code": e.code, "message": e.message}
        }))
        .into_response(),
        (false, Ok(Answer::Value(result))) => {
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

/// The envelope around an answer rendered from its view, the bytes `json!` writes for it
/// (keys sorted: `error`, `id`, `result` in 1.0; `id`, `jsonrpc`, `result` in 2.0) without
/// building a value of the answer first.
fn rendered(v2: bool, id: &Value, text: &str) -> Response {
    let body = if v2 {
        format!(r#"{{"id":{id},"jsonrpc":"2.0","result":{text}}}"#)
    } else {
        format!(r#"{{"error":null,"id":{id},"result":{text}}}"#)
    };
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The address the control API is bound to, for logs.
pub(crate) fn describe(addr: SocketAddr) -> String {
    format!("http://{addr}/")
}

/// A control call on `node` by name, without HTTP (the in-process tests): its answer, or
/// its error code and message.
#[cfg(test)]
pub(crate) async fn call(
    node: &Arc<Node>,
    method: &str,
    params: &Value,
) -> Result<Value, (i64, String)> {
    let params = params.as_array().map(Vec::as_slice).unwrap_or_default();
    let known = |id: &[u8; 33]| node.manager.channels.known_peer(id);
    let run = async { Method::parse(method, params, &known)?.apply(node).await };
    match run.await {
        Ok(Answer::Value(value)) => Ok(value),
        Ok(Answer::Rendered(text)) => serde_json::from_str(&text)
            .map_err(|e| (crate::control_error::codes::MISC_ERROR, e.to_string())),
        Err(e) => Err((e.code, e.message)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_of(response: Response) -> (StatusCode, String, Vec<u8>) {
        let status = response.status();
        let kind = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        (status, kind, body.to_vec())
    }

    #[tokio::test]
    async fn a_rendered_answer_is_sent_as_the_same_bytes_as_its_value() {
        let answers = [
            r#"{"a":1,"b":[{"c":null,"d":"e\"f"}],"z":true}"#,
            r#""potluck node stopping""#,
            "[]",
        ];
        let ids = [json!(7), json!("id \"quoted\""), Value::Null];
        for text in answers {
            for id in &ids {
                for v2 in [false, true] {
                    let value: Value = serde_json::from_str(text).expect("json");
                    let direct = reply(v2, id.clone(), Ok(Answer::Rendered(text.to_owned())));
                    let through_value = reply(v2, id.clone(), Ok(Answer::Value(value)));
                    assert_eq!(
                        body_of(direct).await,
                        body_of(through_value).await,
                        "{text} with id {id}, 2.0: {v2}"
                    );
                }
            }
        }
    }
}
