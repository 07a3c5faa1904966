//! A remote Search-R1 `/retrieve` server (the E5 / BM25 retrievers of Search-R1, FlashRAG, or
//! another Grove env-server), called under Grove's outbound HTTP policy (`grove-http`: one
//! deadline, retries honouring `Retry-After`, a capped reply read).

use std::sync::Arc;
use std::time::Duration;

use grove_http::{HttpError, Overflow, Policy};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Hit, SearchBackend, SearchError, SearchFuture};

/// The remote Search-R1 backend's HTTP behaviour.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RemoteConfig {
    /// Deadline for one `/retrieve` call, retries included.
    pub deadline_ms: u64,
    /// Attempts after the first on connection errors, 429 and 5xx replies.
    pub retries: u32,
    pub backoff_ms: u64,
    /// A reply longer than this is refused (`bad_reply`) without being buffered whole: a
    /// `/retrieve` reply for a tick's queries is a few megabytes at most.
    pub max_reply_bytes: usize,
    /// Put the persistent cache (`[cache]`) in front of the retriever too.
    pub cache: bool,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        Self { deadline_ms: 10_000, retries: 2, backoff_ms: 100, max_reply_bytes: 32 << 20, cache: false }
    }
}

#[derive(Debug, Clone)]
pub struct RemoteRetriever {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    url: String,
    http: reqwest::Client,
    config: RemoteConfig,
}

impl RemoteRetriever {
    /// `url` is the full endpoint, e.g. `http://127.0.0.1:8000/retrieve`.
    pub fn new(url: impl Into<String>, config: RemoteConfig) -> Result<Self, SearchError> {
        if config.max_reply_bytes == 0 {
            return Err(SearchError::Config("remote max_reply_bytes must be positive".into()));
        }
        grove_http::install_tls_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(config.deadline_ms.min(5_000)))
            .build()
            .map_err(|e| SearchError::Internal(e.to_string()))?;
        Ok(Self { inner: Arc::new(Inner { url: url.into(), http, config }) })
    }

    /// The HTTP policy of one `/retrieve` call.
    fn policy(config: &RemoteConfig) -> Policy {
        Policy {
            deadline: Duration::from_millis(config.deadline_ms),
            attempt_timeout: None,
            retries: config.retries,
            backoff: Duration::from_millis(config.backoff_ms),
            max_retry_after: Duration::from_millis(config.deadline_ms),
            max_body: config.max_reply_bytes,
            overflow: Overflow::Fail,
        }
    }

    async fn call(inner: &Inner, queries: &[String], topk: usize) -> Result<Vec<Vec<Hit>>, SearchError> {
        let body = serde_json::json!({ "queries": queries, "topk": topk, "return_scores": true });
        let policy = Self::policy(&inner.config);
        let reply = grove_http::send(&policy, &[], |_| {
            let request = inner.http.post(&inner.url).json(&body);
            async move { Ok((request, ())) }
        })
        .await
        .and_then(grove_http::Reply::error_for_status)
        .map_err(|e| search_error(e, inner.config.deadline_ms))?;
        let reply: Value =
            serde_json::from_slice(&reply.body).map_err(|e| SearchError::BadReply(format!("not JSON ({e})")))?;
        parse_reply(&reply, queries.len())
    }
}

/// The policy's error as the search backends report it.
pub(crate) fn search_error(e: HttpError, deadline_ms: u64) -> SearchError {
    match e {
        HttpError::Unreachable(m) => SearchError::Unreachable(m),
        HttpError::Timeout(_) => SearchError::Timeout(deadline_ms),
        HttpError::Status { status, body } => SearchError::Status { status, body },
        HttpError::TooLarge { limit } => SearchError::BadReply(format!("reply larger than {limit} bytes")),
        HttpError::Request(m) => SearchError::Internal(m),
    }
}

/// `{"result": [per query]}`, each per-query list holding `{"document": {...}, "score": s}` or
/// bare documents `{"id", "contents"}` (or `{"title", "text"}`).
pub(crate) fn parse_reply(reply: &Value, expected: usize) -> Result<Vec<Vec<Hit>>, SearchError> {
    let bad = |m: &str| SearchError::BadReply(m.to_string());
    let result = reply.get("result").and_then(Value::as_array).ok_or_else(|| bad("no `result` list"))?;
    if result.len() != expected {
        return Err(SearchError::BadReply(format!("{} result lists for {expected} queries", result.len())));
    }
    result
        .iter()
        .map(|per_query| {
            let items = per_query.as_array().ok_or_else(|| bad("a per-query result is not a list"))?;
            items
                .iter()
                .map(|item| {
                    let (doc, score) = match item.get("document") {
                        Some(doc) => (doc, item.get("score").and_then(Value::as_f64).unwrap_or(0.0)),
                        None => (item, 0.0),
                    };
                    let contents = match (doc.get("contents"), doc.get("title"), doc.get("text")) {
                        (Some(Value::String(c)), _, _) => c.clone(),
                        (_, Some(Value::String(t)), Some(Value::String(x))) => format!("\"{t}\"\n{x}"),
                        _ => return Err(bad("a document has neither `contents` nor `title` + `text`")),
                    };
                    let id = match doc.get("id") {
                        Some(Value::String(s)) => s.clone(),
                        Some(Value::Number(n)) => n.to_string(),
                        _ => String::new(),
                    };
                    Ok(Hit::doc(id, contents, score as f32))
                })
                .collect()
        })
        .collect()
}

impl SearchBackend for RemoteRetriever {
    fn name(&self) -> &str {
        "remote"
    }

    fn search(&self, queries: Vec<String>, topk: usize) -> SearchFuture {
        let inner = self.inner.clone();
        Box::pin(async move { Self::call(&inner, &queries, topk).await })
    }
}
