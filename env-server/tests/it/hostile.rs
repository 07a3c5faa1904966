//! Hostile clients against the real `env-server` binary: malformed MessagePack, huge declared
//! lengths, oversize and never-finished frames, request floods, slowloris and idle connections,
//! fork bombs and megabyte actions. Each attack gets its typed error or its documented
//! disconnect; meanwhile a well-behaved client on another connection sees no errors and every
//! reply within a generous liveness bound, and the server's resident memory stays bounded.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::{em_task, f1_task, fixture, gauge, http_get};
use futures_util::{SinkExt, StreamExt};
use grove_env_server::testkit::{ServerProcess, spawn_ready};
use grove_protocol::client::{Client, ClientError, ClientOptions};
use grove_protocol::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

/// A reply slower than this is a liveness failure (not a speed target).
const LIVENESS: Duration = Duration::from_secs(5);
/// Resident-memory growth that an unbounded allocation would break.
const RSS_BOUND_KB: u64 = 200 * 1024;

// ---------------------------------------------------------------------------------------------
// The server under attack: the env-server binary as a child process.

struct ChildServer {
    process: ServerProcess,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl ChildServer {
    /// Start `env-server serve` over a copy of the fixture corpus with `toml` as its config.
    async fn start(toml: &str) -> ChildServer {
        Self::start_limited(toml, None).await
    }

    /// The same, with the server's open-file limit lowered to `nofile` (`ulimit -n`).
    async fn start_limited(toml: &str, nofile: Option<u64>) -> ChildServer {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("corpus.jsonl");
        std::fs::copy(fixture("wiki18-sample.jsonl"), &corpus).unwrap();
        let config = dir.path().join("server.toml");
        std::fs::write(&config, toml).unwrap();
        let log = dir.path().join("server.log");
        let mut command = match nofile {
            None => Command::new(env!("CARGO_BIN_EXE_env-server")),
            Some(n) => {
                let mut c = Command::new("sh");
                c.args(["-c", &format!("ulimit -n {n} && exec \"$0\" \"$@\""), env!("CARGO_BIN_EXE_env-server")]);
                c
            }
        };
        command
            .args(["serve", "--config"])
            .arg(&config)
            .arg("--corpus")
            .arg(&corpus)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        match spawn_ready(command, Duration::from_secs(30)).await {
            Ok(process) => ChildServer { process, log, _dir: dir },
            Err(e) => {
                let bytes = std::fs::read(&log).unwrap_or_default();
                let tail = String::from_utf8_lossy(&bytes[bytes.len().saturating_sub(4000)..]);
                panic!("server did not come up: {e}\n{tail}");
            }
        }
    }

    fn url(&self) -> String {
        self.process.url()
    }

    fn addr(&self) -> String {
        self.process.addr.to_string()
    }

    /// The server's resident set size in KiB.
    fn rss_kb(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.process.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS in /proc/<pid>/status");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    fn assert_alive(&mut self) {
        assert!(self.process.exited().is_none(), "the server died:\n{}", self.log_tail());
    }

    fn log_tail(&self) -> String {
        let bytes = std::fs::read(&self.log).unwrap_or_default();
        String::from_utf8_lossy(&bytes[bytes.len().saturating_sub(4000)..]).into_owned()
    }

    /// Print the memory figures and check the growth.
    fn check_rss(&mut self, test: &str, before: u64) {
        self.assert_alive();
        let after = self.rss_kb();
        let growth = after.saturating_sub(before);
        println!("[{test}] server VmRSS before {before} KiB, after {after} KiB, growth {growth} KiB");
        assert!(growth < RSS_BOUND_KB, "[{test}] server memory grew by {growth} KiB");
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- server log ---\n{}", self.log_tail());
        }
        // Then `process` kills the server.
    }
}

// ---------------------------------------------------------------------------------------------
// The well-behaved client: create, search, fork, answer, close, in a loop.

#[derive(Debug, Default)]
struct GoodReport {
    rounds: u64,
    replies: u64,
    max_latency: Duration,
    errors: Vec<String>,
}

struct Good {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<GoodReport>,
}

impl Good {
    /// Connect (so the client holds its connection slot before any attack starts) and loop.
    async fn start(url: &str) -> Good {
        let client =
            Client::connect(url, ClientOptions { token: None, name: Some("good".into()), ..Default::default() })
                .await
                .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut report = GoodReport::default();
            while !flag.load(Ordering::Relaxed) {
                if let Err(e) = round(&client, &mut report).await {
                    report.errors.push(e);
                    break;
                }
                report.rounds += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            report
        });
        Good { stop, task }
    }

    /// Stop the loop, print the figures and check that nothing went wrong.
    async fn finish(self, test: &str) -> GoodReport {
        self.stop.store(true, Ordering::Relaxed);
        let report = tokio::time::timeout(LIVENESS * 2, self.task).await.expect("good client stopped").unwrap();
        println!(
            "[{test}] good client: {} rounds, {} replies, max latency {:?}, errors {:?}",
            report.rounds, report.replies, report.max_latency, report.errors
        );
        assert!(report.errors.is_empty(), "[{test}] the good client saw errors: {:?}", report.errors);
        assert!(report.rounds > 0, "[{test}] the good client made no progress");
        report
    }
}

async fn timed<T>(
    report: &mut GoodReport,
    what: &str,
    fut: impl Future<Output = Result<T, ClientError>>,
) -> Result<T, String> {
    let started = Instant::now();
    let r = tokio::time::timeout(LIVENESS, fut).await;
    report.max_latency = report.max_latency.max(started.elapsed());
    report.replies += 1;
    match r {
        Err(_) => Err(format!("{what}: no reply within {LIVENESS:?}")),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Ok(Ok(v)) => Ok(v),
    }
}

async fn round(c: &Client, r: &mut GoodReport) -> Result<(), String> {
    let created = timed(r, "create", c.create_episodes(vec![em_task()], Default::default())).await?;
    let ep = created.into_iter().next().ok_or("no episode")?.map_err(|e| format!("create: {e:?}"))?.episode;
    let obs = timed(r, "search", c.step_text(ep, "<search> Ada Kerrigan </search>")).await?;
    if obs.done || obs.error.is_some() || !obs.text.contains("Kerrigan") {
        return Err(format!("search: unexpected observation {obs:?}"));
    }
    let forked = timed(r, "fork", c.fork(vec![ForkSpec { episode: ep, at_step: 1, n: 2 }])).await?;
    let children = forked.into_iter().next().ok_or("no fork result")?.map_err(|e| format!("fork: {e:?}"))?.children;
    let obs = timed(r, "answer", c.step_text(children[0], "<answer> Ada Kerrigan </answer>")).await?;
    if !obs.done || obs.reward.as_ref().map(|w| w.metric_value) != Some(1.0) {
        return Err(format!("answer: unexpected observation {obs:?}"));
    }
    let mut all = children;
    all.push(ep);
    for closed in timed(r, "close", c.close(all)).await? {
        closed.map_err(|e| format!("close: {e:?}"))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Raw connections.

async fn raw(url: &str) -> Ws {
    // No read limits on our side: the server's replies are what is being checked.
    let config = WebSocketConfig::default().max_message_size(None).max_frame_size(None);
    tokio_tungstenite::connect_async_with_config(url, Some(config), false).await.unwrap().0
}

async fn raw_hello(url: &str) -> Ws {
    let mut ws = raw(url).await;
    let hello = Request::Hello(Hello { protocol_version: PROTOCOL_VERSION, client: "hostile".into(), resume: None });
    ws.send(frame(1, hello)).await.unwrap();
    assert!(matches!(recv(&mut ws).await.msg, Response::Welcome(_)));
    ws
}

fn frame(id: u64, msg: Request) -> Message {
    Message::Binary(encode(&Envelope::new(id, msg)).unwrap().into())
}

async fn recv(ws: &mut Ws) -> Envelope<Response> {
    loop {
        let m = tokio::time::timeout(LIVENESS, ws.next()).await.expect("a reply in time").unwrap().unwrap();
        if let Message::Binary(b) = m {
            return decode_response(&b).unwrap();
        }
    }
}

fn err_of(env: &Envelope<Response>) -> (u64, ErrorCode) {
    match &env.msg {
        Response::Error(e) => (env.id, e.code),
        other => panic!("expected an error, got {other:?}"),
    }
}

/// `{"id": id, "msg": <msg bytes>}` with the msg written by hand.
fn envelope_bytes(id: u8, msg: &[u8]) -> Vec<u8> {
    assert!(id < 128);
    let mut b = vec![0x82, 0xa2, b'i', b'd', id, 0xa3, b'm', b's', b'g'];
    b.extend_from_slice(msg);
    b
}

fn fixstr(s: &str) -> Vec<u8> {
    assert!(s.len() < 32);
    let mut b = vec![0xa0 | s.len() as u8];
    b.extend_from_slice(s.as_bytes());
    b
}

/// `{name: {field: <value>}}`: a request variant with one field written by hand.
fn variant(name: &str, field: &str, value: &[u8]) -> Vec<u8> {
    let mut b = vec![0x81];
    b.extend(fixstr(name));
    b.push(0x81);
    b.extend(fixstr(field));
    b.extend_from_slice(value);
    b
}

/// Whether the server has closed a raw WebSocket (close frame, EOF or reset), waiting at most
/// `within`. Error replies that precede the close are collected.
async fn closed_within(ws: &mut Ws, within: Duration) -> (bool, Vec<ErrorCode>) {
    let deadline = tokio::time::Instant::now() + within;
    let mut codes = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => return (false, codes),
            Ok(None | Some(Err(_)) | Some(Ok(Message::Close(_)))) => return (true, codes),
            Ok(Some(Ok(Message::Binary(b)))) => {
                if let Ok(Envelope { msg: Response::Error(e), .. }) = decode_response(&b) {
                    codes.push(e.code);
                }
            }
            Ok(Some(Ok(_))) => {}
        }
    }
}

/// Whether the server has closed a raw TCP connection, waiting at most `within`.
async fn tcp_closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

fn open_files_limit() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024)
}

const UPGRADE: &str = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
                       Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";

/// RFC 6455 §4.2.2: an upgrade asking for a WebSocket version other than 13 (or none) is
/// answered 426 with `Sec-WebSocket-Version: 13`, not switched; version 13 still upgrades.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_websocket_version_gets_426() {
    let server = ChildServer::start("").await;
    let addr = server.addr();
    for version in [Some("99"), Some("8"), None] {
        let head = match version {
            Some(v) => UPGRADE.replace("Sec-WebSocket-Version: 13", &format!("Sec-WebSocket-Version: {v}")),
            None => UPGRADE.replace("Sec-WebSocket-Version: 13\r\n", ""),
        };
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        let mut reply = vec![0u8; 4096];
        let n = tokio::time::timeout(LIVENESS, s.read(&mut reply)).await.unwrap().unwrap();
        let reply = String::from_utf8_lossy(&reply[..n]).to_ascii_lowercase();
        assert!(reply.starts_with("http/1.1 426"), "{version:?}: {reply}");
        assert!(reply.contains("sec-websocket-version: 13"), "{version:?}: {reply}");
    }
    drop(raw_tcp_ws(&addr).await);
    drop(server);
}

/// A WebSocket opened by hand, for frame-level abuse below tungstenite.
async fn raw_tcp_ws(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(UPGRADE.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tokio::time::timeout(LIVENESS, s.read_exact(&mut byte)).await.unwrap().unwrap();
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
    s
}

/// A masked binary frame header (the mask is all zeroes, so the payload goes as is).
fn ws_header(len: u64) -> Vec<u8> {
    let mut h = vec![0x82];
    if len < 126 {
        h.push(0x80 | len as u8);
    } else if len <= u16::MAX as u64 {
        h.push(0x80 | 126);
        h.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        h.push(0x80 | 127);
        h.extend_from_slice(&len.to_be_bytes());
    }
    h.extend_from_slice(&[0, 0, 0, 0]);
    h
}

// ---------------------------------------------------------------------------------------------
// The attacks.

/// Malformed MessagePack, wrong types and headers declaring 4 GiB strings, binaries, arrays, maps
/// and extensions inside frames of a few bytes, plus nesting bombs: each is `malformed_frame`
/// (with the id when it can be read), nothing is allocated for the declared lengths, and the
/// connection keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_msgpack_and_huge_declared_lengths() {
    const T: &str = "malformed";
    let mut server = ChildServer::start("").await;
    let before = server.rss_kb();
    let good = Good::start(&server.url()).await;

    let huge = |marker: u8| {
        let mut b = vec![marker];
        b.extend_from_slice(&u32::MAX.to_be_bytes());
        b.extend_from_slice(b"abc");
        b
    };
    let mut deep = vec![0x81, 0xa1, b'q'];
    deep.extend(std::iter::repeat_n(0x91u8, 100_000));
    let tool = |args: &[u8]| {
        let mut a = vec![0x81, 0xa4, b'T', b'o', b'o', b'l', 0x82];
        a.extend(fixstr("name"));
        a.extend(fixstr("search"));
        a.extend(fixstr("arguments"));
        a.extend_from_slice(args);
        let mut action = vec![0x82];
        action.extend(fixstr("episode"));
        action.push(0x01);
        action.extend(fixstr("action"));
        action.extend(a);
        let mut actions = vec![0x91];
        actions.extend(action);
        variant("Step", "actions", &actions)
    };
    let mut text_4g = vec![0x81, 0xa4, b'T', b'e', b'x', b't'];
    text_4g.extend(huge(0xdb));
    let mut step_4g = vec![0x91, 0x82];
    step_4g.extend(fixstr("episode"));
    step_4g.push(0x01);
    step_4g.extend(fixstr("action"));
    step_4g.extend(text_4g);

    // (name, frame, id the error may carry)
    let cases: Vec<(&str, Vec<u8>, u64)> = vec![
        ("str32 of 4 GiB as msg", envelope_bytes(20, &huge(0xdb)), 20),
        ("bin32 of 4 GiB as msg", envelope_bytes(21, &huge(0xc6)), 21),
        ("array32 of 4G items as msg", envelope_bytes(22, &huge(0xdd)), 22),
        ("map32 of 4G entries as msg", envelope_bytes(23, &huge(0xdf)), 23),
        ("ext32 of 4 GiB as msg", envelope_bytes(24, &huge(0xc9)), 24),
        ("CreateEpisodes with 4G tasks", envelope_bytes(25, &variant("CreateEpisodes", "tasks", &huge(0xdd))), 25),
        ("Step with 4G actions", envelope_bytes(26, &variant("Step", "actions", &huge(0xdd))), 26),
        ("Close with 4G episodes", envelope_bytes(27, &variant("Close", "episodes", &huge(0xdd))), 27),
        ("a 4 GiB action text", envelope_bytes(28, &variant("Step", "actions", &step_4g)), 28),
        ("tool arguments with 4G entries", envelope_bytes(29, &tool(&huge(0xdf))), 29),
        ("tool arguments nested 100k deep", envelope_bytes(30, &tool(&deep)), 30),
        ("msg nested 100k deep", envelope_bytes(31, &[0x91; 100_000]), 31),
        ("a whole frame of map32 of 4G entries", huge(0xdf), 0),
        ("a whole frame of array32 nested 100k deep", [0xdd, 0, 0, 0, 1].repeat(20_000), 0),
        ("an empty frame", vec![], 0),
        ("nil", vec![0xc0], 0),
        (
            "id as a string",
            [vec![0x82, 0xa2, b'i', b'd', 0xa1, b'7', 0xa3, b'm', b's', b'g'], fixstr("Stats")].concat(),
            0,
        ),
        (
            "negative id",
            envelope_bytes(0, &fixstr("Stats")).into_iter().map(|b| if b == 0 { 0xff } else { b }).collect(),
            0,
        ),
        ("msg as an integer", envelope_bytes(32, &[0x2a]), 32),
        ("Ping nonce as a string", envelope_bytes(33, &variant("Ping", "nonce", &fixstr("many"))), 33),
        ("Step actions as a map", envelope_bytes(34, &variant("Step", "actions", &[0x80])), 34),
        ("invalid UTF-8 in a string", envelope_bytes(35, &[0xa5, b'S', 0xff, 0xfe, b't', b's']), 35),
        (
            "truncated Hello",
            encode(&Envelope::new(36u64, Request::Ping(Ping { nonce: 9 }))).unwrap()[..12].to_vec(),
            36,
        ),
    ];

    let mut ws = raw_hello(&server.url()).await;
    for (name, bytes, id) in &cases {
        ws.send(Message::Binary(bytes.clone().into())).await.unwrap();
        let reply = recv(&mut ws).await;
        let Response::Error(e) = &reply.msg else { panic!("{name}: expected an error, got {reply:?}") };
        let (got_id, code) = (reply.id, e.code);
        assert_eq!(code, ErrorCode::MalformedFrame, "{name}");
        assert!(got_id == *id || got_id == 0, "{name}: reply id {got_id}, request id {id}");
    }
    // The connection still works.
    ws.send(frame(99, Request::Ping(Ping { nonce: 4 }))).await.unwrap();
    assert!(matches!(recv(&mut ws).await.msg, Response::Pong(Ping { nonce: 4 })));

    // And again, many times over on a few connections at once, while the good client works.
    let mut attackers = Vec::new();
    for _ in 0..4 {
        let url = server.url();
        let cases: Vec<Vec<u8>> = cases.iter().map(|c| c.1.clone()).collect();
        attackers.push(tokio::spawn(async move {
            let mut ws = raw_hello(&url).await;
            for _ in 0..25 {
                for bytes in &cases {
                    ws.send(Message::Binary(bytes.clone().into())).await.unwrap();
                    assert_eq!(err_of(&recv(&mut ws).await).1, ErrorCode::MalformedFrame);
                }
            }
        }));
    }
    for a in attackers {
        a.await.unwrap();
    }
    good.finish(T).await;
    server.check_rss(T, before);
}

/// Frames over the limits and frames that never finish: a WebSocket header declaring a 2^62-byte
/// frame gets `frame_too_large` (id 0) and the close at once, without the server waiting for or
/// allocating the payload; a frame trickled a byte at a time, and one whose payload never comes,
/// are closed by the idle policy (`connection_idle_secs` counts whole frames, not bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_and_never_finished_frames() {
    const T: &str = "oversize";
    let mut server = ChildServer::start("[limits]\nconnection_idle_secs = 2\nmax_frame_bytes = 65536\n").await;
    let before = server.rss_kb();
    let good = Good::start(&server.url()).await;

    // A header declaring 2^62 bytes, then nothing.
    let mut s = raw_tcp_ws(&server.addr()).await;
    s.write_all(&ws_header(1 << 62)).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(LIVENESS, s.read(&mut buf)).await.unwrap().unwrap();
    assert!(n > 2 && buf[0] == 0x82, "a binary error frame first");
    let payload = &buf[2..n.min(2 + buf[1] as usize)];
    assert_eq!(err_of(&decode_response(payload).unwrap()), (0, ErrorCode::FrameTooLarge));
    assert!(tcp_closed_within(&mut s, LIVENESS).await, "closed after frame_too_large");

    // Just over the hard cap (4x the limit), sent for real: the same.
    let mut ws = raw_hello(&server.url()).await;
    ws.send(Message::Binary(vec![0x90u8; 4 * 65536 + 1].into())).await.unwrap();
    let (closed, codes) = closed_within(&mut ws, LIVENESS).await;
    assert!(closed && codes == [ErrorCode::FrameTooLarge], "{codes:?}");

    // A 1000-byte frame trickled a byte every 100 ms, and a header whose payload never comes.
    let mut trickle = raw_tcp_ws(&server.addr()).await;
    let mut stuck = raw_tcp_ws(&server.addr()).await;
    stuck.write_all(&ws_header(1000)).await.unwrap();
    let started = Instant::now();
    let mut bytes = ws_header(1000);
    bytes.extend(std::iter::repeat_n(0x90u8, 1000));
    let mut trickle_closed = false;
    for b in bytes {
        if trickle.write_all(&[b]).await.is_err() {
            trickle_closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if started.elapsed() > Duration::from_secs(10) {
            break;
        }
    }
    let trickle_closed = trickle_closed || tcp_closed_within(&mut trickle, Duration::from_secs(1)).await;
    println!("[{T}] the trickled frame was cut off after {:?}", started.elapsed());
    assert!(trickle_closed, "a frame trickled for 10 s still holds its connection");
    assert!(tcp_closed_within(&mut stuck, Duration::from_secs(2)).await, "a never-finished frame is closed");

    good.finish(T).await;
    server.check_rss(T, before);
}

/// Floods: thousands of requests pipelined without reading replies (more than
/// `max_in_flight_per_connection`), mixed with slow replies, big replies and error replies. The
/// server stops reading the connection instead of buffering, and every request is answered
/// exactly once when the client reads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_floods_beyond_the_in_flight_limit() {
    const T: &str = "flood";
    let toml = "[limits]\nmax_in_flight_per_connection = 16\nmax_frame_bytes = 4194304\nmax_action_chars = 4000000\n";
    let mut server = ChildServer::start(toml).await;
    let before = server.rss_kb();
    let good = Good::start(&server.url()).await;

    // 1. Five thousand pings, sent before any reply is read.
    let mut ws = raw_hello(&server.url()).await;
    const PINGS: u64 = 5_000;
    for id in 10..10 + PINGS {
        ws.feed(frame(id, Request::Ping(Ping { nonce: id }))).await.unwrap();
    }
    ws.flush().await.unwrap();
    let mut seen = HashMap::new();
    for _ in 0..PINGS {
        let env = recv(&mut ws).await;
        assert!(matches!(env.msg, Response::Pong(Ping { nonce }) if nonce == env.id));
        *seen.entry(env.id).or_insert(0) += 1;
    }
    assert_eq!(seen.len() as u64, PINGS, "every ping answered once");

    // 2. Big replies that block the writer (transcripts of an episode holding a 3 MB action),
    //    search steps whose replies come a little later, and hundreds of error replies behind
    //    them, all without reading. No reply may be lost.
    let tasks = vec![em_task(); 7];
    ws.send(frame(2, Request::CreateEpisodes(CreateEpisodes { tasks, options: Default::default() }))).await.unwrap();
    let Response::EpisodesCreated(c) = recv(&mut ws).await.msg else { panic!("episodes") };
    let eps: Vec<u64> = c.episodes.into_iter().map(|e| e.unwrap().episode).collect();
    let big = Action::Text(format!("<think>{}</think>", "x".repeat(3_000_000)));
    ws.send(frame(3, Request::Step(Step { actions: vec![StepAction { episode: eps[0], action: big, data: None }] })))
        .await
        .unwrap();
    assert!(matches!(recv(&mut ws).await.msg, Response::Stepped(_)));
    let mut expected: HashMap<u64, &str> = HashMap::new();
    for id in 100..108 {
        ws.feed(frame(id, Request::GetTranscript(GetTranscript { episode: eps[0] }))).await.unwrap();
        expected.insert(id, "transcript");
    }
    ws.flush().await.unwrap();
    // Let the writer block on the transcripts before the rest arrives.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (i, ep) in eps[1..].iter().enumerate() {
        let id = 200 + i as u64;
        let action = Action::Text("<search> Ada Kerrigan </search>".into());
        ws.feed(frame(id, Request::Step(Step { actions: vec![StepAction { episode: *ep, action, data: None }] })))
            .await
            .unwrap();
        expected.insert(id, "step");
    }
    const GARBAGE: usize = 500;
    for _ in 0..GARBAGE {
        ws.feed(Message::Binary(vec![0xc1].into())).await.unwrap();
    }
    ws.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_blocked = server.rss_kb();
    let mut garbage = 0;
    let deadline = Instant::now() + Duration::from_secs(15);
    while (!expected.is_empty() || garbage < GARBAGE) && Instant::now() < deadline {
        let Ok(Some(Ok(m))) = tokio::time::timeout(LIVENESS, ws.next()).await else { break };
        let Message::Binary(b) = m else { continue };
        let env = decode_response(&b).unwrap();
        match (&env.msg, expected.remove(&env.id)) {
            (Response::Error(e), None) if env.id == 0 && e.code == ErrorCode::MalformedFrame => garbage += 1,
            (Response::Transcript(t), Some("transcript")) => assert_eq!(t.steps.len(), 1),
            (Response::Stepped(s), Some("step")) => assert!(s.results[0].is_ok()),
            (other, what) => panic!("unexpected reply {} ({what:?}): {other:?}", env.id),
        }
    }
    let mut missing: Vec<_> = expected.into_iter().collect();
    missing.sort();
    assert!(missing.is_empty(), "requests never answered: {missing:?}");
    assert_eq!(garbage, GARBAGE, "every malformed frame answered");
    println!("[{T}] server VmRSS while the writer was blocked: {rss_blocked} KiB");

    // 3. The connection is still fully usable: its in-flight permits all came back.
    for id in 1000..1000 + 64 {
        ws.feed(frame(id, Request::Stats)).await.unwrap();
    }
    ws.flush().await.unwrap();
    for _ in 0..64 {
        assert!(matches!(recv(&mut ws).await.msg, Response::Stats(_)));
    }
    good.finish(T).await;
    server.check_rss(T, before);
}

/// Slowloris and idle connections: 2,000 TCP connections that send nothing, HTTP upgrade
/// requests sent a byte at a time, and WebSockets that handshake and go silent, some of them
/// beyond `max_connections`. Silent TCP connections and unfinished HTTP heads are closed after
/// `http_header_timeout_secs`; silent WebSockets after `connection_idle_secs`; WebSockets over
/// the connection limit get `too_many_connections` and the close at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_and_thousands_of_idle_connections() {
    const T: &str = "idle";
    let toml = "[limits]\nmax_connections = 64\nconnection_idle_secs = 3\nhttp_header_timeout_secs = 2\n";
    let mut server = ChildServer::start(toml).await;
    let before = server.rss_kb();
    let good = Good::start(&server.url()).await;

    // Silent WebSockets, 100 of them against a limit of 64 (the good client holds one slot):
    // 63 are served; the others are told `too_many_connections` (a few at a time) or, when even
    // the refusal overflow is full, closed at accept.
    let mut silent = Vec::new();
    let mut closed_at_accept = 0;
    for _ in 0..100 {
        let config = WebSocketConfig::default().max_message_size(None).max_frame_size(None);
        match tokio_tungstenite::connect_async_with_config(server.url(), Some(config), false).await {
            Ok((ws, _)) => silent.push(ws),
            Err(_) => closed_at_accept += 1,
        }
    }
    let limit = open_files_limit();
    let mut idle_n = 2_000usize;
    if limit < 3_000 {
        idle_n = (limit as usize).saturating_sub(500).min(2_000);
        println!("[{T}] note: `ulimit -n` is {limit}; opening {idle_n} idle connections instead of 2000");
    }
    let mut idle = Vec::with_capacity(idle_n);
    for _ in 0..idle_n {
        idle.push(TcpStream::connect(server.addr()).await.unwrap());
    }
    // Slowloris: upgrade requests, one byte every 150 ms (they would need ~30 s to finish).
    let mut slow = Vec::new();
    for _ in 0..5 {
        slow.push(tokio::spawn({
            let addr = server.addr();
            async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                let started = Instant::now();
                let request = format!("{UPGRADE}{}", "X-Padding: y\r\n".repeat(10));
                for b in request.bytes() {
                    if s.write_all(&[b]).await.is_err() {
                        return started.elapsed();
                    }
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    if started.elapsed() > Duration::from_secs(15) {
                        break;
                    }
                }
                assert!(tcp_closed_within(&mut s, Duration::from_secs(1)).await, "a slowloris head is cut off");
                started.elapsed()
            }
        }));
    }
    let opened = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_peak = server.rss_kb();
    println!("[{T}] server VmRSS with {idle_n} idle TCP + 100 silent WebSockets: {rss_peak} KiB");

    let checks = silent.iter_mut().map(|ws| closed_within(ws, Duration::from_secs(8)));
    let outcomes = futures_util::future::join_all(checks).await;
    let refused = outcomes.iter().filter(|(_, codes)| codes == &[ErrorCode::TooManyConnections]).count();
    assert!(outcomes.iter().all(|(closed, _)| *closed), "every silent WebSocket is closed");
    assert!(refused >= 1, "over the limit, connections are told too_many_connections");
    assert_eq!(refused + closed_at_accept, 100 - 63, "the ones over the limit were refused");
    println!(
        "[{T}] silent WebSockets closed after {:?}; {refused} refused at the limit, {closed_at_accept} closed at accept",
        opened.elapsed()
    );

    let checks = idle.iter_mut().map(|s| tcp_closed_within(s, Duration::from_secs(8)));
    let closed = futures_util::future::join_all(checks).await.into_iter().filter(|c| *c).count();
    assert_eq!(closed, idle_n, "every silent TCP connection is closed by the header timeout");
    for s in slow {
        let after = s.await.unwrap();
        println!("[{T}] a slowloris upgrade was cut off after {after:?}");
        assert!(after < Duration::from_secs(10));
    }
    // The slots are free again.
    let late = Client::connect(&server.url(), ClientOptions::default()).await.unwrap();
    assert_eq!(late.ping(8).await.unwrap(), 8);
    good.finish(T).await;
    server.check_rss(T, before);
}

/// Fork bombs: `n` far above `max_forks_per_request` (up to u32::MAX), many specs whose sum is
/// over it, and forks of forks until the per-connection and then the server-wide episode limits.
/// Each is `batch_too_large` or `too_many_episodes`; closing the connections frees everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_bombs_hit_the_episode_limits() {
    const T: &str = "forks";
    let toml = "[limits]\nmax_forks_per_request = 64\nmax_batch = 64\n\
                max_episodes_per_connection = 2000\nmax_episodes_total = 5000\n";
    let mut server = ChildServer::start(toml).await;
    let before = server.rss_kb();
    let good = Good::start(&server.url()).await;

    async fn bomb(url: String) -> (usize, ErrorCode) {
        let c = Client::connect(&url, ClientOptions::default()).await.unwrap();
        let root = c.create_episodes(vec![em_task()], Default::default()).await.unwrap()[0].clone().unwrap().episode;
        c.step_text(root, "<search> Ada Kerrigan </search>").await.unwrap();
        let too_big = |n: u32, specs: usize| vec![ForkSpec { episode: root, at_step: 1, n }; specs];
        for forks in [too_big(u32::MAX, 1), too_big(65, 1), too_big(64, 64), too_big(1, 65), too_big(u32::MAX, 64)] {
            assert_eq!(c.fork(forks).await.unwrap_err().code(), Some(ErrorCode::BatchTooLarge));
        }
        // Forks of forks, 64 at a time, until refused.
        let mut frontier = vec![root];
        let mut held = 1;
        loop {
            let parent = frontier[held % frontier.len()];
            let r = c.fork(vec![ForkSpec { episode: parent, at_step: 1, n: 64 }]).await.unwrap();
            match r.into_iter().next().unwrap() {
                Ok(f) => {
                    held += f.children.len();
                    frontier.extend(f.children);
                }
                Err(e) => {
                    // Then one at a time, to the exact limit.
                    loop {
                        let r = c.fork(vec![ForkSpec { episode: root, at_step: 1, n: 1 }]).await.unwrap();
                        match r.into_iter().next().unwrap() {
                            Ok(_) => held += 1,
                            Err(e1) => {
                                assert_eq!(e1.code, e.code);
                                // Keep the connection (and its episodes) until the test is done.
                                std::mem::forget(c);
                                return (held, e.code);
                            }
                        }
                    }
                }
            }
        }
    }
    let (a, b) = tokio::join!(bomb(server.url()), bomb(server.url()));
    assert_eq!(a, (2000, ErrorCode::TooManyEpisodes));
    assert_eq!(b, (2000, ErrorCode::TooManyEpisodes));
    let rss_full = server.rss_kb();
    let report = good.finish(T).await;
    println!("[{T}] server VmRSS with 4000 forked episodes: {rss_full} KiB ({} good rounds)", report.rounds);

    // With the good client gone, a third bomber reaches the server-wide limit.
    let (c, code) = bomb(server.url()).await;
    assert_eq!((c, code), (1000, ErrorCode::TooManyEpisodes));
    let stats_client = Client::connect(&server.url(), ClientOptions::default()).await.unwrap();
    assert_eq!(stats_client.stats().await.unwrap().episodes_live, 5000);
    server.check_rss(T, before);
}

/// Megabytes of text inside the (raised) frame limit: actions, questions and prompt templates
/// over `max_action_chars`, queries over `max_query_chars` (as tags and as tool arguments) get
/// `action_too_long`; a multi-megabyte answer within the limits is scored, and the good client
/// stays live throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn megabyte_actions_and_queries() {
    const T: &str = "megabytes";
    let toml = "[limits]\nmax_frame_bytes = 16777216\nmax_action_chars = 4000000\nmax_batch = 64\n";
    let mut server = ChildServer::start(toml).await;
    let before = server.rss_kb();
    let good = Good::start(&server.url()).await;
    let c = Client::connect(&server.url(), ClientOptions::default()).await.unwrap();
    let mb = |n: usize| "word ".repeat(n * 1_000_000 / 5);

    for round in 0..3 {
        let eps: Vec<u64> = c
            .create_episodes(vec![em_task(), em_task(), f1_task()], Default::default())
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.unwrap().episode)
            .collect();
        let code =
            |r: Result<Vec<Result<Observation, ErrorInfo>>, ClientError>| r.unwrap()[0].clone().unwrap_err().code;
        let text = |ep, t: String| vec![StepAction { episode: ep, action: Action::Text(t), data: None }];
        // A 6 MB action, over max_action_chars.
        assert_eq!(code(c.step(text(eps[0], mb(6))).await), ErrorCode::ActionTooLong);
        // A 3 MB search query, within max_action_chars but over max_query_chars.
        let q = format!("<search>{}</search>", mb(3));
        assert_eq!(code(c.step(text(eps[0], q)).await), ErrorCode::ActionTooLong);
        // The same as a tool call.
        let mut arguments = serde_json::Map::new();
        arguments.insert("query".into(), mb(3).into());
        let call = vec![StepAction {
            episode: eps[1],
            action: Action::Tool(ToolCall { name: "search".into(), arguments }),
            data: None,
        }];
        assert_eq!(code(c.step(call).await), ErrorCode::ActionTooLong);
        // A 5 MB question.
        let task = TaskSpec { question: mb(5), ..em_task() };
        let r = c.create_episodes(vec![task], Default::default()).await.unwrap();
        assert_eq!(r[0].clone().unwrap_err().code, ErrorCode::ActionTooLong);
        // A 5 MB prompt template, which every episode of the request would copy.
        let opts = EpisodeOptions { prompt_template: Some(format!("{{question}}{}", mb(5))), ..Default::default() };
        let r = c.create_episodes(vec![em_task(); 64], opts).await;
        assert_eq!(r.unwrap_err().code(), Some(ErrorCode::ActionTooLong), "round {round}");
        // A 3 MB answer within the limits is scored (F1 over ~600k tokens).
        let started = Instant::now();
        let obs = c.step_text(eps[2], &format!("<answer>Ada Kerrigan {}</answer>", mb(3))).await.unwrap();
        assert!(obs.done && obs.reward.unwrap().metric_value < 0.01);
        println!("[{T}] a 3 MB answer was scored in {:?}", started.elapsed());
        c.close(eps).await.unwrap();
    }
    good.finish(T).await;
    server.check_rss(T, before);
}

/// Wait until `name` reads `want`, at most `within`; the last reading.
async fn gauge_settles(addr: &str, name: &str, want: u64, within: Duration) -> Option<u64> {
    let deadline = Instant::now() + within;
    loop {
        let v = gauge(addr, name).await;
        if v == Some(want) || Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Slow request bodies: 300 `POST /retrieve` whose heads are complete and whose bodies never
/// finish, against a server whose open-file limit is 256 (the probe that once locked out every
/// new client with `Too many open files`). HTTP connections count against the one connection
/// budget, which the server fits under its open-file limit: those holding a slot get `408` at
/// the request deadline and are closed, a few over the budget get `503 too_many_connections`,
/// the rest are closed at accept. The good client, connected before, never notices; after the
/// deadline a new WebSocket client and `/health` are served, and the gauges are back where
/// they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_are_cut_at_their_deadline_within_one_connection_budget() {
    const T: &str = "slow-body";
    let toml = "[limits]\nhttp_request_timeout_secs = 2\nhttp_header_timeout_secs = 2\n";
    let mut server = ChildServer::start_limited(toml, Some(256)).await;
    let addr = server.addr();
    let before = server.rss_kb();
    let good = Good::start(&server.url()).await;
    // The good client's connection and the `/metrics` request's own; the start-up check's
    // client may still be closing.
    let baseline = 2;
    let settled = gauge_settles(&addr, "grove_tcp_connections", baseline, Duration::from_secs(5)).await;
    assert_eq!(settled, Some(baseline));

    let head = "POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                Content-Length: 1000\r\n\r\n{\"queries\": [\"har";
    let started = Instant::now();
    let mut slow = Vec::new();
    for _ in 0..300 {
        let Ok(mut s) = TcpStream::connect(&addr).await else { continue };
        let _ = s.write_all(head.as_bytes()).await;
        slow.push(s);
    }
    assert_eq!(slow.len(), 300, "the kernel accepted every connection");
    let outcomes = futures_util::future::join_all(slow.into_iter().map(|mut s| async move {
        let mut reply = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut reply)).await;
        let closed = matches!(read, Ok(Ok(_)) | Ok(Err(_)));
        let text = String::from_utf8_lossy(&reply).into_owned();
        (closed, text.split_whitespace().nth(1).map(str::to_owned))
    }))
    .await;
    let elapsed = started.elapsed();
    let count = |code: &str| outcomes.iter().filter(|(_, s)| s.as_deref() == Some(code)).count();
    let (timed_out, refused) = (count("408"), count("503"));
    let at_accept = outcomes.iter().filter(|(_, s)| s.is_none()).count();
    println!(
        "[{T}] 300 slow bodies: {timed_out} got 408 at the deadline, {refused} got 503, {at_accept} closed at \
         accept; all closed after {elapsed:?}"
    );
    assert!(outcomes.iter().all(|(closed, _)| *closed), "every slow body is closed");
    assert!(timed_out >= 100, "connections within the budget wait for the deadline, then get 408");
    assert!(refused >= 1, "a few over the budget are told 503");
    assert_eq!(timed_out + refused + at_accept, 300);
    assert!(elapsed < Duration::from_secs(8), "closed at the 2 s deadline, not later: {elapsed:?}");

    // After the deadline, new clients are served again.
    let late = Client::connect(&server.url(), ClientOptions::default()).await.unwrap();
    assert_eq!(late.ping(3).await.unwrap(), 3);
    drop(late);
    let (status, _) = http_get(&addr, "/health").await.expect("/health answers");
    assert_eq!(status, 200);
    let settled = gauge_settles(&addr, "grove_tcp_connections", baseline, Duration::from_secs(5)).await;
    assert_eq!(settled, Some(baseline), "every slow connection gave its slot back");
    good.finish(T).await;
    assert!(!server.log_tail().contains("Too many open files"), "{}", server.log_tail());
    server.check_rss(T, before);
}

/// A client that floods `GetTranscript` (kilobyte replies), never reads, then closes its
/// socket: the server's writer is blocked on a full socket and its reader waits for in-flight
/// permits that only the writer gives back. The close must still release everything: the
/// connection and episode gauges return to their baseline within the reattach grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_released_when_it_closes() {
    const T: &str = "never-reads";
    let toml = "[limits]\nreattach_grace_secs = 1\n";
    let mut server = ChildServer::start(toml).await;
    let addr = server.addr();
    let before = server.rss_kb();
    // The start-up check's client may still be closing: wait for an idle server.
    let base_conns = 0;
    assert_eq!(gauge_settles(&addr, "grove_connections", 0, Duration::from_secs(5)).await, Some(0));
    let base_live = gauge(&addr, "grove_episodes_live").await.unwrap();

    let mut ws = raw_hello(&server.url()).await;
    ws.send(frame(2, Request::CreateEpisodes(CreateEpisodes { tasks: vec![em_task()], options: Default::default() })))
        .await
        .unwrap();
    let Response::EpisodesCreated(c) = recv(&mut ws).await.msg else { panic!() };
    let episode = c.episodes[0].as_ref().unwrap().episode;
    for (i, q) in ["harbor bridge", "port elmsworth", "kerrigan"].iter().enumerate() {
        let step = StepAction { episode, action: Action::Text(format!("<search> {q} </search>")), data: None };
        ws.send(frame(3 + i as u64, Request::Step(Step { actions: vec![step] }))).await.unwrap();
        recv(&mut ws).await;
    }
    // Flood without reading until the sockets are full both ways.
    let mut sent = 0u64;
    'flood: for batch in 0..2_000u64 {
        for i in 0..100 {
            let id = 100 + batch * 100 + i;
            if ws.feed(frame(id, Request::GetTranscript(GetTranscript { episode }))).await.is_err() {
                break 'flood;
            }
        }
        match tokio::time::timeout(Duration::from_millis(500), ws.flush()).await {
            Ok(Ok(())) => sent += 100,
            _ => break,
        }
    }
    let conns = gauge(&addr, "grove_connections").await;
    assert!(conns.is_some_and(|c| c > base_conns), "the flooding connection is open: {conns:?}");
    assert_eq!(gauge(&addr, "grove_episodes_live").await.unwrap(), base_live + 1);
    let (queued_kb, _) = (server.rss_kb(), ());
    println!("[{T}] {sent} transcript requests sent before the sockets filled (server VmRSS {queued_kb} KiB)");
    assert!(sent >= 1_000, "the flood filled the sockets");
    // Close with unread data (a reset), then check the gauges.
    drop(ws);
    let closed = Instant::now();
    let conns = gauge_settles(&addr, "grove_connections", base_conns, Duration::from_secs(10)).await;
    assert_eq!(conns, Some(base_conns), "the connection is released");
    let live = gauge_settles(&addr, "grove_episodes_live", base_live, Duration::from_secs(10)).await;
    assert_eq!(live, Some(base_live), "its episode is closed once the grace period ends");
    println!("[{T}] connection and episode released {:?} after the client closed", closed.elapsed());
    assert_eq!(gauge(&addr, "grove_sessions_detached").await, Some(0));
    let late = Client::connect(&server.url(), ClientOptions::default()).await.unwrap();
    assert_eq!(late.ping(5).await.unwrap(), 5);
    server.check_rss(T, before);
}

// ---------------------------------------------------------------------------------------------
// A hostile peer on the other side: the remote retriever.

/// A `/retrieve` server that answers every request with a 1 GiB JSON reply, streamed in 1 MiB
/// writes for as long as the client reads. Returns its address and the bytes it managed to send.
async fn gigabyte_retriever() -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = sent.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let _ = s.read(&mut buf).await;
                const GIB: u64 = 1 << 30;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {GIB}\r\n\r\n{{\"result\": [["
                );
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b' '; 1 << 20];
                let mut total = head.len() as u64;
                while total < GIB {
                    if s.write_all(&chunk).await.is_err() {
                        return;
                    }
                    total += chunk.len() as u64;
                    counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
            });
        }
    });
    (addr, sent)
}

/// The test of the outbound HTTP policy: a retriever that streams 1 GiB gets the search
/// a typed error (the reply is cut at `remote.max_reply_bytes`, never buffered whole), the
/// server's peak memory stays far below the reply, and the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retriever_streaming_a_gigabyte_is_cut_at_the_reply_cap() {
    let (addr, sent) = gigabyte_retriever().await;
    let toml = format!(
        "backend = \"remote\"\nremote_url = \"http://{addr}/retrieve\"\n[remote]\ndeadline_ms = 60000\nretries = 0\n\
         max_reply_bytes = 8388608\n"
    );
    let mut server = ChildServer::start(&toml).await;
    let c = Client::connect(&server.url(), ClientOptions::default()).await.unwrap();
    let ep = c.create_episodes(vec![em_task()], Default::default()).await.unwrap()[0].clone().unwrap().episode;
    let obs = c.step_text(ep, "<search> harbor bridge </search>").await.unwrap();
    let error = obs.error.expect("the failed search carries its error");
    assert_eq!(error.code, ErrorCode::BackendError, "{error:?}");
    assert!(obs.text.contains("Search failed"), "{}", obs.text);
    let why = format!("{}\n{}", error.message, server.log_tail());
    assert!(why.contains("reply larger than 8388608 bytes"), "{why}");
    // The retriever got to send a few MiB (the cap plus socket buffers), not the gigabyte.
    let streamed = sent.load(Ordering::Relaxed);
    assert!(streamed < 128 << 20, "the server read {streamed} bytes of the reply");
    // Peak resident memory over the whole run, not only now.
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.process.child.id())).unwrap();
    let peak: u64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    println!("retriever sent {streamed} bytes; server peak VmHWM {peak} KiB");
    assert!(peak < RSS_BOUND_KB, "server peak memory {peak} KiB");
    // Still serving: the episode can answer.
    let done = c.step_text(ep, "<answer> Ada Kerrigan </answer>").await.unwrap();
    assert!(done.done);
    server.assert_alive();
}
