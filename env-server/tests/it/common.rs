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
