//! The HTTP side door in the Search-R1 dialect, the remote backend against a real second server,
//! and the BM25 index's build-once, rebuild-on-change behaviour.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{TestServer, em_task, fixture};
use grove_env_server::Backends;
use grove_env_server::config::{RemoteConfig, ServerConfig, ToolErrors};
use grove_env_server::search::{LocalIndex, RemoteRetriever, SearchBackend, SearchError};
use grove_protocol::{ErrorCode, StepAction};
use serde_json::{Value, json};

async fn post(url: &str, body: Value) -> (u16, Value) {
    grove_http::install_tls_provider();
    let r = reqwest::Client::new().post(url).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrieve_in_both_dialects() {
    let server = TestServer::start(ServerConfig::default()).await;
    let url = server.http("/retrieve");
    let (status, body) = post(
        &url,
        json!({"queries": ["Elmsworth Harbor Bridge", "River Lark frozen"], "topk": 2, "return_scores": true}),
    )
    .await;
    assert_eq!(status, 200);
    let result = body["result"].as_array().unwrap();
    assert_eq!(result.len(), 2);
    assert_eq!(result[0].as_array().unwrap().len(), 2);
    let top = &result[0][0];
    assert_eq!(top["document"]["id"], "0");
    assert!(top["document"]["contents"].as_str().unwrap().starts_with("\"Elmsworth Harbor Bridge\"\n"));
    assert!(top["score"].as_f64().unwrap() > result[0][1]["score"].as_f64().unwrap());
    assert!(result[1][0]["document"]["contents"].as_str().unwrap().contains("1788"));

    // Bare documents without scores; topk null means the server default (3).
    let (_, body) = post(&url, json!({"queries": ["Tollmouth"], "topk": null, "return_scores": false})).await;
    let docs = body["result"][0].as_array().unwrap();
    assert_eq!(docs.len(), 3);
    assert!(docs[0].get("score").is_none() && docs[0]["contents"].is_string());
    // The single-query variant (SkyRL / GEM).
    let (_, body) = post(&url, json!({"query": "Marten Quill", "topk": 1, "return_scores": true})).await;
    assert_eq!(body["result"].as_array().unwrap().len(), 1);
    assert!(body["result"][0][0]["document"]["contents"].as_str().unwrap().contains("Marten Quill"));
    // No queries: an empty result list.
    assert_eq!(post(&url, json!({"queries": [], "topk": 3})).await, (200, json!({"result": []})));
    // Bad requests are typed errors.
    let (status, body) = post(&url, json!({"queries": "not a list"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("malformed_frame")));
    let r = reqwest::Client::new().post(&url).body("{not json").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let (status, body) = post(&url, json!({"queries": ["x".repeat(5000)]})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("action_too_long")));
    // Parameters that would otherwise be read as the default are typed errors (the raw body
    // keeps 2^64 as written).
    let bad = [
        json!({"queries": ["Tollmouth"], "topk": -1}),
        json!({"queries": ["Tollmouth"], "topk": "3"}),
        json!({"queries": ["Tollmouth"], "topk": 1.5}),
        json!({"queries": ["Tollmouth"], "topk": 0}),
        json!({"queries": ["Tollmouth"], "topk": 101}),
        json!({"queries": ["Tollmouth"], "top_k": [3]}),
        json!({"queries": ["Tollmouth"], "return_scores": "yes"}),
        json!({"queries": ["Tollmouth"], "return_scores": 1}),
    ];
    let mut raw = vec![r#"{"queries": ["Tollmouth"], "topk": 18446744073709551616}"#.to_string()];
    raw.extend(bad.iter().map(Value::to_string));
    for body in raw {
        let r = reqwest::Client::new().post(&url).body(body.clone()).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 400, "{body}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "malformed_frame", "{body}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("topk") || message.contains("return_scores"), "{body}: {message}");
    }
    // The largest allowed top-k and an explicit `null` are fine.
    let (status, body) = post(&url, json!({"queries": ["Tollmouth"], "topk": 100, "return_scores": null})).await;
    assert_eq!(status, 200);
    assert!(body["result"][0][0].get("score").is_none());

    // /health and /metrics.
    let health: Value = reqwest::get(server.http("/health")).await.unwrap().json().await.unwrap();
    assert_eq!(health["status"], "ok");
    let metrics = reqwest::get(server.http("/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("grove_retrieve_requests_total 17"), "{metrics}");
    assert!(metrics.contains("grove_errors_total{code=\"malformed_frame\"} 11"), "{metrics}");
    assert!(metrics.contains("grove_search_latency_seconds_count"));
    assert_eq!(reqwest::get(server.http("/nope")).await.unwrap().status().as_u16(), 404);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_backend_against_a_real_retrieve_server() {
    // Server A answers /retrieve from its BM25 index; server B searches through A.
    let a = TestServer::start(ServerConfig::default()).await;
    let remote = RemoteRetriever::new(a.http("/retrieve"), RemoteConfig::default()).unwrap();
    let config = ServerConfig::default();
    let dir = tempfile::tempdir().unwrap();
    let b = TestServer::start_with(config, Backends::new("remote", Arc::new(remote)), a.index.clone(), dir).await;
    let (ca, cb) = (a.client().await, b.client().await);
    let action = "<think>t</think><search> who designed the Elmsworth Harbor Bridge </search>";
    let ea = ca.create_episodes(vec![em_task()], Default::default()).await.unwrap()[0].clone().unwrap().episode;
    let eb = cb.create_episodes(vec![em_task()], Default::default()).await.unwrap()[0].clone().unwrap().episode;
    let (oa, ob) = (ca.step_text(ea, action).await.unwrap(), cb.step_text(eb, action).await.unwrap());
    assert!(oa.text.contains("Ada Kerrigan"));
    assert_eq!(oa.text, ob.text, "the same observation locally and through /retrieve");
    b.shutdown().await;
    a.shutdown().await;
}

/// A TCP server that accepts connections and never answers.
async fn hanging_server() -> std::net::SocketAddr {
    let hang = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = hang.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = hang.accept().await {
            held.push(s);
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_backend_that_hangs_meets_its_deadline() {
    let addr = hanging_server().await;
    let cfg = RemoteConfig { deadline_ms: 300, retries: 1, backoff_ms: 10, ..Default::default() };
    let remote = RemoteRetriever::new(format!("http://{addr}/retrieve"), cfg).unwrap();
    let t = Instant::now();
    let err = remote.search(vec!["q".into()], 3).await.unwrap_err();
    assert_eq!(err, SearchError::Timeout(300));
    assert!(t.elapsed() < Duration::from_secs(2));

    // Through the server, by default: the failed search is a step whose observation says why and
    // carries the typed code; with `tool_errors = "error"` the item fails and the episode is
    // unchanged. Either way the server keeps serving.
    let mut strict = ServerConfig::default();
    strict.episodes.tool_errors = ToolErrors::Error;
    for config in [ServerConfig::default(), strict] {
        let mode = config.episodes.tool_errors;
        let server = TestServer::start_with(
            config,
            Backends::new("remote", Arc::new(remote.clone())),
            LocalIndex::open_or_build(
                &fixture("wiki18-sample.jsonl"),
                Some(&tempfile::tempdir().unwrap().path().join("i")),
                &mut |_| {},
            )
            .unwrap(),
            tempfile::tempdir().unwrap(),
        )
        .await;
        let c = server.client().await;
        let ep = c.create_episodes(vec![em_task()], Default::default()).await.unwrap()[0].clone().unwrap().episode;
        let action = grove_protocol::Action::Text("<search> q </search>".into());
        let r = c.step(vec![StepAction { episode: ep, action, data: None }]).await.unwrap().remove(0);
        match mode {
            ToolErrors::Observation => {
                let obs = r.unwrap();
                assert_eq!(obs.error.map(|e| e.code), Some(ErrorCode::BackendTimeout));
                assert_eq!(
                    obs.text,
                    "\n\n<information>Search failed for query: q (timeout after 300 ms)</information>\n\n"
                );
                assert_eq!(c.transcript(ep).await.unwrap().steps.len(), 1);
            }
            ToolErrors::Error => {
                assert_eq!(r.unwrap_err().code, ErrorCode::BackendTimeout);
                assert_eq!(c.transcript(ep).await.unwrap().steps.len(), 0);
            }
        }
        let obs = c.step_text(ep, "<answer> Ada Kerrigan </answer>").await.unwrap();
        assert!(obs.done);
        drop(c);
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_backend_rejects_garbage_replies() {
    // A minimal HTTP server that answers every request with the given body.
    async fn serve(body: &'static str, status: u16) -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = vec![0u8; 65536];
                let _ = s.read(&mut buf).await;
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(reply.as_bytes()).await;
            }
        });
        addr
    }
    let cfg = RemoteConfig { deadline_ms: 2000, retries: 2, backoff_ms: 5, ..Default::default() };
    for (body, status, want) in [
        ("not json", 200, "unreadable"),
        ("{\"result\": [[{\"document\": {\"id\": \"1\"}}]]}", 200, "unreadable"),
        ("{\"result\": []}", 200, "unreadable"),
        ("{\"detail\": \"boom\"}", 500, "500"),
        ("{\"detail\": \"bad\"}", 422, "422"),
    ] {
        let addr = serve(body, status).await;
        let r = RemoteRetriever::new(format!("http://{addr}/retrieve"), cfg.clone()).unwrap();
        let err = r.search(vec!["q".into()], 3).await.unwrap_err();
        assert!(err.to_string().contains(want), "{body}: {err}");
    }
    // Both reply shapes are understood.
    let addr = serve(
        "{\"result\": [[{\"id\": \"7\", \"contents\": \"\\\"T\\\"\\nbody\"}, {\"title\": \"U\", \"text\": \"more\"}]]}",
        200,
    )
    .await;
    let r = RemoteRetriever::new(format!("http://{addr}/retrieve"), cfg).unwrap();
    let hits = r.search(vec!["q".into()], 3).await.unwrap();
    assert_eq!(hits[0][0].contents, "\"T\"\nbody");
    assert_eq!(hits[0][1].contents, "\"U\"\nmore");
}

#[test]
fn index_is_built_once_and_rebuilt_when_the_corpus_changes() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    std::fs::copy(fixture("wiki18-sample.jsonl"), &corpus).unwrap();
    let mut builds = 0;
    let index = LocalIndex::open_or_build(&corpus, None, &mut |_| builds += 1).unwrap();
    assert_eq!(index.num_docs(), 6);
    assert!(LocalIndex::default_dir(&corpus).join("meta.json").exists());
    assert!(builds > 0);
    builds = 0;
    let again = LocalIndex::open_or_build(&corpus, None, &mut |_| builds += 1).unwrap();
    assert_eq!((again.num_docs(), builds), (6, 0), "opened, not rebuilt");
    let mut text = std::fs::read_to_string(&corpus).unwrap();
    text.push_str("{\"id\": \"6\", \"contents\": \"\\\"Lark Canal\\\"\\nThe Lark Canal was dug in 1702.\"}\n");
    std::fs::write(&corpus, text).unwrap();
    let rebuilt = LocalIndex::open_or_build(&corpus, None, &mut |_| builds += 1).unwrap();
    assert_eq!(rebuilt.num_docs(), 7);
    assert!(builds > 0);
    let hits = rebuilt.search_blocking(&["when was the lark canal dug".into()], 1).unwrap();
    assert!(hits[0][0].contents.contains("1702"));
    // Lenient parsing: query syntax a model might write is not an error.
    let odd = rebuilt.search_blocking(&["title:(\"unbalanced AND OR -".into(), String::new()], 3).unwrap();
    assert_eq!(odd.len(), 2);
    assert!(odd[1].is_empty());
    // A bad corpus row is reported with its line.
    std::fs::write(&corpus, "{\"id\": \"1\", \"contents\": \"x\"}\n{\"id\": 2}\n").unwrap();
    let err = LocalIndex::open_or_build(&corpus, None, &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("c.jsonl:2"), "{err}");
}

/// A remote backend that hangs never stalls the tick loop: while searches wait at the hanging
/// backend (every one of them until its deadline), episodes on the local backend step, fork and
/// finish as usual, and the waiting steps end with `backend_timeout` observations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_backend_does_not_stall_the_others() {
    let addr = hanging_server().await;
    let cfg = RemoteConfig { deadline_ms: 6_000, retries: 0, backoff_ms: 5, ..Default::default() };
    let remote = RemoteRetriever::new(format!("http://{addr}/retrieve"), cfg).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let index =
        LocalIndex::open_or_build(&fixture("wiki18-sample.jsonl"), Some(&dir.path().join("i")), &mut |_| {}).unwrap();
    let backends = Backends::new("local", Arc::new(index.clone())).with("hanging", Arc::new(remote));
    let server = TestServer::start_with(ServerConfig::default(), backends, index, dir).await;
    let slow = Arc::new(server.client().await);
    let opts = grove_protocol::EpisodeOptions { backend: Some("hanging".into()), ..Default::default() };
    let tasks = vec![em_task(); 16];
    let waiting: Vec<_> =
        slow.create_episodes(tasks, opts).await.unwrap().into_iter().map(|r| r.unwrap().episode).collect();
    let started = Instant::now();
    let pending = {
        let slow = slow.clone();
        let actions = waiting
            .iter()
            .map(|e| StepAction {
                episode: *e,
                action: grove_protocol::Action::Text("<search> q </search>".into()),
                data: None,
            })
            .collect();
        tokio::spawn(async move { slow.step(actions).await })
    };
    // Meanwhile, on the local backend: whole episodes, each reply long before the deadline.
    let c = server.client().await;
    for _ in 0..5 {
        let t = Instant::now();
        let ep = c.create_episodes(vec![em_task()], Default::default()).await.unwrap()[0].clone().unwrap().episode;
        let obs = c.step_text(ep, "<search> Ada Kerrigan </search>").await.unwrap();
        assert!(obs.text.contains("Ada Kerrigan"));
        let forked = c.fork(vec![grove_protocol::ForkSpec { episode: ep, at_step: 1, n: 2 }]).await.unwrap();
        assert_eq!(forked[0].as_ref().unwrap().children.len(), 2);
        assert!(c.step_text(ep, "<answer> x </answer>").await.unwrap().done);
        assert!(t.elapsed() < Duration::from_secs(4), "a local episode waited on the hanging backend");
    }
    assert!(started.elapsed() < Duration::from_millis(5_500), "the local episodes finished while the others waited");
    let results = pending.await.unwrap().unwrap();
    assert!(started.elapsed() >= Duration::from_millis(5_900), "the hanging searches waited for their deadline");
    for r in results {
        assert_eq!(r.unwrap().error.map(|e| e.code), Some(ErrorCode::BackendTimeout));
    }
    server.shutdown().await;
}
