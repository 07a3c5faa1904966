//! Search backends behind one trait. They are called outside the ECS systems: the sim loop hands
//! a batch of queries to a backend and gets the results back as a message. CPU-bound backends
//! (BM25) run on tokio's blocking pool; HTTP backends on the runtime.

mod local;
mod remote;

use std::future::Future;
use std::pin::Pin;

pub use local::{BuildProgress, IndexError, LocalIndex};
pub use remote::RemoteRetriever;

/// One retrieved document, in the Search-R1 shape: `contents` is `"Title"\ntext`.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    pub id: String,
    pub contents: String,
    pub score: f32,
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
}

pub type SearchFuture = Pin<Box<dyn Future<Output = Result<Vec<Vec<Hit>>, SearchError>> + Send>>;

/// A search engine: a batch of queries in, one ranked list per query out, in order.
pub trait SearchBackend: Send + Sync + std::fmt::Debug + 'static {
    fn name(&self) -> &str;
    fn search(&self, queries: Vec<String>, topk: usize) -> SearchFuture;
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
