//! The web environment end to end: a real env-server with `backend = "web"` over WebSocket, its
//! provider replaced by a loopback server that speaks Serper's API, pages served on loopback, the
//! persistent cache on a real SQLite file or a real redis-server.

use std::process::{Command, Stdio};
use std::time::Duration;

use grove_env_server::backends::{remote_backends, web_backends};
use grove_env_server::config::{BackendKind, CacheMode, CacheStoreKind, Provider, ServerConfig};
use grove_env_server::testkit::{Canned, LocalServer, Recorded, RedisServer, ScriptedServer, spawn_ready};
use grove_protocol::client::{Client, ClientOptions};
use grove_protocol::{ActionKind, EpisodeId, ErrorCode, ForkSpec, Observation, TaskSpec};

/// A Serper stand-in: two organic results derived from the query, plus the fields Serper sends
/// that we ignore. `slow` queries answer after 3 s; `fail` queries get a 500.
async fn serper() -> ScriptedServer {
    ScriptedServer::start(|req: &Recorded| {
        let q = req.json().get("q").and_then(|v| v.as_str()).unwrap_or_default().to_string();
        if q.contains("fail") {
            return Canned::status(500, "upstream exploded");
        }
        let slug = q.replace(' ', "_");
        let body = serde_json::json!({
            "searchParameters": {"q": q, "gl": "us", "hl": "en", "num": 10, "type": "search", "engine": "google"},
            "organic": [
                {"title": format!("{q} - Wikipedia"), "link": format!("https://en.wikipedia.org/wiki/{slug}"),
                 "snippet": format!("{q} is the first fact."), "position": 1},
                {"title": format!("All about {q}"), "link": format!("https://example.org/{slug}"),
                 "snippet": format!("A second page on {q}."), "position": 2, "date": "Mar 3, 2024"}
            ],
            "relatedSearches": [{"query": format!("{q} history")}],
            "credits": 1
        });
        let reply = Canned::json(&body);
        if q.contains("slow") { reply.delayed(Duration::from_secs(3)) } else { reply }
    })
    .await
    .unwrap()
}

fn web_config(provider: &ScriptedServer, cache: &std::path::Path) -> ServerConfig {
    let mut c = ServerConfig { backend: BackendKind::Web, ..Default::default() };
    c.web.provider = Provider::Serper;
    c.web.endpoint = Some(format!("{}/search", provider.url()));
    c.web.api_key = Some("test-key-not-secret".into());
    c.web.deadline_ms = 1_000;
    c.web.retries = 1;
    c.web.backoff_ms = 10;
    c.web.rate_per_sec = 1000.0;
    c.web.burst = 1000;
    c.cache.path = Some(cache.to_path_buf());
    c.pages.allow_private = true;
    c.episodes.max_turns = 8;
    c
}

/// A [`LocalServer`] with the web (or remote) backends its configuration names.
struct Server(LocalServer);

impl Server {
    async fn start(config: ServerConfig) -> Server {
        let backends = match config.backend {
            BackendKind::Remote => remote_backends(&config).await.unwrap(),
            _ => web_backends(&config).await.unwrap(),
        };
        Server(LocalServer::start_with(config, backends).await.unwrap())
    }

    async fn client(&self) -> Client {
        Client::connect(&self.0.url(), ClientOptions::default()).await.unwrap()
    }

    async fn metrics(&self) -> String {
        reqwest::get(self.0.http("/metrics")).await.unwrap().text().await.unwrap()
    }

    async fn stop(self) {
        self.0.shutdown().await.unwrap();
    }
}

fn task() -> TaskSpec {
    TaskSpec {
        question: "who wrote hamlet".into(),
        golden_answers: vec!["William Shakespeare".into()],
        data_source: "simpleqa".into(),
        task_id: None,
        metric: None,
    }
}

async fn episode(c: &Client) -> EpisodeId {
    c.create_episodes(vec![task()], Default::default()).await.unwrap()[0].clone().unwrap().episode
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no {series} in /metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_search_renders_pages_and_forks_share_the_cache() {
    let provider = serper().await;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(web_config(&provider, &dir.path().join("cache.sqlite3"))).await;
    let c = server.client().await;
    let e = episode(&c).await;
    let obs = c.step_text(e, "<think>look it up</think><search> Hamlet author </search>").await.unwrap();
    assert_eq!(obs.kind, ActionKind::Search);
    assert_eq!(
        obs.text,
        "\n\n<information>Page 1: Hamlet author is the first fact.\nPage 2: A second page on Hamlet author.\
         </information>\n\n"
    );
    assert!(obs.error.is_none());
    assert_eq!(provider.count(), 1);
    let sent = &provider.requests()[0];
    assert_eq!(sent.header("x-api-key"), Some("test-key-not-secret"));

    // Siblings forked before the search ask the same query: served by the cache.
    let forked = c.fork(vec![ForkSpec { episode: e, at_step: 0, n: 3 }]).await.unwrap();
    let children = forked[0].clone().unwrap().children;
    for child in &children {
        let again = c.step_text(*child, "<search>  hamlet   AUTHOR </search>").await.unwrap();
        assert_eq!(again.text, obs.text, "normalised query, same cached result");
    }
    assert_eq!(provider.count(), 1, "cache hits cost no provider call");
    let stats = c.stats().await.unwrap();
    let serper = stats.providers["serper"];
    assert_eq!((serper.calls, serper.cache_hits, serper.cache_misses), (1, 3, 1));
    let m = server.metrics().await;
    assert_eq!(metric(&m, "grove_provider_calls_total{provider=\"serper\"}"), 1.0);
    assert_eq!(metric(&m, "grove_cache_hits_total{provider=\"serper\"}"), 3.0);
    drop(c);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_fetches_readable_text_once() {
    let provider = serper().await;
    let pages = ScriptedServer::start(|_req: &Recorded| {
        Canned::html(
            "<html><head><title>Hamlet</title><script>var tracking = 1;</script></head><body>\
             <nav>Home | About</nav><article><h1>Hamlet</h1>\
             <p>Hamlet is a tragedy written by William Shakespeare sometime between 1599 and 1601.</p>\
             <p>It is Shakespeare's longest play, with 29,551 words, and is considered among the most \
             powerful and influential tragedies in the English language.</p></article>\
             <footer>Copyright</footer></body></html>",
        )
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(web_config(&provider, &dir.path().join("cache.sqlite3"))).await;
    let c = server.client().await;
    let e = episode(&c).await;
    let url = format!("{}/wiki/Hamlet", pages.url());
    let obs = c.step_text(e, &format!("<open> {url} </open>")).await.unwrap();
    assert_eq!(obs.kind, ActionKind::Open);
    assert!(obs.error.is_none(), "{:?}", obs.error);
    assert!(obs.text.contains("Title: Hamlet"), "{}", obs.text);
    assert!(obs.text.contains("written by William Shakespeare"), "{}", obs.text);
    assert!(!obs.text.contains("tracking"), "{}", obs.text);
    // The structured tool call does the same, from the cache.
    let e2 = episode(&c).await;
    let call = grove_protocol::ToolCall {
        name: "open".into(),
        arguments: [("url".to_string(), serde_json::Value::String(url.clone()))].into_iter().collect(),
    };
    let step = grove_protocol::StepAction { episode: e2, action: grove_protocol::Action::Tool(call), data: None };
    let again = c.step(vec![step]).await.unwrap().remove(0).unwrap();
    assert_eq!(again.text, obs.text);
    assert_eq!(pages.count(), 1, "the second open is a cache hit");
    let t = c.transcript(e2).await.unwrap();
    assert_eq!(t.steps[0].action, format!("<open> {url} </open>"));
    assert_eq!(c.stats().await.unwrap().providers["open"].cache_hits, 1);
    drop(c);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_tool_calls_are_observations_with_typed_codes() {
    let provider = serper().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = web_config(&provider, &dir.path().join("cache.sqlite3"));
    config.pages.allow_private = false;
    let server = Server::start(config).await;
    let c = server.client().await;
    let e = episode(&c).await;

    let failed = c.step_text(e, "<search> please fail </search>").await.unwrap();
    assert_eq!(failed.text, "\n\n<information>Search failed for query: please fail (HTTP 500)</information>\n\n");
    assert_eq!(failed.error.as_ref().map(|e| e.code), Some(ErrorCode::BackendError));
    assert_eq!(failed.turns_left, 7, "a failed search is a step");
    assert_eq!(provider.requests().iter().filter(|r| r.json()["q"] == "please fail").count(), 2, "one retry");

    let slow = c.step_text(e, "<search> slow one </search>").await.unwrap();
    assert_eq!(slow.error.as_ref().map(|e| e.code), Some(ErrorCode::BackendTimeout));
    assert!(slow.text.contains("Search failed for query: slow one (timeout after 1000 ms)"), "{}", slow.text);

    let refused = c.step_text(e, &format!("<open> {}/admin </open>", provider.url())).await.unwrap();
    assert_eq!(refused.error.as_ref().map(|e| e.code), Some(ErrorCode::UrlRejected));
    assert!(refused.text.contains("Could not open"), "{}", refused.text);
    assert!(provider.requests().iter().all(|r| r.target != "/admin"), "nothing was fetched");

    // Failures are not cached: the provider is asked again.
    let before = provider.count();
    c.step_text(e, "<search> please fail </search>").await.unwrap();
    assert!(provider.count() > before);

    let m = server.metrics().await;
    assert!(metric(&m, "grove_errors_total{code=\"backend_error\"}") >= 2.0);
    assert_eq!(metric(&m, "grove_errors_total{code=\"backend_timeout\"}"), 1.0);
    assert_eq!(metric(&m, "grove_errors_total{code=\"url_rejected\"}"), 1.0);
    assert!(metric(&m, "grove_provider_errors_total{provider=\"serper\"}") >= 3.0);
    drop(c);
    server.stop().await;
}

/// One evaluation pass: a fixed list of searches on fresh episodes, the observations in order.
async fn evaluation(server: &Server, queries: &[String]) -> Vec<Observation> {
    let c = server.client().await;
    let mut out = Vec::new();
    for q in queries {
        let e = episode(&c).await;
        out.push(c.step_text(e, &format!("<search> {q} </search>")).await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_serves_a_recorded_evaluation_without_the_network() {
    let provider = serper().await;
    let dir = tempfile::tempdir().unwrap();
    let recorded = dir.path().join("recorded.sqlite3");
    let queries: Vec<String> = (0..12).map(|i| format!("question number {i}")).collect();
    let server = Server::start(web_config(&provider, &recorded)).await;
    let first = evaluation(&server, &queries).await;
    server.stop().await;
    assert_eq!(provider.count(), 12);

    // Move the recording through JSONL, as one would ship it with a paper.
    let jsonl = dir.path().join("cache.jsonl");
    {
        let cfg = web_config(&provider, &recorded).cache;
        let cache = grove_env_server::backends::open_cache(&cfg).await.unwrap().unwrap();
        let n = cache.export_jsonl(std::fs::File::create(&jsonl).unwrap()).await.unwrap();
        assert_eq!(n, 12);
        let mut cfg2 = cfg.clone();
        cfg2.path = Some(dir.path().join("imported.sqlite3"));
        let imported = grove_env_server::backends::open_cache(&cfg2).await.unwrap().unwrap();
        let file = std::io::BufReader::new(std::fs::File::open(&jsonl).unwrap());
        assert_eq!(imported.import_jsonl(file).await.unwrap().imported, 12);
    }

    // Replay from the imported copy with the recording's configuration (its endpoint is part of
    // the cache key); the provider counts every call.
    let mut config = web_config(&provider, &dir.path().join("imported.sqlite3"));
    config.cache.mode = CacheMode::Replay;
    let server = Server::start(config).await;
    let second = evaluation(&server, &queries).await;
    let texts = |obs: &[Observation]| obs.iter().map(|o| (o.text.clone(), o.error.clone())).collect::<Vec<_>>();
    assert_eq!(texts(&second), texts(&first), "identical observations");
    assert!(first.iter().all(|o| o.error.is_none()));
    assert_eq!(provider.count(), 12, "replay makes no provider call");
    let miss = evaluation(&server, &["never asked".to_string()]).await.remove(0);
    assert_eq!(miss.error.as_ref().map(|e| e.code), Some(ErrorCode::ReplayMiss));
    assert_eq!(provider.count(), 12);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_share_one_redis_cache() {
    let redis = RedisServer::start().unwrap();
    let provider = serper().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = web_config(&provider, &dir.path().join("unused.sqlite3"));
    config.cache.store = CacheStoreKind::Redis;
    config.cache.redis_url = Some(redis.url());
    config.cache.ttl_secs = Some(3600);
    let a = Server::start(config.clone()).await;
    let b = Server::start(config).await;
    let on_a = evaluation(&a, &["shared question".to_string()]).await.remove(0);
    assert_eq!(provider.count(), 1);
    let on_b = evaluation(&b, &["Shared  Question".to_string()]).await.remove(0);
    assert_eq!(provider.count(), 1, "a hit on the other server");
    assert_eq!(on_b.text, on_a.text);
    let stats = b.client().await.stats().await.unwrap();
    assert_eq!((stats.providers["serper"].calls, stats.providers["serper"].cache_hits), (0, 1));
    a.stop().await;
    b.stop().await;
}

/// The env-server binary, killed with SIGKILL after a batch of cached calls, serves every one of
/// them again from its SQLite file after a restart, without a provider call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_results_survive_kill_9() {
    let provider = serper().await;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache.sqlite3");
    let config = dir.path().join("server.toml");
    std::fs::write(
        &config,
        format!(
            "backend = \"web\"\n[web]\nprovider = \"serper\"\nendpoint = \"{}/search\"\napi_key_env = \"GROVE_TEST_SERPER_KEY\"\n\
             rate_per_sec = 1000.0\nburst = 1000\n[cache]\npath = \"{}\"\n",
            provider.url(),
            cache.display()
        ),
    )
    .unwrap();
    let queries: Vec<String> = (0..25).map(|i| format!("durable question {i}")).collect();
    let spawn = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_env-server"));
        cmd.args(["serve", "--config"])
            .arg(&config)
            .env("GROVE_TEST_SERPER_KEY", "k")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        spawn_ready(cmd, Duration::from_secs(10))
    };
    async fn ask(c: &Client, queries: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        for q in queries {
            let e = c.create_episodes(vec![task()], Default::default()).await.unwrap()[0].clone().unwrap().episode;
            out.push(c.step_text(e, &format!("<search> {q} </search>")).await.unwrap().text);
        }
        out
    }
    let mut server = spawn().await.unwrap();
    let c = Client::connect(&server.url(), ClientOptions::default()).await.unwrap();
    let before = ask(&c, &queries).await;
    assert_eq!(provider.count(), 25);
    server.child.kill().unwrap(); // SIGKILL: no shutdown path runs
    server.child.wait().unwrap();
    drop(c);

    let server = spawn().await.unwrap();
    let c = Client::connect(&server.url(), ClientOptions::default()).await.unwrap();
    let after = ask(&c, &queries).await;
    assert_eq!(after, before);
    assert_eq!(provider.count(), 25, "every result came from the cache");
    drop(server); // killed

    // `env-server cache export` names the cache with the same flags as `serve`.
    let out = dir.path().join("cache.jsonl");
    let status = Command::new(env!("CARGO_BIN_EXE_env-server"))
        .args(["cache", "export", "--config"])
        .arg(&config)
        .arg("--out")
        .arg(&out)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let lines = std::fs::read_to_string(&out).unwrap();
    assert_eq!(lines.lines().count(), 25);
    assert!(lines.lines().all(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["provider"] == "serper"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_results_can_be_rendered_as_documents() {
    let provider = serper().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = web_config(&provider, &dir.path().join("cache.sqlite3"));
    config.episodes.render = Some(grove_env_server::config::RenderFormat::Docs);
    let server = Server::start(config).await;
    let c = server.client().await;
    let e = episode(&c).await;
    let obs = c.step_text(e, "<search> Ophelia </search>").await.unwrap();
    assert_eq!(
        obs.text,
        "\n\n<information>Doc 1(Title: \"Ophelia - Wikipedia\") Ophelia is the first fact.\n\
         Doc 2(Title: \"All about Ophelia\") A second page on Ophelia.</information>\n\n"
    );
    drop(c);
    server.stop().await;
}

/// The remote Search-R1 retriever is a provider like the others: behind the cache when
/// `remote.cache` is set, keyed by its URL, the query and top-k.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_retriever_behind_the_cache() {
    let retriever = ScriptedServer::start(|req: &Recorded| {
        let body = req.json();
        let lists: Vec<serde_json::Value> = body["queries"]
            .as_array()
            .map(|qs| {
                qs.iter()
                    .map(|q| {
                        let q = q.as_str().unwrap_or_default();
                        serde_json::json!([{"document": {"id": "7", "contents": format!("\"{q}\"\nAbout {q}.")}, "score": 1.5}])
                    })
                    .collect()
            })
            .unwrap_or_default();
        Canned::json(&serde_json::json!({ "result": lists }))
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig { backend: BackendKind::Remote, ..Default::default() };
    config.remote_url = Some(format!("{}/retrieve", retriever.url()));
    config.remote.cache = true;
    config.cache.path = Some(dir.path().join("cache.sqlite3"));
    let server = Server::start(config).await;
    let c = server.client().await;
    let first = c.step_text(episode(&c).await, "<search> Elsinore </search>").await.unwrap();
    assert_eq!(first.text, "\n\n<information>Doc 1(Title: \"Elsinore\") About Elsinore.</information>\n\n");
    let again = c.step_text(episode(&c).await, "<search> elsinore </search>").await.unwrap();
    assert_eq!(again.text, first.text);
    assert_eq!(retriever.count(), 1, "the second search is a cache hit");
    // Another top-k is another request.
    let opts = grove_protocol::EpisodeOptions { topk: Some(5), ..Default::default() };
    let e = c.create_episodes(vec![task()], opts).await.unwrap()[0].clone().unwrap().episode;
    c.step_text(e, "<search> Elsinore </search>").await.unwrap();
    assert_eq!(retriever.count(), 2);
    let remote = c.stats().await.unwrap().providers["remote"];
    assert_eq!((remote.cache_hits, remote.cache_misses), (1, 2));
    drop(c);
    server.stop().await;
}
