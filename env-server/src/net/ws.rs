//! One WebSocket connection: a reader task that checks and forwards frames, and a writer task
//! that encodes replies. The reader holds one permit per request in flight, so a client that
//! floods requests without reading replies is simply not read from any more.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use grove_protocol::{ErrorCode, Request, Response, decode_request};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use super::{Ctx, DriverInput, Outgoing, error_reply};

/// Small buffers: a connection costs a few KiB, not the 128 KiB default per buffer. Frames up to
/// 4x the protocol limit are read (and answered with `frame_too_large`); larger ones end the
/// connection.
pub(crate) fn ws_config(max_frame_bytes: usize) -> WebSocketConfig {
    let hard = max_frame_bytes.saturating_mul(4).max(64 * 1024);
    WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0)
        .max_message_size(Some(hard))
        .max_frame_size(Some(hard))
}

pub(crate) async fn serve<S>(ws: WebSocketStream<S>, ctx: Arc<Ctx>, slot: Option<OwnedSemaphorePermit>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = ws.split();
    let Some(_slot) = slot else {
        // Over the connection limit: say so in the protocol's terms, then close.
        let reply = error_reply(None, ErrorCode::TooManyConnections, "the server is at its connection limit");
        ctx.metrics.error(ErrorCode::TooManyConnections);
        if let Ok(bytes) = grove_protocol::encode(&reply.envelope) {
            let _ = sink.send(Message::Binary(bytes.into())).await;
        }
        let _ = sink.close().await;
        return;
    };
    let conn = ctx.new_conn_id();
    let limits = &ctx.config.limits;
    let in_flight = Arc::new(Semaphore::new(limits.max_in_flight_per_connection));
    // Room for every counted reply plus the reader's own error replies.
    let (tx, mut rx) = mpsc::channel::<Outgoing>(limits.max_in_flight_per_connection + 64);
    if ctx.driver.send(DriverInput::Open { conn, tx: tx.clone() }).await.is_err() {
        return;
    }
    ctx.metrics.connections.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::debug!(conn, "connection opened");

    let writer_permits = in_flight.clone();
    let metrics = ctx.metrics.clone();
    let writer = tokio::spawn(async move {
        while let Some(out) = rx.recv().await {
            if !out.counted {
                super::count_errors(&out.envelope.msg, &metrics);
            }
            let bytes = match grove_protocol::encode(&out.envelope) {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(error = %e, "cannot encode a reply");
                    continue;
                }
            };
            if out.counted {
                writer_permits.add_permits(1);
            }
            if sink.send(Message::Binary(bytes.into())).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });

    // The reader's own replies (Welcome and error replies) take an in-flight permit too, given
    // back when written, exactly like forwarded requests. Without it, error replies piling up
    // behind a blocked writer (a client pipelining bad frames without reading) could fill the
    // reply channel, and the sim's replies, which are sent with `try_send`, would be dropped:
    // requests silently unanswered and their permits lost for good.
    let send_local = |reply: Outgoing| {
        let (tx, in_flight, metrics) = (tx.clone(), in_flight.clone(), ctx.metrics.clone());
        async move {
            let Ok(permit) = in_flight.acquire_owned().await else { return false };
            permit.forget();
            super::count_errors(&reply.envelope.msg, &metrics);
            tx.send(Outgoing { counted: true, ..reply }).await.is_ok()
        }
    };
    let mut shutdown = ctx.shutdown.clone();
    let idle = Duration::from_secs(limits.connection_idle_secs);
    let mut handshaken = false;
    loop {
        let next = tokio::select! {
            _ = shutdown.changed() => {
                let _ = tx.send(error_reply(None, ErrorCode::ShuttingDown, "the server is shutting down")).await;
                break;
            }
            next = tokio::time::timeout(idle, stream.next()) => next,
        };
        let msg = match next {
            Err(_) => {
                tracing::debug!(conn, "idle connection closed");
                break;
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                use tokio_tungstenite::tungstenite::Error as WsError;
                if let WsError::Capacity(c) = &e {
                    let _ = tx.send(error_reply(None, ErrorCode::FrameTooLarge, format!("{c}; closing"))).await;
                }
                tracing::debug!(conn, error = %e, "connection error");
                break;
            }
            Ok(Some(Ok(msg))) => msg,
        };
        let bytes = match msg {
            Message::Binary(b) => b,
            Message::Close(_) => break,
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
            Message::Text(_) => {
                let r = error_reply(None, ErrorCode::UnsupportedFrame, "frames must be binary MessagePack, not text");
                if !send_local(r).await {
                    break;
                }
                continue;
            }
        };
        if bytes.len() > limits.max_frame_bytes {
            let id = grove_protocol::peek_id(&bytes);
            let r = error_reply(
                id,
                ErrorCode::FrameTooLarge,
                format!("frame of {} bytes; the limit is {}", bytes.len(), limits.max_frame_bytes),
            );
            if !send_local(r).await {
                break;
            }
            continue;
        }
        let env = match decode_request(&bytes) {
            Ok(env) => env,
            Err(e) => {
                if !send_local(error_reply(e.id, ErrorCode::MalformedFrame, e.to_string())).await {
                    break;
                }
                continue;
            }
        };
        let local = match (&env.msg, handshaken) {
            (Request::Hello(h), false) if h.protocol_version == grove_protocol::PROTOCOL_VERSION => {
                handshaken = true;
                tracing::debug!(conn, client = %h.client, "handshake");
                Some(Outgoing {
                    envelope: grove_protocol::Envelope::new(env.id, Response::Welcome(ctx.welcome.clone())),
                    counted: false,
                })
            }
            (Request::Hello(h), false) => Some(error_reply(
                Some(env.id),
                ErrorCode::UnsupportedVersion,
                format!(
                    "protocol version {} is not supported; this server speaks {}",
                    h.protocol_version,
                    grove_protocol::PROTOCOL_VERSION
                ),
            )),
            (_, false) => Some(error_reply(Some(env.id), ErrorCode::HandshakeRequired, "send Hello first")),
            (Request::Hello(_), true) => {
                Some(error_reply(Some(env.id), ErrorCode::HandshakeRequired, "Hello was already sent"))
            }
            (_, true) => None,
        };
        if let Some(r) = local {
            if !send_local(r).await {
                break;
            }
            continue;
        }
        // Backpressure: wait for a free in-flight slot before forwarding.
        let Ok(permit) = in_flight.clone().acquire_owned().await else { break };
        permit.forget();
        if ctx.driver.send(DriverInput::Request { conn, id: env.id, request: env.msg }).await.is_err() {
            break;
        }
    }
    let _ = ctx.driver.send(DriverInput::Closed { conn }).await;
    drop(tx);
    // Let the writer flush what is queued (bounded), then stop it.
    let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
    ctx.metrics.connections.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    tracing::debug!(conn, "connection closed");
}
