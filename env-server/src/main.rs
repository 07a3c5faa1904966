//! `env-server`: serve episodes over WebSocket + HTTP, or benchmark the server on loopback.

mod bench;

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
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use grove_env_server::config::{BackendKind, ServerConfig};
use grove_env_server::search::{LocalIndex, RemoteRetriever};
use grove_env_server::{Backends, run};

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
}

#[derive(clap::Args)]
struct ServeArgs {
    /// TOML configuration; command-line flags override its keys.
    #[arg(long)]
    config: Option<PathBuf>,
    /// wiki-18 JSONL corpus for the local BM25 backend.
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// Index directory (default: `<corpus>.index` beside the corpus).
    #[arg(long)]
    index: Option<PathBuf>,
    /// `local` (BM25 over --corpus) or `remote` (a Search-R1 /retrieve server at --remote-url).
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match cli.command {
        Command::Serve(args) => runtime.block_on(serve(args)),
        Command::Bench(args) => runtime.block_on(bench::run_bench(args)),
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
    if let Some(i) = &args.index {
        config.index = Some(i.clone());
    }
    if let Some(b) = args.backend {
        config.backend = b;
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
    Ok(config)
}

/// Open (building if needed) the BM25 index of a corpus, with a progress bar.
pub(crate) fn open_local_index(corpus: &std::path::Path, index: Option<&std::path::Path>) -> Result<LocalIndex> {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("indexing {bar:40} {bytes}/{total_bytes} {msg} ({eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let index = LocalIndex::open_or_build(corpus, index, &mut |p| {
        bar.set_length(p.bytes_total);
        bar.set_position(p.bytes_read);
        bar.set_message(format!("{} passages", p.passages));
    })
    .with_context(|| format!("index for {}", corpus.display()))?;
    bar.finish_and_clear();
    Ok(index)
}

async fn serve(args: ServeArgs) -> Result<()> {
    let config = load_config(&args)?;
    let backends = match config.backend {
        BackendKind::Local => {
            let Some(corpus) = &config.corpus else {
                bail!("the local backend needs --corpus (or `corpus` in the config)")
            };
            let corpus = corpus.clone();
            let index_dir = config.index.clone();
            let index = tokio::task::spawn_blocking(move || open_local_index(&corpus, index_dir.as_deref())).await??;
            tracing::info!(docs = index.num_docs(), "BM25 index ready");
            Backends::new("local", Arc::new(index))
        }
        BackendKind::Remote => {
            let Some(url) = &config.remote_url else { bail!("the remote backend needs --remote-url") };
            Backends::new("remote", Arc::new(RemoteRetriever::new(url.clone(), config.remote.clone())?))
        }
    };
    let listener = tokio::net::TcpListener::bind(config.bind).await.with_context(|| format!("bind {}", config.bind))?;
    if config.resolved_token().is_none() && !config.bind.ip().is_loopback() {
        tracing::warn!("listening on a non-loopback address without a token");
    }
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    run(listener, config, backends, shutdown).await?;
    Ok(())
}
