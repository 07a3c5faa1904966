//! Live web search providers (Serper, SerpAPI, Brave, Tavily, SearxNG) behind [`SearchBackend`].
//!
//! Every query goes through the same path: a semaphore caps the requests in flight to the
//! provider, a token bucket shared by the backend spaces them out, and Grove's outbound HTTP
//! policy (`grove-http`) retries 429 / 5xx / connection errors with exponential backoff
//! (honouring `Retry-After`), caps the reply, and runs the whole query, waits and retries
//! included, under one deadline. Replies are normalised to [`WebResult`]s ranked
//! 1..n in provider order. The API key never appears in an error message or a log line.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::header::HeaderValue;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::{EachFuture, Hit, RenderFormat, SearchBackend, SearchError, SearchFuture, Usage};

/// A web search provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
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

/// Where a provider puts its result list and the fields of one entry.
struct Shape {
    list: &'static str,
    url: &'static str,
    snippet: &'static str,
    dates: &'static [&'static str],
}

/// Normalise one provider reply (the JSON body of a 200) to results ranked 1..n in provider order.
pub fn parse_response(provider: Provider, body: &Value) -> Result<Vec<WebResult>, SearchError> {
    let bad = |m: String| SearchError::BadReply(format!("{}: {m}", provider.name()));
    let obj = body.as_object().ok_or_else(|| bad("the reply is not a JSON object".into()))?;
    let error_text = ["error", "message"].iter().find_map(|k| obj.get(*k).and_then(Value::as_str));
    let (shape, list) = match provider {
        Provider::Serper => {
            let shape = Shape { list: "organic", url: "link", snippet: "snippet", dates: &["date"] };
            (shape, obj.get("organic"))
        }
        Provider::Serpapi => {
            let list = obj.get("organic_results");
            if list.is_none()
                && let Some(message) = obj.get("error").and_then(Value::as_str)
            {
                // SerpAPI answers a query without results with a 200 and this error.
                if message.contains("hasn't returned any results") {
                    return Ok(Vec::new());
                }
                return Err(bad(format!("error: {message}")));
            }
            let shape = Shape { list: "organic_results", url: "link", snippet: "snippet", dates: &["date"] };
            (shape, list)
        }
        Provider::Brave => {
            // Brave leaves out the `web` section when there are no web results.
            let list = match obj.get("web") {
                None | Some(Value::Null) => None,
                Some(Value::Object(web)) => web.get("results"),
                Some(_) => return Err(bad("`web` is not an object".into())),
            };
            let shape = Shape { list: "web.results", url: "url", snippet: "description", dates: &["page_age", "age"] };
            (shape, list)
        }
        Provider::Tavily | Provider::Searxng => {
            let dates: &'static [&'static str] =
                if provider == Provider::Tavily { &["published_date"] } else { &["publishedDate"] };
            let list = obj.get("results");
            if list.is_none() {
                let why = error_text.map_or_else(|| "no `results` list".to_string(), |m| format!("error: {m}"));
                return Err(bad(why));
            }
            (Shape { list: "results", url: "url", snippet: "content", dates }, list)
        }
    };
    let entries = match list {
        None | Some(Value::Null) => {
            // Serper without `organic` and without an error: no results.
            if provider == Provider::Serper
                && let Some(m) = error_text
            {
                return Err(bad(format!("error: {m}")));
            }
            return Ok(Vec::new());
        }
        Some(Value::Array(entries)) => entries,
        Some(_) => return Err(bad(format!("`{}` is not a list", shape.list))),
    };
    let text = |entry: &Value, key: &str| entry.get(key).and_then(Value::as_str).map(clean_text);
    let mut out = Vec::new();
    for entry in entries {
        let Some(url) = entry.get(shape.url).and_then(Value::as_str).map(str::trim).filter(|u| !u.is_empty()) else {
            continue;
        };
        let published = shape
            .dates
            .iter()
            .filter_map(|k| entry.get(*k).and_then(Value::as_str))
            .map(str::trim)
            .find(|d| !d.is_empty())
            .map(str::to_string);
        out.push(WebResult {
            rank: out.len() as u32 + 1,
            title: text(entry, "title").unwrap_or_default(),
            url: url.to_string(),
            snippet: text(entry, shape.snippet).unwrap_or_default(),
            published,
        });
    }
    Ok(out)
}

/// The request parameters that determine a result (provider, results, country, language), for
/// cache keys.
pub fn request_params(cfg: &WebConfig) -> Value {
    json!({
        "provider": cfg.provider.name(),
        "results": cfg.results,
        "country": cfg.country,
        "language": cfg.language,
    })
}

/// Strip simple HTML tags, decode the common entities, collapse whitespace and trim.
fn clean_text(s: &str) -> String {
    let decoded = decode_entities(&strip_tags(s));
    decoded.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Remove `<tag …>` and `</tag>`; a `<` that does not open a tag (`a < b`) is kept.
fn strip_tags(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('<') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let name = after.strip_prefix('/').unwrap_or(after);
        let opens_tag = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic());
        match after.find('>') {
            Some(j) if opens_tag && !after[..j].contains('<') => rest = &after[j + 1..],
            _ => {
                out.push('<');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Decode `&amp;`-style named entities and numeric character references; unknown ones are kept.
fn decode_entities(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let decoded = after.find(';').filter(|&j| j <= 10).and_then(|j| {
            let name = &after[..j];
            let c = match name {
                "amp" => Some('&'),
                "lt" => Some('<'),
                "gt" => Some('>'),
                "quot" => Some('"'),
                "apos" => Some('\''),
                "nbsp" => Some(' '),
                _ => {
                    let num = name.strip_prefix('#')?;
                    let code = match num.strip_prefix(['x', 'X']) {
                        Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                        None => num.parse().ok()?,
                    };
                    char::from_u32(code)
                }
            };
            c.map(|c| (c, j))
        });
        match decoded {
            Some((c, j)) => {
                out.push(c);
                rest = &after[j + 1..];
            }
            None => {
                out.push('&');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

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

/// A live web search provider.
#[derive(Debug, Clone)]
pub struct WebSearch {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cfg: WebConfig,
    endpoint: url::Url,
    key: Option<Secret>,
    http: reqwest::Client,
    bucket: Bucket,
    gate: Semaphore,
    counters: Counters,
}

impl WebSearch {
    /// `SearchError::Config` if the provider needs a key and none is found (in `api_key`, then in
    /// the environment variable), or there is no usable endpoint (SearxNG has no default).
    pub fn new(cfg: WebConfig) -> Result<WebSearch, SearchError> {
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
        let inner = Inner {
            endpoint,
            key: key.map(Secret),
            http,
            bucket: Bucket::new(cfg.rate_per_sec, cfg.burst),
            gate: Semaphore::new(cfg.max_concurrency.max(1)),
            counters: Counters::default(),
            cfg,
        };
        Ok(WebSearch { inner: Arc::new(inner) })
    }

    /// One query: rate limit, concurrency cap, retries, all under the deadline. At most
    /// `results` results.
    pub async fn search_one(&self, query: &str) -> Result<Vec<WebResult>, SearchError> {
        let inner = &*self.inner;
        match inner.run(query).await {
            Ok(mut results) => {
                results.truncate(inner.cfg.results as usize);
                Ok(results)
            }
            Err(e) => {
                bump(&inner.counters.errors);
                let e = inner.redact(e);
                tracing::warn!(provider = inner.cfg.provider.name(), error = %e, "web search failed");
                Err(e)
            }
        }
    }

    pub fn provider(&self) -> Provider {
        self.inner.cfg.provider
    }

    pub fn config(&self) -> &WebConfig {
        &self.inner.cfg
    }
}

impl Inner {
    fn key(&self) -> &str {
        self.key.as_ref().map_or("", |k| k.0.as_str())
    }

    /// A header value holding (part of) the key, marked sensitive.
    fn secret_header(&self, value: &str) -> HeaderValue {
        let mut v = HeaderValue::from_str(value).unwrap_or_else(|_| HeaderValue::from_static(""));
        v.set_sensitive(true);
        v
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
            Ok((self.request(query), permit))
        })
        .await
        .and_then(grove_http::Reply::error_for_status)
        .map_err(|e| super::remote::search_error(e, self.cfg.deadline_ms))?;
        let body: Value = serde_json::from_slice(&reply.body)
            .map_err(|e| SearchError::BadReply(format!("{}: not JSON ({e})", self.cfg.provider.name())))?;
        parse_response(self.cfg.provider, &body)
    }

    /// The provider's request for `query`.
    fn request(&self, query: &str) -> reqwest::RequestBuilder {
        let cfg = &self.cfg;
        let key = self.key();
        let mut url = self.endpoint.clone();
        match cfg.provider {
            Provider::Serper => {
                let mut body = json!({ "q": query, "num": cfg.results });
                if let Some(gl) = &cfg.country {
                    body["gl"] = json!(gl);
                }
                if let Some(hl) = &cfg.language {
                    body["hl"] = json!(hl);
                }
                self.http.post(url).header("X-API-KEY", self.secret_header(key)).json(&body)
            }
            Provider::Serpapi => {
                {
                    let mut q = url.query_pairs_mut();
                    q.append_pair("engine", "google").append_pair("q", query).append_pair("api_key", key);
                    q.append_pair("num", &cfg.results.to_string());
                    if let Some(hl) = &cfg.language {
                        q.append_pair("hl", hl);
                    }
                    if let Some(gl) = &cfg.country {
                        q.append_pair("gl", gl);
                    }
                }
                self.http.get(url)
            }
            Provider::Brave => {
                {
                    let mut q = url.query_pairs_mut();
                    q.append_pair("q", query).append_pair("count", &cfg.results.min(20).to_string());
                    if let Some(country) = &cfg.country {
                        q.append_pair("country", country);
                    }
                    if let Some(lang) = &cfg.language {
                        q.append_pair("search_lang", lang);
                    }
                }
                self.http
                    .get(url)
                    .header("X-Subscription-Token", self.secret_header(key))
                    .header(reqwest::header::ACCEPT, "application/json")
            }
            Provider::Tavily => {
                let body = json!({ "query": query, "max_results": cfg.results, "search_depth": "basic" });
                self.http
                    .post(url)
                    .header(reqwest::header::AUTHORIZATION, self.secret_header(&format!("Bearer {key}")))
                    .json(&body)
            }
            Provider::Searxng => {
                {
                    let mut q = url.query_pairs_mut();
                    q.append_pair("q", query).append_pair("format", "json");
                    if let Some(lang) = &cfg.language {
                        q.append_pair("language", lang);
                    }
                    q.append_pair("pageno", "1");
                }
                let req = self.http.get(url).header(reqwest::header::ACCEPT, "application/json");
                // A SearxNG behind an authenticating proxy may want a bearer token.
                match &self.key {
                    Some(_) => req.header(reqwest::header::AUTHORIZATION, self.secret_header(&format!("Bearer {key}"))),
                    None => req,
                }
            }
        }
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
        let c = &self.inner.counters;
        let usage = Usage {
            calls: c.calls.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            throttled: c.throttled.load(Ordering::Relaxed),
            cache_hits: 0,
            cache_misses: 0,
        };
        vec![(self.inner.cfg.provider.name().to_string(), usage)]
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::testkit::{Canned, Recorded, ScriptedServer};

    const KEY: &str = "sk-test-S3CRET-key-9f8e7d";

    fn config(provider: Provider, endpoint: String) -> WebConfig {
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

    async fn serve(reply: Canned) -> ScriptedServer {
        ScriptedServer::start(move |_: &Recorded| reply.clone()).await.unwrap()
    }

    fn only_request(server: &ScriptedServer) -> Recorded {
        let requests = server.requests();
        assert_eq!(requests.len(), 1, "{requests:?}");
        requests.into_iter().next().unwrap()
    }

    fn path(r: &Recorded) -> &str {
        r.target.split('?').next().unwrap()
    }

    #[tokio::test]
    async fn serper_request_and_normalisation() {
        let body = json!({
            "searchParameters": {"q": "rust language", "gl": "us", "hl": "en", "num": 10, "type": "search", "engine": "google"},
            "knowledgeGraph": {"title": "Rust", "type": "Programming language", "description": "A language."},
            "answerBox": {"title": "Rust", "answer": "2015", "link": "https://example.org/answer"},
            "organic": [
                {"title": "Rust <b>Programming</b> Language", "link": "https://www.rust-lang.org/", "snippet": "A language empowering <b>everyone</b>.", "position": 1,
                 "sitelinks": [{"title": "Install", "link": "https://www.rust-lang.org/tools/install"}]},
                {"title": "No link here", "snippet": "skipped", "position": 2},
                {"title": "Rust (programming language) - Wikipedia", "link": "https://en.wikipedia.org/wiki/Rust_(programming_language)", "snippet": "Rust is a general-purpose &amp; multi-paradigm language.", "date": "Jan 3, 2025", "position": 3},
                {"title": "Bare", "link": "https://bare.example/", "position": 4}
            ],
            "peopleAlsoAsk": [{"question": "Is Rust hard?", "snippet": "…", "title": "Q", "link": "https://q.example/"}],
            "relatedSearches": [{"query": "rust vs go"}],
            "credits": 1
        });
        let server = serve(Canned::json(&body)).await;
        let web = WebSearch::new(config(Provider::Serper, format!("{}/search", server.url()))).unwrap();
        let results = web.search_one("rust language").await.unwrap();

        let r = only_request(&server);
        assert_eq!(r.method, "POST");
        assert_eq!(path(&r), "/search");
        assert_eq!(r.header("x-api-key"), Some(KEY));
        assert_eq!(r.json(), json!({"q": "rust language", "num": 10, "gl": "us", "hl": "en"}));

        assert_eq!(results.len(), 3);
        assert_eq!(results.iter().map(|r| r.rank).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(results[0].title, "Rust Programming Language");
        assert_eq!(results[0].url, "https://www.rust-lang.org/");
        assert_eq!(results[0].snippet, "A language empowering everyone.");
        assert_eq!(results[0].published, None);
        assert_eq!(results[1].snippet, "Rust is a general-purpose & multi-paradigm language.");
        assert_eq!(results[1].published.as_deref(), Some("Jan 3, 2025"));
        assert_eq!(results[2].snippet, "");
        let usage = web.usage();
        assert_eq!(usage[0].0, "serper");
        assert_eq!(usage[0].1, Usage { calls: 1, ..Usage::default() });
    }

    #[tokio::test]
    async fn serpapi_request_and_normalisation() {
        let body = json!({
            "search_metadata": {"id": "abc", "status": "Success", "json_endpoint": "https://serpapi.com/searches/abc.json",
                                "created_at": "2025-01-01 00:00:00 UTC", "processed_at": "2025-01-01 00:00:00 UTC", "total_time_taken": 1.2},
            "search_parameters": {"engine": "google", "q": "who wrote hamlet", "google_domain": "google.com", "hl": "en", "gl": "us", "device": "desktop"},
            "search_information": {"total_results": 123, "time_taken_displayed": 0.3, "query_displayed": "who wrote hamlet"},
            "answer_box": {"type": "organic_result", "answer": "William Shakespeare"},
            "organic_results": [
                {"position": 1, "title": "Hamlet - Wikipedia", "link": "https://en.wikipedia.org/wiki/Hamlet", "displayed_link": "en.wikipedia.org › wiki › Hamlet",
                 "snippet": "The Tragedy of Hamlet is a tragedy written by <em>William Shakespeare</em>.", "source": "Wikipedia"},
                {"position": 2, "title": "Hamlet | Folger", "link": "https://www.folger.edu/hamlet", "snippet": "Read Hamlet.", "date": "Mar 2, 2024"},
                {"position": 3, "title": "Ad without link", "snippet": "none"}
            ],
            "related_questions": [{"question": "Who wrote Hamlet?", "snippet": "Shakespeare", "title": "t", "link": "https://x.example/"}],
            "related_searches": [{"query": "hamlet summary"}],
            "pagination": {"current": 1}, "serpapi_pagination": {"current": 1}
        });
        let server = serve(Canned::json(&body)).await;
        let mut cfg = config(Provider::Serpapi, format!("{}/search.json", server.url()));
        cfg.results = 7;
        cfg.country = Some("gb".into());
        let web = WebSearch::new(cfg).unwrap();
        let results = web.search_one("who wrote hamlet").await.unwrap();

        let r = only_request(&server);
        assert_eq!(r.method, "GET");
        assert_eq!(path(&r), "/search.json");
        assert_eq!(r.query_param("engine").as_deref(), Some("google"));
        assert_eq!(r.query_param("q").as_deref(), Some("who wrote hamlet"));
        assert_eq!(r.query_param("api_key").as_deref(), Some(KEY));
        assert_eq!(r.query_param("num").as_deref(), Some("7"));
        assert_eq!(r.query_param("hl").as_deref(), Some("en"));
        assert_eq!(r.query_param("gl").as_deref(), Some("gb"));

        assert_eq!(results.len(), 2);
        assert_eq!(results[0].rank, 1);
        assert_eq!(results[0].title, "Hamlet - Wikipedia");
        assert_eq!(results[0].snippet, "The Tragedy of Hamlet is a tragedy written by William Shakespeare.");
        assert_eq!(results[1].rank, 2);
        assert_eq!(results[1].url, "https://www.folger.edu/hamlet");
        assert_eq!(results[1].published.as_deref(), Some("Mar 2, 2024"));
    }

    #[tokio::test]
    async fn serpapi_error_bodies() {
        let none = json!({"search_metadata": {"status": "Success"}, "search_parameters": {"q": "zzqx"},
                          "error": "Google hasn't returned any results for this query."});
        assert_eq!(parse_response(Provider::Serpapi, &none).unwrap(), Vec::new());
        let other = json!({"error": "Your account has run out of searches."});
        match parse_response(Provider::Serpapi, &other) {
            Err(SearchError::BadReply(m)) => assert!(m.contains("run out of searches"), "{m}"),
            r => panic!("{r:?}"),
        }
        // The live path gives the same outcome.
        let server = serve(Canned::json(&none)).await;
        let web = WebSearch::new(config(Provider::Serpapi, format!("{}/search.json", server.url()))).unwrap();
        assert_eq!(web.search_one("zzqx").await.unwrap(), Vec::new());
    }

    #[tokio::test]
    async fn brave_request_and_normalisation() {
        let body = json!({
            "type": "search",
            "query": {"original": "tokio runtime", "show_strict_warning": false, "is_navigational": false, "spellcheck_off": true},
            "mixed": {"type": "mixed", "main": [{"type": "web", "index": 0, "all": false}]},
            "web": {"type": "search", "family_friendly": true, "results": [
                {"title": "<strong>Tokio</strong> - An asynchronous Rust runtime", "url": "https://tokio.rs/",
                 "description": "<strong>Tokio</strong> is an event-driven, non-blocking I/O platform. It&#x27;s fast.",
                 "page_age": "2024-11-02T10:00:00", "age": "November 2, 2024", "language": "en", "family_friendly": true,
                 "extra_snippets": ["more"], "meta_url": {"scheme": "https", "netloc": "tokio.rs", "hostname": "tokio.rs", "favicon": "https://imgs.search.brave.com/x", "path": ""}},
                {"title": "No url", "description": "skipped"},
                {"title": "tokio - Rust", "url": "https://docs.rs/tokio", "description": "A runtime for writing <strong>reliable</strong>\n network applications", "age": "3 days ago"}
            ]},
            "videos": {"type": "videos", "results": []}
        });
        let server = serve(Canned::json(&body)).await;
        let mut cfg = config(Provider::Brave, format!("{}/res/v1/web/search", server.url()));
        cfg.results = 50;
        let web = WebSearch::new(cfg).unwrap();
        let results = web.search_one("tokio runtime").await.unwrap();

        let r = only_request(&server);
        assert_eq!(r.method, "GET");
        assert_eq!(path(&r), "/res/v1/web/search");
        assert_eq!(r.query_param("q").as_deref(), Some("tokio runtime"));
        assert_eq!(r.query_param("count").as_deref(), Some("20"));
        assert_eq!(r.query_param("country").as_deref(), Some("us"));
        assert_eq!(r.query_param("search_lang").as_deref(), Some("en"));
        assert_eq!(r.header("x-subscription-token"), Some(KEY));
        assert_eq!(r.header("accept"), Some("application/json"));
        assert!(!r.target.contains(KEY));

        assert_eq!(results.len(), 2);
        assert_eq!(results[0].rank, 1);
        assert_eq!(results[0].title, "Tokio - An asynchronous Rust runtime");
        assert_eq!(results[0].snippet, "Tokio is an event-driven, non-blocking I/O platform. It's fast.");
        assert_eq!(results[0].published.as_deref(), Some("2024-11-02T10:00:00"));
        assert_eq!(results[1].rank, 2);
        assert_eq!(results[1].url, "https://docs.rs/tokio");
        assert_eq!(results[1].snippet, "A runtime for writing reliable network applications");
        assert_eq!(results[1].published.as_deref(), Some("3 days ago"));

        // No `web` section: no results.
        assert_eq!(parse_response(Provider::Brave, &json!({"type": "search", "query": {}})).unwrap(), Vec::new());
    }

    #[tokio::test]
    async fn tavily_request_and_normalisation() {
        let body = json!({
            "query": "capital of australia",
            "follow_up_questions": null,
            "answer": null,
            "images": [],
            "results": [
                {"title": "Canberra - Wikipedia", "url": "https://en.wikipedia.org/wiki/Canberra", "content": "Canberra is the capital city of Australia.",
                 "score": 0.98, "raw_content": null},
                {"title": "Missing url", "content": "skipped", "score": 0.5},
                {"title": "Canberra news", "url": "https://news.example/canberra", "content": "  News  about <b>Canberra</b> ", "score": 0.7,
                 "published_date": "Mon, 06 Jan 2025 10:00:00 GMT"}
            ],
            "response_time": 1.23,
            "request_id": "123e4567"
        });
        let server = serve(Canned::json(&body)).await;
        let mut cfg = config(Provider::Tavily, format!("{}/search", server.url()));
        cfg.results = 5;
        let web = WebSearch::new(cfg).unwrap();
        let results = web.search_one("capital of australia").await.unwrap();

        let r = only_request(&server);
        assert_eq!(r.method, "POST");
        assert_eq!(path(&r), "/search");
        assert_eq!(r.header("authorization"), Some(format!("Bearer {KEY}").as_str()));
        assert_eq!(r.json(), json!({"query": "capital of australia", "max_results": 5, "search_depth": "basic"}));

        assert_eq!(results.len(), 2);
        assert_eq!(results[0].title, "Canberra - Wikipedia");
        assert_eq!(results[0].snippet, "Canberra is the capital city of Australia.");
        assert_eq!(results[0].published, None);
        assert_eq!(results[1].rank, 2);
        assert_eq!(results[1].snippet, "News about Canberra");
        assert_eq!(results[1].published.as_deref(), Some("Mon, 06 Jan 2025 10:00:00 GMT"));
    }

    #[tokio::test]
    async fn searxng_request_and_normalisation() {
        let body = json!({
            "query": "ocaml",
            "results": [
                {"url": "https://ocaml.org/", "title": "OCaml", "content": "An industrial-strength <span class=\"highlight\">functional</span> language",
                 "engine": "brave", "engines": ["brave", "duckduckgo"], "positions": [1, 3], "score": 2.5, "category": "general",
                 "template": "default.html", "parsed_url": ["https", "ocaml.org", "/", "", "", ""], "thumbnail": "", "img_src": "",
                 "publishedDate": null, "priority": ""},
                {"url": "", "title": "Empty url", "content": "skipped"},
                {"url": "https://en.wikipedia.org/wiki/OCaml", "title": "OCaml - Wikipedia", "engine": "wikipedia", "engines": ["wikipedia"],
                 "positions": [2], "score": 1.0, "category": "general", "publishedDate": "2024-05-01T00:00:00"},
                {"url": "https://third.example/", "title": "Third", "content": "over the cap"}
            ],
            "answers": [], "corrections": [], "infoboxes": [], "suggestions": ["ocaml tutorial"],
            "unresponsive_engines": [["google", "timeout"]]
        });
        let server = serve(Canned::json(&body)).await;
        let mut cfg = config(Provider::Searxng, format!("{}/search", server.url()));
        cfg.api_key = None;
        cfg.results = 2;
        let web = WebSearch::new(cfg).unwrap();
        let results = web.search_one("ocaml").await.unwrap();

        let r = only_request(&server);
        assert_eq!(r.method, "GET");
        assert_eq!(path(&r), "/search");
        assert_eq!(r.query_param("q").as_deref(), Some("ocaml"));
        assert_eq!(r.query_param("format").as_deref(), Some("json"));
        assert_eq!(r.query_param("language").as_deref(), Some("en"));
        assert_eq!(r.query_param("pageno").as_deref(), Some("1"));

        assert_eq!(results.len(), 2, "capped at `results`");
        assert_eq!(results[0].snippet, "An industrial-strength functional language");
        assert_eq!(results[0].published, None);
        assert_eq!(results[1].rank, 2);
        assert_eq!(results[1].title, "OCaml - Wikipedia");
        assert_eq!(results[1].snippet, "");
        assert_eq!(results[1].published.as_deref(), Some("2024-05-01T00:00:00"));

        // Through the trait: hits in the Search-R1 shape, rendered as pages.
        let hits = web.search_each(vec!["ocaml".into()], 3).await;
        let hits = hits.into_iter().next().unwrap().unwrap();
        assert_eq!(hits[0].id, "https://ocaml.org/");
        assert_eq!(hits[0].url.as_deref(), Some("https://ocaml.org/"));
        assert_eq!(hits[0].contents, "\"OCaml\"\nAn industrial-strength functional language");
        assert_eq!(hits[0].title_and_text(), ("OCaml", "An industrial-strength functional language"));
        assert_eq!(web.render(), RenderFormat::Pages);
        assert_eq!(web.name(), "searxng");
    }

    #[test]
    fn wrong_shapes_are_bad_replies() {
        for (provider, body) in [
            (Provider::Serper, json!(["not", "an", "object"])),
            (Provider::Serper, json!({"organic": "nope"})),
            (Provider::Brave, json!({"web": {"results": {}}})),
            (Provider::Tavily, json!({"query": "x"})),
            (Provider::Searxng, json!({"query": "x", "results": 3})),
        ] {
            assert!(matches!(parse_response(provider, &body), Err(SearchError::BadReply(_))), "{provider:?} {body}");
        }
    }

    #[test]
    fn text_cleaning() {
        assert_eq!(
            clean_text("  <strong>Rust</strong> &amp; <em class=\"x\">C</em>: a < b, c > d &bogus; "),
            "Rust & C: a < b, c > d &bogus;"
        );
        assert_eq!(clean_text("It&#39;s &#x27;quoted&#x27;\n\tand &lt;b&gt; stays"), "It's 'quoted' and <b> stays");
        assert_eq!(clean_text("x <br/> y</p>"), "x y");
    }

    #[test]
    fn provider_names_and_config_defaults() {
        for p in [Provider::Serper, Provider::Serpapi, Provider::Brave, Provider::Tavily, Provider::Searxng] {
            assert_eq!(serde_json::to_value(p).unwrap(), json!(p.name()));
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
    }

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
