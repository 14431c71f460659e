//! `potluck node` and `potluck cli` as real processes: two nodes connect over loopback and see each other.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::wait_for_blocking;

struct Node {
    child: Child,
    id: String,
    peers: String,
    rpc: String,
    dir: tempfile::TempDir,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_node() -> Node {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_potluck"))
        .args([
            "node",
            "--listen",
            "127.0.0.1:0",
            "--rpc-bind",
            "127.0.0.1:0",
        ])
        .args(["--dev-block-interval", "0", "--data-dir"])
        .arg(dir.path())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // "potluck node <id> peers on <addr> control on <url>"
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.get(..2), Some(&["potluck", "node"][..]), "{line}");
    Node {
        id: words[2].to_owned(),
        peers: words[5].to_owned(),
        rpc: words[8].to_owned(),
        child,
        dir,
    }
}

fn cli(node: &Node, args: &[&str]) -> Output {
    cli_with(&node.rpc, node.dir.path(), args)
}

fn cli_with(rpc: &str, data_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_potluck"))
        .args(["cli", "--rpc", rpc, "--data-dir"])
        .arg(data_dir)
        .args(args)
        .output()
        .unwrap()
}

fn json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "cli failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn two_nodes_connect_and_list_each_other() {
    let a = start_node();
    let b = start_node();
    assert_ne!(a.id, b.id);

    let info = json(&cli(&a, &["getinfo"]));
    assert_eq!(info["node_id"], a.id.as_str());
    assert_eq!(info["listen"], a.peers.as_str());
    assert_eq!(info["network"], "regtest");
    // The development chain starts with a mature faucet (height above 100).
    assert!(
        info["block_height"].as_u64().is_some_and(|h| h > 100),
        "{info}"
    );

    let connected = json(&cli(&a, &["connect", &b.peers]));
    assert_eq!(connected["node_id"], b.id.as_str());

    let peers = json(&cli(&a, &["listpeers"]));
    assert_eq!(peers["peers"][0]["node_id"], b.id.as_str());
    assert_eq!(peers["peers"][0]["connected"], true);
    // B sees A once its side of the handshake has attached.
    wait_for_blocking("B lists A", Duration::from_secs(5), || {
        let peers = json(&cli(&b, &["listpeers"]));
        let listed =
            peers["peers"][0]["node_id"] == a.id.as_str() && peers["peers"][0]["connected"] == true;
        if listed {
            Ok(())
        } else {
            Err(peers)
        }
    });

    // A second session to the same node is refused; the first stays up.
    let again = cli(&a, &["connect", &b.peers]);
    assert!(!again.status.success());
    let text = String::from_utf8_lossy(&again.stderr).to_lowercase();
    assert!(text.contains("already connected"), "{text}");
    let peers = json(&cli(&a, &["listpeers"]));
    assert_eq!(peers["peers"].as_array().unwrap().len(), 1);
    assert_eq!(peers["peers"][0]["connected"], true);

    // Disconnect: both sides see it, and since they have no channel, each forgets the other
    // (docs/node.md: peers without a channel are trimmed once gone).
    json(&cli(&a, &["disconnect", &b.id]));
    wait_for_blocking(
        "both sides forget each other",
        Duration::from_secs(30),
        || {
            let a_peers = json(&cli(&a, &["listpeers"]));
            let b_peers = json(&cli(&b, &["listpeers"]));
            let gone = |v: &Value| v["peers"].as_array().is_some_and(|p| p.is_empty());
            if gone(&a_peers) && gone(&b_peers) {
                Ok(())
            } else {
                Err(format!("still connected: {a_peers} {b_peers}"))
            }
        },
    );
}

#[test]
fn cli_errors_are_readable() {
    let a = start_node();
    let out = cli(&a, &["nosuchmethod"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Method not found: nosuchmethod"));

    let out = cli(&a, &["connect", "127.0.0.1:1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("connect to 127.0.0.1:1 failed"));

    // Each kind of failure has its own code (docs/node.md), so clients need not parse text.
    let code = |args: &[&str]| {
        let out = cli(&a, args);
        assert!(!out.status.success());
        let text = String::from_utf8_lossy(&out.stderr).into_owned();
        // `potluck cli` prints `error code: N` on its own line, as bitcoin-cli does.
        let code = text
            .lines()
            .find_map(|l| l.strip_prefix("error code: "))
            .map(str::to_owned);
        (code.unwrap_or_default(), text)
    };
    // The generator point: a valid node id no node here has.
    let someone = "0279be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798".to_owned();
    let codes = [
        code(&["nosuchmethod"]),
        code(&["connect", "127.0.0.1:1"]),
        code(&["pay", &someone, "1000"]),
        code(&["open", &someone, "100000"]),
        code(&["pay", &someone, "x"]),
    ];
    let expected = ["-32601", "-101", "-102", "-9", "-32602"];
    for ((got, text), want) in codes.iter().zip(expected) {
        assert_eq!(got, want, "{text}");
    }

    // Another directory's cookie (or none) is refused.
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::write(elsewhere.path().join(".cookie"), "__cookie__:00").unwrap();
    let out = cli_with(&a.rpc, elsewhere.path(), &["getinfo"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("refused the cookie"));
}

#[test]
fn stop_ends_the_process_and_removes_the_cookie() {
    let mut a = start_node();
    let cookie = a.dir.path().join(".cookie");
    assert!(cookie.exists());
    let out = cli(&a, &["stop"]);
    assert!(out.status.success());
    // A string result is printed as text, as bitcoin-cli does.
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "potluck node stopping\n"
    );
    let status = wait_for_blocking("the node to stop", Duration::from_secs(10), || {
        a.child.try_wait().unwrap()
    });
    assert!(status.success());
    assert!(!cookie.exists());
    // The control URL goes with the cookie: a stopped node is not found by its directory.
    assert!(!a.dir.path().join("control_url").exists());
    let out = cli_dir(a.dir.path(), &["getinfo"]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("control_url") && text.contains("--rpc"),
        "{text}"
    );
    // The node key survives for the next start.
    assert!(a.dir.path().join("node_key").exists());
}

/// `potluck cli` with only `--data-dir` (no `--rpc`, nothing from the environment).
fn cli_dir(data_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_potluck"))
        .args(["cli", "--data-dir"])
        .arg(data_dir)
        .args(args)
        .env_remove("POTLUCK_RPC")
        .env_remove("POTLUCK_DATA_DIR")
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn two_nodes_are_each_reached_by_their_data_directory_alone() {
    let a = start_node();
    let b = start_node();
    for node in [&a, &b] {
        let out = cli_dir(node.dir.path(), &["getinfo"]);
        assert!(
            out.stdout.ends_with(b"}\n"),
            "JSON output must end with a newline: {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert_eq!(json(&out)["node_id"], node.id.as_str());
        assert_eq!(
            std::fs::read_to_string(node.dir.path().join("control_url"))
                .unwrap()
                .trim(),
            node.rpc
        );
    }
    // --rpc still overrides the file: B's cookie sent to A is refused.
    let out = cli_with(&a.rpc, b.dir.path(), &["getinfo"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("refused the cookie"),
        "{}",
        stderr(&out)
    );
    // --get picks one field, a string printed as text.
    let out = cli_dir(b.dir.path(), &["--get", "node_id", "getinfo"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{}\n", b.id));
}

/// The methods the node lists in `help`: the first word of each line up to the first blank line.
fn listed_methods(overview: &str) -> Vec<String> {
    overview
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn help_explains_every_method_the_node_dispatches() {
    let a = start_node();
    let out = cli_dir(a.dir.path(), &["help"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let overview = String::from_utf8(out.stdout).unwrap();
    assert!(overview.ends_with('\n'));
    let methods = listed_methods(&overview);
    for m in [
        "getinfo",
        "connect",
        "listpeers",
        "disconnect",
        "newaddr",
        "listfunds",
        "open",
        "pay",
        "newhtlc",
        "fulfillhtlc",
        "failhtlc",
        "close",
        "listchannels",
        "help",
        "stop",
    ] {
        assert!(
            methods.iter().any(|l| l == m),
            "{m} missing from:\n{overview}"
        );
    }

    // Another JSON-RPC client gets the same text from the node's `help` method.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut config = chain::RpcConfig::new(
        a.rpc.clone(),
        chain::Auth::Cookie(a.dir.path().join(".cookie")),
    );
    config.retries = 0;
    let rpc = chain::BitcoindRpc::new(config).unwrap();
    let call = |method: &str, params: Value| -> Result<Value, chain::RpcError> {
        rt.block_on(rpc.call(method, params))
    };
    let answer = call("help", serde_json::json!([])).unwrap();
    assert_eq!(format!("{}\n", answer.as_str().unwrap()), overview);

    for m in &methods {
        let out = cli_dir(a.dir.path(), &["help", m]);
        assert!(out.status.success(), "help {m}: {}", stderr(&out));
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.starts_with(m.as_str()), "help {m}:\n{text}");
        assert!(text.contains("Example"), "help {m} has no example:\n{text}");
        assert!(text.contains("potluck cli"), "help {m}:\n{text}");
        let answer = call("help", serde_json::json!([m])).unwrap();
        assert_eq!(format!("{}\n", answer.as_str().unwrap()), text);
        // Every listed method is dispatched: junk arguments are refused by the method, never "not found".
        if m != "stop" {
            if let Err(chain::RpcError::Rpc { code, message }) =
                call(m, serde_json::json!(["zz", "zz", "zz", "zz"]))
            {
                assert_ne!(code, -32601, "{m} is listed but not dispatched: {message}");
            }
        }
    }
    units_spelled_out_and_unknown_names_refused(a.dir.path());

    // `help` in the CLI works without a node too (same text, from the same table).
    let nowhere = tempfile::tempdir().unwrap();
    let out = cli_dir(nowhere.path(), &["help"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), overview);
}

/// The node's help spells out units; unknown names, chain methods and bad parameters get the JSON-RPC code on stderr, with the closest name suggested.
fn units_spelled_out_and_unknown_names_refused(dir: &Path) {
    // Units are spelled out.
    let pay = String::from_utf8(cli_dir(dir, &["help", "pay"]).stdout).unwrap();
    assert!(
        pay.contains("AMOUNT_MSAT") && pay.contains("millisatoshi"),
        "{pay}"
    );
    let open = String::from_utf8(cli_dir(dir, &["help", "open"]).stdout).unwrap();
    assert!(
        open.contains("AMOUNT_SAT") && open.contains("satoshi"),
        "{open}"
    );
    let newhtlc = String::from_utf8(cli_dir(dir, &["help", "newhtlc"]).stdout).unwrap();
    assert!(newhtlc.contains("block height"), "{newhtlc}");

    // Unknown names: an error on stderr with the JSON-RPC code, nothing on stdout, the closest name suggested.
    let out = cli_dir(dir, &["listchanels"]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let text = stderr(&out);
    assert!(text.contains("-32601"), "{text}");
    assert!(text.contains("did you mean listchannels"), "{text}");
    let out = cli_dir(dir, &["help", "pya"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("did you mean pay"),
        "{}",
        stderr(&out)
    );
    // A chain method sent to the node points at the chain.
    let out = cli_dir(dir, &["sendtoaddress", "x", "1"]);
    assert!(stderr(&out).contains("--chain"), "{}", stderr(&out));
    // Bad parameters: the code of "invalid params".
    let out = cli_dir(dir, &["pay", "nobody", "1"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("-32602"), "{}", stderr(&out));
}

#[test]
fn chain_flag_reaches_the_development_chain_by_its_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("chain");
    let mut chain = Command::new(env!("CARGO_BIN_EXE_potluck"))
        .args([
            "chain",
            "--rpc-bind",
            "127.0.0.1:0",
            "--block-interval",
            "0",
        ])
        .arg("--data-dir")
        .arg(&data)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let chain_cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_potluck"))
            .args(["cli", "--chain", "--data-dir"])
            .arg(&data)
            .args(args)
            .env_remove("POTLUCK_RPC")
            .env_remove("POTLUCK_DATA_DIR")
            .output()
            .unwrap()
    };
    // --wait: until the chain wrote its control URL and cookie and answers.
    let out = chain_cli(&["--wait", "getblockcount"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let height: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let url = std::fs::read_to_string(data.join("control_url")).unwrap();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    let address = wallet::Wallet::from_seed(&[9u8; 32], bitcoin::Network::Regtest)
        .unwrap()
        .derive_address(0, 0)
        .unwrap()
        .to_string();
    let out = chain_cli(&["sendtoaddress", &address, "0.01"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let txid = String::from_utf8(out.stdout).unwrap();
    assert_eq!(txid.trim().len(), 64, "{txid}");
    let out = chain_cli(&["generatetoaddress", "2", &address]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = chain_cli(&["getblockcount"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (height + 2).to_string()
    );
    let out = chain_cli(&["stop"]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for_blocking("the chain to stop", Duration::from_secs(10), || {
        chain.try_wait().unwrap()
    });
    assert!(!data.join("control_url").exists());
}

#[test]
fn chain_flag_reaches_a_nodes_embedded_chain_by_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_potluck"))
        .args([
            "node",
            "--listen",
            "127.0.0.1:0",
            "--rpc-bind",
            "127.0.0.1:0",
        ])
        .args([
            "--dev-block-interval",
            "0",
            "--dev-chain-rpc-bind",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let chain_dir = dir.path().join("chain");
    let out = Command::new(env!("CARGO_BIN_EXE_potluck"))
        .args(["cli", "--chain", "--wait", "--data-dir"])
        .arg(&chain_dir)
        .arg("getblockcount")
        .env_remove("POTLUCK_RPC")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let chain_height = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let info = json(&cli_dir(dir.path(), &["--wait", "getinfo"]));
    assert_eq!(info["block_height"].to_string(), chain_height);
    json(&cli_dir(dir.path(), &["getinfo"]));
    assert!(cli_dir(dir.path(), &["stop"]).status.success());
    wait_for_blocking("the node to stop", Duration::from_secs(10), || {
        child.try_wait().unwrap()
    });
    assert!(!chain_dir.join("control_url").exists());
}
