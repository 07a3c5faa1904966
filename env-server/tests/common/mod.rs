//! A real server on 127.0.0.1:0 over the shared wiki-18 fixture, and clients for it.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use grove_env_server::config::ServerConfig;
use grove_env_server::search::LocalIndex;
use grove_env_server::{Backends, run};
use grove_protocol::TaskSpec;
use grove_protocol::client::{Client, ClientOptions};

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures").join(name)
}

pub struct TestServer {
    pub addr: std::net::SocketAddr,
    pub index: LocalIndex,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<Result<(), grove_env_server::net::ServerError>>>,
    _dir: tempfile::TempDir,
}

impl TestServer {
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
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(run(listener, config, backends, async {
            let _ = rx.await;
        }));
        TestServer { addr, index, stop: Some(tx), handle: Some(handle), _dir: dir }
    }

    pub fn url(&self) -> String {
        format!("ws://{}/", self.addr)
    }

    pub fn http(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.url(), ClientOptions::default()).await.unwrap()
    }

    /// Stop the server and wait for it to finish cleanly.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            tokio::time::timeout(std::time::Duration::from_secs(10), h).await.unwrap().unwrap().unwrap();
        }
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
