//! `env-server-soak` (feature `soak`; `cargo xtask soak` builds and runs it): start an
//! `env-server` as a separate process over the synthetic world, keep about `--episodes` episodes
//! live on it (stepping with real searches, forking, answering, closing and replacing them) for
//! `--minutes`, and print the server's RSS, its live heap and the step latency over time. Fails
//! when RSS or the heap grows after warm-up or when any request errors. A client of the server,
//! not part of it: it talks through the protocol client and cuts connections with the testkit's
//! proxy.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use grove_datasets::synthetic::{World, WorldConfig};
use grove_env_server::testkit::{CutProxy, spawn_ready};
use grove_protocol::client::{Client, ClientError, ClientOptions, Reconnect};
use grove_protocol::*;

#[derive(Parser, Debug)]
#[command(
    name = "env-server-soak",
    version,
    about = "Start an env-server process and keep ~1,000 episodes stepping and forking on it for N \
             minutes, printing its RSS and step latency over time; fails if RSS grows after warm-up."
)]
struct SoakArgs {
    /// The `env-server` binary to soak (default: the one beside this program).
    #[arg(long)]
    server: Option<PathBuf>,
    /// Length of the run, in minutes.
    #[arg(long)]
    minutes: f64,
    /// Episodes kept live at all times (forks may add up to 10% more for a moment).
    #[arg(long, default_value_t = 1_000)]
    episodes: usize,
    /// WebSocket connections the episodes are spread over.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Seconds between two printed lines.
    #[arg(long, default_value_t = 10.0)]
    interval_secs: f64,
    /// Warm-up before the RSS reference is taken (default: 1 minute or 20% of the run, whichever
    /// is smaller).
    #[arg(long)]
    warmup_minutes: Option<f64>,
    /// Size factor of the synthetic world (236 passages per unit).
    #[arg(long, default_value_t = 40)]
    scale: usize,
    /// Tool turns of each episode before its forced final turn.
    #[arg(long, default_value_t = 6)]
    max_turns: u32,
    /// Think time between two steps of one episode, in milliseconds (0: closed loop).
    #[arg(long, default_value_t = 0)]
    think_ms: u64,
    /// Seed of the episodes' random choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Cut every connection, at random moments about this many seconds apart (0: never), through
    /// a loopback proxy; the clients reconnect and reattach to their sessions, and nothing may
    /// be lost.
    #[arg(long, default_value_t = 0.0)]
    drop_every_secs: f64,
}

/// VmRSS of a process, in bytes.
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// xorshift64*: enough randomness for the episodes' choices, reproducible from `--seed`.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // splitmix64 of the seed, so that neighbouring seeds give unrelated streams.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + (self.next() % u64::from(hi - lo + 1)) as u32
    }

    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// State shared by the episode loops and the reporter.
struct Shared {
    stop: AtomicBool,
    steps: AtomicU64,
    /// Children created by forks.
    forks: AtomicU64,
    errors: AtomicU64,
    /// Episodes this client holds open (created or forked, not yet closed).
    open: AtomicI64,
    /// Step latencies of the current interval, in microseconds.
    latencies: Mutex<Vec<u32>>,
    /// The first few errors of the current interval.
    samples: Mutex<Vec<String>>,
    target: usize,
    queries: Vec<String>,
    options: EpisodeOptions,
}

impl Shared {
    fn error(&self, what: &str, why: impl std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut s) = self.samples.lock()
            && s.len() < 3
        {
            s.push(format!("{what}: {why}"));
        }
    }

    /// Whether a fork of `n` children (whose parent is then closed) keeps the open count within
    /// 10% of the target.
    fn room_for(&self, n: u32) -> bool {
        let open = self.open.load(Ordering::Relaxed).max(0) as usize;
        open + n as usize <= self.target + self.target / 10 + 1
    }
}

fn task(question: &str) -> TaskSpec {
    TaskSpec {
        question: question.into(),
        golden_answers: vec!["soak".into()],
        data_source: "nq".into(),
        task_id: None,
        metric: None,
    }
}

fn main() -> Result<()> {
    grove_env_server::init_logging();
    let args = SoakArgs::parse();
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run_soak(args))
}

/// The `env-server` binary beside this program's.
fn sibling_server() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locate this program")?;
    Ok(exe.with_file_name(format!("env-server{}", std::env::consts::EXE_SUFFIX)))
}

async fn run_soak(args: SoakArgs) -> Result<()> {
    if args.minutes <= 0.0 || args.episodes == 0 || args.connections == 0 || args.interval_secs <= 0.0 {
        bail!("--minutes, --episodes, --connections and --interval-secs must be positive");
    }
    let total = Duration::from_secs_f64(args.minutes * 60.0);
    let warmup = Duration::from_secs_f64(args.warmup_minutes.unwrap_or((args.minutes * 0.2).min(1.0)) * 60.0);
    if warmup >= total {
        bail!("the warm-up ({:.1} min) must be shorter than the run", warmup.as_secs_f64() / 60.0);
    }

    // The corpus, and a configuration with limits well above the load.
    let dir = tempfile::tempdir()?;
    let world = World::generate(&WorldConfig::scaled(7, args.scale));
    let corpus = dir.path().join("synthetic.jsonl");
    grove_datasets::loaders::write_wiki18(&corpus, &world.passages)?;
    let mut queries: Vec<String> = world.passages.iter().map(|p| p.title.clone()).collect();
    queries.sort();
    queries.dedup();
    if queries.is_empty() {
        bail!("the synthetic world has no passages");
    }
    let config = dir.path().join("soak.toml");
    let per_conn = args.episodes.div_ceil(args.connections) * 2 + 64;
    std::fs::write(
        &config,
        format!(
            "[limits]\nmax_episodes_per_connection = {}\nmax_episodes_total = {}\nmax_in_flight_per_connection = {}\n\
             max_turns = {}\nidle_timeout_secs = 3600\nconnection_idle_secs = 3600\n",
            per_conn.max(65_536),
            (args.episodes * 2 + 1_024).max(262_144),
            per_conn.max(4_096),
            args.max_turns.max(64),
        ),
    )?;

    let exe = match &args.server {
        Some(path) => path.clone(),
        None => sibling_server()?,
    };
    let mut cmd = Command::new(&exe);
    cmd.arg("serve")
        .arg("--corpus")
        .arg(&corpus)
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "warn");
    }
    // Ready once it listens (it builds its index first).
    let mut server =
        spawn_ready(cmd, Duration::from_secs(300)).await.with_context(|| format!("start {} serve", exe.display()))?;
    let (addr, pid) = (server.addr, server.child.id());
    let heap_idle = heap_bytes(addr).await;
    eprintln!(
        "soak: server pid {pid} on {addr}, {} passages, {} episodes over {} connections, {:.1} min (warm-up {:.1} min)",
        world.passages.len(),
        args.episodes,
        args.connections,
        args.minutes,
        warmup.as_secs_f64() / 60.0
    );

    let direct = format!("ws://{addr}/");
    let proxy = if args.drop_every_secs > 0.0 {
        Some(Arc::new(CutProxy::start(&direct).await.context("start the cutting proxy")?))
    } else {
        None
    };
    let url = proxy.as_ref().map_or(direct, |p| p.url.clone());
    let mut clients = Vec::new();
    for i in 0..args.connections {
        let reconnect = Reconnect { first_delay: Duration::from_millis(50), ..Default::default() };
        let options = ClientOptions { token: None, name: Some(format!("soak-{i}")), reconnect };
        clients.push(Arc::new(Client::connect(&url, options).await.context("connect to the soak server")?));
    }
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        steps: AtomicU64::new(0),
        forks: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        open: AtomicI64::new(0),
        latencies: Mutex::new(Vec::new()),
        samples: Mutex::new(Vec::new()),
        target: args.episodes,
        queries,
        options: EpisodeOptions { max_turns: Some(args.max_turns), ..Default::default() },
    });

    let started = Instant::now();
    // Drops: every connection cut at once, at uniformly random intervals around the period.
    let cutter = proxy.clone().map(|proxy| {
        let (mut rng, every, shared) = (Rng::new(args.seed ^ 0xd20b), args.drop_every_secs, shared.clone());
        tokio::spawn(async move {
            while !shared.stop.load(Ordering::Relaxed) {
                let wait = every * (0.5 + f64::from(rng.range(0, 1000)) / 1000.0);
                tokio::time::sleep(Duration::from_secs_f64(wait)).await;
                if !shared.stop.load(Ordering::Relaxed) {
                    proxy.cut_now();
                }
            }
        })
    });
    let mut loops = Vec::new();
    for e in 0..args.episodes {
        let (client, shared) = (clients[e % clients.len()].clone(), shared.clone());
        let seed = args.seed.wrapping_mul(1_000_003).wrapping_add(e as u64);
        let think = Duration::from_millis(args.think_ms);
        loops.push(tokio::spawn(episode_loop(client, shared, seed, think)));
    }

    // Report: RSS sampled every second, the server's live heap (its `/metrics`) and a line every
    // interval.
    println!(
        "{:>8} {:>9} {:>8} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6}",
        "elapsed", "rss_MB", "heap_MB", "live", "steps/s", "forks/s", "p50_ms", "p99_ms", "max_ms", "errors"
    );
    let mut samples: Vec<(Duration, u64)> = Vec::new();
    let mut heap_samples: Vec<(Duration, u64)> = Vec::new();
    let mut warm_rss: Option<u64> = None;
    let interval = Duration::from_secs_f64(args.interval_secs);
    let mut next_line = interval;
    let (mut last_steps, mut last_forks, mut last_errors, mut last_t) = (0u64, 0u64, 0u64, Duration::ZERO);
    let mut error_samples: Vec<String> = Vec::new();
    let mut server_died = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = started.elapsed();
        if let Some(status) = server.exited() {
            server_died = Some(status);
            break;
        }
        let Some(rss) = rss_bytes(pid) else { continue };
        samples.push((now, rss));
        if warm_rss.is_none() && now >= warmup {
            warm_rss = Some(rss);
        }
        if now >= next_line || now >= total {
            let heap = heap_bytes(addr).await;
            if let Some(h) = heap {
                heap_samples.push((now, h));
            }
            let live = tokio::time::timeout(Duration::from_secs(5), clients[0].stats()).await;
            let live = match live {
                Ok(Ok(s)) => s.episodes_live.to_string(),
                Ok(Err(e)) => {
                    shared.error("stats", e);
                    "?".into()
                }
                Err(_) => "timeout".into(),
            };
            let (steps, forks, errors) = (
                shared.steps.load(Ordering::Relaxed),
                shared.forks.load(Ordering::Relaxed),
                shared.errors.load(Ordering::Relaxed),
            );
            let dt = (now - last_t).as_secs_f64().max(1e-9);
            let mut lat = std::mem::take(&mut *shared.latencies.lock().unwrap_or_else(|p| p.into_inner()));
            lat.sort_unstable();
            let pct = |p: f64| {
                lat.get(((lat.len() as f64 - 1.0) * p).round() as usize).map_or(0.0, |&us| f64::from(us) / 1e3)
            };
            println!(
                "{:>7.0}s {:>9.1} {:>8} {:>6} {:>8.0} {:>8.0} {:>8.2} {:>8.2} {:>8.2} {:>6}",
                now.as_secs_f64(),
                mb(rss),
                heap.map_or_else(|| "?".into(), |h| format!("{:.1}", mb(h))),
                live,
                (steps - last_steps) as f64 / dt,
                (forks - last_forks) as f64 / dt,
                pct(0.5),
                pct(0.99),
                pct(1.0),
                errors - last_errors
            );
            let interval_samples = std::mem::take(&mut *shared.samples.lock().unwrap_or_else(|p| p.into_inner()));
            for s in &interval_samples {
                println!("         error: {s}");
            }
            if error_samples.len() < 10 {
                error_samples.extend(interval_samples);
            }
            (last_steps, last_forks, last_errors, last_t) = (steps, forks, errors, now);
            next_line += interval;
        }
        if now >= total {
            break;
        }
    }

    // Stop the loops (each closes what it holds), then see what the server gives back.
    shared.stop.store(true, Ordering::Relaxed);
    if let Some(c) = cutter {
        c.abort();
    }
    for l in loops {
        if tokio::time::timeout(Duration::from_secs(30), l).await.is_err() {
            shared.error("shutdown", "an episode loop did not stop within 30 s");
        }
    }
    if let Some(status) = server_died {
        bail!("the server exited during the soak: {status}");
    }
    let stats = tokio::time::timeout(Duration::from_secs(5), clients[0].stats()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_closed = rss_bytes(pid).unwrap_or_default();
    let heap_closed = heap_bytes(addr).await;
    let reattaches: u64 = clients.iter().map(|c| c.reconnects()).sum();
    let (replayed, resent) = clients.iter().map(|c| c.recovered()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    drop(clients);
    drop(server);

    let (steps, forks, errors) = (
        shared.steps.load(Ordering::Relaxed),
        shared.forks.load(Ordering::Relaxed),
        shared.errors.load(Ordering::Relaxed),
    );
    let warm = warm_rss.context("no RSS sample after the warm-up")?;
    let end = samples.last().map_or(0, |s| s.1);
    let last_third = total.mul_f64(2.0 / 3.0);
    let tail_max = samples.iter().filter(|s| s.0 >= last_third).map(|s| s.1).max().unwrap_or(end);
    let allowed = (warm as f64 * 1.10).max(warm as f64 + 20.0 * 1024.0 * 1024.0);
    let flat_rss = (tail_max as f64) <= allowed;
    // The same rule on the live heap: RSS can creep with allocator fragmentation while the heap
    // stays flat; a leak grows both.
    let heap_warm = heap_samples.iter().find(|s| s.0 >= warmup).map(|s| s.1);
    let heap_tail_max = heap_samples.iter().filter(|s| s.0 >= last_third).map(|s| s.1).max();
    let heap_allowed = heap_warm.map(|w| (w as f64 * 1.10).max(w as f64 + 20.0 * 1024.0 * 1024.0));
    let flat_heap = match (heap_tail_max, heap_allowed) {
        (Some(max), Some(allowed)) => (max as f64) <= allowed,
        _ => true,
    };
    let flat = flat_rss && flat_heap;
    let wall = started.elapsed().as_secs_f64();

    println!("\nsoak summary ({:.1} min, {} episodes, {} connections)", args.minutes, args.episodes, args.connections);
    println!("  RSS after warm-up ({:>5.1} min)      {:>9.1} MB", warmup.as_secs_f64() / 60.0, mb(warm));
    println!("  RSS at the end                     {:>9.1} MB  ({:.3}x warm-up)", mb(end), end as f64 / warm as f64);
    println!(
        "  max RSS, last third of the run     {:>9.1} MB  ({:.3}x warm-up; allowed {:.1} MB)",
        mb(tail_max),
        tail_max as f64 / warm as f64,
        mb(allowed as u64)
    );
    println!("  RSS after closing every episode    {:>9.1} MB", mb(rss_closed));
    match (heap_warm, heap_tail_max, heap_allowed) {
        (Some(w), Some(max), Some(allowed)) => {
            println!("  live heap after warm-up            {:>9.1} MB", mb(w));
            println!(
                "  max live heap, last third          {:>9.1} MB  ({:.3}x warm-up; allowed {:.1} MB)",
                mb(max),
                max as f64 / w as f64,
                mb(allowed as u64)
            );
        }
        _ => println!("  live heap: not reported by the server (its /metrics has no grove_heap_live_bytes)"),
    }
    if let (Some(idle), Some(closed)) = (heap_idle, heap_closed) {
        println!(
            "  live heap before the first episode {:>9.1} MB; after closing every episode {:.1} MB",
            mb(idle),
            mb(closed)
        );
    }
    let mut lost = None;
    match &stats {
        Ok(Ok(s)) => {
            println!(
                "  server after close: episodes_live {} (created {}, closed {}, reaped {}), steps {}, forks {}",
                s.episodes_live, s.episodes_created, s.episodes_closed, s.episodes_reaped, s.steps, s.forks
            );
            if s.episodes_live != 0 || s.episodes_created != s.episodes_closed + s.episodes_reaped {
                lost = Some(format!(
                    "the counts do not add up: created {} != closed {} + reaped {} (live {})",
                    s.episodes_created, s.episodes_closed, s.episodes_reaped, s.episodes_live
                ));
            }
        }
        _ => println!("  server stats after close: unavailable"),
    }
    if let Some(p) = &proxy {
        println!(
            "  drops: {} cuts of every connection ({} connection drops), {reattaches} reattaches, \
             {replayed} replies replayed, {resent} requests sent again",
            p.cuts(),
            p.cuts() * args.connections as u64
        );
    }
    println!(
        "  steps {steps} ({:.0}/s), forked children {forks} ({:.0}/s), errors {errors}",
        steps as f64 / wall,
        forks as f64 / wall
    );
    for s in &error_samples {
        println!("    error: {s}");
    }
    println!(
        "  rule: flat when the max RSS (and live heap) of the last third <= max(1.10 x, +20 MB) its value at the end of the warm-up"
    );
    println!("  RSS flat after warm-up: {}", if flat { "yes" } else { "no" });
    if !flat_heap {
        bail!(
            "the live heap grew after warm-up: {:.1} MB -> max {:.1} MB in the last third",
            mb(heap_warm.unwrap_or_default()),
            mb(heap_tail_max.unwrap_or_default())
        );
    }
    if !flat {
        bail!("RSS grew after warm-up: {:.1} MB -> max {:.1} MB in the last third", mb(warm), mb(tail_max));
    }
    if errors > 0 {
        bail!("{errors} requests failed during the soak");
    }
    if let Some(why) = lost {
        bail!("{why}");
    }
    Ok(())
}

/// The server's live heap bytes, from the `grove_heap_live_bytes` line of its `/metrics` (one
/// HTTP/1.1 request on a fresh connection); `None` when it does not report them or does not
/// answer within 5 s.
async fn heap_bytes(addr: SocketAddr) -> Option<u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut reply = Vec::new();
        stream.take(1 << 20).read_to_end(&mut reply).await.ok()?;
        let text = String::from_utf8_lossy(&reply);
        text.lines().find_map(|l| l.strip_prefix("grove_heap_live_bytes ")).and_then(|v| v.trim().parse().ok())
    };
    tokio::time::timeout(Duration::from_secs(5), fetch).await.ok().flatten()
}

async fn create(client: &Client, shared: &Shared, rng: &mut Rng) -> Option<EpisodeId> {
    let q = &shared.queries[rng.next() as usize % shared.queries.len()];
    match client.create_episodes(vec![task(&format!("Who is {q}?"))], shared.options.clone()).await {
        Ok(mut r) => match r.pop() {
            Some(Ok(start)) => {
                shared.open.fetch_add(1, Ordering::Relaxed);
                Some(start.episode)
            }
            Some(Err(e)) => {
                shared.error("create", e);
                None
            }
            None => {
                shared.error("create", "empty reply");
                None
            }
        },
        Err(e) => {
            shared.error("create", e);
            None
        }
    }
}

async fn close(client: &Client, shared: &Shared, episodes: Vec<EpisodeId>) {
    if episodes.is_empty() {
        return;
    }
    shared.open.fetch_sub(episodes.len() as i64, Ordering::Relaxed);
    match client.close(episodes).await {
        Ok(results) => {
            for r in results {
                if let Err(e) = r {
                    shared.error("close", e);
                }
            }
        }
        Err(e) => shared.error("close", e),
    }
}

/// Fork `episode` at `at_step` into `n` children; the children, or `None` on error.
async fn fork(client: &Client, shared: &Shared, episode: EpisodeId, at_step: u32, n: u32) -> Option<Vec<EpisodeId>> {
    match client.fork(vec![ForkSpec { episode, at_step, n }]).await {
        Ok(mut r) => match r.pop() {
            Some(Ok(f)) => {
                shared.forks.fetch_add(f.children.len() as u64, Ordering::Relaxed);
                shared.open.fetch_add(f.children.len() as i64, Ordering::Relaxed);
                Some(f.children)
            }
            Some(Err(e)) => {
                shared.error("fork", e);
                None
            }
            None => {
                shared.error("fork", "empty reply");
                None
            }
        },
        Err(e) => {
            shared.error("fork", e);
            None
        }
    }
}

/// One slot of the load: it always holds at least one open episode and steps the newest. An
/// episode ends with an answer or at its forced final turn; then it is closed (sometimes after
/// forking it at an earlier step) and the next one is taken or created. A live episode is
/// sometimes forked at a random completed step into 1-3 children, and closed.
async fn episode_loop(client: Arc<Client>, shared: Arc<Shared>, seed: u64, think: Duration) {
    let mut rng = Rng::new(seed);
    let mut held: Vec<EpisodeId> = Vec::new();
    while !shared.stop.load(Ordering::Relaxed) {
        let episode = match held.last() {
            Some(&e) => e,
            None => match create(&client, &shared, &mut rng).await {
                Some(e) => {
                    held.push(e);
                    e
                }
                None => {
                    if matches!(client.ping(0).await, Err(ClientError::Closed)) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        if !think.is_zero() {
            tokio::time::sleep(think.mul_f64(0.5 + rng.range(0, 100) as f64 / 100.0)).await;
        }
        let roll = rng.range(0, 99);
        let action = if roll < 12 {
            format!("<think>I know it.</think> <answer> {} </answer>", rng.range(0, 999))
        } else if roll < 16 {
            "<think>Thinking without a tool call.</think>".to_string()
        } else {
            let q = &shared.queries[rng.next() as usize % shared.queries.len()];
            format!("<think>I need to look this up.</think> <search> {q} </search>")
        };
        let t = Instant::now();
        let result = client.step_text(episode, &action).await;
        let elapsed = t.elapsed();
        let obs = match result {
            Ok(obs) => obs,
            Err(e) => {
                shared.error("step", e);
                held.pop();
                close(&client, &shared, vec![episode]).await;
                continue;
            }
        };
        shared.steps.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut l) = shared.latencies.lock() {
            l.push(u32::try_from(elapsed.as_micros()).unwrap_or(u32::MAX));
        }
        if let Some(e) = &obs.error {
            shared.error("step (tool)", e);
        } else if obs.kind == ActionKind::Search && !obs.done && obs.text.is_empty() {
            shared.error("step", "a search observation with no text");
        }
        let n = rng.range(1, 3);
        if obs.done {
            // Finished: sometimes branch from an earlier step (as Tree-GRPO does), then close.
            held.pop();
            if obs.step >= 2
                && rng.chance(0.3)
                && shared.room_for(n)
                && let Some(children) = fork(&client, &shared, episode, rng.range(1, obs.step - 1), n).await
            {
                held.extend(children);
            }
            close(&client, &shared, vec![episode]).await;
        } else if rng.chance(0.1)
            && shared.room_for(n)
            && let Some(children) = fork(&client, &shared, episode, rng.range(1, obs.step), n).await
        {
            // Forked away: the children continue, the parent is closed.
            held.pop();
            held.extend(children);
            close(&client, &shared, vec![episode]).await;
        }
    }
    close(&client, &shared, held).await;
}
