//! A JSON-RPC proxy between `potluck serve` and `potluck chain` that plays a slow or lagging node: it delays chosen methods, and can make `getblockchaininfo` report a node that is catching up (more headers than blocks, initial block download).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does to the calls passing through it.
#[derive(Debug, Default, Clone)]
pub struct Rules {
    /// Calls of these methods wait this long before they are forwarded.
    pub delays: HashMap<String, Duration>,
    /// `getblockchaininfo` reports this many headers beyond its blocks.
    pub headers_ahead: u32,
    /// `getblockchaininfo` reports initial block download.
    pub initial_block_download: bool,
}

/// A running proxy; dropping it leaves the listener task running until the test ends.
pub struct RpcProxy {
    /// Where `serve --bitcoind-url` should point.
    pub addr: SocketAddr,
    rules: Arc<Mutex<Rules>>,
}

impl RpcProxy {
    /// Listens on an ephemeral port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let rules = Arc::new(Mutex::new(Rules::default()));
        let shared = rules.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve_connection(conn, upstream, shared.clone()));
            }
        });
        Self { addr, rules }
    }

    /// `http://ADDR/`.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Calls of `method` wait `delay` from now on (zero: none).
    pub fn delay(&self, method: &str, delay: Duration) {
        self.rules
            .lock()
            .unwrap()
            .delays
            .insert(method.to_string(), delay);
    }

    /// The node reports `ahead` headers beyond its blocks (0: in sync) and
    /// whether it is in initial block download.
    pub fn lag(&self, ahead: u32, initial_block_download: bool) {
        let mut r = self.rules.lock().unwrap();
        r.headers_ahead = ahead;
        r.initial_block_download = initial_block_download;
    }
}

/// One keep-alive connection from the service: request by request.
async fn serve_connection(conn: TcpStream, upstream: SocketAddr, rules: Arc<Mutex<Rules>>) {
    let (read, mut write) = conn.into_split();
    let mut read = BufReader::new(read);
    loop {
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            match read.read_line(&mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" {
                break;
            }
            head.push(line.trim_end().to_string());
        }
        let Some(request_line) = head.first().cloned() else {
            return;
        };
        let headers: Vec<(String, String)> = head[1..]
            .iter()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let length: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; length];
        if read.read_exact(&mut body).await.is_err() {
            return;
        }
        let path = request_line.split(' ').nth(1).unwrap_or("/").to_string();
        let call: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let method = call["method"].as_str().unwrap_or("").to_string();
        let rules_now = rules.lock().unwrap().clone();
        if let Some(delay) = rules_now.delays.get(&method) {
            tokio::time::sleep(*delay).await;
        }
        let auth: Vec<(&str, &str)> = headers
            .iter()
            .filter(|(k, _)| k == "authorization")
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let resp = super::request(upstream, "POST", &path, &auth, Some(body)).await;
        let mut answer = resp.body;
        if method == "getblockchaininfo"
            && (rules_now.headers_ahead > 0 || rules_now.initial_block_download)
        {
            if let Ok(mut v) = serde_json::from_slice::<Value>(&answer) {
                let blocks = v["result"]["blocks"].as_u64().unwrap_or(0);
                v["result"]["headers"] = (blocks + u64::from(rules_now.headers_ahead)).into();
                v["result"]["initialblockdownload"] = rules_now.initial_block_download.into();
                answer = v.to_string().into_bytes();
            }
        }
        let head = format!(
            "HTTP/1.1 {} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            resp.status,
            answer.len()
        );
        if write.write_all(head.as_bytes()).await.is_err()
            || write.write_all(&answer).await.is_err()
        {
            return;
        }
    }
}

/// `potluck chain` as its own process (blocks on demand only), restartable
/// on the same data and port.
pub struct ChainProcess {
    /// Its data directory (the RPC cookie is `.cookie` there).
    pub dir: PathBuf,
    /// Its RPC address.
    pub addr: SocketAddr,
    child: Option<tokio::process::Child>,
}

impl ChainProcess {
    /// Starts it on an ephemeral port under `dir`.
    pub async fn start(dir: PathBuf) -> Self {
        Self::start_on(dir, 0).await
    }

    /// Starts it on `port` (0: the OS's choice) under `dir`.
    pub async fn start_on(dir: PathBuf, port: u16) -> Self {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_potluck"))
            .arg("chain")
            .args(["--rpc-bind", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(&dir)
            .args(["--block-interval", "0"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("potluck chain printed its address")
            .unwrap()
            .expect("potluck chain exited");
        let addr = line
            .rsplit("http://")
            .next()
            .unwrap()
            .trim()
            .trim_end_matches('/')
            .parse()
            .unwrap();
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self {
            dir,
            addr,
            child: Some(child),
        }
    }

    /// SIGKILL, and waits until it is gone.
    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().await.unwrap();
        }
    }

    /// SIGKILL, then a start on the same data directory and port.
    pub async fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
        *self = Self::start_on(self.dir.clone(), self.addr.port()).await;
    }

    /// An RPC client of the chain (not through the proxy).
    pub fn rpc(&self) -> chain::BitcoindRpc {
        chain::BitcoindRpc::new(chain::RpcConfig::new(
            format!("http://{}/", self.addr),
            chain::Auth::Cookie(self.dir.join(".cookie")),
        ))
        .unwrap()
    }

    /// The cookie file, for `serve --bitcoind-cookie`.
    pub fn cookie(&self) -> String {
        self.dir.join(".cookie").display().to_string()
    }
}
