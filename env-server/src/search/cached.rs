//! The persistent cache in front of a search backend and of the page fetcher. A hit costs no
//! provider call; a miss goes to the backend and its successful result is stored before the
//! step completes (so a kill -9 right after a reply loses nothing). In replay mode a miss is an
//! error and nothing goes to the network, so a recorded evaluation re-runs exactly.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::future::join_all;
use serde_json::Value;

use super::page::{Page, PageFetcher, render_page};
use super::{EachFuture, Hit, PageTool, RenderFormat, SearchBackend, SearchError, SearchFuture, Usage};
use crate::cache::{CacheKey, CacheMode, WebCache};

#[derive(Debug, Default)]
struct Counts {
    hits: AtomicU64,
    misses: AtomicU64,
}

impl Counts {
    fn add_to(&self, provider: &str, mut usage: Vec<(String, Usage)>) -> Vec<(String, Usage)> {
        if !usage.iter().any(|(n, _)| n == provider) {
            usage.push((provider.to_string(), Usage::default()));
        }
        for (n, u) in &mut usage {
            if n == provider {
                u.cache_hits += self.hits.load(Ordering::Relaxed);
                u.cache_misses += self.misses.load(Ordering::Relaxed);
            }
        }
        usage
    }
}

/// A search backend behind the cache.
#[derive(Debug, Clone)]
pub struct CachedSearch {
    inner: Arc<SearchInner>,
}

#[derive(Debug)]
struct SearchInner {
    backend: Arc<dyn SearchBackend>,
    cache: Option<WebCache>,
    mode: CacheMode,
    /// The provider part of the cache key (`serper`, `remote:<url>`, ...).
    provider: String,
    /// The request parameters that change a result, part of the cache key.
    params: Value,
    /// Corpora and retrievers answer `topk` documents; web providers ignore it.
    topk_in_key: bool,
    counts: Counts,
}

impl CachedSearch {
    pub fn new(
        backend: Arc<dyn SearchBackend>,
        cache: Option<WebCache>,
        mode: CacheMode,
        provider: impl Into<String>,
        params: Value,
        topk_in_key: bool,
    ) -> Self {
        let provider = provider.into();
        Self {
            inner: Arc::new(SearchInner {
                backend,
                cache,
                mode,
                provider,
                params,
                topk_in_key,
                counts: Counts::default(),
            }),
        }
    }
}

impl SearchInner {
    fn key(&self, query: &str, topk: usize) -> CacheKey {
        let mut params = self.params.clone();
        if let (true, Value::Object(map)) = (self.topk_in_key, &mut params) {
            map.insert("topk".into(), topk.into());
        }
        CacheKey::new("search", &self.provider, query, &params)
    }

    async fn search_each(&self, queries: Vec<String>, topk: usize) -> Vec<Result<Vec<Hit>, SearchError>> {
        let keys: Vec<CacheKey> = queries.iter().map(|q| self.key(q, topk)).collect();
        let mut out: Vec<Option<Result<Vec<Hit>, SearchError>>> = vec![None; queries.len()];
        if let Some(cache) = &self.cache {
            let found = join_all(keys.iter().map(|k| cache.get(k))).await;
            for (i, f) in found.into_iter().enumerate() {
                match f {
                    Ok(Some(value)) => match serde_json::from_value::<Vec<Hit>>(value) {
                        Ok(hits) => out[i] = Some(Ok(hits)),
                        Err(e) => tracing::warn!(error = %e, "unreadable cached search result; asking the provider"),
                    },
                    Ok(None) => {}
                    Err(e) => tracing::warn!(error = %e, "cache lookup failed; asking the provider"),
                }
            }
        }
        let missing: Vec<usize> = (0..queries.len()).filter(|&i| out[i].is_none()).collect();
        self.counts.hits.fetch_add((queries.len() - missing.len()) as u64, Ordering::Relaxed);
        self.counts.misses.fetch_add(missing.len() as u64, Ordering::Relaxed);
        if self.mode == CacheMode::Replay {
            for &i in &missing {
                out[i] = Some(Err(SearchError::ReplayMiss(format!("{} query {:?}", self.provider, queries[i]))));
            }
        } else if !missing.is_empty() {
            let asked = missing.iter().map(|&i| queries[i].clone()).collect();
            let answers = self.backend.search_each(asked, topk).await;
            let mut stores = Vec::new();
            for (&i, answer) in missing.iter().zip(answers) {
                if let (Ok(hits), Some(cache)) = (&answer, &self.cache) {
                    match serde_json::to_value(hits) {
                        Ok(value) => stores.push(cache.put(&keys[i], value)),
                        Err(e) => tracing::warn!(error = %e, "search result not cached"),
                    }
                }
                out[i] = Some(answer);
            }
            for stored in join_all(stores).await {
                if let Err(e) = stored {
                    tracing::warn!(error = %e, "search result not cached");
                }
            }
        }
        out.into_iter()
            .map(|o| o.unwrap_or_else(|| Err(SearchError::Internal("the backend returned fewer results".into()))))
            .collect()
    }
}

impl SearchBackend for CachedSearch {
    fn name(&self) -> &str {
        self.inner.backend.name()
    }

    fn search(&self, queries: Vec<String>, topk: usize) -> SearchFuture {
        let each = self.search_each(queries, topk);
        Box::pin(async move { each.await.into_iter().collect() })
    }

    fn search_each(&self, queries: Vec<String>, topk: usize) -> EachFuture {
        let inner = self.inner.clone();
        Box::pin(async move { inner.search_each(queries, topk).await })
    }

    fn render(&self) -> RenderFormat {
        self.inner.backend.render()
    }

    fn usage(&self) -> Vec<(String, Usage)> {
        self.inner.counts.add_to(&self.inner.provider, self.inner.backend.usage())
    }
}

/// The open-page tool: [`PageFetcher`] behind the cache, rendering pages for the model.
#[derive(Debug, Clone)]
pub struct CachedPages {
    inner: Arc<PagesInner>,
}

#[derive(Debug)]
struct PagesInner {
    fetcher: PageFetcher,
    cache: Option<WebCache>,
    mode: CacheMode,
    counts: Counts,
}

/// The provider name pages are accounted under.
pub const PAGES: &str = "open";

impl CachedPages {
    pub fn new(fetcher: PageFetcher, cache: Option<WebCache>, mode: CacheMode) -> Self {
        Self { inner: Arc::new(PagesInner { fetcher, cache, mode, counts: Counts::default() }) }
    }
}

impl PagesInner {
    fn key(&self, url: &str) -> CacheKey {
        // URLs are case-sensitive: keyed as written (trimmed), not normalised like queries.
        let params = serde_json::json!({ "max_bytes": self.fetcher.config().max_bytes });
        let mut key = CacheKey::new("page", PAGES, "", &params);
        key.query = url.trim().to_string();
        key
    }

    async fn open(&self, url: String) -> Result<Hit, SearchError> {
        let key = self.key(&url);
        let cached = match &self.cache {
            Some(cache) => match cache.get(&key).await {
                Ok(Some(v)) => serde_json::from_value::<Page>(v).ok(),
                Ok(None) => None,
                Err(e) => {
                    tracing::warn!(error = %e, "cache lookup failed; fetching the page");
                    None
                }
            },
            None => None,
        };
        let page = match cached {
            Some(page) => {
                self.counts.hits.fetch_add(1, Ordering::Relaxed);
                page
            }
            None => {
                self.counts.misses.fetch_add(1, Ordering::Relaxed);
                if self.mode == CacheMode::Replay {
                    return Err(SearchError::ReplayMiss(format!("page {url}")));
                }
                let page = self.fetcher.fetch(&url).await?;
                if let Some(cache) = &self.cache {
                    let stored = match serde_json::to_value(&page) {
                        Ok(value) => cache.put(&key, value).await.map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    if let Err(e) = stored {
                        tracing::warn!(error = %e, "page not cached");
                    }
                }
                page
            }
        };
        let contents = render_page(&page, self.fetcher.config().max_chars);
        Ok(Hit { id: page.url.clone(), contents, score: 0.0, url: Some(page.url), published: None })
    }
}

impl PageTool for CachedPages {
    fn open_each(&self, urls: Vec<String>) -> EachFuture {
        let inner = self.inner.clone();
        Box::pin(async move {
            join_all(urls.into_iter().map(|u| inner.open(u))).await.into_iter().map(|r| r.map(|h| vec![h])).collect()
        })
    }

    fn usage(&self) -> Vec<(String, Usage)> {
        self.inner.counts.add_to(PAGES, vec![(PAGES.to_string(), self.inner.fetcher.usage())])
    }
}
