//! A real server on 127.0.0.1:0 over the shared wiki-18 fixture, and clients for it.

use std::path::PathBuf;
use std::sync::Arc;

use grove_env_server::Backends;
use grove_env_server::config::ServerConfig;
use grove_env_server::search::LocalIndex;
use grove_env_server::testkit::LocalServer;
use grove_protocol::TaskSpec;
use grove_protocol::client::{Client, ClientOptions};

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures").join(name)
}

/// A [`LocalServer`] on the test's runtime, with the BM25 index it searches (when it does) and
/// the folder that holds its corpus.
pub struct TestServer {
    pub index: LocalIndex,
    server: LocalServer,
    _dir: tempfile::TempDir,
}

impl TestServer {
    /// BM25 over a copy of the fixture corpus.
    pub async fn start(config: ServerConfig) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("corpus.jsonl");
        std::fs::copy(fixture("wiki18-sample.jsonl"), &corpus).unwrap();
        let index = LocalIndex::open_or_build(&corpus, None, &mut |_| {}).unwrap();
        Self::start_with(config, Backends::new("local", Arc::new(index.clone())), index, dir).await
    }

    pub async fn start_with(
        config: ServerConfig,
        backends: Backends,
        index: LocalIndex,
        dir: tempfile::TempDir,
    ) -> TestServer {
        let server = LocalServer::start_with(config, backends).await.unwrap();
        TestServer { index, server, _dir: dir }
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    pub fn http(&self, path: &str) -> String {
        self.server.http(path)
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.url(), ClientOptions::default()).await.unwrap()
    }

    /// Stop the server and wait for it to finish cleanly.
    pub async fn shutdown(self) {
        self.server.shutdown().await.unwrap();
    }
}

pub fn em_task() -> TaskSpec {
    TaskSpec {
        question: "who designed the harbor bridge in port elmsworth".into(),
        golden_answers: vec!["Ada Kerrigan".into(), "A. Kerrigan".into()],
        data_source: "nq".into(),
        task_id: Some("train_0".into()),
        metric: None,
    }
}

pub fn f1_task() -> TaskSpec {
    TaskSpec { data_source: "simpleqa".into(), golden_answers: vec!["Ada Kerrigan".into()], ..em_task() }
}

/// `GET path` over a fresh TCP connection: the status code and the body (None when the server
/// closed the connection without an answer, as it does at accept when its budget is full).
pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let head = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    s.write_all(head.as_bytes()).await.ok()?;
    let mut reply = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut reply)).await.ok()?.ok()?;
    let text = String::from_utf8_lossy(&reply).into_owned();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Some((status, body))
}

/// One gauge of `/metrics`.
pub async fn gauge(addr: &str, name: &str) -> Option<u64> {
    let (status, body) = http_get(addr, "/metrics").await?;
    if status != 200 {
        return None;
    }
    body.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}
