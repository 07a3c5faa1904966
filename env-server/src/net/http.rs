//! HTTP on the same port as the protocol: the WebSocket upgrade, `POST /retrieve` in the
//! Search-R1 dialect, `GET /health` and `GET /metrics`. Every request is checked against the
//! bearer token when one is configured.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::ws::{serve as serve_ws, ws_config};
use super::{Ctx, Slot};
use grove_protocol::ErrorCode;

type Body = Full<Bytes>;

/// The slot of one TCP connection; a WebSocket upgrade takes it out.
type SlotCell = Arc<Mutex<Option<Slot>>>;

/// Serve one TCP connection until it closes or the server shuts down (keep-alive connections
/// are closed gracefully then, so that shutdown does not wait on idle HTTP clients).
pub(crate) async fn serve_connection(stream: TcpStream, peer: SocketAddr, ctx: Arc<Ctx>, slot: Slot) {
    let slot: SlotCell = Arc::new(Mutex::new(Some(slot)));
    let mut shutdown = ctx.shutdown.clone();
    let header_timeout = Duration::from_secs(ctx.config.limits.http_header_timeout_secs.max(1));
    let service = hyper::service::service_fn(move |req| route(req, ctx.clone(), slot.clone()));
    let conn = hyper::server::conn::http1::Builder::new()
        .max_buf_size(64 * 1024)
        // Slowloris policy: the whole request head within `http_header_timeout_secs` (a
        // connection that sends nothing at all included), or hyper closes the connection.
        .header_read_timeout(header_timeout)
        .timer(hyper_util::rt::TokioTimer::new())
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = async { shutdown.wait_for(|stop| *stop).await.map(|_| ()) } => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "http connection ended with an error");
    }
}

fn respond(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// A JSON error body with the protocol's error code, counted in the metrics.
fn error(ctx: &Ctx, status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Response<Body> {
    ctx.metrics.error(code);
    let body = json!({ "error": { "code": code.name(), "message": message.into() } });
    respond(status, "application/json", body.to_string())
}

/// Constant-time comparison of the presented bearer token.
fn authorised(ctx: &Ctx, req: &Request<Incoming>) -> bool {
    let Some(token) = &ctx.token else { return true };
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    let (a, b) = (presented.as_bytes(), token.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn is_websocket_upgrade(req: &Request<Incoming>) -> bool {
    let has = |name: header::HeaderName, want: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(',').any(|p| p.trim().eq_ignore_ascii_case(want)))
    };
    req.method() == Method::GET && has(header::CONNECTION, "upgrade") && has(header::UPGRADE, "websocket")
}

/// Close the connection after this response.
fn closing(mut r: Response<Body>) -> Response<Body> {
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

async fn route(mut req: Request<Incoming>, ctx: Arc<Ctx>, slot: SlotCell) -> Result<Response<Body>, Infallible> {
    let refusing = matches!(*slot.lock().unwrap_or_else(|p| p.into_inner()), Some(Slot::Refusing { .. }));
    if refusing && !is_websocket_upgrade(&req) {
        let r = error(
            &ctx,
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::TooManyConnections,
            "the server is at its connection limit",
        );
        return Ok(closing(r));
    }
    // A request body this handler does not read would hold the connection open: answer, then
    // close it.
    let unread_body = !hyper::body::Body::is_end_stream(req.body());
    if !authorised(&ctx, &req) {
        tracing::debug!(path = req.uri().path(), "rejected: missing or wrong bearer token");
        let mut r = error(&ctx, StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized, "missing or wrong bearer token");
        r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return Ok(r);
    }
    if is_websocket_upgrade(&req) {
        return Ok(upgrade(&mut req, ctx, &slot));
    }
    let response = match (req.method(), req.uri().path()) {
        (&Method::POST, "/retrieve") => return Ok(retrieve(req, &ctx).await),
        (&Method::GET, "/health") => {
            let live = ctx.metrics.episodes_live.load(Ordering::Relaxed);
            let body = json!({ "status": "ok", "episodes_live": live, "backends": ctx.backends.names() });
            respond(StatusCode::OK, "application/json", body.to_string())
        }
        (&Method::GET, "/metrics") => {
            let mut text = ctx.metrics.render();
            crate::metrics::render_providers(&mut text, &ctx.backends.usage());
            respond(StatusCode::OK, "text/plain; version=0.0.4", text)
        }
        (_, "/retrieve" | "/health" | "/metrics") => {
            error(&ctx, StatusCode::METHOD_NOT_ALLOWED, ErrorCode::MalformedFrame, "method not allowed")
        }
        (_, path) => error(&ctx, StatusCode::NOT_FOUND, ErrorCode::MalformedFrame, format!("no route {path}")),
    };
    Ok(if unread_body { closing(response) } else { response })
}

fn upgrade(req: &mut Request<Incoming>, ctx: Arc<Ctx>, slot: &SlotCell) -> Response<Body> {
    // RFC 6455 §4.2.2: a version other than 13 gets 426 and the version this server speaks.
    let version = req.headers().get(header::SEC_WEBSOCKET_VERSION).map(|v| v.as_bytes().trim_ascii());
    if version != Some(b"13".as_slice()) {
        let shown = version.map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_else(|| "none".into());
        let mut r = error(
            &ctx,
            StatusCode::UPGRADE_REQUIRED,
            ErrorCode::MalformedFrame,
            format!("Sec-WebSocket-Version {shown}: this server speaks version 13"),
        );
        r.headers_mut().insert(header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
        return r;
    }
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY).map(|k| derive_accept_key(k.as_bytes())) else {
        return error(&ctx, StatusCode::BAD_REQUEST, ErrorCode::MalformedFrame, "missing Sec-WebSocket-Key");
    };
    let Some(slot) = slot.lock().unwrap_or_else(|p| p.into_inner()).take() else {
        return error(&ctx, StatusCode::BAD_REQUEST, ErrorCode::MalformedFrame, "connection already upgraded");
    };
    let on_upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let config = ws_config(ctx.config.limits.max_frame_bytes);
                let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config)).await;
                serve_ws(ws, ctx, slot).await;
            }
            Err(e) => tracing::debug!(error = %e, "websocket upgrade failed"),
        }
    });
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(v) = HeaderValue::from_str(&key) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    r
}

/// `POST /retrieve`: `{queries | query, topk, return_scores}` -> `{result: [[...]]}`, with
/// `{document, score}` items when `return_scores` is true and bare documents otherwise.
async fn retrieve(req: Request<Incoming>, ctx: &Ctx) -> Response<Body> {
    ctx.metrics.retrieve_requests.fetch_add(1, Ordering::Relaxed);
    let limits = &ctx.config.limits;
    // The body must arrive in full within the request deadline (the head had its own).
    let deadline = Duration::from_secs(limits.http_request_timeout_secs.max(1));
    let body =
        match tokio::time::timeout(deadline, Limited::new(req.into_body(), limits.max_frame_bytes).collect()).await {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(_)) => {
                let r = error(
                    ctx,
                    StatusCode::PAYLOAD_TOO_LARGE,
                    ErrorCode::FrameTooLarge,
                    format!("body over {} bytes", limits.max_frame_bytes),
                );
                return closing(r);
            }
            Err(_) => {
                let r = error(
                    ctx,
                    StatusCode::REQUEST_TIMEOUT,
                    ErrorCode::MalformedFrame,
                    format!("the request body did not arrive within {} s", deadline.as_secs()),
                );
                return closing(r);
            }
        };
    let parsed: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(ctx, StatusCode::BAD_REQUEST, ErrorCode::MalformedFrame, format!("invalid JSON: {e}")),
    };
    let queries: Vec<String> = match (parsed.get("queries"), parsed.get("query")) {
        (Some(Value::Array(qs)), _) => match qs.iter().map(|q| q.as_str().map(str::to_owned)).collect() {
            Some(qs) => qs,
            None => {
                return error(ctx, StatusCode::BAD_REQUEST, ErrorCode::MalformedFrame, "`queries` must hold strings");
            }
        },
        (None, Some(Value::String(q))) => vec![q.clone()],
        _ => {
            return error(
                ctx,
                StatusCode::BAD_REQUEST,
                ErrorCode::MalformedFrame,
                "expected `queries` (list) or `query`",
            );
        }
    };
    if queries.len() > limits.max_retrieve_queries {
        return error(
            ctx,
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::BatchTooLarge,
            format!("{} queries; the limit is {}", queries.len(), limits.max_retrieve_queries),
        );
    }
    if let Some(q) = queries.iter().find(|q| q.chars().count() > limits.max_query_chars) {
        return error(
            ctx,
            StatusCode::BAD_REQUEST,
            ErrorCode::ActionTooLong,
            format!("query of {} characters; the limit is {}", q.chars().count(), limits.max_query_chars),
        );
    }
    // `topk` (or `top_k`): absent or null means the server default; anything else must be a
    // whole number from 1 to the limit. A value that would be read as something else (`-1`,
    // `"3"`, `1.5`, 2^64) is refused, not replaced by the default.
    let topk = match parsed.get("topk").or_else(|| parsed.get("top_k")) {
        None | Some(Value::Null) => (ctx.config.episodes.topk as usize).min(limits.max_topk as usize),
        Some(v) => match v.as_u64() {
            Some(k) if k >= 1 && k <= u64::from(limits.max_topk) => k as usize,
            Some(k) if k >= 1 => {
                return error(
                    ctx,
                    StatusCode::BAD_REQUEST,
                    ErrorCode::MalformedFrame,
                    format!("`topk` {k} is over the limit of {}", limits.max_topk),
                );
            }
            _ => {
                return error(
                    ctx,
                    StatusCode::BAD_REQUEST,
                    ErrorCode::MalformedFrame,
                    format!("`topk` must be a whole number from 1 to {}, not {v}", limits.max_topk),
                );
            }
        },
    };
    let with_scores = match parsed.get("return_scores") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return error(
                ctx,
                StatusCode::BAD_REQUEST,
                ErrorCode::MalformedFrame,
                format!("`return_scores` must be true or false, not {v}"),
            );
        }
    };
    if queries.is_empty() {
        return respond(StatusCode::OK, "application/json", json!({ "result": [] }).to_string());
    }
    let started = std::time::Instant::now();
    let hits = match ctx.backends.default_backend().search(queries, topk).await {
        Ok(h) => h,
        Err(e) => {
            return error(ctx, StatusCode::BAD_GATEWAY, ErrorCode::BackendError, e.to_string());
        }
    };
    ctx.metrics.search_latency.observe(started.elapsed());
    let result: Vec<Vec<Value>> = hits
        .into_iter()
        .map(|per_query| {
            per_query
                .into_iter()
                .map(|h| {
                    let doc = json!({ "id": h.id, "contents": h.contents });
                    if with_scores { json!({ "document": doc, "score": h.score }) } else { doc }
                })
                .collect()
        })
        .collect();
    respond(StatusCode::OK, "application/json", json!({ "result": result }).to_string())
}
