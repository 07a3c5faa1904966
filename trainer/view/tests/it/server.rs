//! The view server started in-process on a free loopback port (`serve`, the library's
//! `browser_check::serve`), and a raw HTTP client: every request is written byte for byte, so
//! malformed ones can be sent too.

use std::net::SocketAddr;
use std::time::Duration;

pub use grove_view::browser_check::serve;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A parsed response.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        assert_eq!(self.header("content-type"), Some("application/json"), "{self:?}");
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// Send `request` as is and read the whole response (the server closes after it).
pub async fn raw(addr: SocketAddr, request: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request).await.expect("send the request");
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut buf))
        .await
        .expect("the server answers within 20 s")
        .expect("read the response");
    parse(&buf)
}

pub async fn get(addr: SocketAddr, target: &str) -> Reply {
    raw(addr, format!("GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n", addr.port()).as_bytes()).await
}

fn parse(buf: &[u8]) -> Reply {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or_else(|| {
        panic!("no response head in {:?}", String::from_utf8_lossy(buf));
    });
    let head = std::str::from_utf8(&buf[..end]).expect("the head is UTF-8");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status = status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status code");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect::<Vec<_>>();
    let body = buf[end + 4..].to_vec();
    let reply = Reply { status, headers, body };
    if let Some(len) = reply.header("content-length") {
        assert!(
            len.parse::<usize>().unwrap() == reply.body.len() || reply.body.is_empty(),
            "Content-Length {len} for {} bytes",
            reply.body.len()
        );
    }
    reply
}
