//! The HTTP/1.1 the view speaks, and no more: one GET (or HEAD) per connection, read with a size
//! limit and a deadline, answered with `Connection: close`. Anything else is a typed
//! [`RequestError`] with its status code; no input panics.

use std::net::IpAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest request head (request line and headers) read.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// The most header lines in a request.
pub const MAX_HEADERS: usize = 100;
/// How long a client has to send its whole request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client has to take a response.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// What the page's responses allow the browser to load: this server, nothing else.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// A request the server does not serve, with the status it is answered with.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("request head over {MAX_HEAD_BYTES} bytes")]
    TooLarge,
    #[error("malformed request: {0}")]
    Malformed(String),
    #[error("method {0} not allowed: this server answers GET and HEAD")]
    Method(String),
    #[error("no complete request head within {} s", HEAD_TIMEOUT.as_secs())]
    Timeout,
    #[error("host {0:?} refused: this server answers loopback names only (start it with --bind to serve others)")]
    Host(String),
    #[error("connection closed before a whole request")]
    Closed,
    #[error("reading the request: {0}")]
    Io(#[from] std::io::Error),
}

impl RequestError {
    /// The status to answer with; `None` when there is nobody to answer.
    pub fn status(&self) -> Option<u16> {
        match self {
            RequestError::TooLarge => Some(431),
            RequestError::Malformed(_) => Some(400),
            RequestError::Method(_) => Some(405),
            RequestError::Timeout => Some(408),
            RequestError::Host(_) => Some(403),
            RequestError::Closed | RequestError::Io(_) => None,
        }
    }
}

/// A parsed request: the path and the query's pairs (not percent-decoded: the routes and their
/// parameters are plain ASCII).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub head_only: bool,
    pub path: String,
    pub query: Vec<(String, String)>,
    pub host: Option<String>,
}

impl Request {
    /// The value of a query parameter (the first, if repeated).
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// Read one request head from `r`, at most [`MAX_HEAD_BYTES`]. The caller bounds the time.
pub async fn read_request<R: AsyncRead + Unpin>(r: &mut R) -> Result<Request, RequestError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    let end = loop {
        let n = r.read(&mut chunk).await?;
        if n == 0 {
            return Err(if buf.is_empty() {
                RequestError::Closed
            } else {
                RequestError::Malformed("the connection ended inside the request head".into())
            });
        }
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = find(&buf[from..], b"\r\n\r\n") {
            break from + i;
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Err(RequestError::TooLarge);
        }
    };
    if end > MAX_HEAD_BYTES {
        return Err(RequestError::TooLarge);
    }
    parse_head(&buf[..end])
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Parse a request head (without its final blank line).
pub fn parse_head(head: &[u8]) -> Result<Request, RequestError> {
    let bad = |m: &str| RequestError::Malformed(m.to_string());
    let text = std::str::from_utf8(head).map_err(|_| bad("the request head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("the request line is not `METHOD TARGET HTTP/1.x`"));
    };
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(RequestError::Malformed(format!("unsupported protocol version {:?}", clip(version))));
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(bad("the method is not a token"));
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        other => return Err(RequestError::Method(other.to_string())),
    };
    if !target.starts_with('/') || target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(bad("the target is not a path starting with `/`"));
    }
    let mut host = None;
    let mut count = 0;
    for l in lines {
        count += 1;
        if count > MAX_HEADERS {
            return Err(RequestError::Malformed(format!("more than {MAX_HEADERS} header lines")));
        }
        let Some((name, value)) = l.split_once(':') else {
            return Err(bad("a header line without `:`"));
        };
        if name.is_empty() || name.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(bad("a header name is not a token"));
        }
        let value = value.trim();
        if name.eq_ignore_ascii_case("host") {
            if host.is_some() {
                return Err(bad("more than one Host header"));
            }
            host = Some(value.to_string());
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || (name.eq_ignore_ascii_case("content-length") && value != "0")
        {
            return Err(bad("a GET or HEAD request carries no body"));
        }
    }
    if version == "HTTP/1.1" && host.is_none() {
        return Err(bad("an HTTP/1.1 request without a Host header"));
    }
    let target = target.split('#').next().unwrap_or_default();
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let query = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_string(), v.to_string())
        })
        .collect();
    Ok(Request { head_only, path: path.to_string(), query, host })
}

/// Whether a Host header names this machine's loopback interface (`localhost`, `127.x.y.z`,
/// `[::1]`, with any port): a page served on loopback answers nothing else, so that a web page
/// elsewhere cannot read it through a DNS name rebound to 127.0.0.1.
pub fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        match host.rsplit_once(':') {
            Some((n, port)) if port.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => host,
        }
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost") || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn clip(s: &str) -> String {
    s.chars().take(40).collect()
}

/// A response: status, content type and body.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

pub const JSON: &str = "application/json";

impl Response {
    pub fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Self {
        Self { status, content_type, body: body.into() }
    }

    pub fn json(status: u16, value: &serde_json::Value) -> Self {
        Self::new(status, JSON, value.to_string())
    }

    /// `{"error": message, "status": status}`.
    pub fn error(status: u16, message: impl std::fmt::Display) -> Self {
        Self::json(status, &serde_json::json!({ "error": message.to_string(), "status": status }))
    }

    /// The bytes of the response, headers and (unless `head_only`) body.
    pub fn to_bytes(&self, head_only: bool) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n\
             X-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\nContent-Security-Policy: {CSP}\r\n\
             Connection: close\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len()
        )
        .into_bytes();
        if self.status == 405 {
            out.extend_from_slice(b"Allow: GET, HEAD\r\n");
        }
        out.extend_from_slice(b"\r\n");
        if !head_only {
            out.extend_from_slice(&self.body);
        }
        out
    }

    pub async fn write_to<W: AsyncWrite + Unpin>(&self, w: &mut W, head_only: bool) -> std::io::Result<()> {
        w.write_all(&self.to_bytes(head_only)).await?;
        w.flush().await
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Request, RequestError> {
        parse_head(s.as_bytes())
    }

    #[test]
    fn a_get_with_a_query_parses() {
        let r = parse("GET /api/trees?step=3&run=1#x HTTP/1.1\r\nHost: 127.0.0.1:8450\r\nAccept: */*").unwrap();
        assert_eq!(r.path, "/api/trees");
        assert_eq!(r.param("step"), Some("3"));
        assert_eq!(r.param("run"), Some("1"));
        assert_eq!(r.param("nope"), None);
        assert!(!r.head_only);
        assert!(parse("HEAD / HTTP/1.0").unwrap().head_only);
    }

    #[test]
    fn bad_requests_are_typed() {
        let status = |s: &str| parse(s).unwrap_err().status();
        assert_eq!(status("POST / HTTP/1.1\r\nHost: x"), Some(405));
        assert_eq!(status("GET / HTTP/2.0\r\nHost: x"), Some(400));
        assert_eq!(status("GET /\r\nHost: x"), Some(400));
        assert_eq!(status("GET  / HTTP/1.1\r\nHost: x"), Some(400));
        assert_eq!(status("GET http://a/ HTTP/1.1\r\nHost: x"), Some(400));
        assert_eq!(status("GET / HTTP/1.1"), Some(400), "1.1 needs a Host");
        assert_eq!(status("GET / HTTP/1.1\r\nHost: a\r\nHost: b"), Some(400));
        assert_eq!(status("GET / HTTP/1.1\r\nHost: a\r\nbroken"), Some(400));
        assert_eq!(status("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5"), Some(400));
        assert_eq!(status("GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked"), Some(400));
        assert_eq!(parse_head(b"GET /\xff HTTP/1.1\r\nHost: a").unwrap_err().status(), Some(400));
        assert_eq!(status(""), Some(400));
    }

    #[test]
    fn loopback_hosts() {
        for h in ["localhost", "localhost:8450", "127.0.0.1:1", "127.1.2.3", "[::1]:80", "[::1]", "app.localhost:9"] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in ["example.com", "10.0.0.1:80", "evil.com:127", "[::2]:80", "", "127.0.0.1.evil.com"] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    #[tokio::test]
    async fn heads_are_read_with_a_size_limit() {
        let mut ok: &[u8] = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\ntrailing";
        assert_eq!(read_request(&mut ok).await.unwrap().path, "/");
        let big = format!("GET / HTTP/1.1\r\nHost: localhost\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD_BYTES));
        let mut big = big.as_bytes();
        assert!(matches!(read_request(&mut big).await, Err(RequestError::TooLarge)));
        let mut cut: &[u8] = b"GET / HTTP/1.1\r\nHost: local";
        assert_eq!(read_request(&mut cut).await.unwrap_err().status(), Some(400));
        let mut empty: &[u8] = b"";
        assert!(matches!(read_request(&mut empty).await, Err(RequestError::Closed)));
    }

    #[test]
    fn responses_say_their_type_and_length() {
        let r = Response::error(404, "no trees for step 7");
        let text = String::from_utf8(r.to_bytes(false)).unwrap();
        assert!(text.starts_with("HTTP/1.1 404 Not Found\r\n"), "{text}");
        assert!(text.contains("Content-Type: application/json\r\n"));
        assert!(text.ends_with(r#"{"error":"no trees for step 7","status":404}"#), "{text}");
        let head = String::from_utf8(r.to_bytes(true)).unwrap();
        assert!(head.ends_with("\r\n\r\n"));
    }
}
