//! The open-page tool's fetcher: an agent writes `<open> url </open>`, the server fetches the page
//! and the model reads its title and main text.
//!
//! Fetching URLs chosen by a model is a server-side request forgery risk, so every hop is
//! guarded: the request URL and every redirect target must pass [`check_url`] (http/https, a
//! host, no credentials, no private IP literal), and host names are resolved by a resolver that
//! drops non-public addresses, so the connection only ever goes to an address that was checked
//! (no DNS-rebinding gap between the check and the connect). Loopback tests turn the guard off
//! with [`PageConfig::allow_private`].

use std::error::Error as StdError;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use url::{Host, Url};

use super::{SearchError, Usage};

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

/// Elements readability may walk; bigger documents go straight to the plain-text fallback.
const MAX_ELEMENTS: usize = 200_000;
/// Characters of an error page kept in [`SearchError::Status`].
const STATUS_BODY_CHARS: usize = 300;
/// Bytes of an error page read at most.
const STATUS_BODY_BYTES: usize = 4096;

impl PageFetcher {
    pub fn new(cfg: PageConfig) -> Result<PageFetcher, SearchError> {
        if cfg.timeout_ms == 0 {
            return Err(SearchError::Config("page timeout_ms must be positive".into()));
        }
        if cfg.max_bytes == 0 {
            return Err(SearchError::Config("page max_bytes must be positive".into()));
        }
        grove_http::install_tls_provider();
        let policy_cfg = cfg.clone();
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            match redirect_verdict(attempt.url(), attempt.previous().len(), &policy_cfg) {
                Ok(()) => attempt.follow(),
                Err(why) => attempt.error(Refusal(why)),
            }
        });
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::ACCEPT,
            reqwest::header::HeaderValue::from_static("text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.5"),
        );
        let http = reqwest::Client::builder()
            .user_agent(cfg.user_agent.as_str())
            .default_headers(headers)
            .redirect(policy)
            .dns_resolver(GuardedResolver { allow_private: cfg.allow_private })
            // A proxy would connect on our behalf to addresses the resolver never saw.
            .no_proxy()
            .connect_timeout(Duration::from_millis(cfg.timeout_ms))
            .timeout(Duration::from_millis(cfg.timeout_ms))
            .build()
            .map_err(|e| SearchError::Config(format!("page fetcher: {}", error_chain(&e))))?;
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
        let fetched = tokio::time::timeout(Duration::from_millis(ms), Self::download(inner, target))
            .await
            .map_err(|_| SearchError::Timeout(ms))??;
        let Fetched { url, kind, body, truncated } = fetched;
        let text_of = move || -> Result<Page, SearchError> {
            let body = decode(&body, truncated);
            let kind = match kind {
                Kind::Sniff if looks_like_html(&body) => Kind::Html,
                Kind::Sniff if looks_binary(&body) => {
                    return Err(SearchError::Unusable("content type unknown (binary data)".into()));
                }
                Kind::Sniff => Kind::Plain,
                k => k,
            };
            let (title, text) = match kind {
                Kind::Html => extract_text(&body, &url),
                _ => (String::new(), tidy(&body)),
            };
            let title = if title.is_empty() { title_from_url(&url) } else { title };
            Ok(Page { url, title, text, truncated })
        };
        // Parsing a large page is CPU work: keep it off the runtime's threads.
        tokio::task::spawn_blocking(text_of)
            .await
            .map_err(|e| SearchError::Internal(format!("page extraction: {e}")))?
    }

    /// The request, its redirects and the body (at most `max_bytes` of it).
    async fn download(inner: &Inner, target: Url) -> Result<Fetched, SearchError> {
        let cfg = &inner.config;
        let mut resp = inner.http.get(target).send().await.map_err(|e| map_reqwest(&e, cfg.timeout_ms))?;
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
        let header =
            |name| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(|s| s.trim().to_ascii_lowercase());
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
}

/// What the network gave, before text extraction.
struct Fetched {
    url: String,
    kind: Kind,
    body: Vec<u8>,
    truncated: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
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

/// UTF-8, lossily; a character cut by the byte cap is dropped rather than replaced.
fn decode(bytes: &[u8], truncated: bool) -> String {
    let bytes = match std::str::from_utf8(bytes) {
        Err(e) if truncated && e.error_len().is_none() => &bytes[..e.valid_up_to()],
        _ => bytes,
    };
    String::from_utf8_lossy(bytes).into_owned()
}

fn looks_like_html(body: &str) -> bool {
    let head: String = body.trim_start_matches(['\u{feff}', ' ', '\t', '\r', '\n']).chars().take(1024).collect();
    let head = head.to_ascii_lowercase();
    head.starts_with("<!doctype html")
        || head.starts_with("<html")
        || ["<html", "<head", "<body", "<title", "<meta ", "<p>", "<div"].iter().any(|tag| head.contains(tag))
}

/// Binary data decoded lossily: NUL bytes or many replacement characters.
fn looks_binary(body: &str) -> bool {
    let sample: Vec<char> = body.chars().take(4096).collect();
    let odd = sample.iter().filter(|&&c| c == '\u{fffd}' || (c.is_control() && !c.is_whitespace())).count();
    body.starts_with("%PDF") || sample.contains(&'\0') || odd * 20 > sample.len().max(1)
}

/// The title of a page that has none: its last path segment, or the URL.
fn title_from_url(url: &str) -> String {
    Url::parse(url)
        .ok()
        .and_then(|u| u.path_segments().and_then(|mut s| s.rfind(|seg| !seg.is_empty()).map(str::to_string)))
        .unwrap_or_else(|| url.to_string())
}

/// Our refusal of an address or a redirect, carried through reqwest's error chain.
#[derive(Debug)]
struct Refusal(String);

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Refusal {}

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

/// Resolves host names with the system resolver and keeps only public addresses (unless
/// private ones are allowed), failing when none is left.
#[derive(Debug)]
struct GuardedResolver {
    allow_private: bool,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_private = self.allow_private;
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let kept: Vec<SocketAddr> =
                found.iter().copied().filter(|a| allow_private || is_public_ip(a.ip())).collect();
            if kept.is_empty() {
                let why = if found.is_empty() {
                    format!("{host} has no address")
                } else {
                    format!("{host} resolves to a non-public address")
                };
                return Err(Box::new(Refusal(why)) as Box<dyn StdError + Send + Sync>);
            }
            Ok(Box::new(kept.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Whether to follow a redirect to `next`, the `hops`-th of this fetch (1 for the first).
fn redirect_verdict(next: &Url, hops: usize, cfg: &PageConfig) -> Result<(), String> {
    if hops > cfg.max_redirects {
        return Err(format!("more than {} redirects", cfg.max_redirects));
    }
    match check_url(next.as_str(), cfg.allow_private) {
        Ok(_) => Ok(()),
        Err(SearchError::UrlRejected(why)) => Err(format!("redirect to {next}: {why}")),
        Err(e) => Err(format!("redirect to {next}: {e}")),
    }
}

/// Scheme http/https only, a host, no credentials in the URL; an IP-literal host must be public
/// unless `allow_private`. Host names are judged when they are resolved.
pub fn check_url(url: &str, allow_private: bool) -> Result<Url, SearchError> {
    let reject = |why: String| SearchError::UrlRejected(why);
    let parsed = Url::parse(url.trim()).map_err(|e| reject(format!("not a valid URL ({e})")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(reject(format!("scheme `{}` not allowed", parsed.scheme())));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(reject("credentials in the URL".into()));
    }
    let ip = match parsed.host() {
        None => return Err(reject("no host".into())),
        Some(Host::Domain("")) => return Err(reject("no host".into())),
        Some(Host::Domain(_)) => None,
        Some(Host::Ipv4(v4)) => Some(IpAddr::V4(v4)),
        Some(Host::Ipv6(v6)) => Some(IpAddr::V6(v6)),
    };
    if let Some(ip) = ip
        && !allow_private
        && !is_public_ip(ip)
    {
        return Err(reject(format!("{ip} is not a public address")));
    }
    Ok(parsed)
}

/// False for loopback, unspecified, private, shared (CGNAT), link-local, `0/8`, broadcast,
/// multicast, documentation, benchmarking and reserved IPv4 ranges, and for IPv6 `::1`, `::`,
/// unique-local, link-local, site-local, multicast and documentation ranges. IPv6 forms that
/// embed an IPv4 address (mapped, NAT64, 6to4) are judged as that IPv4 address.
pub fn is_public_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    let refused = a == 0 // "this network", includes the unspecified address
        || a == 10
        || a == 127
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 169 && b == 254)
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 168)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // TEST-NET-1
        || (a == 198 && b == 51 && c == 100) // TEST-NET-2
        || (a == 203 && b == 0 && c == 113) // TEST-NET-3
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || a >= 224; // multicast, reserved, broadcast
    !refused
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    let seg = ip.segments();
    // NAT64 (64:ff9b::/96) carries an IPv4 address in its low 32 bits.
    if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_public_v4(Ipv4Addr::new((seg[6] >> 8) as u8, seg[6] as u8, (seg[7] >> 8) as u8, seg[7] as u8));
    }
    // 6to4 (2002::/16) carries one in bits 16..48.
    if seg[0] == 0x2002 {
        return is_public_v4(Ipv4Addr::new((seg[1] >> 8) as u8, seg[1] as u8, (seg[2] >> 8) as u8, seg[2] as u8));
    }
    let refused = seg[..6] == [0; 6] // ::, ::1 and the deprecated IPv4-compatible ::/96
        || (seg[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (seg[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (seg[0] & 0xffc0) == 0xfec0 // site-local fec0::/10 (deprecated)
        || (seg[0] & 0xff00) == 0xff00 // multicast
        || (seg[0] == 0x2001 && seg[1] == 0x0db8) // documentation
        || (seg[0] == 0x2001 && seg[1] == 0) // Teredo
        || seg[..4] == [0x100, 0, 0, 0]; // discard-only 100::/64
    !refused
}

/// Readable text of an HTML page: `(title, text)`. The title and main text come from
/// readability; when it finds no article, the visible body text (no script, style or noscript).
/// Whitespace is collapsed, paragraphs are kept as line breaks.
pub fn extract_text(html: &str, url: &str) -> (String, String) {
    let config = dom_smoothie::Config {
        text_mode: dom_smoothie::TextMode::Formatted,
        max_elements_to_parse: MAX_ELEMENTS,
        disable_json_ld: true,
        ..dom_smoothie::Config::default()
    };
    let doc_url = Url::parse(url).ok().filter(|u| matches!(u.scheme(), "http" | "https")).map(|_| url);
    let article = dom_smoothie::Readability::new(html, doc_url, Some(config)).ok().and_then(|mut r| r.parse().ok());
    let (mut title, mut text) = match article {
        Some(a) => (tidy(&a.title), tidy(&a.text_content)),
        None => (String::new(), String::new()),
    };
    if text.is_empty() || title.is_empty() {
        let (fallback_title, fallback_text) = visible_text(html);
        if title.is_empty() {
            title = fallback_title;
        }
        if text.is_empty() {
            text = fallback_text;
        }
    }
    (title, text)
}

/// The `<title>` and the visible text of the body, without readability's judgement.
fn visible_text(html: &str) -> (String, String) {
    let doc = dom_smoothie::Readability::from(html).doc;
    let title = tidy(&doc.select("title").first().text());
    doc.select("script, style, noscript, template, head").remove();
    let body = doc.select("body");
    let text = if body.exists() { body.formatted_text() } else { doc.formatted_text() };
    (title, tidy(&text))
}

/// Collapse runs of whitespace inside lines, trim lines and drop empty ones.
fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut words = line.split_whitespace().peekable();
        if words.peek().is_none() {
            continue;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        for (i, word) in words.enumerate() {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(word);
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::testkit::{Canned, ScriptedServer};

    fn cfg(allow_private: bool) -> PageConfig {
        PageConfig { enabled: true, allow_private, ..PageConfig::default() }
    }

    fn fetcher(cfg: PageConfig) -> PageFetcher {
        PageFetcher::new(cfg).expect("fetcher")
    }

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
    fn extract_text_falls_back_to_visible_body_text() {
        let html = "<html><head><title>Tiny</title><style>p{x:SECRETSTYLE}</style></head><body>\
                    <script>SECRETSCRIPT</script><noscript>SECRETNOSCRIPT</noscript>\
                    <div>Hello   there</div><div>second\n\n   line</div></body></html>";
        let (title, text) = extract_text(html, "http://example.com/tiny");
        assert_eq!(title, "Tiny");
        assert!(text.contains("Hello there"), "{text}");
        assert!(text.contains("second"), "{text}");
        for secret in ["SECRETSTYLE", "SECRETSCRIPT", "SECRETNOSCRIPT"] {
            assert!(!text.contains(secret), "{secret} leaked: {text}");
        }
        let (_, visible) = visible_text(html);
        assert!(visible.contains("Hello there") && visible.contains('\n'), "{visible:?}");
        assert!(!visible.contains("SECRET"), "{visible}");
    }

    #[tokio::test]
    async fn plain_text_page() {
        let server = ScriptedServer::start(|_| {
            Canned::status(200, "First line.\n\n  Second   line.\n").header("content-type", "text/plain; charset=utf-8")
        })
        .await
        .unwrap();
        let page = fetcher(cfg(true)).fetch(&format!("{}/docs/notes.txt", server.url())).await.unwrap();
        assert_eq!(page.title, "notes.txt");
        assert_eq!(page.text, "First line.\nSecond line.");
    }

    #[tokio::test]
    async fn missing_content_type_is_sniffed() {
        let server = ScriptedServer::start(|r| {
            if r.target == "/html" {
                Canned::status(200, "<html><head><title>Sniffed</title></head><body><p>Body text.</p></body></html>")
            } else {
                Canned::status(200, vec![0x25, 0x50, 0x44, 0x46, 0, 1, 2, 0xff, 0xfe])
            }
        })
        .await
        .unwrap();
        let f = fetcher(cfg(true));
        let page = f.fetch(&format!("{}/html", server.url())).await.unwrap();
        assert_eq!(page.title, "Sniffed");
        assert!(page.text.contains("Body text."), "{}", page.text);
        let err = f.fetch(&format!("{}/bin", server.url())).await.unwrap_err();
        assert!(matches!(err, SearchError::Unusable(_)), "{err:?}");
    }

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
    async fn redirect_to_a_refused_scheme_is_rejected() {
        let server = ScriptedServer::start(|r| match r.target.as_str() {
            "/ftp" => Canned::status(301, "").header("location", "ftp://example.com/file"),
            _ => Canned::status(302, "").header("location", "file:///etc/passwd"),
        })
        .await
        .unwrap();
        let f = fetcher(cfg(true));
        for path in ["/ftp", "/file"] {
            let err = f.fetch(&format!("{}{path}", server.url())).await.unwrap_err();
            assert!(matches!(&err, SearchError::UrlRejected(why) if why.contains("scheme")), "{path}: {err:?}");
        }
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

    #[tokio::test]
    async fn private_and_malformed_urls_are_refused_before_any_request() {
        let server = ScriptedServer::start(|_| Canned::html("<p>secret</p>")).await.unwrap();
        let port = server.addr().port();
        let f = fetcher(cfg(false));
        let urls = [
            format!("http://127.0.0.1:{port}/"),
            "http://10.0.0.1/".to_string(),
            format!("http://[::1]:{port}/"),
            "http://169.254.169.254/latest".to_string(),
            format!("http://localhost:{port}/"),
            "file:///etc/passwd".to_string(),
            "ftp://x".to_string(),
            "http://user:pw@example.com/".to_string(),
            format!("http://[::ffff:127.0.0.1]:{port}/"),
            format!("http://0x7f.1:{port}/"),
            "not a url".to_string(),
        ];
        for url in &urls {
            let err = f.fetch(url).await.unwrap_err();
            assert!(matches!(err, SearchError::UrlRejected(_)), "{url}: {err:?}");
        }
        let err = f.fetch(&format!("http://localhost:{port}/")).await.unwrap_err();
        assert!(matches!(&err, SearchError::UrlRejected(why) if why.contains("non-public")), "{err:?}");
        assert_eq!(server.count(), 0);
        let usage = f.usage();
        assert_eq!(usage.errors, urls.len() as u64 + 1);
        assert_eq!(usage.calls, 2, "only `localhost` got as far as resolution");
    }

    #[test]
    fn check_url_accepts_public_urls() {
        for url in
            ["http://example.com/", "https://93.184.216.34/x?y=1", "https://[2606:4700::1111]/", "http://localhost/"]
        {
            assert!(check_url(url, false).is_ok(), "{url}");
        }
        assert!(check_url("http://127.0.0.1:8080/", true).is_ok());
        assert!(check_url("ftp://127.0.0.1/", true).is_err());
        assert!(check_url("http://u@127.0.0.1/", true).is_err());
    }

    #[test]
    fn public_ip_table() {
        let table: &[(&str, bool)] = &[
            ("8.8.8.8", true),
            ("93.184.216.34", true),
            ("1.1.1.1", true),
            ("127.0.0.1", false),
            ("127.255.0.3", false),
            ("0.0.0.0", false),
            ("0.1.2.3", false),
            ("10.1.2.3", false),
            ("172.16.0.1", false),
            ("172.31.255.255", false),
            ("172.32.0.1", true),
            ("192.168.1.1", false),
            ("100.64.0.1", false),
            ("100.127.255.255", false),
            ("100.128.0.1", true),
            ("169.254.169.254", false),
            ("255.255.255.255", false),
            ("224.0.0.1", false),
            ("192.0.2.1", false),
            ("198.51.100.7", false),
            ("203.0.113.9", false),
            ("2606:4700:4700::1111", true),
            ("2001:4860:4860::8888", true),
            ("::1", false),
            ("::", false),
            ("fc00::1", false),
            ("fd12:3456::1", false),
            ("fe80::1", false),
            ("ff02::1", false),
            ("2001:db8::1", false),
            ("::ffff:127.0.0.1", false),
            ("::ffff:10.0.0.1", false),
            ("::ffff:8.8.8.8", true),
            ("64:ff9b::a00:1", false),
            ("64:ff9b::808:808", true),
            ("2002:7f00:1::", false),
        ];
        for &(ip, public) in table {
            let parsed: IpAddr = ip.parse().unwrap();
            assert_eq!(is_public_ip(parsed), public, "{ip}");
        }
    }

    #[test]
    fn redirect_verdicts() {
        let c = PageConfig { max_redirects: 2, ..PageConfig::default() };
        let url = |s: &str| Url::parse(s).unwrap();
        assert_eq!(redirect_verdict(&url("https://example.com/next"), 1, &c), Ok(()));
        assert_eq!(redirect_verdict(&url("https://example.com/next"), 2, &c), Ok(()));
        assert!(redirect_verdict(&url("https://example.com/next"), 3, &c).unwrap_err().contains("redirects"));
        for target in ["http://127.0.0.1/", "http://10.0.0.1/admin", "http://[::1]/", "http://169.254.169.254/latest"] {
            assert!(redirect_verdict(&url(target), 1, &c).is_err(), "{target}");
        }
        assert!(redirect_verdict(&url("file:///etc/passwd"), 1, &c).is_err());
        assert!(redirect_verdict(&url("http://u:p@example.com/"), 1, &c).is_err());
        let open = PageConfig { allow_private: true, ..c };
        assert_eq!(redirect_verdict(&url("http://127.0.0.1/"), 1, &open), Ok(()));
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

    #[test]
    fn truncated_utf8_is_not_replaced() {
        let bytes = "ab€".as_bytes();
        assert_eq!(decode(&bytes[..3], true), "ab");
        assert_eq!(decode(&bytes[..3], false), "ab\u{fffd}");
    }
}
