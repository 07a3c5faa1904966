//! The policy against real loopback servers speaking raw HTTP/1.1: retries and `Retry-After`,
//! the deadline, the capped read in both overflow modes, and secrets kept out of error text.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use grove_http::{HttpError, Overflow, Policy, send};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A server answering request `i` (0 first) with `reply(i)`'s raw bytes; `None` never answers.
async fn serve(reply: impl Fn(u32) -> Option<String> + Send + Sync + 'static) -> (String, Arc<AtomicU32>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/x", listener.local_addr().unwrap());
    let count = Arc::new(AtomicU32::new(0));
    let seen = count.clone();
    let reply = Arc::new(reply);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let i = seen.fetch_add(1, Ordering::SeqCst);
            let reply = reply.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let _ = s.read(&mut buf).await;
                match reply(i) {
                    Some(r) => {
                        let _ = s.write_all(r.as_bytes()).await;
                    }
                    None => tokio::time::sleep(Duration::from_secs(60)).await,
                }
            });
        }
    });
    (url, count)
}

fn http(status: u16, extra: &str, body: &str) -> String {
    format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n{body}", body.len())
}

fn policy() -> Policy {
    Policy { backoff: Duration::from_millis(5), ..Policy::default() }
}

async fn get(policy: &Policy, url: &str, secrets: &[String]) -> Result<grove_http::Reply, HttpError> {
    grove_http::install_tls_provider();
    let client = reqwest::Client::new();
    send(policy, secrets, |_| {
        let req = client.get(url);
        async move { Ok((req, ())) }
    })
    .await
}

#[tokio::test]
async fn retries_wait_the_servers_retry_after_then_succeed() {
    let (url, count) = serve(|i| {
        Some(match i {
            0 => http(503, "retry-after: 0.3\r\n", "busy"),
            1 => http(429, "", "slow down"),
            _ => http(200, "", "ok"),
        })
    })
    .await;
    let t = Instant::now();
    let reply = get(&policy(), &url, &[]).await.unwrap();
    assert_eq!((reply.status.as_u16(), reply.body.as_slice(), reply.attempts), (200, &b"ok"[..], 3));
    assert!(t.elapsed() >= Duration::from_millis(300), "Retry-After was not honoured");
    assert_eq!(count.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_final_status_is_not_retried_and_keeps_no_secret() {
    let key = "sk-very-secret".to_string();
    let (url, count) = serve(|_| Some(http(401, "", "bad key sk-very-secret (sk-very-secret)"))).await;
    let err = get(&policy(), &url, std::slice::from_ref(&key)).await.unwrap().error_for_status().unwrap_err();
    assert_eq!(err, HttpError::Status { status: 401, body: "bad key <redacted> (<redacted>)".into() });
    assert_eq!(count.load(Ordering::SeqCst), 1);
    // Retries exhausted on 5xx: the last reply comes back, and error_for_status types it.
    let (url, count) = serve(|_| Some(http(500, "", "boom"))).await;
    let p = Policy { retries: 2, ..policy() };
    let err = get(&p, &url, &[]).await.unwrap().error_for_status().unwrap_err();
    assert_eq!(err, HttpError::Status { status: 500, body: "boom".into() });
    assert_eq!(count.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn the_deadline_bounds_the_whole_call() {
    let (url, _) = serve(|_| None).await;
    let p = Policy { deadline: Duration::from_millis(300), retries: 5, ..policy() };
    let t = Instant::now();
    assert!(matches!(get(&p, &url, &[]).await, Err(HttpError::Timeout(_))));
    assert!(t.elapsed() < Duration::from_secs(3));
    // A per-attempt timeout is retried, then reported.
    let (url, count) = serve(|_| None).await;
    let p = Policy { attempt_timeout: Some(Duration::from_millis(100)), retries: 2, ..policy() };
    assert_eq!(get(&p, &url, &[]).await.unwrap_err(), HttpError::Timeout(Duration::from_millis(100)));
    assert_eq!(count.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn long_replies_are_refused_or_cut_at_the_cap() {
    let body = "x".repeat(100_000);
    let reply = http(200, "", &body);
    let (url, _) = serve(move |_| Some(reply.clone())).await;
    let p = Policy { max_body: 1000, ..policy() };
    assert_eq!(get(&p, &url, &[]).await.unwrap_err(), HttpError::TooLarge { limit: 1000 });
    let p = Policy { max_body: 1000, overflow: Overflow::Truncate, ..policy() };
    let cut = get(&p, &url, &[]).await.unwrap();
    assert_eq!((cut.body.len(), cut.truncated), (1000, true));
    let p = Policy { max_body: 100_000, ..policy() };
    let whole = get(&p, &url, &[]).await.unwrap();
    assert_eq!((whole.body.len(), whole.truncated), (100_000, false));
}

#[tokio::test]
async fn an_unreachable_server_is_retried_then_typed_without_its_url() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}/path?api_key=sk-in-the-query");
    let err = get(&Policy { retries: 1, ..policy() }, &url, &[]).await.unwrap_err();
    match err {
        HttpError::Unreachable(m) => assert!(!m.contains("sk-in-the-query") && !m.contains("/path"), "{m}"),
        other => panic!("{other:?}"),
    }
}
