//! A small Chrome DevTools Protocol client for the browser checks: headless Chromium started on
//! a free debugging port (read from `DevToolsActivePort` in its own profile folder), one page
//! target attached with a flat session, commands matched to their replies by id, and the
//! events that tell of a broken page (exceptions, console errors, CSP refusals, requests to
//! other hosts) kept for the test to check. Test support: every failure panics with what went
//! wrong.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// A Chromium process, killed when dropped.
pub struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
    ws_url: String,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser").field("pid", &self.child.id()).field("ws_url", &self.ws_url).finish()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    /// Start `program` headless on a free debugging port and wait (at most 30 s) until it listens.
    pub fn launch(program: &Path) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new(program)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--mute-audio",
                "--remote-debugging-port=0",
                "--window-size=1440,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
        // Chromium writes its port and browser target path once it listens.
        let file = profile.path().join("DevToolsActivePort");
        let started = Instant::now();
        let ws_url = loop {
            if let Ok(text) = std::fs::read_to_string(&file) {
                let mut lines = text.lines();
                if let (Some(port), Some(path)) = (lines.next(), lines.next()) {
                    break format!("ws://127.0.0.1:{}{}", port.trim(), path.trim());
                }
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{} exited at start ({status})", program.display());
            }
            assert!(started.elapsed() < Duration::from_secs(30), "{} did not listen within 30 s", program.display());
            std::thread::sleep(Duration::from_millis(50));
        };
        Browser { child, _profile: profile, ws_url }
    }

    /// A new page, attached, with the domains the checks listen to enabled.
    pub async fn page(&self) -> Page {
        let (ws, _) = tokio_tungstenite::connect_async(&self.ws_url).await.expect("connect to DevTools");
        let mut page = Page { ws, next: 0, session: None, events: Vec::new() };
        let target = page.call("Target.createTarget", json!({ "url": "about:blank" })).await;
        let target_id = target["targetId"].as_str().expect("a target id").to_string();
        let attached = page.call("Target.attachToTarget", json!({ "targetId": target_id, "flatten": true })).await;
        page.session = Some(attached["sessionId"].as_str().expect("a session id").to_string());
        for domain in ["Page.enable", "Runtime.enable", "Log.enable", "Network.enable"] {
            page.call(domain, json!({})).await;
        }
        page
    }
}

/// One page target over the browser's WebSocket.
pub struct Page {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next: u64,
    session: Option<String>,
    /// Every event received so far.
    pub events: Vec<Value>,
}

impl std::fmt::Debug for Page {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Page").field("session", &self.session).field("events", &self.events.len()).finish()
    }
}

impl Page {
    /// Send a command and wait (at most 30 s) for its reply; events that arrive meanwhile are kept.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = &self.session {
            msg["sessionId"] = json!(s);
        }
        self.ws.send(Message::text(msg.to_string())).await.expect("send to DevTools");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let next = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .unwrap_or_else(|_| panic!("no reply to {method} within 30 s"));
            let Some(Ok(frame)) = next else { panic!("DevTools connection closed while waiting for {method}") };
            let Message::Text(text) = frame else { continue };
            let v: Value = serde_json::from_str(text.as_str()).expect("DevTools sends JSON");
            if v["id"].as_u64() == Some(id) {
                if let Some(e) = v.get("error") {
                    panic!("{method} failed: {e}");
                }
                return v["result"].clone();
            }
            if v.get("method").is_some() {
                self.events.push(v);
            }
        }
    }

    /// The value of a JavaScript expression (awaited if a promise); a thrown error fails the test.
    pub async fn eval(&mut self, expression: &str) -> Value {
        let r = self
            .call("Runtime.evaluate", json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }))
            .await;
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expression}\nthrew: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Wait until a JavaScript expression is true.
    pub async fn wait_for(&mut self, what: &str, expression: &str, within: Duration) {
        let started = Instant::now();
        loop {
            if self.eval(expression).await == Value::Bool(true) {
                return;
            }
            if started.elapsed() > within {
                let body = self.eval("document.body ? document.body.innerText.slice(0, 2000) : ''").await;
                panic!(
                    "{what}: not within {} s ({expression})\npage text:\n{}",
                    within.as_secs(),
                    body.as_str().unwrap_or("")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Load `url` in the page (returns once the navigation is under way).
    pub async fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url })).await;
    }

    /// Emulate a `width` x `height` viewport at scale 1.
    pub async fn viewport(&mut self, width: u32, height: u32) {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false }),
        )
        .await;
    }

    /// A PNG of the viewport, written to `path`.
    pub async fn screenshot(&mut self, path: &Path) {
        let r = self.call("Page.captureScreenshot", json!({ "format": "png" })).await;
        let png = base64_decode(r["data"].as_str().expect("screenshot data"));
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap();
    }

    /// What went wrong in the page so far: uncaught exceptions, console errors, log errors (CSP
    /// refusals among them), and requests to anything but `origin` (or `data:`).
    pub fn problems(&self, origin: &str) -> Vec<String> {
        let mut out = Vec::new();
        for e in &self.events {
            let p = &e["params"];
            match e["method"].as_str().unwrap_or_default() {
                "Runtime.exceptionThrown" => out.push(format!("exception: {}", p["exceptionDetails"])),
                "Runtime.consoleAPICalled" if p["type"] == "error" => out.push(format!("console error: {}", p["args"])),
                "Log.entryAdded" if p["entry"]["level"] == "error" => {
                    out.push(format!("log error: {}", p["entry"]["text"]));
                }
                "Network.requestWillBeSent" => {
                    let url = p["request"]["url"].as_str().unwrap_or_default();
                    if !url.starts_with(origin) && !url.starts_with("data:") && url != "about:blank" {
                        out.push(format!("request to another origin: {url}"));
                    }
                }
                _ => {}
            }
        }
        out
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let bytes: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace() && *b != b'=').collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= value(c) << (18 - 6 * i);
        }
        let n = chunk.len() * 6 / 8;
        out.extend_from_slice(&acc.to_be_bytes()[1..1 + n]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::base64_decode;

    #[test]
    fn base64_decodes() {
        assert_eq!(base64_decode("aGVsbG8="), b"hello");
        assert_eq!(base64_decode("aGVsbG8hIQ=="), b"hello!!");
        assert_eq!(base64_decode("YWJj"), b"abc");
    }
}
