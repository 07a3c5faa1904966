//! The search backends a server offers ([`Backends`]: the registry `run` takes, by name, with the
//! optional page tool), and building them from a configuration: the local BM25 index (built
//! first if needed, the caller told of the progress), the web provider and the page tool behind
//! the persistent cache, the remote retriever (behind the cache when asked), and the dense and
//! hybrid backends (`dense` feature; without it, a typed refusal saying how to build with it).
//! [`build`] is the one place a configuration's backends are made.

use std::path::PathBuf;
use std::sync::Arc;

use crate::cache::{CacheConfig, CacheError, CacheStoreKind, WebCache};
use crate::config::{BackendKind, ServerConfig};
use crate::search::cached::{CachedPages, CachedSearch};
use crate::search::page::PageFetcher;
use crate::search::web::{WebSearch, request_params};
use crate::search::{
    BuildProgress, IndexError, LocalIndex, PageTool, RemoteRetriever, RenderFormat, SearchBackend, SearchError,
};

/// The search backends a server offers, by name; the first is the default. `pages`, when set,
/// makes `open` a tool.
#[derive(Debug, Clone)]
pub struct Backends {
    list: Vec<(String, Arc<dyn SearchBackend>)>,
    pub pages: Option<Arc<dyn PageTool>>,
}

impl Backends {
    pub fn new(name: impl Into<String>, backend: Arc<dyn SearchBackend>) -> Self {
        Self { list: vec![(name.into(), backend)], pages: None }
    }

    /// Offer the open-page tool.
    pub fn with_pages(mut self, pages: Arc<dyn PageTool>) -> Self {
        self.pages = Some(pages);
        self
    }

    /// Calls, errors and cache figures of every backend and of the page tool, by provider.
    pub fn usage(&self) -> std::collections::BTreeMap<String, grove_protocol::ProviderUsage> {
        let mut all = std::collections::BTreeMap::new();
        let pages = self.pages.iter().flat_map(|p| p.usage());
        for (name, u) in self.list.iter().flat_map(|(_, b)| b.usage()).chain(pages) {
            let e: &mut grove_protocol::ProviderUsage = all.entry(name).or_default();
            e.calls += u.calls;
            e.errors += u.errors;
            e.retries += u.retries;
            e.throttled += u.throttled;
            e.cache_hits += u.cache_hits;
            e.cache_misses += u.cache_misses;
        }
        all
    }

    /// Add another named backend.
    pub fn with(mut self, name: impl Into<String>, backend: Arc<dyn SearchBackend>) -> Self {
        self.list.push((name.into(), backend));
        self
    }

    pub fn names(&self) -> Vec<String> {
        self.list.iter().map(|(n, _)| n.clone()).collect()
    }

    pub fn default_backend(&self) -> &Arc<dyn SearchBackend> {
        &self.list[0].1
    }

    /// The backend at position `i` of [`names`](Self::names).
    pub(crate) fn get(&self, i: usize) -> Option<&Arc<dyn SearchBackend>> {
        self.list.get(i).map(|(_, b)| b)
    }

    /// How each backend renders its results by default, in the order of [`names`](Self::names).
    pub(crate) fn renders(&self) -> Vec<RenderFormat> {
        self.list.iter().map(|(_, b)| b.render()).collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cache: {0}")]
    Cache(#[from] CacheError),
    #[error("{0}")]
    Backend(#[from] SearchError),
    #[error("{0}")]
    Config(String),
    /// The BM25 index of `corpus` could not be opened or built.
    #[error("index for {}", corpus.display())]
    Index {
        corpus: PathBuf,
        #[source]
        source: IndexError,
    },
    /// The dense index, its encoder or its corpus could not be opened.
    #[cfg(feature = "dense")]
    #[error(transparent)]
    Dense(#[from] crate::search::dense::DenseSetupError),
    /// A task on the blocking pool failed (panicked or was cancelled).
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

/// Where the SQLite cache lives when the configuration does not say: `web-cache.sqlite3` in
/// Grove's one cache directory (`$GROVE_CACHE`, else `$XDG_CACHE_HOME/grove`, else
/// `~/.cache/grove`), the directory every other Grove tool uses.
pub fn default_cache_path() -> PathBuf {
    grove_datasets::assets::cache_dir().join("web-cache.sqlite3")
}

/// Open the cache a configuration names (`None` for `store = "none"`).
pub async fn open_cache(config: &CacheConfig) -> Result<Option<WebCache>, SetupError> {
    let mut config = config.clone();
    if config.store == CacheStoreKind::Sqlite && config.path.is_none() {
        config.path = Some(default_cache_path());
    }
    let cache = WebCache::open(&config).await?;
    if let Some(c) = &cache {
        tracing::info!(cache = %c.describe(), mode = ?config.mode, "web cache ready");
    }
    Ok(cache)
}

/// The backend of `backend = "local"`: BM25 over `corpus`, its index opened from `index` (default
/// `<corpus>.index/`) or built there first on the blocking pool, `progress` told as it goes; with
/// the page tool when `pages.enabled` is.
pub async fn local_backends(
    config: &ServerConfig,
    progress: impl FnMut(BuildProgress) + Send + 'static,
) -> Result<Backends, SetupError> {
    let Some(corpus) = config.corpus.clone() else {
        return Err(SetupError::Config("the local backend needs --corpus (or `corpus` in the config)".into()));
    };
    let index = open_or_build_local(corpus, config.index.clone(), progress).await?;
    let cache = if config.pages.enabled { open_cache(&config.cache).await? } else { None };
    with_pages(Backends::new("local", Arc::new(index)), config, cache)
}

/// The backends of `backend = "web"`: the provider behind the cache, and the page tool (always
/// on for web, see [`with_pages`]).
pub async fn web_backends(config: &ServerConfig) -> Result<Backends, SetupError> {
    let cache = open_cache(&config.cache).await?;
    let web = WebSearch::new(config.web.clone())?;
    let name = web.provider().name().to_string();
    let params = request_params(&config.web);
    let search = CachedSearch::new(Arc::new(web), cache.clone(), config.cache.mode, name.clone(), params, false);
    with_pages(Backends::new(name, Arc::new(search)), config, cache)
}

/// The remote Search-R1 retriever, behind the cache when `remote.cache` is set, with the page
/// tool when `pages.enabled` is.
pub async fn remote_backends(config: &ServerConfig) -> Result<Backends, SetupError> {
    let Some(url) = &config.remote_url else {
        return Err(SetupError::Config("the remote backend needs --remote-url".into()));
    };
    let remote = RemoteRetriever::new(url.clone(), config.remote.clone())?;
    let cache = if config.remote.cache || config.pages.enabled { open_cache(&config.cache).await? } else { None };
    let backend: Arc<dyn SearchBackend> = if config.remote.cache {
        let params = serde_json::json!({ "url": url });
        Arc::new(CachedSearch::new(Arc::new(remote), cache.clone(), config.cache.mode, "remote", params, true))
    } else {
        Arc::new(remote)
    };
    with_pages(Backends::new("remote", backend), config, cache)
}

/// The backends of a configuration, whichever its `backend` is; `progress` is told of a BM25
/// index build (the local and hybrid backends build one when the corpus has none yet).
pub async fn build(
    config: &ServerConfig,
    progress: impl FnMut(BuildProgress) + Send + 'static,
) -> Result<Backends, SetupError> {
    match config.backend {
        BackendKind::Local => local_backends(config, progress).await,
        BackendKind::Remote => remote_backends(config).await,
        BackendKind::Web => web_backends(config).await,
        BackendKind::Dense | BackendKind::Hybrid => dense_backends(config, progress).await,
    }
}

/// What a server built without the `dense` feature says when asked for dense retrieval.
pub const NO_DENSE: &str = "this env-server was built without dense retrieval; build it with \
     `cargo build --release -p grove-env-server --features dense` (after `cargo xtask setup`)";

/// The BM25 index of `corpus` (at `index`, default `<corpus>.index/`), opened or built on the
/// blocking pool, `progress` told as it goes.
async fn open_or_build_local(
    corpus: PathBuf,
    index: Option<PathBuf>,
    mut progress: impl FnMut(BuildProgress) + Send + 'static,
) -> Result<LocalIndex, SetupError> {
    let index = tokio::task::spawn_blocking(move || {
        LocalIndex::open_or_build(&corpus, index.as_deref(), &mut progress)
            .map_err(|source| SetupError::Index { corpus, source })
    })
    .await??;
    tracing::info!(docs = index.num_docs(), "BM25 index ready");
    Ok(index)
}

/// The backend of `backend = "dense"` (the FAISS index over `corpus`), or of `"hybrid"` (BM25
/// over the same corpus fused with it by reciprocal rank); with the page tool when
/// `pages.enabled` is.
#[cfg(feature = "dense")]
pub async fn dense_backends(
    config: &ServerConfig,
    progress: impl FnMut(BuildProgress) + Send + 'static,
) -> Result<Backends, SetupError> {
    use crate::search::dense::{DenseBackend, HybridBackend};
    let Some(corpus) = config.corpus.clone() else {
        return Err(SetupError::Config(format!(
            "the {:?} backend needs --corpus (the passages whose rows the index holds)",
            config.backend
        )));
    };
    let (dense_config, rows) = (config.dense.clone(), corpus.clone());
    let dense = tokio::task::spawn_blocking(move || DenseBackend::open(&dense_config, &rows)).await??;
    tracing::info!(vectors = dense.len(), "dense index ready");
    let cache = if config.pages.enabled { open_cache(&config.cache).await? } else { None };
    let backends = if config.backend == BackendKind::Hybrid {
        let bm25 = open_or_build_local(corpus, config.index.clone(), progress).await?;
        let hybrid = HybridBackend::new(bm25, dense, config.dense.hybrid_depth, config.dense.rrf_k);
        Backends::new("hybrid", Arc::new(hybrid))
    } else {
        Backends::new("dense", Arc::new(dense))
    };
    with_pages(backends, config, cache)
}

/// Without the `dense` feature: a refusal that says how to build a server with it.
#[cfg(not(feature = "dense"))]
pub async fn dense_backends(
    _config: &ServerConfig,
    _progress: impl FnMut(BuildProgress) + Send + 'static,
) -> Result<Backends, SetupError> {
    Err(SetupError::Config(NO_DENSE.into()))
}

/// Add the page tool to `backends` when the configuration enables it (or the backend is web).
pub fn with_pages(backends: Backends, config: &ServerConfig, cache: Option<WebCache>) -> Result<Backends, SetupError> {
    if !(config.pages.enabled || config.backend == BackendKind::Web) {
        return Ok(backends);
    }
    let pages = CachedPages::new(PageFetcher::new(config.pages.clone())?, cache, config.cache.mode);
    Ok(backends.with_pages(Arc::new(pages)))
}
