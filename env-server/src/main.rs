//! `env-server`: serve episodes over WebSocket + HTTP, or benchmark the server on loopback.

mod bench;
#[cfg(feature = "dense")]
mod bench_dense;

/// Live heap bytes, counted by a wrapper around the system allocator (the bench measures what a
/// fork allocates with it).
mod alloc_counter {
    #![allow(unsafe_code)]

    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicUsize, Ordering};

    static LIVE: AtomicUsize = AtomicUsize::new(0);

    pub struct Counting;

    // SAFETY: every call is forwarded unchanged to the system allocator; only a counter is added.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: same contract as the caller's.
            let p = unsafe { System.alloc(layout) };
            if !p.is_null() {
                LIVE.fetch_add(layout.size(), Ordering::Relaxed);
            }
            p
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: same contract as the caller's.
            unsafe { System.dealloc(ptr, layout) };
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: same contract as the caller's.
            let p = unsafe { System.realloc(ptr, layout, new_size) };
            if !p.is_null() {
                LIVE.fetch_add(new_size, Ordering::Relaxed);
                LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            }
            p
        }
    }

    #[global_allocator]
    static GLOBAL: Counting = Counting;

    pub fn allocated() -> usize {
        LIVE.load(Ordering::Relaxed)
    }
}

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use grove_env_server::backends::open_cache;
use grove_env_server::config::{BackendKind, CacheMode, CacheStoreKind, Provider, ServerConfig};
use grove_env_server::run;
use grove_env_server::search::{BuildProgress, LocalIndex};

#[derive(Parser)]
#[command(name = "env-server", version, about = "Grove environment server")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve episodes (WebSocket) and /retrieve, /health, /metrics (HTTP) on one port.
    Serve(ServeArgs),
    /// Start a server in-process on loopback and measure it with real WebSocket clients.
    Bench(bench::BenchArgs),
    /// Export or import the persistent web cache as JSONL (one entry per line).
    #[command(subcommand)]
    Cache(CacheCommand),
    /// Dense retrieval against Python faiss-cpu on the same index and queries (queries/s, time
    /// to first answer, memory), and recall@3 of BM25, dense and hybrid on FanOutQA questions.
    #[cfg(feature = "dense")]
    BenchDense(bench_dense::BenchDenseArgs),
    /// Build the index of a wiki-18 JSONL corpus ahead of serving: BM25 (tantivy) by default, or
    /// with --dense a FAISS flat index of its passages encoded by --model (resumable).
    Index(IndexArgs),
}

#[derive(clap::Args)]
struct IndexArgs {
    /// The wiki-18 JSONL corpus.
    corpus: PathBuf,
    /// Build a dense FAISS flat index (row i = passage i) instead of the BM25 index.
    #[arg(long)]
    dense: bool,
    /// The encoder folder (Hugging Face: config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Where to write: the FAISS file (default `<corpus>.<model folder name>.flat.index`, or
    /// `.fp16.index` with `--precision f16`) or the
    /// BM25 directory (default `<corpus>.index`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Put before every passage; `"passage: "` for e5 (default: the model folder's prompt).
    #[arg(long)]
    passage_prefix: Option<String>,
    /// Pooling when the model folder has no sentence-transformers pooling module.
    #[arg(long, value_enum)]
    pooling: Option<grove_env_server::config::DensePooling>,
    /// Passages per encoder forward pass.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Inner product (for normalised encoders, as Search-R1's e5 index) or squared L2.
    #[arg(long, value_enum, default_value = "inner-product")]
    metric: MetricArg,
    /// How the index stores vectors: `f32` (FAISS `IndexFlat`, as Search-R1 ships) or `f16`
    /// (FAISS `IndexScalarQuantizer` fp16, `faiss.read_index` reads it too): half the disk and
    /// memory, scores within about 1e-4 of f32's.
    #[arg(long, value_enum, default_value = "f32")]
    precision: PrecisionArg,
    #[arg(long, value_enum, default_value = "auto")]
    device: grove_env_server::config::DenseDevice,
    /// Also build the HNSW graph of the dense index (`<out>.usearch`), for `--search hnsw`.
    #[arg(long)]
    hnsw: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum MetricArg {
    InnerProduct,
    L2,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum PrecisionArg {
    F32,
    F16,
}

#[derive(Subcommand)]
enum CacheCommand {
    /// Write every live entry of the cache the configuration names to a JSONL file.
    Export {
        #[command(flatten)]
        serve: ServeArgs,
        /// The JSONL file to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Add the entries of a JSONL file to the cache (an entry of the file replaces the cached one).
    Import {
        #[command(flatten)]
        serve: ServeArgs,
        /// The JSONL file to read.
        #[arg(long = "in")]
        input: PathBuf,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// TOML configuration; command-line flags override its keys.
    #[arg(long)]
    config: Option<PathBuf>,
    /// wiki-18 JSONL corpus for the local BM25 backend.
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// Index: the BM25 directory for `local` (default: `<corpus>.index` beside the corpus), the
    /// FAISS flat index file for `dense` and `hybrid`.
    #[arg(long)]
    index: Option<PathBuf>,
    /// `local` (BM25 over --corpus), `remote` (a Search-R1 /retrieve server at --remote-url),
    /// `web` (a live search provider, see --provider, with the open-page tool), `dense` (--model
    /// and a FAISS --index over --corpus) or `hybrid` (BM25 and dense, fused by reciprocal rank).
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// Dense encoder folder (Hugging Face: config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Put before every query for the dense encoder; `"query: "` for e5.
    #[arg(long)]
    query_prefix: Option<String>,
    /// The BM25 index directory of `hybrid` (default: `<corpus>.index`).
    #[arg(long)]
    bm25_index: Option<PathBuf>,
    /// Dense search: `exact` (every vector scored) or `hnsw` (an approximate graph, built beside
    /// the index as `<index>.usearch` on the first start).
    #[arg(long, value_enum)]
    search: Option<grove_env_server::config::DenseSearch>,
    /// Web search provider (implies --backend web). Its API key comes from `web.api_key_env`,
    /// by default SERPER_API_KEY, SERPAPI_API_KEY, BRAVE_API_KEY or TAVILY_API_KEY.
    #[arg(long, value_enum)]
    provider: Option<Provider>,
    /// The provider's search endpoint (required for a self-hosted SearxNG: http://host:port/search).
    #[arg(long)]
    web_endpoint: Option<String>,
    /// SQLite file of the persistent cache (default ~/.cache/grove/web-cache.sqlite3).
    #[arg(long)]
    cache: Option<PathBuf>,
    /// Share the cache through Redis, e.g. redis://127.0.0.1:6379/0.
    #[arg(long)]
    redis_url: Option<String>,
    /// Serve only cached results; a miss is a `replay_miss` error and nothing goes to the network.
    #[arg(long)]
    replay: bool,
    /// URL of the remote /retrieve endpoint, e.g. http://127.0.0.1:8000/retrieve.
    #[arg(long)]
    remote_url: Option<String>,
    /// Listen address (default 127.0.0.1:8000).
    #[arg(long)]
    bind: Option<std::net::SocketAddr>,
    /// Name of an environment variable holding the bearer token to require.
    #[arg(long)]
    token_env: Option<String>,
}

fn main() -> Result<()> {
    grove_env_server::init_logging();
    let cli = Cli::parse();
    grove_env_server::metrics::report_heap_bytes(alloc_counter::allocated);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match cli.command {
        Command::Serve(args) => runtime.block_on(serve(args)),
        Command::Bench(args) => runtime.block_on(bench::run_bench(args)),
        Command::Cache(cmd) => runtime.block_on(cache_command(cmd)),
        Command::Index(args) => build_index(&args),
        #[cfg(feature = "dense")]
        Command::BenchDense(args) => runtime.block_on(bench_dense::run_bench_dense(args)),
    }
}

fn load_config(args: &ServeArgs) -> Result<ServerConfig> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
            ServerConfig::from_toml(&text).with_context(|| format!("parse {}", path.display()))?
        }
        None => ServerConfig::default(),
    };
    if let Some(c) = &args.corpus {
        config.corpus = Some(c.clone());
    }
    if let Some(b) = args.backend {
        config.backend = b;
    }
    if let Some(i) = &args.index {
        match config.backend {
            BackendKind::Dense | BackendKind::Hybrid => config.dense.index = Some(i.clone()),
            _ => config.index = Some(i.clone()),
        }
    }
    if let Some(i) = &args.bm25_index {
        config.index = Some(i.clone());
    }
    if let Some(m) = &args.model {
        config.dense.model = Some(m.clone());
    }
    if let Some(p) = &args.query_prefix {
        config.dense.query_prefix = Some(p.clone());
    }
    if let Some(search) = args.search {
        config.dense.search = search;
    }
    if let Some(u) = &args.remote_url {
        config.remote_url = Some(u.clone());
        if args.backend.is_none() {
            config.backend = BackendKind::Remote;
        }
    }
    if let Some(b) = args.bind {
        config.bind = b;
    }
    if let Some(t) = &args.token_env {
        config.token_env = Some(t.clone());
    }
    if let Some(p) = args.provider {
        config.web.provider = p;
        if args.backend.is_none() {
            config.backend = BackendKind::Web;
        }
    }
    if let Some(e) = &args.web_endpoint {
        config.web.endpoint = Some(e.clone());
    }
    if let Some(path) = &args.cache {
        config.cache.path = Some(path.clone());
        config.cache.store = CacheStoreKind::Sqlite;
    }
    if let Some(url) = &args.redis_url {
        config.cache.redis_url = Some(url.clone());
        config.cache.store = CacheStoreKind::Redis;
    }
    if args.replay {
        config.cache.mode = CacheMode::Replay;
    }
    Ok(config)
}

async fn cache_command(cmd: CacheCommand) -> Result<()> {
    let (args, file, export) = match &cmd {
        CacheCommand::Export { serve, out } => (serve, out, true),
        CacheCommand::Import { serve, input } => (serve, input, false),
    };
    let config = load_config(args)?;
    let Some(cache) = open_cache(&config.cache).await? else { bail!("the configuration has no cache (store = none)") };
    if export {
        let out = std::fs::File::create(file).with_context(|| format!("create {}", file.display()))?;
        let n = cache.export_jsonl(std::io::BufWriter::new(out)).await?;
        eprintln!("exported {n} entries of {} to {}", cache.describe(), file.display());
    } else {
        let input = std::fs::File::open(file).with_context(|| format!("open {}", file.display()))?;
        let report = cache.import_jsonl(std::io::BufReader::new(input)).await?;
        eprintln!(
            "imported {} entries into {} ({} already expired, {} unreadable lines)",
            report.imported,
            cache.describe(),
            report.expired,
            report.bad_lines.len()
        );
        for (line, why) in report.bad_lines.iter().take(10) {
            eprintln!("  line {line}: {why}");
        }
    }
    Ok(())
}

/// The progress bar of a BM25 index build.
fn index_bar() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("indexing {bar:40} {bytes}/{total_bytes} {msg} ({eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// Show one progress report of a BM25 index build on `bar`.
fn show_index_progress(bar: &indicatif::ProgressBar, p: BuildProgress) {
    bar.set_length(p.bytes_total);
    bar.set_position(p.bytes_read);
    bar.set_message(format!("{} passages", p.passages));
}

/// Open (building if needed) the BM25 index of a corpus, with a progress bar.
pub(crate) fn open_local_index(corpus: &std::path::Path, index: Option<&std::path::Path>) -> Result<LocalIndex> {
    let bar = index_bar();
    let index = LocalIndex::open_or_build(corpus, index, &mut |p| show_index_progress(&bar, p))
        .with_context(|| format!("index for {}", corpus.display()))?;
    bar.finish_and_clear();
    Ok(index)
}

fn build_index(args: &IndexArgs) -> Result<()> {
    if !args.dense {
        let index = open_local_index(&args.corpus, args.out.as_deref())?;
        eprintln!("BM25 index of {} passages ready", index.num_docs());
        return Ok(());
    }
    build_dense_index(args)
}

#[cfg(not(feature = "dense"))]
fn build_dense_index(_args: &IndexArgs) -> Result<()> {
    bail!(grove_env_server::backends::NO_DENSE)
}

/// Encode every passage of the corpus and write a FAISS flat index, resuming an interrupted run.
#[cfg(feature = "dense")]
fn build_dense_index(args: &IndexArgs) -> Result<()> {
    use grove_dense::Metric;
    use grove_env_server::config::DenseConfig;
    let Some(model) = &args.model else { bail!("--dense needs --model (the encoder folder)") };
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    let config = DenseConfig {
        model: Some(model.clone()),
        pooling: args.pooling,
        passage_prefix: args.passage_prefix.clone(),
        batch_size: args.batch_size,
        device: args.device,
        ..DenseConfig::default()
    };
    let encoder = grove_env_server::search::dense::load_encoder(&config)?;
    let storage = match args.precision {
        PrecisionArg::F32 => grove_dense::Storage::F32,
        PrecisionArg::F16 => grove_dense::Storage::F16,
    };
    let out = match &args.out {
        Some(out) => out.clone(),
        None => grove_env_server::search::dense::default_index_path(&args.corpus, model, storage),
    };
    let metric = match args.metric {
        MetricArg::InnerProduct => Metric::InnerProduct,
        MetricArg::L2 => Metric::L2,
    };
    if grove_dense::FlatIndex::open(&out).is_ok() {
        eprintln!("{} exists; remove it to encode the corpus again", out.display());
    } else {
        write_dense_index(&encoder, &args.corpus, &out, metric, storage, args.batch_size)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    if args.hnsw {
        let flat = grove_dense::FlatIndex::open(&out)?;
        let path = grove_dense::approx::default_path(&out);
        if path.exists() {
            eprintln!("{} exists; remove it to build the graph again", path.display());
        } else {
            let started = std::time::Instant::now();
            grove_env_server::search::dense::open_or_build_hnsw(&flat, Some(&path), &config)?;
            eprintln!("wrote {} in {:.1} s", path.display(), started.elapsed().as_secs_f64());
        }
    }
    Ok(())
}

/// [`grove_env_server::search::dense::write_flat_index`] with a progress bar and a summary line.
/// Returns the number of vectors.
#[cfg(feature = "dense")]
pub(crate) fn write_dense_index(
    encoder: &grove_dense::Encoder,
    corpus: &std::path::Path,
    out: &std::path::Path,
    metric: grove_dense::Metric,
    storage: grove_dense::Storage,
    batch_size: usize,
) -> Result<usize> {
    use grove_env_server::search::dense::{WriteProgress, write_flat_index};
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("encoding {bar:40} {bytes}/{total_bytes} {msg} ({eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut told = false;
    let mut show = |p: WriteProgress| {
        if p.resumed > 0 && !told {
            bar.suspend(|| eprintln!("resuming {}: {} passages already encoded", out.display(), p.resumed));
            told = true;
        }
        bar.set_length(p.total_bytes);
        bar.set_position(p.bytes_read);
        bar.set_message(format!("{} passages", p.rows));
    };
    let report = write_flat_index(encoder, corpus, out, metric, storage, batch_size, &mut show)?;
    bar.finish_and_clear();
    eprintln!(
        "wrote {} ({} vectors of dimension {}, {metric:?}); encoded {} passages in {:.1} s ({:.1}/s)",
        report.path.display(),
        report.rows,
        report.dim,
        report.encoded,
        report.secs,
        report.encoded as f64 / report.secs.max(1e-9)
    );
    Ok(report.rows)
}

async fn serve(args: ServeArgs) -> Result<()> {
    let config = load_config(&args)?;
    // The callback holds the bar's one handle: the bar is cleared when the index build's task
    // ends and drops it, before the index is reported ready.
    let bar = index_bar().with_finish(indicatif::ProgressFinish::AndClear);
    let backends = grove_env_server::backends::build(&config, move |p| show_index_progress(&bar, p)).await?;
    let listener = tokio::net::TcpListener::bind(config.bind).await.with_context(|| format!("bind {}", config.bind))?;
    if config.resolved_token().is_none() && !config.bind.ip().is_loopback() {
        tracing::warn!("listening on a non-loopback address without a token");
    }
    // Ctrl-C, or SIGTERM (what containers, systemd and Ray send): the same drain either way.
    let shutdown = async {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            match signal(SignalKind::terminate()) {
                Ok(mut term) => {
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => {}
                        _ = term.recv() => tracing::info!("SIGTERM: draining"),
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGTERM; stopping on Ctrl-C only");
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    };
    run(listener, config, backends, shutdown).await?;
    Ok(())
}
