//! `potluck node` and `potluck cli` as real processes: two nodes connect over loopback and see each other.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

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
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let peers = json(&cli(&b, &["listpeers"]));
        if peers["peers"][0]["node_id"] == a.id.as_str() && peers["peers"][0]["connected"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "B never listed A: {peers}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // A second session to the same node is refused; the first stays up.
    let again = cli(&a, &["connect", &b.peers]);
    assert!(!again.status.success());
    let text = String::from_utf8_lossy(&again.stderr).to_lowercase();
    assert!(text.contains("already connected"), "{text}");
    let peers = json(&cli(&a, &["listpeers"]));
    assert_eq!(peers["peers"].as_array().unwrap().len(), 1);
    assert_eq!(peers["peers"][0]["connected"], true);

    // Disconnect: both sides see it.
    json(&cli(&a, &["disconnect", &b.id]));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let a_peers = json(&cli(&a, &["listpeers"]));
        let b_peers = json(&cli(&b, &["listpeers"]));
        if a_peers["peers"][0]["connected"] == false && b_peers["peers"][0]["connected"] == false {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still connected: {a_peers} {b_peers}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
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
    json(&cli(&a, &["stop"]));
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = a.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "node did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success());
    assert!(!cookie.exists());
    // The node key survives for the next start.
    assert!(a.dir.path().join("node_key").exists());
}
