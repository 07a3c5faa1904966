//! The `env-server` binary: a TOML config plus flags, serving until SIGINT.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{em_task, fixture};
use grove_env_server::config::{BackendKind, RewardMode, ServerConfig};
use grove_protocol::client::{Client, ClientOptions};

#[test]
fn config_file_keys() {
    let text = r#"
        bind = "127.0.0.1:9000"
        corpus = "/data/wiki-18.jsonl"
        backend = "remote"
        remote_url = "http://127.0.0.1:8000/retrieve"
        token_env = "GROVE_TOKEN"
        [limits]
        max_frame_bytes = 65536
        max_connections = 16
        [episodes]
        max_turns = 5
        topk = 10
        reward = "validation"
        [remote]
        deadline_ms = 2500
    "#;
    let c = ServerConfig::from_toml(text).unwrap();
    assert_eq!(c.bind.port(), 9000);
    assert_eq!(c.backend, BackendKind::Remote);
    assert_eq!((c.limits.max_frame_bytes, c.limits.max_connections), (65536, 16));
    assert_eq!(c.limits.max_batch, ServerConfig::default().limits.max_batch, "unset keys keep defaults");
    assert_eq!((c.episodes.max_turns, c.episodes.topk, c.episodes.reward), (5, 10, RewardMode::Validation));
    assert_eq!(c.remote.deadline_ms, 2500);
    let err = ServerConfig::from_toml("[limits]\nmax_frames = 3\n").unwrap_err();
    assert!(err.to_string().contains("max_frames"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_from_the_command_line_until_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    std::fs::copy(fixture("wiki18-sample.jsonl"), &corpus).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = dir.path().join("server.toml");
    std::fs::write(&config, "[episodes]\nmax_turns = 2\n").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_env-server"))
        .args(["serve", "--config"])
        .arg(&config)
        .arg("--corpus")
        .arg(&corpus)
        .args(["--bind", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let url = format!("ws://127.0.0.1:{port}/");
    let mut client = None;
    for _ in 0..100 {
        if let Ok(c) = Client::connect(&url, ClientOptions::default()).await {
            client = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let c = client.expect("server came up");
    assert_eq!(c.welcome().limits.max_turns, 2, "the config file was read");
    let ep = c.create_episodes(vec![em_task()], Default::default()).await.unwrap()[0].clone().unwrap();
    assert!(c.step_text(ep.episode, "<search> Ada Kerrigan </search>").await.unwrap().text.contains("Ada Kerrigan"));
    assert!(corpus.with_file_name("corpus.jsonl.index").join("meta.json").exists());
    drop(c);
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let mut waited = 0;
    let exit = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(waited < 100, "server did not stop on SIGINT");
        waited += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(exit.success(), "{exit:?}");
}
