//! Grove's one outbound HTTP policy, used by every client Grove runs against a server it does not
//! own: the env-server's remote retriever, web search providers and page fetcher, and the
//! trainer's OpenAI-compatible client.
//!
//! [`send`] makes one logical call under a [`Policy`]:
//! - a **deadline** for the whole call (attempts, waits and body reads), and optionally one per
//!   attempt;
//! - **retries** of 429, 5xx, transport errors and attempt timeouts, waiting the server's
//!   `Retry-After` (delta-seconds, capped) or else an exponential backoff;
//! - a **capped body read**: a reply longer than `max_body` is an error ([`Overflow::Fail`]) or
//!   cut there ([`Overflow::Truncate`], for page text), never buffered whole first;
//! - **error text** that says what happened, with an excerpt of an error body, and with every
//!   secret the caller names (API keys, raw or URL-encoded) replaced by `<redacted>`; transport
//!   errors never carry the URL (some APIs put the key in the query string).
//!
//! The caller builds each attempt's request (and may hold a guard, e.g. a concurrency permit or
//! a rate-limit token, for the attempt's duration), and decides what a final non-success status
//! means; [`Reply::error_for_status`] gives the policy's error for it.

use std::future::Future;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::header::HeaderMap;

/// What happens when a reply is longer than [`Policy::max_body`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// [`HttpError::TooLarge`]: the reply is refused (an API's JSON is useless cut).
    Fail,
    /// The body is cut at `max_body` and [`Reply::truncated`] says so (a web page's text).
    Truncate,
}

/// How one logical call is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The whole call: every attempt, wait and body read.
    pub deadline: Duration,
    /// One attempt, when shorter than what is left of the deadline; a timed-out attempt is
    /// retried.
    pub attempt_timeout: Option<Duration>,
    /// Attempts after the first on 429, 5xx, transport errors and attempt timeouts.
    pub retries: u32,
    /// The first wait between attempts, doubled on every retry.
    pub backoff: Duration,
    /// The longest wait between attempts: a longer `Retry-After` (or backoff) waits this long.
    pub max_retry_after: Duration,
    /// Reply bytes read at most.
    pub max_body: usize,
    pub overflow: Overflow,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            deadline: Duration::from_secs(30),
            attempt_timeout: None,
            retries: 2,
            backoff: Duration::from_millis(200),
            max_retry_after: Duration::from_secs(10),
            max_body: 8 << 20,
            overflow: Overflow::Fail,
        }
    }
}

/// Why a call failed. The text never holds a secret the caller named, nor a URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// Connection refused or reset, DNS, TLS, an interrupted body: the cause chain.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// The call's deadline (or, after the last retry, an attempt's timeout) passed.
    #[error("no reply within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// A non-success status, with an excerpt of the body.
    #[error("HTTP {status}: {body}")]
    Status { status: u16, body: String },
    /// The reply is longer than the policy reads.
    #[error("reply larger than {limit} bytes")]
    TooLarge { limit: usize },
    /// The request could not be built (a bad header value, a body that does not serialise).
    #[error("request not built: {0}")]
    Request(String),
}

impl HttpError {
    /// Whether another attempt may succeed.
    fn retryable(&self) -> bool {
        match self {
            HttpError::Unreachable(_) | HttpError::Timeout(_) => true,
            HttpError::Status { status, .. } => retryable_status(*status),
            HttpError::TooLarge { .. } | HttpError::Request(_) => false,
        }
    }
}

fn retryable_status(status: u16) -> bool {
    status == 429 || (500..600).contains(&status)
}

/// A final reply: a success, a non-retryable status, or the last of the retried ones.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    /// The body was cut at the policy's `max_body` ([`Overflow::Truncate`] only).
    pub truncated: bool,
    /// Attempts made, the first included.
    pub attempts: u32,
    secrets: Vec<String>,
}

impl Reply {
    /// The reply itself if its status is a success, else [`HttpError::Status`] with a redacted
    /// excerpt of its body.
    pub fn error_for_status(self) -> Result<Reply, HttpError> {
        if self.status.is_success() {
            return Ok(self);
        }
        let body = redact(&excerpt(&self.body), &self.secrets);
        Err(HttpError::Status { status: self.status.as_u16(), body })
    }
}

/// The first 300 characters of a body, trimmed.
pub fn excerpt(body: &[u8]) -> String {
    String::from_utf8_lossy(body).trim().chars().take(300).collect()
}

/// `Retry-After` in delta-seconds; an HTTP date gives `None` (the backoff applies).
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    let secs: f64 = value.parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(86_400.0)))
}

/// `text` with every secret (as given, and URL-encoded) replaced by `<redacted>`. Secrets
/// shorter than 4 characters are left alone (they would blank out ordinary words).
pub fn redact(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    for s in secrets.iter().filter(|s| s.len() >= 4) {
        out = out.replace(s.as_str(), "<redacted>");
        let encoded = url_encode(s);
        if encoded != *s {
            out = out.replace(encoded.as_str(), "<redacted>");
        }
    }
    out
}

/// Percent-encoding of everything but unreserved characters (as a query string encodes a key).
fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A transport error without its URL, with the chain of causes.
pub fn transport_error(e: reqwest::Error) -> HttpError {
    let e = e.without_url();
    if e.is_builder() {
        return HttpError::Request(e.to_string());
    }
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        msg.push_str(": ");
        msg.push_str(&cause.to_string());
        source = cause.source();
    }
    HttpError::Unreachable(msg)
}

/// Install ring as rustls's crypto provider (reqwest is built without one); idempotent.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// One logical call under `policy`. `attempt(i)` builds attempt `i`'s request (0 first) and may
/// return a guard held until that attempt's reply is read. Returns the final reply (see
/// [`Reply`]); an error only when no reply could be had: transport, deadline, size, or a
/// request that could not be built. `secrets` are blanked out of every error text.
pub async fn send<G, F, Fut>(policy: &Policy, secrets: &[String], mut attempt: F) -> Result<Reply, HttpError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<(reqwest::RequestBuilder, G), HttpError>>,
{
    let started = Instant::now();
    let deadline = policy.deadline;
    let call = async {
        let mut i = 0u32;
        loop {
            let outcome = match policy.attempt_timeout {
                Some(limit) => match tokio::time::timeout(limit, one(policy, secrets, &mut attempt, i)).await {
                    Ok(outcome) => outcome,
                    Err(_) => Err((HttpError::Timeout(limit), None)),
                },
                None => one(policy, secrets, &mut attempt, i).await,
            };
            let (err, after) = match outcome {
                Ok(reply) if retryable_status(reply.status.as_u16()) && i < policy.retries => {
                    let after = retry_after(&reply.headers);
                    (HttpError::Status { status: reply.status.as_u16(), body: excerpt(&reply.body) }, after)
                }
                Ok(reply) => return Ok(reply),
                Err((e, after)) if e.retryable() && i < policy.retries => (e, after),
                Err((e, _)) => return Err(e),
            };
            i += 1;
            let wait = match after {
                Some(after) => after.min(policy.max_retry_after),
                None => policy.backoff.saturating_mul(1u32 << (i - 1).min(16)).min(policy.max_retry_after),
            };
            tracing::debug!(attempt = i, wait_ms = wait.as_millis() as u64, reason = %redact(&err.to_string(), secrets), "retrying");
            tokio::time::sleep(wait).await;
        }
    };
    match tokio::time::timeout(deadline, call).await {
        Ok(outcome) => outcome.map_err(|e| redact_error(e, secrets)),
        Err(_) => Err(HttpError::Timeout(started.elapsed().max(deadline))),
    }
}

/// One attempt: build, send, read the body within the cap.
async fn one<G, F, Fut>(
    policy: &Policy,
    secrets: &[String],
    attempt: &mut F,
    i: u32,
) -> Result<Reply, (HttpError, Option<Duration>)>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<(reqwest::RequestBuilder, G), HttpError>>,
{
    let (request, guard) = attempt(i).await.map_err(|e| (e, None))?;
    // A client-level timeout (reqwest's own) reads as the attempt's timeout.
    let timeout = policy.attempt_timeout.unwrap_or(policy.deadline);
    let failed = |e: reqwest::Error| if e.is_timeout() { HttpError::Timeout(timeout) } else { transport_error(e) };
    let mut resp = request.send().await.map_err(|e| (failed(e), None))?;
    let after = retry_after(resp.headers());
    let (body, truncated) = read_body(&mut resp, policy.max_body, policy.overflow).await.map_err(|e| match e {
        BodyError::Transport(e) => (failed(e), after),
        BodyError::TooLarge { limit } => (HttpError::TooLarge { limit }, None),
    })?;
    drop(guard);
    Ok(Reply {
        status: resp.status(),
        headers: resp.headers().clone(),
        body,
        truncated,
        attempts: i + 1,
        secrets: secrets.to_vec(),
    })
}

/// Why [`read_body`] stopped.
#[derive(Debug)]
pub enum BodyError {
    /// The connection failed mid-body (the error keeps its source chain for callers that look
    /// into it, e.g. for their own refusals).
    Transport(reqwest::Error),
    /// Longer than the cap, with [`Overflow::Fail`].
    TooLarge { limit: usize },
}

/// Read `resp`'s body chunk by chunk, never more than `max` bytes; `true` when it was cut
/// ([`Overflow::Truncate`]). The one capped read of every Grove HTTP client.
pub async fn read_body(
    resp: &mut reqwest::Response,
    max: usize,
    overflow: Overflow,
) -> Result<(Vec<u8>, bool), BodyError> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(BodyError::Transport)? {
        let room = max - body.len();
        if chunk.len() > room {
            return match overflow {
                Overflow::Fail => Err(BodyError::TooLarge { limit: max }),
                Overflow::Truncate => {
                    body.extend_from_slice(&chunk[..room]);
                    Ok((body, true))
                }
            };
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

fn redact_error(e: HttpError, secrets: &[String]) -> HttpError {
    match e {
        HttpError::Unreachable(m) => HttpError::Unreachable(redact(&m, secrets)),
        HttpError::Status { status, body } => HttpError::Status { status, body: redact(&body, secrets) },
        HttpError::Request(m) => HttpError::Request(redact(&m, secrets)),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_blanked_raw_and_encoded() {
        let secrets = vec!["k3y/with+plus".to_string(), "ab".to_string()];
        let text = "key k3y/with+plus in q=k3y%2Fwith%2Bplus; ab stays";
        assert_eq!(redact(text, &secrets), "key <redacted> in q=<redacted>; ab stays");
    }

    #[test]
    fn retry_after_is_delta_seconds_only() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(reqwest::header::RETRY_AFTER, "2".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert(reqwest::header::RETRY_AFTER, "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap());
        assert_eq!(retry_after(&h), None);
        h.insert(reqwest::header::RETRY_AFTER, "-1".parse().unwrap());
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn only_429_5xx_and_transport_retry() {
        assert!(HttpError::Status { status: 429, body: String::new() }.retryable());
        assert!(HttpError::Status { status: 503, body: String::new() }.retryable());
        assert!(!HttpError::Status { status: 404, body: String::new() }.retryable());
        assert!(HttpError::Unreachable(String::new()).retryable());
        assert!(!HttpError::TooLarge { limit: 1 }.retryable());
    }
}
