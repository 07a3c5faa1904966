//! Test scaffolding (feature `testkit`, which only dev-dependencies and the soak binary turn on).
//!
//! - [`ScriptedServer`]: a scripted HTTP server on loopback, for tests that stand in for services
//!   we cannot reach (web-search providers, web pages, remote retrievers). A handler closure sees
//!   each request and returns the canned reply; every request is recorded with its arrival time,
//!   so tests can count provider calls and measure the spacing between them.
//! - [`RedisServer`]: a real redis-server on a free port, killed on drop.
//! - [`CutProxy`]: a loopback TCP proxy that cuts the connections through it, for what must
//!   survive a dropped connection.
//! - [`LocalServer`]: an env-server in this process on a free loopback port (BM25 over a corpus,
//!   or any backends), on the caller's runtime or on one of its own.
//! - [`spawn_ready`]: an env-server process (or anything taking `--bind`) started on a free
//!   loopback port and waited for until it listens; [`ServerProcess`] kills it on drop.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

use crate::Backends;
use crate::config::ServerConfig;
use crate::net::ServerError;
use crate::search::LocalIndex;

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    /// Path and query string, e.g. `/search?q=x&format=json`.
    pub target: String,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub at: Instant,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// A query-string parameter, percent-decoded.
    pub fn query_param(&self, name: &str) -> Option<String> {
        let url = url::Url::parse(&format!("http://x{}", self.target)).ok()?;
        url.query_pairs().find(|(k, _)| k == name).map(|(_, v)| v.into_owned())
    }
}

/// The reply to one request.
#[derive(Debug, Clone)]
pub struct Canned {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Wait this long before answering (a slow or hanging service).
    pub delay: Duration,
}

impl Canned {
    pub fn json(value: &serde_json::Value) -> Canned {
        Canned::status(200, value.to_string()).header("content-type", "application/json")
    }

    pub fn html(body: impl Into<String>) -> Canned {
        Canned::status(200, body.into()).header("content-type", "text/html; charset=utf-8")
    }

    pub fn status(status: u16, body: impl Into<Vec<u8>>) -> Canned {
        Canned { status, headers: Vec::new(), body: body.into(), delay: Duration::ZERO }
    }

    pub fn header(mut self, name: &str, value: &str) -> Canned {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    pub fn delayed(mut self, delay: Duration) -> Canned {
        self.delay = delay;
        self
    }
}

type Handler = dyn Fn(&Recorded) -> Canned + Send + Sync;

/// The server; it stops when dropped.
#[derive(Debug)]
pub struct ScriptedServer {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<Recorded>>>,
    _stop: watch::Sender<bool>,
}

impl ScriptedServer {
    /// Bind `127.0.0.1:0` and serve with `handler`. Needs a tokio runtime.
    pub async fn start(handler: impl Fn(&Recorded) -> Canned + Send + Sync + 'static) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let (stop_tx, stop_rx) = watch::channel(false);
        let server_log = log.clone();
        tokio::spawn(async move {
            let mut stop = stop_rx;
            loop {
                let accepted = tokio::select! {
                    _ = stop.changed() => break,
                    a = listener.accept() => a,
                };
                let Ok((stream, _)) = accepted else { continue };
                let (log, handler) = (server_log.clone(), handler.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| answer(req, log.clone(), handler.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { addr, log, _stop: stop_tx })
    }

    /// `http://127.0.0.1:<port>`, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    pub fn count(&self) -> usize {
        self.log.lock().map(|l| l.len()).unwrap_or(0)
    }
}

async fn answer(
    req: hyper::Request<hyper::body::Incoming>,
    log: Arc<Mutex<Vec<Recorded>>>,
    handler: Arc<Handler>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let at = Instant::now();
    let method = req.method().to_string();
    let target = req.uri().path_and_query().map(|p| p.to_string()).unwrap_or_else(|| "/".into());
    let headers = req
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str().to_ascii_lowercase(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let body = req.into_body().collect().await.map(|b| b.to_bytes().to_vec()).unwrap_or_default();
    let recorded = Recorded { method, target, headers, body, at };
    if let Ok(mut l) = log.lock() {
        l.push(recorded.clone());
    }
    let canned = handler(&recorded);
    if !canned.delay.is_zero() {
        tokio::time::sleep(canned.delay).await;
    }
    let mut resp = hyper::Response::new(Full::new(Bytes::from(canned.body)));
    *resp.status_mut() = hyper::StatusCode::from_u16(canned.status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    for (n, v) in canned.headers {
        if let (Ok(n), Ok(v)) =
            (hyper::header::HeaderName::from_bytes(n.as_bytes()), hyper::header::HeaderValue::from_str(&v))
        {
            resp.headers_mut().append(n, v);
        }
    }
    Ok(resp)
}

/// A real `redis-server` on a free loopback port, for the Redis cache tests; killed on drop.
/// The binary is `$GROVE_REDIS_SERVER` or `redis-server` on `PATH` (`cargo xtask test` installs
/// it). Nothing is persisted: `--save "" --appendonly no`, working directory in a temp dir.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// Start one and wait (up to 10 s) until it answers `PING`. A missing binary is an error
    /// that says to install redis-server.
    pub fn start() -> std::io::Result<RedisServer> {
        let bin = std::env::var("GROVE_REDIS_SERVER").ok().filter(|b| !b.is_empty());
        let bin = bin.unwrap_or_else(|| "redis-server".to_string());
        let mut last_err = None;
        // A port picked free can be taken before redis binds it: retry with another.
        for _ in 0..3 {
            match Self::try_start(&bin) {
                Ok(server) => return Ok(server),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(e),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| std::io::Error::other("redis-server did not start")))
    }

    fn try_start(bin: &str) -> std::io::Result<RedisServer> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("redis.log");
        let child = Command::new(bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(&log)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    std::io::Error::new(
                        e.kind(),
                        format!(
                            "`{bin}` not found: install redis-server (apt-get install redis-server; \
                             `cargo xtask test` installs it) or point GROVE_REDIS_SERVER at the binary"
                        ),
                    )
                } else {
                    std::io::Error::new(e.kind(), format!("starting `{bin}`: {e}"))
                }
            })?;
        // From here on, drop kills the process on every error path.
        let mut server = RedisServer { child, port, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if server.answers_ping() {
                return Ok(server);
            }
            let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(status) = server.child.try_wait()? {
                return Err(std::io::Error::other(format!(
                    "redis-server on port {port} exited ({status}); log:\n{}",
                    log_text()
                )));
            }
            if Instant::now() > deadline {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("redis-server on port {port} did not answer PING within 10 s; log:\n{}", log_text()),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn answers_ping(&self) -> bool {
        use std::io::{Read, Write};
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).is_ok() && buf == *b"+PONG\r\n"
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback TCP proxy in front of a server that can cut every connection through it, to test
/// what survives a dropped connection. `cut_after(bytes)` arms a one-shot cut once that many
/// bytes have gone from the server to clients (counted over all connections), so a cut lands in
/// the middle of a run, mid-frame included; `cut_now` cuts at once. [`CutMode`] says what a cut
/// leaves behind. Used by the reattach tests and by `env-server-soak --drop-every-secs`.
#[derive(Debug)]
pub struct CutProxy {
    /// `ws://` address of the proxy.
    pub url: String,
    state: Arc<ProxyState>,
}

#[derive(Debug, Default)]
struct ProxyState {
    down_bytes: std::sync::atomic::AtomicU64,
    cut_at: std::sync::atomic::AtomicU64,
    cuts: std::sync::atomic::AtomicU64,
    accepted: std::sync::atomic::AtomicU64,
    mode: std::sync::atomic::AtomicU8,
    /// New connections are closed at once until this many have been refused.
    refuse: std::sync::atomic::AtomicU64,
    generation: Mutex<Option<watch::Sender<u64>>>,
    graveyard: Mutex<Vec<tokio::net::TcpStream>>,
}

impl CutProxy {
    /// A proxy in front of `upstream` (`ws://host:port/`), served on the current runtime.
    pub async fn start(upstream: &str) -> std::io::Result<CutProxy> {
        use std::sync::atomic::Ordering::SeqCst;
        let upstream = upstream.trim_start_matches("ws://").trim_end_matches('/').to_owned();
        let state = Arc::new(ProxyState::default());
        state.cut_at.store(u64::MAX, SeqCst);
        let (gen_tx, gen_rx) = watch::channel(0u64);
        *state.generation.lock().unwrap_or_else(|p| p.into_inner()) = Some(gen_tx);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("ws://{}/", listener.local_addr()?);
        let st = state.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                st.accepted.fetch_add(1, SeqCst);
                if st.refuse.load(SeqCst) > 0 {
                    st.refuse.fetch_sub(1, SeqCst);
                    drop(client);
                    continue;
                }
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else { continue };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                tokio::spawn(proxy_one(client, server, st.clone(), gen_rx.clone()));
            }
        });
        Ok(CutProxy { url, state })
    }

    /// Cut every connection once `bytes` more bytes have gone from the server to clients.
    pub fn cut_after(&self, bytes: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        self.state.cut_at.store(self.state.down_bytes.load(SeqCst) + bytes, SeqCst);
    }

    pub fn cut_now(&self) {
        cut(&self.state);
    }

    /// What the next cuts leave behind.
    pub fn set_mode(&self, mode: CutMode) {
        self.state.mode.store(mode as u8, std::sync::atomic::Ordering::SeqCst);
    }

    /// Close the next `n` connections at accept (a server that is unreachable for a while).
    pub fn refuse_next(&self, n: u64) {
        self.state.refuse.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Bytes sent from the server to clients so far.
    pub fn down_bytes(&self) -> u64 {
        self.state.down_bytes.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn cuts(&self) -> u64 {
        self.state.cuts.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn accepted(&self) -> u64 {
        self.state.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// What a cut of [`CutProxy`] leaves behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutMode {
    /// Both ends are closed: client and server see the connection end.
    Close = 0,
    /// The client's end is closed; the server's stays open (a peer that vanished without a
    /// reset, as behind a NAT that dropped the flow): the server learns of it from a reattach.
    KeepServerSide = 1,
    /// Nothing is closed and nothing more is forwarded: only a heartbeat notices.
    Freeze = 2,
}

fn cut(state: &ProxyState) {
    state.cuts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    if let Some(tx) = state.generation.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        tx.send_modify(|g| *g += 1);
    }
}

async fn proxy_one(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    state: Arc<ProxyState>,
    mut generation: watch::Receiver<u64>,
) {
    use std::sync::atomic::Ordering::SeqCst;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let born = *generation.borrow_and_update();
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if sw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // Forward up to the cut point, then cut: the client may get half a frame.
            let before = state.down_bytes.fetch_add(n as u64, SeqCst);
            let at = state.cut_at.load(SeqCst);
            if before + n as u64 >= at {
                let keep = at.saturating_sub(before) as usize;
                let _ = cw.write_all(&buf[..keep.min(n)]).await;
                state.cut_at.store(u64::MAX, SeqCst);
                cut(&state);
                return;
            }
            if cw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let cut_signal = generation.wait_for(|g| *g != born);
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = cut_signal => {}
    }
    let mode = state.mode.load(SeqCst);
    let mut graveyard = state.graveyard.lock().unwrap_or_else(|p| p.into_inner());
    if mode >= CutMode::KeepServerSide as u8
        && let Ok(server) = sr.reunite(sw)
    {
        graveyard.push(server);
    }
    if mode == CutMode::Freeze as u8
        && let Ok(client) = cr.reunite(cw)
    {
        graveyard.push(client);
    }
}

/// An env-server in this process, listening on `127.0.0.1:<free port>`. `start` and
/// `start_with` serve on the caller's tokio runtime; `start_blocking` and `start_blocking_with`
/// on a runtime of their own (two worker threads), for tests that have none. Dropping it stops
/// the server (and its runtime, when it has one); `shutdown` stops it and checks it ended cleanly.
#[derive(Debug)]
pub struct LocalServer {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<Result<(), ServerError>>>,
    /// Dropped last: the server's tasks run on it.
    rt: Option<tokio::runtime::Runtime>,
}

impl LocalServer {
    /// BM25 over `corpus` (its index built beside it, `<corpus>.index`, when missing) with
    /// `config`, on the current runtime.
    pub async fn start(corpus: &Path, config: ServerConfig) -> std::io::Result<LocalServer> {
        Self::start_with(config, bm25(corpus)?).await
    }

    /// `backends` with `config`, on the current runtime.
    pub async fn start_with(config: ServerConfig, backends: Backends) -> std::io::Result<LocalServer> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(crate::run(listener, config, backends, async {
            let _ = stopped.await;
        }));
        Ok(LocalServer { addr, stop: Some(stop), handle: Some(handle), rt: None })
    }

    /// [`LocalServer::start`] on a runtime of its own.
    pub fn start_blocking(corpus: &Path, config: ServerConfig) -> std::io::Result<LocalServer> {
        Self::start_blocking_with(config, bm25(corpus)?)
    }

    /// [`LocalServer::start_with`] on a runtime of its own.
    pub fn start_blocking_with(config: ServerConfig, backends: Backends) -> std::io::Result<LocalServer> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let mut server = rt.block_on(Self::start_with(config, backends))?;
        server.rt = Some(rt);
        Ok(server)
    }

    /// `ws://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("ws://{}/", self.addr)
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn http(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stop the server and wait (up to 10 s) until it has finished; an error when it does not
    /// finish in time or `run` returned one. For a server on the caller's runtime.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let Some(handle) = self.handle.take() else { return Ok(()) };
        match tokio::time::timeout(Duration::from_secs(10), handle).await {
            Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the server did not stop within 10 s")),
            Ok(Err(join)) => Err(std::io::Error::other(join)),
            Ok(Ok(Err(e))) => Err(std::io::Error::other(e)),
            Ok(Ok(Ok(()))) => Ok(()),
        }
    }
}

/// The local BM25 backend over `corpus`, its index built beside it when missing.
fn bm25(corpus: &Path) -> std::io::Result<Backends> {
    let index = LocalIndex::open_or_build(corpus, None, &mut |_| {}).map_err(std::io::Error::other)?;
    Ok(Backends::new("local", Arc::new(index)))
}

/// An env-server process started by [`spawn_ready`], listening on `addr`; killed (and reaped)
/// when dropped.
#[derive(Debug)]
pub struct ServerProcess {
    pub child: Child,
    pub addr: SocketAddr,
}

impl ServerProcess {
    /// `ws://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("ws://{}/", self.addr)
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn http(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `Some(status)` once the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Add `--bind 127.0.0.1:<free port>` to `cmd` (say `env-server serve --corpus ...`, with its
/// environment and output already set), start it, and wait until the port accepts connections:
/// the env-server opens its listener only once its backends are ready. An error, with the
/// process killed, when it exits first (the error carries its stderr when that was piped) or is
/// not listening `within`.
pub async fn spawn_ready(mut cmd: Command, within: Duration) -> std::io::Result<ServerProcess> {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let child = cmd.arg("--bind").arg(addr.to_string()).spawn()?;
    let mut process = ServerProcess { child, addr };
    let started = Instant::now();
    loop {
        if let Some(status) = process.exited() {
            let mut stderr = String::new();
            if let Some(mut pipe) = process.child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
            }
            return Err(std::io::Error::other(format!(
                "the server exited ({status}) before listening on {addr}{}{stderr}",
                if stderr.is_empty() { "" } else { ":\n" }
            )));
        }
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(process);
        }
        if started.elapsed() > within {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the server did not listen on {addr} within {within:?}"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
