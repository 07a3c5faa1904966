//! The open-page tool: an agent writes `<open> url </open>`, the server fetches the page and the
//! model reads its title and main text. This module holds the tool's settings ([`PageConfig`]),
//! its entry point ([`PageFetcher::fetch`]: guard, fetch, extract, count) and what the model
//! reads ([`render_page`]). The parts: `ssrf.rs` (which URLs and addresses are refused), `fetch.rs`
//! (the HTTP request, redirects and the capped body read), `extract.rs` (bytes to readable text).
//!
//! Fetching URLs chosen by a model is a server-side request forgery risk, so every hop is
//! guarded: the request URL and every redirect target must pass [`check_url`] (http/https, a
//! host, no credentials, no private IP literal), and host names are resolved by a resolver that
//! drops non-public addresses, so the connection only ever goes to an address that was checked
//! (no DNS-rebinding gap between the check and the connect). Loopback tests turn the guard off
//! with [`PageConfig::allow_private`].

mod extract;
mod fetch;
mod ssrf;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use url::Url;

use super::{SearchError, Usage};

pub use extract::extract_text;
pub use ssrf::{check_url, is_public_ip};

/// Settings of the open-page tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PageConfig {
    /// Whether the tool is offered (the web environment turns it on).
    pub enabled: bool,
    /// The whole fetch, redirects and body included.
    pub timeout_ms: u64,
    /// Body bytes read at most; the rest is not read and the page is marked truncated.
    pub max_bytes: usize,
    pub max_redirects: usize,
    /// Characters of page text the model sees (see [`render_page`]).
    pub max_chars: usize,
    /// Allow loopback, private and link-local addresses (tests only).
    pub allow_private: bool,
    pub user_agent: String,
}

impl Default for PageConfig {
    fn default() -> Self {
        PageConfig {
            enabled: false,
            timeout_ms: 10_000,
            max_bytes: 2 * 1024 * 1024,
            max_redirects: 5,
            max_chars: 5_000,
            allow_private: false,
            user_agent: concat!("grove-env-server/", env!("CARGO_PKG_VERSION"), " (+open-page tool)").to_string(),
        }
    }
}

/// A fetched page, as text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Page {
    /// The final URL, after redirects.
    pub url: String,
    pub title: String,
    pub text: String,
    /// The body hit `max_bytes` and the rest was not read.
    pub truncated: bool,
}

/// Fetches pages for the open-page tool; cheap to clone (shared inside).
#[derive(Debug, Clone)]
pub struct PageFetcher {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    http: reqwest::Client,
    config: PageConfig,
    calls: AtomicU64,
    errors: AtomicU64,
}

impl PageFetcher {
    pub fn new(cfg: PageConfig) -> Result<PageFetcher, SearchError> {
        if cfg.timeout_ms == 0 {
            return Err(SearchError::Config("page timeout_ms must be positive".into()));
        }
        if cfg.max_bytes == 0 {
            return Err(SearchError::Config("page max_bytes must be positive".into()));
        }
        let http = fetch::client(&cfg)?;
        Ok(PageFetcher {
            inner: Arc::new(Inner { http, config: cfg, calls: AtomicU64::new(0), errors: AtomicU64::new(0) }),
        })
    }

    /// Fetch `url` and extract its text. Refused URLs fail with [`SearchError::UrlRejected`]
    /// before anything goes to the network.
    pub async fn fetch(&self, url: &str) -> Result<Page, SearchError> {
        let inner = &self.inner;
        let outcome = match check_url(url, inner.config.allow_private) {
            Err(e) => Err(e),
            Ok(target) => {
                inner.calls.fetch_add(1, Ordering::Relaxed);
                Self::fetch_checked(inner, target).await
            }
        };
        if let Err(e) = &outcome {
            inner.errors.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(url, error = %e, "page fetch failed");
        }
        outcome
    }

    /// `calls`: fetches that went to the network; `errors`: failed fetches, refused URLs included.
    pub fn usage(&self) -> Usage {
        Usage {
            calls: self.inner.calls.load(Ordering::Relaxed),
            errors: self.inner.errors.load(Ordering::Relaxed),
            ..Usage::default()
        }
    }

    pub fn config(&self) -> &PageConfig {
        &self.inner.config
    }

    async fn fetch_checked(inner: &Inner, target: Url) -> Result<Page, SearchError> {
        let ms = inner.config.timeout_ms;
        let fetched =
            tokio::time::timeout(Duration::from_millis(ms), fetch::download(&inner.http, &inner.config, target))
                .await
                .map_err(|_| SearchError::Timeout(ms))??;
        // Parsing a large page is CPU work: keep it off the runtime's threads.
        tokio::task::spawn_blocking(move || extract::page_of(fetched))
            .await
            .map_err(|e| SearchError::Internal(format!("page extraction: {e}")))?
    }
}

/// What the model reads: `Title: …`, `URL: …`, a blank line, and the text cut to `max_chars`
/// characters (with ` …[truncated]` when cut).
pub fn render_page(page: &Page, max_chars: usize) -> String {
    let text = match page.text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{} …[truncated]", page.text[..cut].trim_end()),
        None => page.text.clone(),
    };
    format!("Title: {}\nURL: {}\n\n{text}", page.title, page.url)
}

/// Helpers shared by the tests of this module and of its parts.
#[cfg(test)]
mod test_support {
    use super::*;

    pub(super) fn cfg(allow_private: bool) -> PageConfig {
        PageConfig { enabled: true, allow_private, ..PageConfig::default() }
    }

    pub(super) fn fetcher(cfg: PageConfig) -> PageFetcher {
        PageFetcher::new(cfg).expect("fetcher")
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;
    use crate::testkit::{Canned, ScriptedServer};

    const ARTICLE: &str = r#"<!doctype html>
<html><head>
  <title>Rivers of the North</title>
  <style>body { color: SECRETSTYLE; }</style>
  <script>var tracker = "SECRETSCRIPT";</script>
</head>
<body>
  <nav><a href="/">Home</a> | <a href="/about">About</a> | <a href="/contact">Contact</a></nav>
  <article>
    <h1>Rivers of the North</h1>
    <p>The northern rivers freeze every winter, and their ice breaks up in a rush each spring,
       carrying trees, boulders and whole banks of gravel towards the sea in a matter of days.</p>
    <p>Salmon return to these rivers in late summer. They swim against the current for hundreds of
       kilometres, leaping waterfalls, to spawn in the gravel beds where they themselves hatched.</p>
    <p>Scientists who study the rivers count the fish at weirs and tag some of them, which lets them
       follow individual salmon along the whole journey from the estuary to the headwaters.</p>
    <script>document.write("SECRETINLINE");</script>
  </article>
  <footer>Copyright 2024 River Society. All rights reserved.</footer>
</body></html>"#;

    #[tokio::test]
    async fn article_page_gives_title_and_main_text() {
        let server = ScriptedServer::start(|_| Canned::html(ARTICLE)).await.unwrap();
        let f = fetcher(cfg(true));
        let page = f.fetch(&format!("{}/rivers", server.url())).await.unwrap();
        assert_eq!(page.title, "Rivers of the North");
        assert!(page.text.contains("The northern rivers freeze every winter"), "{}", page.text);
        assert!(page.text.contains("Salmon return to these rivers"), "{}", page.text);
        for secret in ["SECRETSTYLE", "SECRETSCRIPT", "SECRETINLINE"] {
            assert!(!page.text.contains(secret), "{secret} leaked: {}", page.text);
        }
        assert!(!page.text.contains("  "), "whitespace not collapsed: {:?}", page.text);
        assert!(!page.truncated);
        assert_eq!(page.url, format!("{}/rivers", server.url()));
        assert_eq!(f.usage().calls, 1);
        assert_eq!(f.usage().errors, 0);
        let req = &server.requests()[0];
        assert!(req.header("user-agent").unwrap_or_default().starts_with("grove-env-server/"));
    }

    #[test]
    fn render_page_cuts_on_a_char_boundary() {
        let page =
            Page { url: "https://e.com/".into(), title: "T".into(), text: "héllo wörld".into(), truncated: false };
        assert_eq!(render_page(&page, 2), "Title: T\nURL: https://e.com/\n\nhé …[truncated]");
        assert_eq!(render_page(&page, 11), "Title: T\nURL: https://e.com/\n\nhéllo wörld");
        assert_eq!(render_page(&page, 0), "Title: T\nURL: https://e.com/\n\n …[truncated]");
        let emoji = Page { text: "🦀🦀🦀".into(), ..page };
        assert_eq!(render_page(&emoji, 1), "Title: T\nURL: https://e.com/\n\n🦀 …[truncated]");
    }

    #[test]
    fn config_defaults_and_validation() {
        let c = PageConfig::default();
        assert!(!c.enabled && !c.allow_private);
        assert_eq!((c.timeout_ms, c.max_bytes, c.max_redirects, c.max_chars), (10_000, 2 << 20, 5, 5_000));
        assert!(c.user_agent.starts_with("grove-env-server/") && c.user_agent.ends_with("(+open-page tool)"));
        let parsed: PageConfig = serde_json::from_str(r#"{"enabled": true, "max_chars": 100}"#).unwrap();
        assert_eq!(parsed, PageConfig { enabled: true, max_chars: 100, ..PageConfig::default() });
        assert!(serde_json::from_str::<PageConfig>(r#"{"bogus": 1}"#).is_err());
        assert!(matches!(PageFetcher::new(PageConfig { timeout_ms: 0, ..c }), Err(SearchError::Config(_))));
    }
}
