//! Building the tools a configuration names: the web provider and the page tool behind the
//! persistent cache, and the cache for the remote retriever. The local BM25 backend is opened by
//! the command line (it shows indexing progress).

use std::path::PathBuf;
use std::sync::Arc;

use crate::Backends;
use crate::cache::{CacheConfig, CacheError, CacheStoreKind, WebCache};
use crate::config::{BackendKind, ServerConfig};
use crate::search::cached::{CachedPages, CachedSearch};
use crate::search::page::PageFetcher;
use crate::search::web::{WebSearch, request_params};
use crate::search::{RemoteRetriever, SearchBackend, SearchError};

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cache: {0}")]
    Cache(#[from] CacheError),
    #[error("{0}")]
    Backend(#[from] SearchError),
    #[error("{0}")]
    Config(String),
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

/// Add the page tool to `backends` when the configuration enables it (or the backend is web).
pub fn with_pages(backends: Backends, config: &ServerConfig, cache: Option<WebCache>) -> Result<Backends, SetupError> {
    if !(config.pages.enabled || config.backend == BackendKind::Web) {
        return Ok(backends);
    }
    let pages = CachedPages::new(PageFetcher::new(config.pages.clone())?, cache, config.cache.mode);
    Ok(backends.with_pages(Arc::new(pages)))
}
