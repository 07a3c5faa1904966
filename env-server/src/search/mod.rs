//! Search backends behind one trait. They are called outside the ECS systems: the sim loop hands
//! a batch of queries to a backend and gets the results back as a message. CPU-bound backends
//! (BM25) run on tokio's blocking pool; HTTP backends on the runtime.

pub mod cached;
pub mod dense;
mod local;
pub mod page;
mod remote;
pub mod web;

use std::future::Future;
use std::pin::Pin;

pub use local::{BuildProgress, IndexError, LocalIndex};
pub use remote::{RemoteConfig, RemoteRetriever};

use grove_protocol::ErrorCode;

/// One retrieved document, in the Search-R1 shape: `contents` is `"Title"\ntext`. Web results
/// carry their URL (also their `id`) and publication date when the provider gives one; their
/// text is the provider's snippet.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Hit {
    pub id: String,
    pub contents: String,
    pub score: f32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<String>,
}

impl Hit {
    /// A document of a local corpus or a retriever.
    pub fn doc(id: impl Into<String>, contents: impl Into<String>, score: f32) -> Hit {
        Hit { id: id.into(), contents: contents.into(), score, url: None, published: None }
    }

    /// The title line without its quotes, and the text after it.
    pub fn title_and_text(&self) -> (&str, &str) {
        let (title, text) = self.contents.split_once('\n').unwrap_or((&self.contents, ""));
        let title = title.strip_prefix('"').and_then(|t| t.strip_suffix('"')).unwrap_or(title);
        (title, text)
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SearchError {
    #[error("search timed out after {0} ms")]
    Timeout(u64),
    #[error("search backend unreachable: {0}")]
    Unreachable(String),
    #[error("search backend answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("search backend sent an unreadable reply: {0}")]
    BadReply(String),
    #[error("index error: {0}")]
    Index(String),
    #[error("search task failed: {0}")]
    Internal(String),
    /// Replay mode: the call is not in the cache, and replay never goes to the network.
    #[error("not in the cache (replay mode): {0}")]
    ReplayMiss(String),
    /// The open-page tool refused a URL (scheme, private address, too many redirects).
    #[error("URL not allowed: {0}")]
    UrlRejected(String),
    /// A fetched page could not be used (content type, encoding).
    #[error("page unusable: {0}")]
    Unusable(String),
    /// The backend is misconfigured (e.g. no API key).
    #[error("backend misconfigured: {0}")]
    Config(String),
}

impl SearchError {
    /// The protocol's code for this failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            SearchError::Timeout(_) => ErrorCode::BackendTimeout,
            SearchError::ReplayMiss(_) => ErrorCode::ReplayMiss,
            SearchError::UrlRejected(_) => ErrorCode::UrlRejected,
            _ => ErrorCode::BackendError,
        }
    }

    /// A short reason for the model to read, e.g. `timeout` or `HTTP 503`.
    pub fn short(&self) -> String {
        match self {
            SearchError::Timeout(ms) => format!("timeout after {ms} ms"),
            SearchError::Unreachable(_) => "unreachable".into(),
            SearchError::Status { status, .. } => format!("HTTP {status}"),
            SearchError::BadReply(_) => "unreadable reply".into(),
            SearchError::Index(_) | SearchError::Internal(_) | SearchError::Config(_) => "internal error".into(),
            SearchError::ReplayMiss(_) => "not recorded".into(),
            SearchError::UrlRejected(why) => format!("URL not allowed ({why})"),
            SearchError::Unusable(why) => why.clone(),
        }
    }
}

pub type SearchFuture = Pin<Box<dyn Future<Output = Result<Vec<Vec<Hit>>, SearchError>> + Send>>;

/// One outcome per query: web providers fail (and time out) query by query.
pub type EachFuture = Pin<Box<dyn Future<Output = Vec<Result<Vec<Hit>, SearchError>>> + Send>>;

/// A search engine: a batch of queries in, one ranked list per query out, in order.
pub trait SearchBackend: Send + Sync + std::fmt::Debug + 'static {
    fn name(&self) -> &str;
    fn search(&self, queries: Vec<String>, topk: usize) -> SearchFuture;

    /// Like [`search`](Self::search), with one outcome per query. Backends that answer a batch as
    /// a whole (BM25, `/retrieve`) keep the default: a failed batch fails every query.
    fn search_each(&self, queries: Vec<String>, topk: usize) -> EachFuture {
        let n = queries.len();
        let batch = self.search(queries, topk);
        Box::pin(async move {
            match batch.await {
                Ok(lists) if lists.len() == n => lists.into_iter().map(Ok).collect(),
                Ok(lists) => {
                    let e = SearchError::BadReply(format!("{} result lists for {n} queries", lists.len()));
                    vec![Err(e); n]
                }
                Err(e) => vec![Err(e); n],
            }
        })
    }

    /// How observations of this backend are rendered by default.
    fn render(&self) -> RenderFormat {
        RenderFormat::Docs
    }

    /// Calls, errors and cache figures, for `Stats` and `/metrics`. Empty for local backends.
    fn usage(&self) -> Vec<(String, Usage)> {
        Vec::new()
    }
}

/// The open-page tool: fetch each URL and give back one hit whose `contents` is the page as the
/// model reads it.
pub trait PageTool: Send + Sync + std::fmt::Debug + 'static {
    fn open_each(&self, urls: Vec<String>) -> EachFuture;
    fn usage(&self) -> Vec<(String, Usage)> {
        Vec::new()
    }
}

/// How search results are written into the agent's context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum RenderFormat {
    /// Search-R1: `Doc i(Title: …) text`.
    Docs,
    /// The web format of the spec: `Page i: <snippet>`.
    Pages,
}

/// Cost accounting of one provider (or fetcher) as seen by this server.
pub use grove_protocol::ProviderUsage as Usage;

/// Render one query's results in `format`.
pub fn render(format: RenderFormat, hits: &[Hit]) -> String {
    match format {
        RenderFormat::Docs => render_docs(hits),
        RenderFormat::Pages => render_pages(hits),
    }
}

/// The web format of the spec (§1.4): `Page i: <snippet>` per result, at most 10, unique
/// non-empty snippets, each truncated to 1000 characters, joined by newlines; `No search results
/// found.` when nothing is left.
pub fn render_pages(hits: &[Hit]) -> String {
    let mut seen = std::collections::HashSet::new();
    let snippets: Vec<String> = hits
        .iter()
        .map(|h| h.title_and_text().1.trim())
        .filter(|s| !s.is_empty() && seen.insert(*s))
        .take(10)
        .map(|s| s.chars().take(1000).collect())
        .collect();
    if snippets.is_empty() {
        return "No search results found.".to_string();
    }
    snippets.iter().enumerate().map(|(i, s)| format!("Page {}: {s}", i + 1)).collect::<Vec<_>>().join("\n")
}

/// Search-R1's rendering of one query's results: `Doc i(Title: <first line>) <rest>` per hit,
/// each followed by a newline, where the title line is kept verbatim (with its quotes).
pub fn render_docs(hits: &[Hit]) -> String {
    let mut out = String::new();
    for (i, hit) in hits.iter().enumerate() {
        let (title, text) = hit.contents.split_once('\n').unwrap_or((&hit.contents, ""));
        out.push_str(&format!("Doc {}(Title: {title}) {text}\n", i + 1));
    }
    out
}
