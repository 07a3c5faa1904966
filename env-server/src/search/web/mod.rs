//! Live web search providers (Serper, SerpAPI, Brave, Tavily, SearxNG) behind [`SearchBackend`]:
//! the backend ([`WebSearch`]), its configuration ([`WebConfig`], [`Provider`]) and the
//! normalised result ([`WebResult`]). The providers' API shapes (request building, reply
//! parsing) are in `providers.rs`; the call path (keys, rate limit, concurrency cap, HTTP policy,
//! usage counters) in `client.rs`.
//!
//! Every query goes through the same path: a semaphore caps the requests in flight to the
//! provider, a token bucket shared by the backend spaces them out, and Grove's outbound HTTP
//! policy (`grove-http`) retries 429 / 5xx / connection errors with exponential backoff
//! (honouring `Retry-After`), caps the reply, and runs the whole query, waits and retries
//! included, under one deadline. Replies are normalised to [`WebResult`]s ranked
//! 1..n in provider order. The API key never appears in an error message or a log line.

mod client;
mod providers;

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{EachFuture, Hit, RenderFormat, SearchBackend, SearchError, SearchFuture, Usage};

pub use providers::parse_response;

/// A web search provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    Serper,
    Serpapi,
    Brave,
    Tavily,
    Searxng,
}

impl Provider {
    /// The provider's name in configuration, metrics and cache keys.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Serper => "serper",
            Provider::Serpapi => "serpapi",
            Provider::Brave => "brave",
            Provider::Tavily => "tavily",
            Provider::Searxng => "searxng",
        }
    }

    /// The public search endpoint; `None` for SearxNG, which is self-hosted.
    pub fn default_endpoint(self) -> Option<&'static str> {
        match self {
            Provider::Serper => Some("https://google.serper.dev/search"),
            Provider::Serpapi => Some("https://serpapi.com/search.json"),
            Provider::Brave => Some("https://api.search.brave.com/res/v1/web/search"),
            Provider::Tavily => Some("https://api.tavily.com/search"),
            Provider::Searxng => None,
        }
    }

    /// The environment variable that holds the API key by default; `None` for SearxNG.
    pub fn default_key_env(self) -> Option<&'static str> {
        match self {
            Provider::Serper => Some("SERPER_API_KEY"),
            Provider::Serpapi => Some("SERPAPI_API_KEY"),
            Provider::Brave => Some("BRAVE_API_KEY"),
            Provider::Tavily => Some("TAVILY_API_KEY"),
            Provider::Searxng => None,
        }
    }

    /// Whether the provider refuses requests without a key.
    fn needs_key(self) -> bool {
        self != Provider::Searxng
    }
}

/// Configuration of one web search backend.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebConfig {
    pub provider: Provider,
    /// Full URL of the search endpoint; defaults to [`Provider::default_endpoint`].
    pub endpoint: Option<String>,
    /// The key itself. Prefer `api_key_env`; never logged nor put in an error message.
    pub api_key: Option<String>,
    /// The environment variable holding the key; defaults to [`Provider::default_key_env`].
    pub api_key_env: Option<String>,
    /// Results asked per query (Brave caps at 20).
    pub results: u32,
    pub country: Option<String>,
    pub language: Option<String>,
    /// Token-bucket refill rate; 0 (or less) disables the rate limiter.
    pub rate_per_sec: f64,
    /// Token-bucket size.
    pub burst: u32,
    /// Requests in flight to the provider.
    pub max_concurrency: usize,
    /// Per query, waits and retries included.
    pub deadline_ms: u64,
    /// Retries after the first attempt, on 429 / 5xx / connection errors.
    pub retries: u32,
    /// First backoff, doubled each retry.
    pub backoff_ms: u64,
    /// Cap on a provider's `Retry-After`.
    pub max_retry_after_ms: u64,
}

impl Default for WebConfig {
    fn default() -> Self {
        WebConfig {
            provider: Provider::Serper,
            endpoint: None,
            api_key: None,
            api_key_env: None,
            results: 10,
            country: Some("us".into()),
            language: Some("en".into()),
            rate_per_sec: 5.0,
            burst: 5,
            max_concurrency: 8,
            deadline_ms: 15_000,
            retries: 3,
            backoff_ms: 500,
            max_retry_after_ms: 10_000,
        }
    }
}

impl fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebConfig")
            .field("provider", &self.provider)
            .field("endpoint", &self.endpoint)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("api_key_env", &self.api_key_env)
            .field("results", &self.results)
            .field("country", &self.country)
            .field("language", &self.language)
            .field("rate_per_sec", &self.rate_per_sec)
            .field("burst", &self.burst)
            .field("max_concurrency", &self.max_concurrency)
            .field("deadline_ms", &self.deadline_ms)
            .field("retries", &self.retries)
            .field("backoff_ms", &self.backoff_ms)
            .field("max_retry_after_ms", &self.max_retry_after_ms)
            .finish()
    }
}

/// One normalised web result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebResult {
    /// 1-based position in the provider's order.
    pub rank: u32,
    pub title: String,
    pub url: String,
    pub snippet: String,
    pub published: Option<String>,
}

impl WebResult {
    /// The Search-R1 shaped hit: `id` is the URL, `contents` is `"Title"\nsnippet`.
    pub fn into_hit(self) -> Hit {
        Hit {
            contents: format!("\"{}\"\n{}", self.title, self.snippet),
            id: self.url.clone(),
            score: 0.0,
            url: Some(self.url),
            published: self.published,
        }
    }
}

/// The request parameters that determine a result (provider, results, country, language, and
/// the endpoint where it is not the provider's own), for cache keys. Two SearxNG instances (or a
/// provider behind another URL) answer differently, so they do not share entries; a provider at
/// its default endpoint keys as it always did.
pub fn request_params(cfg: &WebConfig) -> Value {
    let mut params = json!({
        "provider": cfg.provider.name(),
        "results": cfg.results,
        "country": cfg.country,
        "language": cfg.language,
    });
    if let Some(endpoint) = cfg.endpoint.as_deref().filter(|e| Some(*e) != cfg.provider.default_endpoint()) {
        params["endpoint"] = json!(endpoint);
    }
    params
}

/// A live web search provider.
#[derive(Debug, Clone)]
pub struct WebSearch {
    inner: Arc<client::Client>,
}

impl WebSearch {
    /// `SearchError::Config` if the provider needs a key and none is found (in `api_key`, then in
    /// the environment variable), or there is no usable endpoint (SearxNG has no default).
    pub fn new(cfg: WebConfig) -> Result<WebSearch, SearchError> {
        Ok(WebSearch { inner: Arc::new(client::Client::new(cfg)?) })
    }

    /// One query: rate limit, concurrency cap, retries, all under the deadline. At most
    /// `results` results.
    pub async fn search_one(&self, query: &str) -> Result<Vec<WebResult>, SearchError> {
        self.inner.search(query).await
    }

    pub fn provider(&self) -> Provider {
        self.inner.cfg.provider
    }

    pub fn config(&self) -> &WebConfig {
        &self.inner.cfg
    }
}

impl SearchBackend for WebSearch {
    fn name(&self) -> &str {
        self.inner.cfg.provider.name()
    }

    fn search(&self, queries: Vec<String>, topk: usize) -> SearchFuture {
        let each = self.search_each(queries, topk);
        Box::pin(async move { each.await.into_iter().collect() })
    }

    /// Every query at once; `topk` is ignored (the provider returns up to `results`).
    fn search_each(&self, queries: Vec<String>, _topk: usize) -> EachFuture {
        let this = self.clone();
        Box::pin(async move {
            let calls = queries.iter().map(|q| this.search_one(q));
            futures_util::future::join_all(calls)
                .await
                .into_iter()
                .map(|r| r.map(|results| results.into_iter().map(WebResult::into_hit).collect()))
                .collect()
        })
    }

    fn render(&self) -> RenderFormat {
        RenderFormat::Pages
    }

    fn usage(&self) -> Vec<(String, Usage)> {
        vec![(self.inner.cfg.provider.name().to_string(), self.inner.usage())]
    }
}

/// Helpers shared by the tests of this module, of the providers and of the client.
#[cfg(test)]
mod test_support {
    use super::*;
    use crate::testkit::{Canned, Recorded, ScriptedServer};

    pub(super) const KEY: &str = "sk-test-S3CRET-key-9f8e7d";

    pub(super) fn config(provider: Provider, endpoint: String) -> WebConfig {
        WebConfig {
            provider,
            endpoint: Some(endpoint),
            api_key: Some(KEY.into()),
            backoff_ms: 10,
            rate_per_sec: 1000.0,
            burst: 100,
            ..WebConfig::default()
        }
    }

    pub(super) async fn serve(reply: Canned) -> ScriptedServer {
        ScriptedServer::start(move |_: &Recorded| reply.clone()).await.unwrap()
    }

    pub(super) fn only_request(server: &ScriptedServer) -> Recorded {
        let requests = server.requests();
        assert_eq!(requests.len(), 1, "{requests:?}");
        requests.into_iter().next().unwrap()
    }

    pub(super) fn path(r: &Recorded) -> &str {
        r.target.split('?').next().unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_names_and_config_defaults() {
        for p in [Provider::Serper, Provider::Serpapi, Provider::Brave, Provider::Tavily, Provider::Searxng] {
            assert_eq!(serde_json::to_value(p).unwrap(), json!(p.name()));
            #[cfg(feature = "cli")]
            assert_eq!(<Provider as clap::ValueEnum>::from_str(p.name(), false).unwrap(), p);
            assert_eq!(p.default_endpoint().is_none(), p == Provider::Searxng);
            assert_eq!(p.default_key_env().is_none(), p == Provider::Searxng);
        }
        assert_eq!(Provider::Brave.default_endpoint(), Some("https://api.search.brave.com/res/v1/web/search"));
        let cfg: WebConfig = serde_json::from_value(json!({"provider": "brave", "results": 5})).unwrap();
        assert_eq!(cfg, WebConfig { provider: Provider::Brave, results: 5, ..WebConfig::default() });
        assert_eq!(cfg.country.as_deref(), Some("us"));
        assert!(serde_json::from_value::<WebConfig>(json!({"provder": "brave"})).is_err());
        assert_eq!(request_params(&cfg), json!({"provider": "brave", "results": 5, "country": "us", "language": "en"}));
        let brave_default = WebConfig { endpoint: Provider::Brave.default_endpoint().map(Into::into), ..cfg.clone() };
        assert_eq!(request_params(&brave_default), request_params(&cfg));
        let searx =
            |url: &str| WebConfig { provider: Provider::Searxng, endpoint: Some(url.into()), ..WebConfig::default() };
        let (a, b) = (request_params(&searx("http://a.test/search")), request_params(&searx("http://b.test/search")));
        assert_ne!(a, b, "two SearxNG instances share no cache entries");
        assert_eq!(a["endpoint"], json!("http://a.test/search"));
    }
}
