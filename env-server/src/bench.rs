//! `env-server bench`: start a server in-process on loopback over a corpus, drive it with real
//! WebSocket clients, and print one table (or JSON lines with `--json`, for `cargo xtask bench`).
//! Each figure is measured in this run; fork cost is measured at depth 1 and depth 50 side by side
//! so their ratio shows depth (in)dependence, and the same searches go through HTTP
//! `POST /retrieve` (the Search-R1 dialect, one query per request) as a baseline for the steps.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use grove_datasets::synthetic::{World, WorldConfig};
use grove_env_server::config::ServerConfig;
use grove_env_server::sim::Sim;
use grove_env_server::{Backends, run};
use grove_protocol::client::{Client, ClientOptions};
use grove_protocol::*;

use crate::alloc_counter;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Corpus to index (default: the synthetic world, scaled by --scale, in a temp dir).
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// Size factor of the synthetic world (236 passages per unit).
    #[arg(long, default_value_t = 40)]
    scale: usize,
    /// Concurrent episodes stepping at once (and concurrent HTTP `/retrieve` requests in the
    /// baseline).
    #[arg(long, default_value_t = 256)]
    episodes: usize,
    /// WebSocket connections the episodes are spread over.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Seconds of each stepping phase (saturated, paced, and the HTTP baseline).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Seconds of each BM25-alone measurement.
    #[arg(long, default_value_t = 2.0)]
    bm25_seconds: f64,
    /// Offered load of the paced phase, in steps/s over all episodes (a trainer's episodes
    /// think between steps; latency is measured at this load).
    #[arg(long, default_value_t = 5_000.0)]
    rate: f64,
    /// Skip the HTTP `POST /retrieve` baseline.
    #[arg(long)]
    no_http: bool,
    /// Print the rows as JSON lines (`{"figure", "value", "unit", "note"}`) instead of the table.
    #[arg(long)]
    json: bool,
}

/// One figure of the report, in the schema every bench prints (`grove_rundir::bench`).
pub(crate) type Row = grove_rundir::bench::BenchRow;

pub(crate) fn row(figure: impl Into<String>, value: impl Into<String>, unit: &str, note: impl Into<String>) -> Row {
    Row::new(figure, value, unit, note)
}

/// The `p50 / p99` row of a sorted latency sample.
fn latency_row(figure: &str, sorted: &[Duration], note: &str) -> Row {
    row(figure, format!("{:.2} / {:.2}", pct_ms(sorted, 0.5), pct_ms(sorted, 0.99)), "ms", note)
}

/// Latency percentile of a sorted sample, in milliseconds.
fn pct_ms(sorted: &[Duration], p: f64) -> f64 {
    sorted.get(((sorted.len() as f64 - 1.0) * p) as usize).copied().unwrap_or_default().as_secs_f64() * 1e3
}

pub async fn run_bench(args: BenchArgs) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (corpus, label) = match &args.corpus {
        Some(c) => (c.clone(), c.display().to_string()),
        None => {
            let world = World::generate(&WorldConfig::scaled(7, args.scale));
            let path = dir.path().join("synthetic.jsonl");
            grove_datasets::loaders::write_wiki18(&path, &world.passages)?;
            (path, format!("synthetic world x{} ({} passages)", args.scale, world.passages.len()))
        }
    };
    let index_dir = dir.path().join("index");
    let index = {
        let (c, i) = (corpus.clone(), index_dir.clone());
        tokio::task::spawn_blocking(move || crate::open_local_index(&c, Some(&i))).await??
    };
    let queries = bench_queries(&corpus, 2_000)?;
    let mut rows = Vec::new();
    let corpus_note = format!("{label}, {} documents", index.num_docs());
    eprintln!("corpus: {corpus_note}");
    let window = Duration::from_secs_f64(args.bm25_seconds.max(0.1));

    // 1. The backend alone, on one thread.
    let bm25_qps = bm25_queries_per_s(&index, &queries, window)?;
    rows.push(row(
        "BM25 queries/s, backend alone (1 thread, top-3)",
        format!("{bm25_qps:.0}"),
        "queries/s",
        corpus_note,
    ));
    // The mini-Wikipedia corpus of `cargo xtask assets`, when it is there.
    let wiki = grove_datasets::assets::wiki_summaries_corpus();
    if wiki.exists() && args.corpus.is_none() {
        let wiki_index = {
            let (c, i) = (wiki.clone(), dir.path().join("wiki-index"));
            tokio::task::spawn_blocking(move || crate::open_local_index(&c, Some(&i))).await??
        };
        let qps = bm25_queries_per_s(&wiki_index, &bench_queries(&wiki, 2_000)?, window)?;
        rows.push(row(
            "BM25 queries/s, mini-Wikipedia (1 thread, top-3)",
            format!("{qps:.0}"),
            "queries/s",
            format!("{} passages", wiki_index.num_docs()),
        ));
    } else {
        rows.push(row("BM25 queries/s, mini-Wikipedia", "-", "", "assets missing (cargo xtask assets)"));
    }

    // 2. Search steps over WebSocket.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let mut config = ServerConfig::default();
    let connection_slots = grove_env_server::net::connection_budget(config.limits.max_connections).0;
    config.limits.max_turns = 1_000;
    config.limits.max_in_flight_per_connection = 4_096;
    let topk = config.episodes.topk;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(run(listener, config, Backends::new("local", Arc::new(index.clone())), async {
        let _ = stop_rx.await;
    }));
    let url = format!("ws://{addr}/");
    let mut clients = Vec::new();
    for _ in 0..args.connections.max(1) {
        clients.push(Arc::new(Client::connect(&url, ClientOptions::default()).await?));
    }
    let (steps, mut lat, wall) = step_phase(&clients, &queries, args.episodes, args.seconds, None).await?;
    lat.sort_unstable();
    let steps_per_s = steps as f64 / wall;
    let setting = format!("{} episodes over {} connections, closed loop", args.episodes, args.connections);
    rows.push(row("search steps/s over WebSocket, saturated", format!("{steps_per_s:.0}"), "steps/s", setting));
    rows.push(latency_row("  step latency p50 / p99, saturated", &lat, "queueing included"));
    rows.push(row(
        "  steps/s vs BM25 backend alone",
        format!("{:.2}x", steps_per_s / bm25_qps),
        "ratio",
        "server over 1-thread backend",
    ));
    let (steps, mut lat, wall) = step_phase(&clients, &queries, args.episodes, args.seconds, Some(args.rate)).await?;
    lat.sort_unstable();
    rows.push(row(
        "search steps/s over WebSocket, paced",
        format!("{:.0}", steps as f64 / wall),
        "steps/s",
        format!("offered {:.0} steps/s by {} episodes", args.rate, args.episodes),
    ));
    rows.push(latency_row("  step latency p50 / p99, paced", &lat, "target p99 < 10"));

    // 3. Baseline: the same searches as Search-R1 `POST /retrieve`, one query per request.
    if !args.no_http {
        let retrieve = format!("http://{addr}/retrieve");
        let in_flight = http_in_flight(args.episodes, clients.len(), connection_slots);
        if in_flight < args.episodes {
            eprintln!(
                "HTTP baseline: {in_flight} requests in flight, not {}: each holds a connection (two open files \
                 in this process), and the server takes {connection_slots} (raise `ulimit -n` for more)",
                args.episodes
            );
        }
        let (n, mut lat, wall) = http_phase(&retrieve, &queries, in_flight, args.seconds, topk).await?;
        lat.sort_unstable();
        let http_per_s = n as f64 / wall;
        rows.push(row(
            "HTTP POST /retrieve/s, saturated (baseline)",
            format!("{http_per_s:.0}"),
            "requests/s",
            format!("{in_flight} in flight on keep-alive connections, 1 query each, top-{topk}"),
        ));
        rows.push(latency_row("  request latency p50 / p99, saturated", &lat, ""));
        rows.push(row(
            "  WebSocket steps/s vs HTTP /retrieve/s",
            format!("{:.2}x", steps_per_s / http_per_s),
            "ratio",
            if in_flight == args.episodes {
                "same searches, same concurrency".to_string()
            } else {
                format!("same searches; HTTP at {in_flight} in flight, WebSocket at {}", args.episodes)
            },
        ));
    }

    // 4. Forks over the wire, at depth 1 and 50.
    for depth in [1u32, 50] {
        let (forks_per_s, _) = wire_forks(&clients[0], depth).await?;
        rows.push(row(
            format!("forks/s over WebSocket, depth {depth}"),
            format!("{forks_per_s:.0}"),
            "forks/s",
            "16 per request",
        ));
    }
    drop(clients);
    let _ = stop_tx.send(());
    server.await??;

    // 5. Forks in-process, and the memory each fork allocates, at depth 1 and 50.
    let mut per_depth = Vec::new();
    for depth in [1u32, 50] {
        let (forks_per_s, bytes) = in_process_forks(depth);
        per_depth.push((forks_per_s, bytes));
        rows.push(row(
            format!("fork cost in-process, depth {depth}"),
            format!("{:.0}", 1e9 / forks_per_s),
            "ns/fork",
            format!("{forks_per_s:.0} forks/s, best of 3 x 4,000"),
        ));
        rows.push(row(
            format!("heap bytes per forked episode, depth {depth}"),
            format!("{bytes:.0}"),
            "bytes",
            "amortised over 50,000 forks",
        ));
    }
    rows.push(row(
        "fork cost depth 50 / depth 1 (time, bytes)",
        format!("{:.2}x, {:.2}x", per_depth[0].0 / per_depth[1].0, per_depth[1].1 / per_depth[0].1),
        "ratio",
        "1.0 = independent of depth",
    ));

    if args.json {
        for r in rows {
            println!("{}", r.to_json_line());
        }
    } else {
        println!("\n{:<52} {:>16} {:<11} note", "env-server bench", "value", "unit");
        println!("{}", "-".repeat(110));
        for r in rows {
            println!("{:<52} {:>16} {:<11} {}", r.figure, r.value, r.unit, r.note);
        }
    }
    Ok(())
}

/// Top-3 BM25 queries per second on the calling thread, over `window`.
fn bm25_queries_per_s(
    index: &grove_env_server::search::LocalIndex,
    queries: &[String],
    window: Duration,
) -> Result<f64> {
    let t = Instant::now();
    let mut n = 0;
    while t.elapsed() < window {
        for chunk in queries.chunks(64) {
            index.search_blocking(chunk, 3).context("bm25")?;
            n += chunk.len();
        }
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// Questions of the corpus's own titles, as search queries.
fn bench_queries(corpus: &std::path::Path, n: usize) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for p in grove_datasets::loaders::stream_wiki18(corpus)?.take(n) {
        let p = p?;
        out.push(format!("{} {}", p.title, p.text.split_whitespace().take(4).collect::<Vec<_>>().join(" ")));
    }
    if out.is_empty() {
        bail!("the corpus is empty");
    }
    Ok(out)
}

fn task(q: &str) -> TaskSpec {
    TaskSpec {
        question: q.into(),
        golden_answers: vec!["x".into()],
        data_source: "nq".into(),
        task_id: None,
        metric: None,
    }
}

/// `episodes` concurrent loops, each stepping one episode with searches: as fast as replies come
/// (`rate` None), or each at `rate / episodes` steps per second (open loop, staggered starts).
async fn step_phase(
    clients: &[Arc<Client>],
    queries: &[String],
    episodes: usize,
    seconds: f64,
    rate: Option<f64>,
) -> Result<(usize, Vec<Duration>, f64)> {
    let options = EpisodeOptions { max_turns: Some(1_000), ..Default::default() };
    let stop = Arc::new(AtomicBool::new(false));
    let queries = Arc::new(queries.to_vec());
    let mut tasks = Vec::new();
    let started = Instant::now();
    for e in 0..episodes {
        let client = clients[e % clients.len()].clone();
        let (stop, queries, options) = (stop.clone(), queries.clone(), options.clone());
        tasks.push(tokio::spawn(async move {
            let created = client.create_episodes(vec![task("bench")], options).await?;
            let Some(Ok(start)) = created.into_iter().next() else { bail!("create failed") };
            let mut lat = Vec::new();
            let mut i = e;
            let interval = rate.map(|r| Duration::from_secs_f64(episodes as f64 / r));
            let mut next = tokio::time::Instant::now()
                + interval.map_or(Duration::ZERO, |d| d.mul_f64(e as f64 / episodes as f64));
            while !stop.load(Ordering::Relaxed) {
                if let Some(d) = interval {
                    tokio::time::sleep_until(next).await;
                    next += d;
                }
                let q = &queries[i % queries.len()];
                i += episodes;
                let t = Instant::now();
                let obs = client.step_text(start.episode, &format!("<search> {q} </search>")).await?;
                lat.push(t.elapsed());
                if obs.kind != ActionKind::Search || obs.text.is_empty() {
                    bail!("unexpected observation {obs:?}");
                }
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    finish_phase(tasks, &stop, seconds, started).await
}

/// Let a phase's loops run for `seconds`, stop them, and gather their latencies: (requests,
/// latencies, wall seconds since `started`).
async fn finish_phase(
    tasks: Vec<tokio::task::JoinHandle<Result<Vec<Duration>>>>,
    stop: &AtomicBool,
    seconds: f64,
    started: Instant,
) -> Result<(usize, Vec<Duration>, f64)> {
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let wall = started.elapsed().as_secs_f64();
    Ok((all.len(), all, wall))
}

/// The Search-R1 baseline: `concurrency` loops, each posting one query per `POST /retrieve` as
/// fast as replies come, over a shared pool of keep-alive connections (HTTP/1.1: one request in
/// flight per connection, so the pool grows to `concurrency` connections).
/// Requests the HTTP baseline keeps in flight: one per episode, as far as connections allow.
/// Each holds a TCP connection, whose two ends are both open files of this process, and the
/// server accepts at most `server_slots` connections, `ws_connections` of which the WebSocket
/// clients hold.
fn http_in_flight(episodes: usize, ws_connections: usize, server_slots: usize) -> usize {
    let by_server = server_slots.saturating_sub(ws_connections + 1);
    // What is open already (index files, the WebSocket clients), and some room to spare.
    let open = std::fs::read_dir("/proc/self/fd").map_or(256, |d| d.count());
    let by_files =
        grove_env_server::net::open_files_limit().map_or(usize::MAX, |l| (l as usize).saturating_sub(open + 64) / 2);
    episodes.min(by_server).min(by_files).max(1)
}

async fn http_phase(
    url: &str,
    queries: &[String],
    concurrency: usize,
    seconds: f64,
    topk: u32,
) -> Result<(usize, Vec<Duration>, f64)> {
    grove_http::install_tls_provider();
    let stop = Arc::new(AtomicBool::new(false));
    let queries = Arc::new(queries.to_vec());
    let mut tasks = Vec::new();
    let started = Instant::now();
    for e in 0..concurrency {
        // A client per worker, each on its own keep-alive connection (as Search-R1's worker
        // processes have): a shared pool opens more connections than requests in flight when a
        // connection is not back in the pool yet, and connections are what the limits count.
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(1)
            .tcp_nodelay(true)
            .timeout(Duration::from_secs(30))
            .build()
            .context("http client")?;
        let (stop, queries, url) = (stop.clone(), queries.clone(), url.to_string());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = e;
            while !stop.load(Ordering::Relaxed) {
                let q = &queries[i % queries.len()];
                i += concurrency;
                let t = Instant::now();
                let body = serde_json::json!({ "query": q, "topk": topk, "return_scores": false });
                let reply = http.post(&url).json(&body).send().await?.error_for_status()?;
                let v: serde_json::Value = serde_json::from_slice(&reply.bytes().await?)?;
                lat.push(t.elapsed());
                if v["result"][0].as_array().is_none_or(Vec::is_empty) {
                    bail!("unexpected /retrieve reply {v}");
                }
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    finish_phase(tasks, &stop, seconds, started).await
}

/// Advance a fresh episode `depth` steps with invalid actions (no search), then time forks.
async fn wire_forks(client: &Client, depth: u32) -> Result<(f64, usize)> {
    let options = EpisodeOptions { max_turns: Some(depth + 10), ..Default::default() };
    let created = client.create_episodes(vec![task("fork bench")], options).await?;
    let Some(Ok(start)) = created.into_iter().next() else { bail!("create failed") };
    for _ in 0..depth {
        client.step_text(start.episode, "thinking without a tool call").await?;
    }
    let rounds = 200;
    let n = 16;
    let t = Instant::now();
    let mut children = Vec::new();
    for _ in 0..rounds {
        let r = client.fork(vec![ForkSpec { episode: start.episode, at_step: depth, n }]).await?;
        for f in r {
            children.extend(f.map_err(|e| anyhow::anyhow!("{e}"))?.children);
        }
    }
    let per_s = children.len() as f64 / t.elapsed().as_secs_f64();
    for chunk in children.chunks(4096) {
        client.close(chunk.to_vec()).await?;
    }
    Ok((per_s, children.len()))
}

/// Forks straight on a `Sim`, with allocated bytes counted by the global allocator.
fn in_process_forks(depth: u32) -> (f64, f64) {
    let mut config = ServerConfig::default();
    config.limits.max_turns = 1_000;
    config.limits.max_forks_per_request = 100_000;
    let mut sim = Sim::new(config.limits, &config.episodes, vec!["local".into()]);
    let conn = 1;
    let opts = EpisodeOptions { max_turns: Some(depth + 10), ..Default::default() };
    sim.submit(conn, 1, Request::CreateEpisodes(CreateEpisodes { tasks: vec![task("fork bench")], options: opts }));
    sim.tick(Instant::now());
    let episode = 1;
    for s in 0..depth {
        let action =
            StepAction { episode, action: Action::Text(format!("step {s}: no tool call, some words")), data: None };
        sim.submit(conn, 2 + s as u64, Request::Step(Step { actions: vec![action] }));
        sim.tick(Instant::now());
    }
    // Memory: heap growth over 50,000 forks from this state, amortised (the world's tables and
    // the directory grow by doubling, so this includes their slack).
    let n_bytes = 50_000u32;
    let before = alloc_counter::allocated();
    for i in 0..(n_bytes / 500) {
        let forks = vec![ForkSpec { episode, at_step: depth, n: 500 }];
        sim.submit(conn, 10_000 + u64::from(i), Request::Fork(Fork { forks }));
        sim.tick(Instant::now());
    }
    let bytes = alloc_counter::allocated().saturating_sub(before) as f64 / f64::from(n_bytes);
    // Time: best of three rounds of 4,000 forks (the machine is shared).
    let forks = 4_000u32;
    let mut best = f64::INFINITY;
    for round in 0..3u64 {
        let t = Instant::now();
        for i in 0..(forks / 100) {
            let id = 20_000 + round * 1_000 + u64::from(i);
            sim.submit(conn, id, Request::Fork(Fork { forks: vec![ForkSpec { episode, at_step: depth, n: 100 }] }));
            sim.tick(Instant::now());
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    let elapsed = best;
    (forks as f64 / elapsed, bytes)
}
