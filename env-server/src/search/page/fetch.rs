//! The HTTP side of the open-page tool: the client (its redirect policy and resolver come from
//! [`super::ssrf`]; no proxy), one GET with its redirects, the refusal of a redirect reqwest would
//! not follow, status and content-type checks, and the body read through grove-http's capped read
//! (at most `max_bytes`, the rest not read and the page marked truncated).

use std::error::Error as StdError;
use std::time::Duration;

use url::Url;

use super::PageConfig;
use super::ssrf::{GuardedResolver, Refusal, redirect_policy, redirect_verdict};
use crate::search::SearchError;

/// Characters of an error page kept in [`SearchError::Status`].
const STATUS_BODY_CHARS: usize = 300;
/// Bytes of an error page read at most.
const STATUS_BODY_BYTES: usize = 4096;

/// The client of one page fetcher: the SSRF guard's redirect policy and resolver, no proxy, the
/// whole fetch under `timeout_ms`.
pub(super) fn client(cfg: &PageConfig) -> Result<reqwest::Client, SearchError> {
    grove_http::install_tls_provider();
    let policy = redirect_policy(cfg.clone());
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::ACCEPT,
        reqwest::header::HeaderValue::from_static("text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.5"),
    );
    reqwest::Client::builder()
        .user_agent(cfg.user_agent.as_str())
        .default_headers(headers)
        .redirect(policy)
        .dns_resolver(GuardedResolver { allow_private: cfg.allow_private })
        // A proxy would connect on our behalf to addresses the resolver never saw.
        .no_proxy()
        .connect_timeout(Duration::from_millis(cfg.timeout_ms))
        .timeout(Duration::from_millis(cfg.timeout_ms))
        .build()
        .map_err(|e| SearchError::Config(format!("page fetcher: {}", error_chain(&e))))
}

/// The request, its redirects and the body (at most `max_bytes` of it).
pub(super) async fn download(http: &reqwest::Client, cfg: &PageConfig, target: Url) -> Result<Fetched, SearchError> {
    let mut resp = http.get(target).send().await.map_err(|e| map_reqwest(&e, cfg.timeout_ms))?;
    let url = resp.url().to_string();
    let status = resp.status();
    if status.is_redirection()
        && let Some(location) = resp.headers().get(reqwest::header::LOCATION)
    {
        // A redirect reqwest would not follow (e.g. to `file:`), so the policy never saw it.
        let location = String::from_utf8_lossy(location.as_bytes()).into_owned();
        let why = match resp.url().join(&location) {
            Err(e) => format!("redirect to `{location}`: not a valid URL ({e})"),
            Ok(next) => match redirect_verdict(&next, 1, cfg) {
                Err(why) => why,
                Ok(()) => format!("redirect to {next} not followed"),
            },
        };
        return Err(SearchError::UrlRejected(why));
    }
    if !status.is_success() {
        // Best effort: the error page's start, for the log and the error message.
        let (bytes, _) = read_capped(&mut resp, STATUS_BODY_BYTES, cfg.timeout_ms).await.unwrap_or_default();
        let body = String::from_utf8_lossy(&bytes).chars().take(STATUS_BODY_CHARS).collect();
        return Err(SearchError::Status { status: status.as_u16(), body });
    }
    let header = |name| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(|s| s.trim().to_ascii_lowercase());
    if let Some(encoding) = header(reqwest::header::CONTENT_ENCODING)
        && !encoding.is_empty()
        && encoding != "identity"
    {
        return Err(SearchError::Unusable(format!("content encoding {encoding}")));
    }
    let kind = match header(reqwest::header::CONTENT_TYPE) {
        None => Kind::Sniff,
        Some(ct) => {
            let essence = ct.split(';').next().unwrap_or_default().trim().to_string();
            match essence.as_str() {
                "" => Kind::Sniff,
                "text/html" | "application/xhtml+xml" => Kind::Html,
                e if e.starts_with("text/") => Kind::Plain,
                _ => return Err(SearchError::Unusable(format!("content type {essence}"))),
            }
        }
    };
    let (body, truncated) = read_capped(&mut resp, cfg.max_bytes, cfg.timeout_ms).await?;
    Ok(Fetched { url, kind, body, truncated })
}

/// What the network gave, before text extraction.
pub(super) struct Fetched {
    pub(super) url: String,
    pub(super) kind: Kind,
    pub(super) body: Vec<u8>,
    pub(super) truncated: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Html,
    Plain,
    /// No content type: decide from the body.
    Sniff,
}

/// At most `cap` bytes of the body, through the shared capped read; true when more was there.
async fn read_capped(
    resp: &mut reqwest::Response,
    cap: usize,
    timeout_ms: u64,
) -> Result<(Vec<u8>, bool), SearchError> {
    grove_http::read_body(resp, cap, grove_http::Overflow::Truncate).await.map_err(|e| match e {
        grove_http::BodyError::Transport(e) => map_reqwest(&e, timeout_ms),
        grove_http::BodyError::TooLarge { limit } => SearchError::BadReply(format!("page larger than {limit} bytes")),
    })
}

/// The error and its causes, joined by `: `.
fn error_chain(e: &dyn StdError) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let s = cause.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        source = cause.source();
    }
    out
}

fn map_reqwest(e: &reqwest::Error, timeout_ms: u64) -> SearchError {
    let mut source: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(cause) = source {
        if let Some(Refusal(why)) = cause.downcast_ref::<Refusal>() {
            return SearchError::UrlRejected(why.clone());
        }
        source = cause.source();
    }
    if e.is_timeout() {
        return SearchError::Timeout(timeout_ms);
    }
    if e.is_redirect() || e.is_builder() {
        // e.g. a `Location` that is not a URL, or that names a scheme reqwest cannot follow.
        return SearchError::UrlRejected(error_chain(e));
    }
    SearchError::Unreachable(error_chain(e))
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::render_page;
    use super::super::test_support::*;
    use super::*;
    use crate::testkit::{Canned, ScriptedServer};

    #[tokio::test]
    async fn redirect_is_followed_and_final_url_reported() {
        let server = ScriptedServer::start(|r| match r.target.as_str() {
            "/old" => Canned::status(302, "").header("location", "/new"),
            _ => Canned::html("<html><head><title>New home</title></head><body><p>Moved here.</p></body></html>"),
        })
        .await
        .unwrap();
        let page = fetcher(cfg(true)).fetch(&format!("{}/old", server.url())).await.unwrap();
        assert_eq!(page.url, format!("{}/new", server.url()));
        assert_eq!(page.title, "New home");
        assert_eq!(server.count(), 2);
    }

    #[tokio::test]
    async fn redirect_loop_fails_without_hanging() {
        let server = ScriptedServer::start(|_| Canned::status(302, "").header("location", "/again")).await.unwrap();
        let f = fetcher(PageConfig { max_redirects: 3, ..cfg(true) });
        let start = Instant::now();
        let err = f.fetch(&format!("{}/again", server.url())).await.unwrap_err();
        assert!(matches!(&err, SearchError::UrlRejected(why) if why.contains("redirects")), "{err:?}");
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(server.count(), 4, "the first request and three redirects");
        assert_eq!(f.usage().errors, 1);
    }

    #[tokio::test]
    async fn not_found_is_a_status_error() {
        let server = ScriptedServer::start(|_| Canned::status(404, "x".repeat(1000))).await.unwrap();
        let err = fetcher(cfg(true)).fetch(&format!("{}/missing", server.url())).await.unwrap_err();
        match err {
            SearchError::Status { status, body } => {
                assert_eq!(status, 404);
                assert_eq!(body.chars().count(), 300);
            }
            other => panic!("expected a status error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn body_is_capped_at_max_bytes() {
        let paragraph = "<p>Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.</p>\n";
        let mut body = String::from("<html><head><title>Big</title></head><body><article>");
        while body.len() < 5_000_000 {
            body.push_str(paragraph);
        }
        let server = ScriptedServer::start(move |_| Canned::html(body.clone())).await.unwrap();
        let f = fetcher(PageConfig { max_bytes: 64 * 1024, ..cfg(true) });
        let page = f.fetch(&format!("{}/big", server.url())).await.unwrap();
        assert!(page.truncated);
        assert!(page.text.len() <= 64 * 1024, "{} bytes of text", page.text.len());
        assert!(page.text.contains("Lorem ipsum"));
        let rendered = render_page(&page, 5000);
        assert!(rendered.ends_with(" …[truncated]"));
    }

    #[tokio::test]
    async fn pdf_is_unusable() {
        let server = ScriptedServer::start(|_| {
            Canned::status(200, b"%PDF-1.7 binary".to_vec()).header("content-type", "application/pdf")
        })
        .await
        .unwrap();
        let err = fetcher(cfg(true)).fetch(&format!("{}/paper.pdf", server.url())).await.unwrap_err();
        assert!(matches!(&err, SearchError::Unusable(why) if why.contains("application/pdf")), "{err:?}");
    }

    #[tokio::test]
    async fn slow_server_times_out() {
        let server =
            ScriptedServer::start(|_| Canned::html("<p>late</p>").delayed(Duration::from_secs(2))).await.unwrap();
        let f = fetcher(PageConfig { timeout_ms: 300, ..cfg(true) });
        let start = Instant::now();
        let err = f.fetch(&server.url()).await.unwrap_err();
        assert_eq!(err, SearchError::Timeout(300));
        assert!(start.elapsed() < Duration::from_millis(1500), "{:?}", start.elapsed());
    }
}
