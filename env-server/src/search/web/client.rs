//! The call path of one web search: the API key (found in the configuration or the
//! environment, never shown), the endpoint, the token bucket and the concurrency cap, one query's
//! attempts under Grove's HTTP policy (`grove-http`), errors with the key redacted, and the usage
//! counters (calls, errors, retries, throttled waits).

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reqwest::header::HeaderValue;
use serde_json::Value;
use tokio::sync::Semaphore;

use super::{WebConfig, WebResult, providers};
use crate::search::{SearchError, Usage};

/// An API key; its `Debug` never shows it.
#[derive(Clone)]
struct Secret(String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A token bucket: `burst` tokens, refilled at `rate` per second; one token per HTTP attempt.
#[derive(Debug)]
struct Bucket {
    rate: f64,
    burst: f64,
    /// Tokens at the instant.
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    fn new(rate: f64, burst: u32) -> Bucket {
        let burst = f64::from(burst.max(1));
        Bucket { rate, burst, state: Mutex::new((burst, Instant::now())) }
    }

    /// Take one token, waiting for it if needed; true when it had to wait.
    async fn take(&self) -> bool {
        if !(self.rate > 0.0 && self.rate.is_finite()) {
            return false;
        }
        let mut waited = false;
        loop {
            let wait = {
                let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                let now = Instant::now();
                let tokens = (state.0 + now.duration_since(state.1).as_secs_f64() * self.rate).min(self.burst);
                *state = (tokens, now);
                if tokens >= 1.0 {
                    state.0 -= 1.0;
                    return waited;
                }
                Duration::from_secs_f64((1.0 - tokens) / self.rate)
            };
            waited = true;
            tokio::time::sleep(wait).await;
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    calls: AtomicU64,
    errors: AtomicU64,
    retries: AtomicU64,
    throttled: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Everything one web search backend shares between its queries.
#[derive(Debug)]
pub(super) struct Client {
    pub(super) cfg: WebConfig,
    endpoint: url::Url,
    key: Option<Secret>,
    http: reqwest::Client,
    bucket: Bucket,
    gate: Semaphore,
    counters: Counters,
}

impl Client {
    /// `SearchError::Config` if the provider needs a key and none is found (in `api_key`, then in
    /// the environment variable), or there is no usable endpoint (SearxNG has no default).
    pub(super) fn new(cfg: WebConfig) -> Result<Client, SearchError> {
        let provider = cfg.provider;
        let endpoint = cfg
            .endpoint
            .as_deref()
            .or(provider.default_endpoint())
            .ok_or_else(|| SearchError::Config(format!("{}: no endpoint configured", provider.name())))?;
        let endpoint = url::Url::parse(endpoint)
            .map_err(|e| SearchError::Config(format!("{}: invalid endpoint URL ({e})", provider.name())))?;
        if !matches!(endpoint.scheme(), "http" | "https") {
            return Err(SearchError::Config(format!("{}: the endpoint must be http(s)", provider.name())));
        }
        let key_env = cfg.api_key_env.as_deref().or(provider.default_key_env());
        let key = cfg
            .api_key
            .as_deref()
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(str::to_string)
            .or_else(|| std::env::var(key_env?).ok().map(|k| k.trim().to_string()).filter(|k| !k.is_empty()));
        if provider.needs_key() {
            let Some(key) = &key else {
                let where_ = key_env.map_or_else(|| "api_key".to_string(), |v| format!("api_key or ${v}"));
                return Err(SearchError::Config(format!("{}: no API key (set {where_})", provider.name())));
            };
            if HeaderValue::from_str(key).is_err() {
                return Err(SearchError::Config(format!("{}: the API key has invalid characters", provider.name())));
            }
        }
        grove_http::install_tls_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(cfg.deadline_ms.clamp(1, 5_000)))
            .user_agent(concat!("grove-env-server/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| SearchError::Internal(e.without_url().to_string()))?;
        Ok(Client {
            endpoint,
            key: key.map(Secret),
            http,
            bucket: Bucket::new(cfg.rate_per_sec, cfg.burst),
            gate: Semaphore::new(cfg.max_concurrency.max(1)),
            counters: Counters::default(),
            cfg,
        })
    }

    /// One query: rate limit, concurrency cap, retries, all under the deadline. At most
    /// `results` results; a failure is counted, logged and has the key redacted.
    pub(super) async fn search(&self, query: &str) -> Result<Vec<WebResult>, SearchError> {
        match self.run(query).await {
            Ok(mut results) => {
                results.truncate(self.cfg.results as usize);
                Ok(results)
            }
            Err(e) => {
                bump(&self.counters.errors);
                let e = self.redact(e);
                tracing::warn!(provider = self.cfg.provider.name(), error = %e, "web search failed");
                Err(e)
            }
        }
    }

    /// Calls, errors, retries and throttled waits so far (no cache figures: the cache is in
    /// front of the backend).
    pub(super) fn usage(&self) -> Usage {
        let c = &self.counters;
        Usage {
            calls: c.calls.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            throttled: c.throttled.load(Ordering::Relaxed),
            cache_hits: 0,
            cache_misses: 0,
        }
    }

    /// The attempts of one query under the HTTP policy (retries honouring `Retry-After`, the
    /// deadline, a capped reply); each attempt holds a concurrency permit and takes a token.
    async fn run(&self, query: &str) -> Result<Vec<WebResult>, SearchError> {
        let policy = grove_http::Policy {
            deadline: Duration::from_millis(self.cfg.deadline_ms),
            attempt_timeout: None,
            retries: self.cfg.retries,
            backoff: Duration::from_millis(self.cfg.backoff_ms),
            max_retry_after: Duration::from_millis(self.cfg.max_retry_after_ms),
            max_body: MAX_REPLY_BYTES,
            overflow: grove_http::Overflow::Fail,
        };
        let secrets: Vec<String> = self.key.iter().map(|k| k.0.clone()).collect();
        let reply = grove_http::send(&policy, &secrets, |attempt| async move {
            let permit =
                self.gate.acquire().await.map_err(|_| grove_http::HttpError::Request("limiter closed".into()))?;
            if attempt > 0 {
                bump(&self.counters.retries);
                tracing::debug!(provider = self.cfg.provider.name(), attempt, "retrying web search");
            }
            if self.bucket.take().await {
                bump(&self.counters.throttled);
            }
            bump(&self.counters.calls);
            let key = self.key.as_ref().map(|k| k.0.as_str());
            Ok((providers::request(&self.http, &self.endpoint, &self.cfg, key, query), permit))
        })
        .await
        .and_then(grove_http::Reply::error_for_status)
        .map_err(|e| crate::search::remote::search_error(e, self.cfg.deadline_ms))?;
        let body: Value = serde_json::from_slice(&reply.body)
            .map_err(|e| SearchError::BadReply(format!("{}: not JSON ({e})", self.cfg.provider.name())))?;
        providers::parse_response(self.cfg.provider, &body)
    }

    /// The error with every occurrence of the key (raw or URL-encoded) blanked out.
    fn redact(&self, e: SearchError) -> SearchError {
        let Some(Secret(key)) = &self.key else { return e };
        let secrets = [key.clone()];
        let scrub = |m: String| grove_http::redact(&m, &secrets);
        match e {
            SearchError::Unreachable(m) => SearchError::Unreachable(scrub(m)),
            SearchError::Status { status, body } => SearchError::Status { status, body: scrub(body) },
            SearchError::BadReply(m) => SearchError::BadReply(scrub(m)),
            SearchError::Internal(m) => SearchError::Internal(scrub(m)),
            other => other,
        }
    }
}

/// Replies larger than this are refused: a search reply is a few kilobytes.
const MAX_REPLY_BYTES: usize = 8 << 20;

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    use serde_json::json;

    use super::super::test_support::*;
    use super::super::{Provider, WebConfig, WebSearch};
    use super::*;
    use crate::search::SearchBackend;
    use crate::testkit::{Canned, Recorded, ScriptedServer};

    #[tokio::test]
    async fn retry_after_is_honoured() {
        let n = Arc::new(AtomicUsize::new(0));
        let seen = n.clone();
        let server = ScriptedServer::start(move |_: &Recorded| {
            if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                Canned::status(429, r#"{"message":"Too many requests"}"#).header("retry-after", "1")
            } else {
                Canned::json(&json!({"organic": [{"title": "t", "link": "https://a.example/", "snippet": "s"}]}))
            }
        })
        .await
        .unwrap();
        let web = WebSearch::new(config(Provider::Serper, server.url())).unwrap();
        let start = Instant::now();
        let results = web.search_one("q").await.unwrap();
        assert!(start.elapsed() >= Duration::from_millis(950), "{:?}", start.elapsed());
        assert_eq!(results.len(), 1);
        assert_eq!(server.count(), 2);
        let requests = server.requests();
        assert!(requests[1].at.duration_since(requests[0].at) >= Duration::from_millis(950));
        assert_eq!(web.usage()[0].1, Usage { calls: 2, retries: 1, ..Usage::default() });
    }

    #[tokio::test]
    async fn server_errors_are_retried_then_reported() {
        let server = serve(Canned::status(500, "internal trouble")).await;
        let mut cfg = config(Provider::Brave, server.url());
        cfg.retries = 2;
        let web = WebSearch::new(cfg).unwrap();
        let err = web.search_one("q").await.unwrap_err();
        assert_eq!(err, SearchError::Status { status: 500, body: "internal trouble".into() });
        assert_eq!(server.count(), 3);
        assert_eq!(web.usage()[0].1, Usage { calls: 3, errors: 1, retries: 2, ..Usage::default() });
    }

    #[tokio::test]
    async fn client_errors_are_not_retried() {
        let long = format!("{{\"message\":\"Unauthorized.\",\"statusCode\":401,\"pad\":\"{}\"}}", "x".repeat(500));
        let server = serve(Canned::status(401, long)).await;
        let web = WebSearch::new(config(Provider::Serper, server.url())).unwrap();
        match web.search_one("q").await {
            Err(SearchError::Status { status: 401, body }) => {
                assert!(body.starts_with("{\"message\":\"Unauthorized.\""));
                assert_eq!(body.chars().count(), 300);
            }
            r => panic!("{r:?}"),
        }
        assert_eq!(server.count(), 1);
        assert_eq!(web.usage()[0].1, Usage { calls: 1, errors: 1, ..Usage::default() });
    }

    #[tokio::test]
    async fn slow_provider_times_out() {
        let delay = Duration::from_secs(5);
        let server = serve(Canned::json(&json!({"results": []})).delayed(delay)).await;
        let mut cfg = config(Provider::Tavily, server.url());
        cfg.deadline_ms = 300;
        let web = WebSearch::new(cfg).unwrap();
        let start = Instant::now();
        assert_eq!(web.search_one("q").await.unwrap_err(), SearchError::Timeout(300));
        assert!(start.elapsed() < delay - Duration::from_secs(1), "{:?}", start.elapsed());
        assert_eq!(web.usage()[0].1.errors, 1);
    }

    #[tokio::test]
    async fn malformed_json_is_a_bad_reply() {
        let server =
            serve(Canned::status(200, "{\"organic\": [ oops").header("content-type", "application/json")).await;
        let web = WebSearch::new(config(Provider::Serper, server.url())).unwrap();
        assert!(matches!(web.search_one("q").await, Err(SearchError::BadReply(_))));
        assert_eq!(server.count(), 1);
    }

    #[tokio::test]
    async fn rate_limit_spaces_requests() {
        let server = serve(Canned::json(&json!({"organic": []}))).await;
        let mut cfg = config(Provider::Serper, server.url());
        cfg.rate_per_sec = 10.0;
        cfg.burst = 1;
        let web = WebSearch::new(cfg).unwrap();
        let queries: Vec<String> = (0..5).map(|i| format!("q{i}")).collect();
        let outcomes = web.search_each(queries, 10).await;
        assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
        let mut at: Vec<Instant> = server.requests().iter().map(|r| r.at).collect();
        at.sort();
        assert_eq!(at.len(), 5);
        for pair in at.windows(2) {
            let gap = pair[1].duration_since(pair[0]);
            assert!(gap >= Duration::from_millis(80), "gap {gap:?}");
        }
        assert_eq!(web.usage()[0].1.throttled, 4);
    }

    #[tokio::test]
    async fn concurrency_is_capped() {
        let server = serve(Canned::json(&json!({"organic": []})).delayed(Duration::from_millis(300))).await;
        let mut cfg = config(Provider::Serper, server.url());
        cfg.max_concurrency = 2;
        let web = WebSearch::new(cfg).unwrap();
        let queries: Vec<String> = (0..4).map(|i| format!("q{i}")).collect();
        let outcomes = web.search(queries, 10).await.unwrap();
        assert_eq!(outcomes.len(), 4);
        let mut at: Vec<Instant> = server.requests().iter().map(|r| r.at).collect();
        at.sort();
        assert_eq!(at.len(), 4);
        assert!(at[2].duration_since(at[0]) >= Duration::from_millis(250), "{:?}", at[2].duration_since(at[0]));
    }

    #[test]
    fn missing_key_or_endpoint_is_a_config_error() {
        let cfg = WebConfig {
            provider: Provider::Tavily,
            api_key_env: Some("GROVE_TEST_SURELY_UNSET_TAVILY_KEY".into()),
            ..WebConfig::default()
        };
        match WebSearch::new(cfg) {
            Err(SearchError::Config(m)) => assert!(m.contains("GROVE_TEST_SURELY_UNSET_TAVILY_KEY"), "{m}"),
            r => panic!("{r:?}"),
        }
        let cfg = WebConfig { provider: Provider::Searxng, ..WebConfig::default() };
        assert!(matches!(WebSearch::new(cfg), Err(SearchError::Config(_))));
        let cfg = WebConfig { provider: Provider::Searxng, endpoint: Some("not a url".into()), ..WebConfig::default() };
        assert!(matches!(WebSearch::new(cfg), Err(SearchError::Config(_))));
        // SearxNG needs no key.
        let cfg = WebConfig {
            provider: Provider::Searxng,
            endpoint: Some("http://127.0.0.1:8888/search".into()),
            ..WebConfig::default()
        };
        let web = WebSearch::new(cfg).unwrap();
        assert_eq!(web.provider(), Provider::Searxng);
        assert_eq!(web.config().results, 10);
    }

    #[tokio::test]
    async fn the_key_never_leaks() {
        let cfg = config(Provider::Serpapi, "http://127.0.0.1:9/search.json".into());
        assert!(!format!("{cfg:?}").contains(KEY));
        assert!(format!("{cfg:?}").contains("<redacted>"));

        // A closed port: the connection fails, and reqwest's error would carry the URL.
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let mut cfg = config(Provider::Serpapi, format!("http://127.0.0.1:{port}/search.json"));
        cfg.retries = 1;
        let web = WebSearch::new(cfg).unwrap();
        assert!(!format!("{web:?}").contains(KEY));
        let err = web.search_one("leak check").await.unwrap_err();
        assert!(matches!(err, SearchError::Unreachable(_)), "{err:?}");
        for text in [err.to_string(), format!("{err:?}"), err.short()] {
            assert!(!text.contains(KEY), "{text}");
            assert!(!text.contains("api_key"), "{text}");
        }
        assert_eq!(web.usage()[0].1, Usage { calls: 2, errors: 1, retries: 1, ..Usage::default() });

        // A provider that echoes the request back in its error body.
        let server = ScriptedServer::start(|r: &Recorded| Canned::status(403, format!("forbidden: {}", r.target)))
            .await
            .unwrap();
        let web = WebSearch::new(config(Provider::Serpapi, server.url())).unwrap();
        let err = web.search_one("q").await.unwrap_err();
        assert!(matches!(err, SearchError::Status { status: 403, .. }), "{err:?}");
        assert!(!err.to_string().contains(KEY), "{err}");
        assert!(err.to_string().contains("<redacted>"), "{err}");
    }
}
