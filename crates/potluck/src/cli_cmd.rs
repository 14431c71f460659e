//! `potluck cli`: the node's control API from the command line, like `lightning-cli`;
//! with `--chain`, the development chain's JSON-RPC (faucet, mining), like `bitcoin-cli`.
//!
//! The data directory alone finds the server: its `control_url` file names the URL and
//! its `.cookie` authenticates; `--rpc` overrides the URL. Output: a JSON result pretty
//! printed, a string result as plain text (as bitcoin-cli prints them), each ending with
//! a newline; errors on stderr with the JSON-RPC error code (docs/node.md, "potluck cli").

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chain::{Auth, BitcoindRpc, RpcConfig, RpcError};
use serde_json::Value;

/// Where `potluck node` keeps its files when not told otherwise.
const NODE_DATA_DIR: &str = "./potluck-data/node";
/// Where `potluck chain` keeps its files when not told otherwise.
const CHAIN_DATA_DIR: &str = "./potluck-data/chain";
/// `potluck chain`'s default JSON-RPC address, for chains that write no `control_url`
/// (the one embedded in `potluck serve` with `--dev-chain-rpc-bind`).
const CHAIN_DEFAULT_URL: &str = "http://127.0.0.1:18443/";
/// How long `--wait` waits for the server to come up.
const WAIT_LIMIT: Duration = Duration::from_secs(60);
/// A control call may wait up to 60 s for an update in flight before it proposes its own.
const CALL_TIMEOUT: Duration = Duration::from_secs(90);

/// Exit status when the node or chain answered with a JSON-RPC error.
const EXIT_RPC_ERROR: i32 = 1;
/// Exit status when the server could not be found, reached or authenticated.
const EXIT_UNREACHABLE: i32 = 3;

/// Flags of `potluck cli` (each also `POTLUCK_<FLAG>`).
#[derive(Debug, clap::Args)]
#[command(
    after_help = "`potluck cli help` lists the node's methods, `potluck cli help METHOD` \
    explains one. With --chain: sendtoaddress ADDRESS BTC (the faucet), generatetoaddress N \
    ADDRESS (mining), getblockcount, and the rest of the chain's bitcoind-style JSON-RPC.\n\
    Exit status: 0 done, 1 the server answered an error (its code on stderr), 2 bad command \
    line, 3 the server could not be found or reached."
)]
pub struct CliArgs {
    /// The server's URL; without it, read from `<data-dir>/control_url`.
    #[arg(long, env = "POTLUCK_RPC")]
    pub rpc: Option<String>,
    /// The node's data directory (its `control_url` and `.cookie`) [default: ./potluck-data/node;
    /// with --chain: the chain's, ./potluck-data/chain].
    #[arg(long, env = "POTLUCK_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Talk to the development chain (`potluck chain`) instead of a node.
    #[arg(long, env = "POTLUCK_CHAIN")]
    pub chain: bool,
    /// Wait (up to 60 s) for the server to come up instead of failing at once.
    #[arg(long, env = "POTLUCK_WAIT")]
    pub wait: bool,
    /// Print only this field of the result: a dot path such as `node_id` or
    /// `channels.0.ours.spendable_msat` (strings without quotes).
    #[arg(long, env = "POTLUCK_GET", value_name = "PATH")]
    pub get: Option<String>,
    /// The method, e.g. getinfo, connect, pay, listchannels, help.
    pub method: String,
    /// Its arguments; integers are sent as numbers, `[…]`/`{…}` as JSON, everything else as
    /// strings. One that starts with `-` and is not a flag of `potluck cli` is an argument
    /// too (`pay --route NODE,… R_HASH AMOUNT_MSAT`).
    #[arg(allow_hyphen_values = true)]
    pub args: Vec<String>,
}

/// Why a call did not produce a result.
enum Failure {
    /// The server answered with a JSON-RPC error.
    Answered { code: i32, message: String },
    /// The server could not be found, reached or authenticated.
    Unreachable(String),
    /// The answer came, but `--get` names no field of it.
    NoSuchField(String),
}

/// Runs the call and prints its result; returns the process exit status.
pub async fn run(args: CliArgs) -> i32 {
    let data_dir = args.data_dir.clone().unwrap_or_else(|| {
        PathBuf::from(if args.chain {
            CHAIN_DATA_DIR
        } else {
            NODE_DATA_DIR
        })
    });
    let params: Vec<Value> = args.args.iter().map(|a| param(a)).collect();
    let outcome = call(&args, &data_dir, params).await;
    match outcome.and_then(|value| select(value, args.get.as_deref())) {
        Ok(value) => {
            print!("{}", render(&value));
            0
        }
        Err(Failure::Answered { code, message }) => {
            // bitcoin-cli's layout, so that people and scripts used to it read it at once.
            eprintln!("error code: {code}\nerror message:\n{message}");
            EXIT_RPC_ERROR
        }
        Err(Failure::Unreachable(message)) => {
            eprintln!("error: {message}");
            EXIT_UNREACHABLE
        }
        Err(Failure::NoSuchField(message)) => {
            eprintln!("error: {message}");
            EXIT_RPC_ERROR
        }
    }
}

/// One command-line argument as a JSON-RPC parameter.
fn param(arg: &str) -> Value {
    if let Ok(n) = arg.parse::<i64>() {
        return Value::from(n);
    }
    if arg.starts_with('[') || arg.starts_with('{') {
        if let Ok(v) = serde_json::from_str(arg) {
            return v;
        }
    }
    Value::from(arg)
}

/// Finds the server, calls the method, and (with `--wait`) retries until it is up.
async fn call(args: &CliArgs, data_dir: &Path, params: Vec<Value>) -> Result<Value, Failure> {
    let deadline = Instant::now() + WAIT_LIMIT;
    loop {
        let attempt = match locate(args, data_dir) {
            Ok(url) => once(args, data_dir, &url, &params).await,
            // Without a node, `help` still answers, from the same table the node uses.
            Err(_) if args.method == "help" && !args.chain => {
                return node::rpc_help::answer(&params)
                    .map(Value::from)
                    .map_err(|e| Failure::Answered {
                        code: -32602,
                        message: e.to_string(),
                    });
            }
            Err(message) => Err(Failure::Unreachable(message)),
        };
        match attempt {
            Err(Failure::Unreachable(_)) if args.wait && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}

/// The server's URL: `--rpc`, else the data directory's `control_url`.
fn locate(args: &CliArgs, data_dir: &Path) -> Result<String, String> {
    if let Some(url) = &args.rpc {
        return Ok(url.clone());
    }
    let file = data_dir.join(node::control_url::FILE_NAME);
    match node::control_url::read(data_dir) {
        Ok(Some(url)) => Ok(url),
        Ok(None) if args.chain => Ok(CHAIN_DEFAULT_URL.to_owned()),
        Ok(None) => Err(format!(
            "no node is running with data directory {}: {} does not exist \
             (start `potluck node --data-dir {}`, or give --rpc URL)",
            data_dir.display(),
            file.display(),
            data_dir.display()
        )),
        Err(e) => Err(format!("cannot read {}: {e}", file.display())),
    }
}

/// One call, never retried by the client: control calls move money.
async fn once(
    args: &CliArgs,
    data_dir: &Path,
    url: &str,
    params: &[Value],
) -> Result<Value, Failure> {
    let cookie = data_dir.join(".cookie");
    let mut config = RpcConfig::new(url.to_owned(), Auth::Cookie(cookie.clone()));
    config.retries = 0;
    config.timeout = CALL_TIMEOUT;
    let server = if args.chain { "chain" } else { "node" };
    let client = BitcoindRpc::new(config).map_err(|e| Failure::Unreachable(e.to_string()))?;
    match client.call(&args.method, Value::from(params.to_vec())).await {
        Ok(value) => Ok(value),
        Err(RpcError::Rpc { code, message }) => Err(Failure::Answered { code, message }),
        Err(RpcError::Auth(status)) => Err(Failure::Unreachable(format!(
            "the {server} at {url} refused the cookie in {} (HTTP {status}); is --data-dir the {server}'s?",
            cookie.display()
        ))),
        Err(RpcError::Config(reason)) if !cookie.exists() => Err(Failure::Unreachable(format!(
            "no cookie in {} ({reason}); is the {server} running with this data directory?",
            data_dir.display()
        ))),
        Err(e) => Err(Failure::Unreachable(format!(
            "calling {} on the {server} at {url}: {e}",
            args.method
        ))),
    }
}

/// The part of the result that `--get PATH` asks for (all of it without `--get`).
fn select(value: Value, path: Option<&str>) -> Result<Value, Failure> {
    let Some(path) = path else {
        return Ok(value);
    };
    let mut current = &value;
    for key in path.split('.') {
        let next = match current {
            Value::Array(items) => key.parse::<usize>().ok().and_then(|i| items.get(i)),
            Value::Object(fields) => fields.get(key),
            _ => None,
        };
        current =
            next.ok_or_else(|| Failure::NoSuchField(format!("the result has no {path}: {value}")))?;
    }
    Ok(current.clone())
}

/// A result as printed: strings as text, null as nothing, the rest as pretty JSON; each
/// ends with a newline so that the shell prompt starts on its own line.
fn render(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) if s.ends_with('\n') => s.clone(),
        Value::String(s) => format!("{s}\n"),
        other => {
            let text = serde_json::to_string_pretty(other).unwrap_or_else(|_| other.to_string());
            format!("{text}\n")
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn arguments_become_numbers_json_or_strings() {
        assert_eq!(param("500000"), json!(500000));
        assert_eq!(param("-3"), json!(-3));
        assert_eq!(param("0.01"), json!("0.01"));
        assert_eq!(param("[\"ab\"]"), json!(["ab"]));
        assert_eq!(param("[not json"), json!("[not json"));
        // A 64-digit R_HASH stays a string: it does not fit an i64.
        let digits = "1".repeat(64);
        assert_eq!(param(&digits), json!(digits));
    }

    #[test]
    fn results_end_with_a_newline_and_strings_print_as_text() {
        assert_eq!(render(&json!({"a": 1})), "{\n  \"a\": 1\n}\n");
        assert_eq!(
            render(&json!("potluck node stopping")),
            "potluck node stopping\n"
        );
        assert_eq!(render(&json!(5)), "5\n");
        assert_eq!(render(&Value::Null), "");
    }

    #[test]
    fn get_follows_a_dot_path_through_objects_and_arrays() {
        let v = json!({"channels": [{"ours": {"spendable_msat": 7}}], "node_id": "02ab"});
        assert!(matches!(select(v.clone(), Some("node_id")), Ok(x) if x == json!("02ab")));
        assert!(
            matches!(select(v.clone(), Some("channels.0.ours.spendable_msat")), Ok(x) if x == json!(7))
        );
        assert!(matches!(
            select(v, Some("channels.1")),
            Err(Failure::NoSuchField(m)) if m.starts_with("the result has no channels.1")
        ));
    }
}
