//! `env-server bench`: start a server in-process on loopback over a corpus, drive it with real
//! WebSocket clients, and print one table. Each figure is measured in this run; fork cost is
//! measured at depth 1 and depth 50 side by side so their ratio shows depth (in)dependence.

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
    /// Concurrent episodes stepping at once.
    #[arg(long, default_value_t = 256)]
    episodes: usize,
    /// WebSocket connections the episodes are spread over.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Seconds of each stepping phase.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Offered load of the paced phase, in steps/s over all episodes (a trainer's episodes
    /// think between steps; latency is measured at this load).
    #[arg(long, default_value_t = 5_000.0)]
    rate: f64,
}

struct Row(&'static str, String, &'static str);

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
    eprintln!("corpus: {label}, {} documents", index.num_docs());

    // 1. The backend alone, on one thread.
    let bm25_qps = bm25_queries_per_s(&index, &queries)?;
    rows.push(Row("BM25 queries/s (backend alone, 1 thread, top-3)", format!("{bm25_qps:.0}"), ""));
    // The mini-Wikipedia corpus of `cargo xtask assets`, when it is there.
    let wiki = grove_datasets::assets::wiki_summaries_corpus();
    if wiki.exists() && args.corpus.is_none() {
        let wiki_index = {
            let (c, i) = (wiki.clone(), dir.path().join("wiki-index"));
            tokio::task::spawn_blocking(move || crate::open_local_index(&c, Some(&i))).await??
        };
        let qps = bm25_queries_per_s(&wiki_index, &bench_queries(&wiki, 2_000)?)?;
        rows.push(Row("BM25 queries/s, mini-Wikipedia (1 thread, top-3)", format!("{qps:.0}"), "10,033 passages"));
    }

    // 2. Search steps over WebSocket.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let mut config = ServerConfig::default();
    config.limits.max_turns = 1_000;
    config.limits.max_in_flight_per_connection = 4_096;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(run(listener, config, Backends::new("local", Arc::new(index.clone())), async {
        let _ = stop_rx.await;
    }));
    let url = format!("ws://{addr}/");
    let mut clients = Vec::new();
    for _ in 0..args.connections.max(1) {
        clients.push(Arc::new(Client::connect(&url, ClientOptions::default()).await?));
    }
    let (steps, _, wall) = step_phase(&clients, &queries, args.episodes, args.seconds, None).await?;
    let steps_per_s = steps as f64 / wall;
    rows.push(Row(
        "search steps/s over WebSocket, saturated",
        format!("{steps_per_s:.0}"),
        "closed loop, no think time",
    ));
    rows.push(Row("  concurrent episodes / connections", format!("{} / {}", args.episodes, args.connections), ""));
    rows.push(Row("  steps/s vs backend alone", format!("{:.2}x", steps_per_s / bm25_qps), "server overhead ratio"));
    let (steps, mut lat, wall) = step_phase(&clients, &queries, args.episodes, args.seconds, Some(args.rate)).await?;
    lat.sort_unstable();
    let pct = |p: f64| lat.get(((lat.len() as f64 - 1.0) * p) as usize).copied().unwrap_or_default();
    rows.push(Row("search steps/s at offered load", format!("{:.0}", steps as f64 / wall), "paced by --rate"));
    rows.push(Row("  offered load (steps/s)", format!("{:.0}", args.rate), ""));
    rows.push(Row("  step latency p50 (ms)", format!("{:.2}", pct(0.5).as_secs_f64() * 1e3), ""));
    rows.push(Row("  step latency p99 (ms)", format!("{:.2}", pct(0.99).as_secs_f64() * 1e3), "target < 10"));

    // 3. Forks over the wire, at depth 1 and 50.
    for depth in [1u32, 50] {
        let (forks_per_s, _) = wire_forks(&clients[0], depth).await?;
        rows.push(Row(
            if depth == 1 { "forks/s over WebSocket, depth 1" } else { "forks/s over WebSocket, depth 50" },
            format!("{forks_per_s:.0}"),
            "",
        ));
    }
    drop(clients);
    let _ = stop_tx.send(());
    server.await??;

    // 4. Forks in-process, and the memory each fork allocates, at depth 1 and 50.
    let mut per_depth = Vec::new();
    for depth in [1u32, 50] {
        let (forks_per_s, bytes) = in_process_forks(depth);
        per_depth.push((forks_per_s, bytes));
        rows.push(Row(
            if depth == 1 { "forks/s in-process, depth 1" } else { "forks/s in-process, depth 50" },
            format!("{forks_per_s:.0}"),
            "",
        ));
        rows.push(Row(
            if depth == 1 {
                "heap bytes per forked episode, depth 1"
            } else {
                "heap bytes per forked episode, depth 50"
            },
            format!("{bytes:.0}"),
            "",
        ));
    }
    rows.push(Row(
        "fork cost depth 50 / depth 1 (time, bytes)",
        format!("{:.2}x, {:.2}x", per_depth[0].0 / per_depth[1].0, per_depth[1].1 / per_depth[0].1),
        "1.0 = independent of depth",
    ));

    println!("\n{:<52} {:>14}  note", "env-server bench", "value");
    println!("{}", "-".repeat(90));
    for Row(name, value, note) in rows {
        println!("{name:<52} {value:>14}  {note}");
    }
    Ok(())
}

/// Top-3 BM25 queries per second on the calling thread, over two seconds.
fn bm25_queries_per_s(index: &grove_env_server::search::LocalIndex, queries: &[String]) -> Result<f64> {
    let t = Instant::now();
    let mut n = 0;
    while t.elapsed() < Duration::from_secs(2) {
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
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let wall = started.elapsed().as_secs_f64();
    Ok((all.len(), all, wall))
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
        let action = StepAction { episode, action: Action::Text(format!("step {s}: no tool call, some words")) };
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
