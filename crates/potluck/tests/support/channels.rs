//! Processes for the chain and channel tests: `potluck chain` and `potluck node`s that use it
//! through `--bitcoind-url`, driven with `potluck cli` and the chain's JSON-RPC.
//!
//! Every server binds port 0 and the test reads the address the process
//! reports on stdout, so no port is picked before it is bound.

use std::fs::File;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use chain::{Auth, BitcoindRpc, RpcConfig};
use serde_json::{json, Value};

/// The lines a child prints on stdout, read by a thread that drains the pipe
/// to its end: a child printing into a pipe nobody reads any more would die
/// of EPIPE.
pub struct StdoutLines(Receiver<String>);

impl StdoutLines {
    /// Takes over the child's piped stdout.
    pub fn of(child: &mut Child) -> StdoutLines {
        let out = child.stdout.take().expect("stdout is piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                // Once the test stopped listening, the lines are only drained.
                let _ = tx.send(line);
            }
        });
        StdoutLines(rx)
    }

    /// The next line containing `marker`, waiting up to `secs`; `None` when
    /// the child closed its stdout (exited) before printing one.
    pub fn find(&self, marker: &str, secs: u64) -> Option<String> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.0.recv_timeout(left) {
                Ok(line) if line.contains(marker) => return Some(line),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no stdout line with {marker:?} within {secs} s")
                }
                Err(RecvTimeoutError::Disconnected) => return None,
            }
        }
    }
}

/// The `potluck chain` command with `args` (give `--rpc-bind 127.0.0.1:0`).
pub fn chain_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_potluck"));
    cmd.arg("chain").args(args).stdout(Stdio::piped());
    cmd
}

/// Starts `cmd` (a `potluck chain`) and returns it with the JSON-RPC URL it
/// reports (`potluck chain: regtest at height N, JSON-RPC on http://ADDR/`).
pub fn start_chain(mut cmd: Command) -> (Child, String) {
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let lines = StdoutLines::of(&mut child);
    let Some(line) = lines.find("JSON-RPC on ", 60) else {
        let status = child.wait().unwrap();
        panic!("potluck chain exited ({status}) before reporting its RPC address");
    };
    let url = line.split("JSON-RPC on ").nth(1).unwrap().trim().to_owned();
    (child, url)
}

/// A client of the chain's RPC once it answers (its cookie file, if it uses
/// one, appears first), with no retries of its own: the one way the tests
/// wait for a chain they started.
pub async fn rpc_when_up(mut cfg: RpcConfig, cookie: Option<&Path>) -> BitcoindRpc {
    cfg.retries = 0;
    super::wait_for("the chain's RPC to answer", Duration::from_secs(60), || {
        let cfg = cfg.clone();
        async move {
            if !cookie.is_none_or(Path::exists) {
                return None;
            }
            let c = BitcoindRpc::new(cfg).unwrap();
            c.get_block_count().await.ok().map(|_| c)
        }
    })
    .await
}

pub struct DevChainProc {
    child: Child,
    pub dir: tempfile::TempDir,
    pub url: String,
    pub cookie: PathBuf,
    rt: tokio::runtime::Runtime,
    rpc: BitcoindRpc,
    /// A throwaway address for block rewards (so no node's wallet gets coinbase outputs).
    burn: String,
}

impl Drop for DevChainProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the chain keeps a transaction index (`potluck chain --txindex`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxIndex {
    On,
    /// As Bitcoin Core by default: confirmed transactions are found only with a block hash.
    Off,
}

impl DevChainProc {
    pub fn start() -> DevChainProc {
        DevChainProc::start_indexed(TxIndex::On)
    }

    /// A chain with or without the transaction index.
    pub fn start_indexed(index: TxIndex) -> DevChainProc {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("chain");
        let txindex = format!("--txindex={}", index == TxIndex::On);
        let mut cmd = chain_command(&[
            "--rpc-bind",
            "127.0.0.1:0",
            "--block-interval",
            "0",
            &txindex,
        ]);
        cmd.arg("--data-dir")
            .arg(&data)
            .env("RUST_LOG", "warn")
            .stderr(Stdio::null());
        let (child, url) = start_chain(cmd);
        let cookie = data.join(".cookie");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let rpc = rt.block_on(rpc_when_up(
            RpcConfig::new(url.clone(), Auth::Cookie(cookie.clone())),
            Some(&cookie),
        ));
        let w = wallet::Wallet::from_seed(&[7u8; 32], bitcoin::Network::Regtest).unwrap();
        let burn = w.derive_address(0, 0).unwrap().to_string();
        DevChainProc {
            child,
            dir,
            url,
            cookie,
            rt,
            rpc,
            burn,
        }
    }

    pub fn call(&self, method: &str, params: Value) -> Value {
        self.rt
            .block_on(self.rpc.call::<Value>(method, params))
            .unwrap_or_else(|e| panic!("chain {method}: {e}"))
    }

    pub fn mine(&self, n: u32) {
        self.call("generatetoaddress", json!([n, self.burn]));
    }

    pub fn height(&self) -> u64 {
        self.call("getblockcount", json!([])).as_u64().unwrap()
    }

    /// Sends `sat` from the chain's faucet to `address`; returns the txid.
    pub fn send(&self, address: &str, sat: u64) -> String {
        let btc = sat as f64 / 1e8;
        self.call("sendtoaddress", json!([address, btc]))
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The decoded transaction (verbose getrawtransaction). Without the index a
    /// confirmed one is looked up block by block from the tip, with its block hash.
    pub fn tx(&self, txid: &str) -> Value {
        let found = self.rt.block_on(
            self.rpc
                .call::<Value>("getrawtransaction", json!([txid, true])),
        );
        match found {
            Ok(tx) => tx,
            Err(e) if e.to_string().contains("-txindex") => {
                for height in (0..=self.height()).rev() {
                    let hash = self.call("getblockhash", json!([height]));
                    let block = self.call("getblock", json!([hash, 1]));
                    if block["tx"].as_array().unwrap().iter().any(|t| t == txid) {
                        return self.call("getrawtransaction", json!([txid, true, hash]));
                    }
                }
                panic!("transaction {txid} in no block")
            }
            Err(e) => panic!("chain getrawtransaction {txid}: {e}"),
        }
    }

    /// Value in satoshis of output `vout` of `txid`.
    pub fn output_sat(&self, txid: &str, vout: u64) -> u64 {
        let tx = self.tx(txid);
        btc_to_sat(&tx["vout"][vout as usize]["value"])
    }

    /// Fee of a transaction: its inputs' values minus its outputs'.
    pub fn fee(&self, txid: &str) -> u64 {
        let tx = self.tx(txid);
        let ins: u64 = tx["vin"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| self.output_sat(i["txid"].as_str().unwrap(), i["vout"].as_u64().unwrap()))
            .sum();
        let outs: u64 = tx["vout"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| btc_to_sat(&o["value"]))
            .sum();
        ins - outs
    }
}

pub fn btc_to_sat(v: &Value) -> u64 {
    (v.as_f64().unwrap() * 1e8).round() as u64
}

pub struct NodeProc {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub listen: String,
    pub rpc: String,
    pub id: String,
    chain_url: String,
    chain_cookie: PathBuf,
    cheat: bool,
    starts: u32,
    /// More flags for every start.
    extra: Vec<String>,
    /// Environment variables for the next starts (a crash point).
    env: Vec<(String, String)>,
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- log of node {} in {} ----\n{}",
                self.id,
                self.dir.path().display(),
                self.log_tail()
            );
            if std::env::var_os("POTLUCK_TEST_KEEP").is_some() {
                let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
                let _ = dir.keep();
            }
        }
        self.kill9();
    }
}

impl NodeProc {
    pub fn start(chain: &DevChainProc, cheat: bool) -> NodeProc {
        NodeProc::start_with(chain, cheat, &[])
    }

    /// Like [`NodeProc::start`], with more flags (kept for restarts).
    pub fn start_with(chain: &DevChainProc, cheat: bool, extra: &[&str]) -> NodeProc {
        NodeProc::start_via(chain, &chain.url, cheat, extra)
    }

    /// Like [`NodeProc::start_with`], reaching the chain's JSON-RPC at `url` (a proxy).
    pub fn start_via(chain: &DevChainProc, url: &str, cheat: bool, extra: &[&str]) -> NodeProc {
        NodeProc::start_on(url, &chain.cookie, cheat, extra)
    }

    /// Like [`NodeProc::start_with`], on any bitcoind-compatible chain: the JSON-RPC at `url`
    /// with the cookie file `cookie` (a Bitcoin Core, for the Core lane).
    pub fn start_on(url: &str, cookie: &std::path::Path, cheat: bool, extra: &[&str]) -> NodeProc {
        let mut node = NodeProc {
            child: None,
            dir: tempfile::tempdir().unwrap(),
            // Port 0 on the first start; the ports the node reports are kept for restarts.
            listen: "127.0.0.1:0".to_owned(),
            rpc: "127.0.0.1:0".to_owned(),
            id: String::new(),
            chain_url: url.to_owned(),
            chain_cookie: cookie.to_owned(),
            cheat,
            starts: 0,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
        };
        assert!(node.try_start(), "node did not start: {}", node.log_tail());
        node
    }

    /// Starts the process again on the same data directory and the ports it
    /// reported at its first start (its peers know it by that address). The
    /// ports were this node's own until it was stopped, so only a process
    /// that binds them in between could take them.
    pub fn restart(&mut self) {
        assert!(
            self.try_start(),
            "node did not restart: {}",
            self.log_tail()
        );
    }

    fn try_start(&mut self) -> bool {
        assert!(self.child.is_none());
        self.starts += 1;
        let log = File::create(self.dir.path().join(format!("log{}.txt", self.starts))).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_potluck"));
        cmd.args(["node", "--listen", &self.listen, "--rpc-bind", &self.rpc])
            .args(["--bitcoind-url", &self.chain_url, "--bitcoind-cookie"])
            .arg(&self.chain_cookie)
            .arg("--data-dir")
            .arg(self.dir.path())
            .env("POTLUCK_LOG", "info,node=debug")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        if self.cheat {
            cmd.arg("--dev-allow-cheat");
        }
        cmd.args(&self.extra);
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd.spawn().unwrap();
        // "potluck node <id> peers on <addr> control on http://<addr>/"
        let lines = StdoutLines::of(&mut child);
        let Some(line) = lines.find("potluck node ", 60) else {
            let _ = child.kill();
            let _ = child.wait();
            return false;
        };
        let words: Vec<&str> = line.split_whitespace().collect();
        self.id = words[2].to_owned();
        self.listen = words[5].to_owned();
        self.rpc = words[8]
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        self.child = Some(child);
        true
    }

    /// Sets (or, with `None`, removes) an environment variable for the next starts.
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.env.retain(|(k, _)| k != key);
        if let Some(v) = value {
            self.env.push((key.to_owned(), v.to_owned()));
        }
    }

    /// Whether the process ended on its own (a crash point killed it); it is reaped.
    pub fn exited(&mut self) -> bool {
        let ended = self
            .child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_some());
        if ended {
            self.child = None;
        }
        ended
    }

    /// SIGKILL: no chance to clean up.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn run_cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_potluck"))
            .args([
                "cli",
                "--rpc",
                &format!("http://{}/", self.rpc),
                "--data-dir",
            ])
            .arg(self.dir.path())
            .args(args)
            .output()
            .unwrap()
    }

    /// A control call on its own thread, for a test that plays the peer meanwhile; join
    /// it for the CLI's output.
    pub fn cli_in_background(
        &self,
        args: &[&str],
    ) -> std::thread::JoinHandle<std::process::Output> {
        let rpc = self.rpc.clone();
        let dir = self.dir.path().to_owned();
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        std::thread::spawn(move || {
            Command::new(env!("CARGO_BIN_EXE_potluck"))
                .args(["cli", "--rpc", &format!("http://{rpc}/"), "--data-dir"])
                .arg(&dir)
                .args(&args)
                .output()
                .unwrap()
        })
    }

    /// A control call that must succeed.
    pub fn cli(&self, args: &[&str]) -> Value {
        let out = self.run_cli(args);
        assert!(
            out.status.success(),
            "cli {args:?} failed: {}\nlog: {}",
            String::from_utf8_lossy(&out.stderr),
            self.log_tail()
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// A control call: the result, or the error line.
    pub fn try_cli(&self, args: &[&str]) -> Result<Value, String> {
        let out = self.run_cli(args);
        if out.status.success() {
            Ok(serde_json::from_slice(&out.stdout).unwrap())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// A control call that must answer within `secs`: Some(result or error line), None if it
    /// did not (the process is killed).
    pub fn cli_within(&self, args: &[&str], secs: u64) -> Option<Result<Value, String>> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_potluck"))
            .args([
                "cli",
                "--rpc",
                &format!("http://{}/", self.rpc),
                "--data-dir",
            ])
            .arg(self.dir.path())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if child.try_wait().unwrap().is_some() {
                let out = child.wait_with_output().unwrap();
                return Some(if out.status.success() {
                    Ok(serde_json::from_slice(&out.stdout).unwrap())
                } else {
                    Err(String::from_utf8_lossy(&out.stderr).into_owned())
                });
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The channel with `peer` (the newest one), or Null.
    pub fn channel_with(&self, peer: &str) -> Value {
        let v = self.cli(&["listchannels"]);
        v["channels"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|c| c["peer_id"] == peer)
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// Whether a session with `peer` is up.
    pub fn connected_to(&self, peer: &str) -> bool {
        let v = self.cli(&["listpeers"]);
        v["peers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["node_id"] == peer && p["connected"] == true)
    }

    pub fn log_tail(&self) -> String {
        let mut all = String::new();
        for n in 1..=self.starts {
            let path = self.dir.path().join(format!("log{n}.txt"));
            let s = std::fs::read_to_string(path).unwrap_or_default();
            let lines: Vec<&str> = s
                .lines()
                .filter(|l| !l.contains("control rpc method=\"list"))
                .collect();
            all += &format!(
                "[run {n}]\n{}\n",
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        }
        all
    }

    pub fn funds(&self) -> u64 {
        self.cli(&["listfunds"])["total_sat"].as_u64().unwrap()
    }

    pub fn channel(&self) -> Value {
        let v = self.cli(&["listchannels"]);
        v["channels"]
            .as_array()
            .unwrap()
            .last()
            .cloned()
            .unwrap_or(Value::Null)
    }

    pub fn channel_state(&self) -> String {
        self.channel()["state"].as_str().unwrap_or("").to_owned()
    }
}

/// SHA256 of a 32-byte R, as hex.
pub fn r_hash(r: &[u8; 32]) -> String {
    use bitcoin::hashes::{sha256, Hash};
    hex::encode(sha256::Hash::hash(r).to_byte_array())
}

/// A TCP proxy in front of the chain's JSON-RPC that can stop passing requests on (a hung
/// bitcoind: connections stay open, nothing is answered) and pass them on again.
pub struct StallingProxy {
    pub url: String,
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl StallingProxy {
    /// Listens on a free loopback port and forwards to the chain at `chain_url`.
    pub fn start(chain_url: &str) -> StallingProxy {
        use std::io::{Read as _, Write as _};
        use std::sync::atomic::Ordering::Relaxed;
        let target = chain_url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let stalled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stalled.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = std::net::TcpStream::connect(&target) else {
                    continue;
                };
                let (mut c_in, mut s_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (mut s_in, mut c_out) = (server, client);
                let flag = flag.clone();
                // Requests are held while stalled; answers always flow.
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16384];
                    while let Ok(n) = c_in.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        while flag.load(Relaxed) {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        if s_out.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = s_out.shutdown(std::net::Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut s_in, &mut c_out);
                    let _ = c_out.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        StallingProxy { url, stalled }
    }

    /// Stops (true) or resumes (false) passing requests on.
    pub fn stall(&self, on: bool) {
        self.stalled.store(on, std::sync::atomic::Ordering::Relaxed);
    }
}
