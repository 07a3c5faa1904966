//! The `env-server` binary: a TOML config plus flags, serving until SIGINT.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{em_task, fixture};
use grove_env_server::config::{BackendKind, RewardMode, ServerConfig};
use grove_env_server::testkit::spawn_ready;
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
    serve_until("INT").await;
}

/// SIGTERM (containers, systemd, Ray) drains like Ctrl-C: with a client still connected and its
/// episode live, the server tells it so and exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_like_ctrl_c() {
    serve_until("TERM").await;
}

async fn serve_until(signal: &str) {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    std::fs::copy(fixture("wiki18-sample.jsonl"), &corpus).unwrap();
    let config = dir.path().join("server.toml");
    std::fs::write(&config, "[episodes]\nmax_turns = 2\n").unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_env-server"));
    cmd.args(["serve", "--config"])
        .arg(&config)
        .arg("--corpus")
        .arg(&corpus)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut server = spawn_ready(cmd, Duration::from_secs(10)).await.expect("server came up");
    let c = Client::connect(&server.url(), ClientOptions::default()).await.unwrap();
    assert_eq!(c.welcome().limits.max_turns, 2, "the config file was read");
    let ep = c.create_episodes(vec![em_task()], Default::default()).await.unwrap()[0].clone().unwrap();
    assert!(c.step_text(ep.episode, "<search> Ada Kerrigan </search>").await.unwrap().text.contains("Ada Kerrigan"));
    assert!(corpus.with_file_name("corpus.jsonl.index").join("meta.json").exists());
    // The client stays connected with its episode live while the signal arrives.
    signal_and_wait(&mut server, signal).await;
    let err = c.step_text(ep.episode, "<answer> Ada Kerrigan </answer>").await.unwrap_err();
    assert!(err.code() == Some(grove_protocol::ErrorCode::ShuttingDown) || err.code().is_none(), "{err}");
}

/// Send `SIG<signal>` to the server and wait up to 10 s for it to exit; it must exit cleanly.
async fn signal_and_wait(server: &mut grove_env_server::testkit::ServerProcess, signal: &str) {
    let status = Command::new("kill").args([&format!("-{signal}"), &server.child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let mut waited = 0;
    let exit = loop {
        if let Some(s) = server.child.try_wait().unwrap() {
            break s;
        }
        assert!(waited < 100, "server did not stop on SIG{signal}");
        waited += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(exit.success(), "SIG{signal}: {exit:?}");
}

/// A loopback SerpAPI that answers every search with one organic result (title T, snippet S).
async fn serpapi_provider() -> grove_env_server::testkit::ScriptedServer {
    use grove_env_server::testkit::{Canned, ScriptedServer};
    grove_http::install_tls_provider();
    ScriptedServer::start(|_| {
        Canned::json(
            &serde_json::json!({"organic_results": [{"title": "T", "link": "https://a.example/", "snippet": "S"}]}),
        )
    })
    .await
    .unwrap()
}

/// SIGTERM with a web cache open: the server drains with a client connected and its episode live,
/// exits cleanly, and what it cached before the signal is in the SQLite file afterwards (read back
/// by `env-server cache export` from the same configuration).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_web_cache_open_keeps_what_was_cached() {
    let provider = serpapi_provider().await;
    let dir = tempfile::tempdir().unwrap();
    let (config, cache) = (dir.path().join("server.toml"), dir.path().join("cache.sqlite3"));
    std::fs::write(
        &config,
        format!(
            "backend = \"web\"\n[web]\nprovider = \"serpapi\"\nendpoint = \"{}/search.json\"\n\
             api_key_env = \"GROVE_TEST_KEY\"\n[cache]\npath = \"{}\"\n",
            provider.url(),
            cache.display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_env-server"));
    cmd.args(["serve", "--config"]).arg(&config).env("GROVE_TEST_KEY", "k").stdout(Stdio::null()).stderr(Stdio::null());
    let mut server = spawn_ready(cmd, Duration::from_secs(10)).await.expect("server came up");
    let c = Client::connect(&server.url(), ClientOptions::default()).await.unwrap();
    let ep = c.create_episodes(vec![em_task()], Default::default()).await.unwrap()[0].clone().unwrap();
    let obs = c.step_text(ep.episode, "<search> the cached query </search>").await.unwrap();
    assert!(obs.text.contains("Page 1: S"), "{}", obs.text);
    assert_eq!(provider.requests().len(), 1);
    signal_and_wait(&mut server, "TERM").await;
    let out = dir.path().join("export.jsonl");
    let export = Command::new(env!("CARGO_BIN_EXE_env-server"))
        .args(["cache", "export", "--config"])
        .arg(&config)
        .arg("--out")
        .arg(&out)
        .env("GROVE_TEST_KEY", "k")
        .output()
        .unwrap();
    assert!(export.status.success(), "{}", String::from_utf8_lossy(&export.stderr));
    let lines = std::fs::read_to_string(&out).unwrap();
    assert_eq!(lines.lines().count(), 1, "{lines}");
    assert!(lines.contains("the cached query"), "{lines}");
}

/// With a token configured, the binary refuses missing and wrong tokens on the WebSocket upgrade
/// and on HTTP; neither the token, nor a wrong one a client tried, nor the web provider's API key
/// appears anywhere in its logs, even at `RUST_LOG=trace`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_keys_never_reach_the_logs() {
    const TOKEN: &str = "tok-7f3a9c1e-never-log-me";
    const WRONG: &str = "wrong-5b2d8e-guess";
    const KEY: &str = "key-0d4c6a-provider-secret";
    let provider = serpapi_provider().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("server.toml");
    std::fs::write(
        &config,
        format!(
            "backend = \"web\"\ntoken_env = \"GROVE_TEST_TOKEN\"\n[web]\nprovider = \"serpapi\"\n\
             endpoint = \"{}/search.json\"\napi_key_env = \"GROVE_TEST_KEY\"\n[cache]\npath = \"{}\"\n",
            provider.url(),
            dir.path().join("cache.sqlite3").display()
        ),
    )
    .unwrap();
    let log = dir.path().join("server.log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_env-server"));
    cmd.args(["serve", "--config"])
        .arg(&config)
        .env("GROVE_TEST_TOKEN", TOKEN)
        .env("GROVE_TEST_KEY", KEY)
        .env("RUST_LOG", "trace")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut server = spawn_ready(cmd, Duration::from_secs(10)).await.expect("server came up");
    let url = server.url();
    let with = |t: &str| ClientOptions { token: Some(t.into()), name: None, ..Default::default() };
    assert!(Client::connect(&url, ClientOptions::default()).await.is_err(), "no token");
    assert!(Client::connect(&url, with(WRONG)).await.is_err(), "wrong token");
    let http = reqwest::Client::new();
    let metrics = server.http("/metrics");
    assert_eq!(http.get(&metrics).send().await.unwrap().status().as_u16(), 401);
    assert_eq!(http.get(&metrics).bearer_auth(WRONG).send().await.unwrap().status().as_u16(), 401);
    let reply = http.get(&metrics).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(reply.status().as_u16(), 200);
    // The binary counts its heap and reports it (the soak compares it with RSS).
    let text = reply.text().await.unwrap();
    let heap: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("grove_heap_live_bytes "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no grove_heap_live_bytes in\n{text}"));
    assert!(heap > 100_000, "live heap {heap} bytes");
    let c = Client::connect(&url, with(TOKEN)).await.unwrap();
    let ep = c.create_episodes(vec![em_task()], Default::default()).await.unwrap()[0].clone().unwrap();
    let obs = c.step_text(ep.episode, "<search> anything </search>").await.unwrap();
    assert!(obs.text.contains("Page 1: S"), "{}", obs.text);
    assert_eq!(provider.requests()[0].query_param("api_key").as_deref(), Some(KEY), "the key was used");
    drop(c);
    let status = Command::new("kill").args(["-INT", &server.child.id().to_string()]).status().unwrap();
    assert!(status.success());
    server.child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.lines().count() > 10, "trace logging was on:\n{text}");
    for secret in [TOKEN, WRONG, KEY] {
        assert!(!text.contains(secret), "{secret} appears in the log");
    }
    assert!(!text.contains('\u{1b}'), "a log file has no ANSI colour codes");
}
