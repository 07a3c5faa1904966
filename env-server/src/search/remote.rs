//! A remote Search-R1 `/retrieve` server (the E5 / BM25 retrievers of Search-R1, FlashRAG, or
//! another Grove env-server), over HTTP with a deadline and retries.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::{Hit, SearchBackend, SearchError, SearchFuture};
use crate::config::RemoteConfig;

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
        crate::install_tls_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(config.deadline_ms.min(5_000)))
            .build()
            .map_err(|e| SearchError::Internal(e.to_string()))?;
        Ok(Self { inner: Arc::new(Inner { url: url.into(), http, config }) })
    }

    async fn call(inner: &Inner, queries: &[String], topk: usize) -> Result<Vec<Vec<Hit>>, SearchError> {
        let body = serde_json::json!({ "queries": queries, "topk": topk, "return_scores": true });
        let mut attempt = 0;
        loop {
            let outcome = match inner.http.post(&inner.url).json(&body).send().await {
                Err(e) => Err((true, SearchError::Unreachable(e.to_string()))),
                Ok(resp) if resp.status().is_server_error() || resp.status().as_u16() == 429 => {
                    let status = resp.status().as_u16();
                    Err((true, SearchError::Status { status, body: resp.text().await.unwrap_or_default() }))
                }
                Ok(resp) if !resp.status().is_success() => {
                    let status = resp.status().as_u16();
                    Err((false, SearchError::Status { status, body: resp.text().await.unwrap_or_default() }))
                }
                Ok(resp) => match resp.json::<Value>().await {
                    Ok(reply) => parse_reply(&reply, queries.len()).map_err(|e| (false, e)),
                    Err(e) => Err((false, SearchError::BadReply(e.to_string()))),
                },
            };
            match outcome {
                Ok(hits) => return Ok(hits),
                Err((retryable, e)) if !retryable || attempt >= inner.config.retries => return Err(e),
                Err(_) => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(inner.config.backoff_ms << (attempt - 1).min(6))).await;
                }
            }
        }
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
        Box::pin(async move {
            let deadline = Duration::from_millis(inner.config.deadline_ms);
            tokio::time::timeout(deadline, Self::call(&inner, &queries, topk))
                .await
                .map_err(|_| SearchError::Timeout(inner.config.deadline_ms))?
        })
    }
}
