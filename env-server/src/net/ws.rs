//! One WebSocket connection: a reader task that checks and forwards frames, and a writer task
//! that encodes replies. The reader holds one permit per request in flight, so a client that
//! floods requests without reading replies is simply not read from any more.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use grove_protocol::{ErrorCode, Request, Response, decode_request};
use hyper::body::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::session::RingCell;
use super::{Ctx, DriverInput, Outgoing, Payload, Slot, error_reply};

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

pub(crate) async fn serve<S>(ws: WebSocketStream<S>, ctx: Arc<Ctx>, slot: Slot)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = ws.split();
    let Slot::Budget(_slot) = slot else {
        // Over the connection limit: say so in the protocol's terms, then close.
        let reply = error_reply(None, ErrorCode::TooManyConnections, "the server is at its connection limit");
        ctx.metrics.error(ErrorCode::TooManyConnections);
        if let Payload::Reply(env) = &reply.payload
            && let Ok(bytes) = grove_protocol::encode(env)
        {
            let _ = sink.send(Message::Binary(bytes.into())).await;
        }
        let _ = sink.close().await;
        return;
    };
    let conn = ctx.new_conn_id();
    let limits = &ctx.config.limits;
    let in_flight = Arc::new(Semaphore::new(limits.max_in_flight_per_connection));
    // Room for every counted reply, as many uncounted ones (replies rerouted or replayed after
    // a reattach), and the reader's own error replies.
    let (tx, rx) = mpsc::channel::<Outgoing>(2 * limits.max_in_flight_per_connection + 64);
    // Ends the connection from either task or from the sim thread (a reattach elsewhere).
    let kill = Arc::new(watch::channel(false).0);
    let ring: RingCell = Arc::default();
    let open = DriverInput::Open { conn, tx: tx.clone(), kill: kill.clone(), ring: ring.clone() };
    if ctx.driver.send(open).await.is_err() {
        return;
    }
    ctx.metrics.connections.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::debug!(conn, "connection opened");

    let write_timeout = Duration::from_secs(limits.write_timeout_secs.max(1));
    let mut writer = tokio::spawn(write_replies(
        sink,
        rx,
        WriterCtx { permits: in_flight.clone(), metrics: ctx.metrics.clone(), kill: kill.clone(), ring, write_timeout },
    ));

    // The reader's own replies (error replies) take an in-flight permit too, given back when
    // written, exactly like forwarded requests. Without it, error replies piling up behind a
    // blocked writer (a client pipelining bad frames without reading) could fill the reply
    // channel, and the sim's replies, which are sent with `try_send`, would be held back.
    let local_tx = tx;
    let send_local = |reply: Outgoing| {
        let (tx, in_flight, metrics) = (local_tx.clone(), in_flight.clone(), ctx.metrics.clone());
        async move {
            let Ok(permit) = in_flight.acquire_owned().await else { return false };
            permit.forget();
            if let Payload::Reply(env) = &reply.payload {
                super::count_errors(&env.msg, &metrics);
            }
            tx.send(Outgoing { counted: true, ..reply }).await.is_ok()
        }
    };
    let mut shutdown = ctx.shutdown.clone();
    let mut killed = kill.subscribe();
    let idle = Duration::from_secs(limits.connection_idle_secs);
    let mut handshaken = false;
    // A Close frame with code 1000 (or none) is a goodbye: the session ends now. Anything else (a
    // drop, a reset, a time-out, another close code) waits for a reattach.
    let mut goodbye = false;
    loop {
        let next = tokio::select! {
            _ = shutdown.changed() => {
                let _ = local_tx.send(error_reply(None, ErrorCode::ShuttingDown, "the server is shutting down")).await;
                break;
            }
            _ = dead(&mut killed) => break,
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
                    let _ = local_tx.send(error_reply(None, ErrorCode::FrameTooLarge, format!("{c}; closing"))).await;
                }
                tracing::debug!(conn, error = %e, "connection error");
                break;
            }
            Ok(Some(Ok(msg))) => msg,
        };
        let bytes = match msg {
            Message::Binary(b) => b,
            Message::Close(frame) => {
                goodbye = frame.as_ref().is_none_or(|f| f.code == CloseCode::Normal);
                break;
            }
            // Heartbeats: tungstenite answers pings itself; any frame resets the idle clock.
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
        let local = match (env.msg, handshaken) {
            (Request::Hello(h), false) if h.protocol_version == grove_protocol::PROTOCOL_VERSION => {
                tracing::debug!(conn, client = %h.client, resume = h.resume.is_some(), "handshake");
                // The sim thread owns sessions: it opens one or reattaches this connection to
                // an old one, and sends the Welcome (then any replayed replies).
                let (done, answer) = oneshot::channel();
                let hello = DriverInput::Hello { conn, id: env.id, resume: h.resume, done };
                if ctx.driver.send(hello).await.is_err() {
                    break;
                }
                tokio::select! {
                    ok = answer => handshaken = ok.unwrap_or(false),
                    _ = dead(&mut killed) => break,
                }
                continue;
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
            (request, true) => {
                // Backpressure: wait for a free in-flight slot before forwarding. The writer
                // closes the semaphore when it stops, so a reader never waits for a dead one.
                let permit = tokio::select! {
                    p = in_flight.clone().acquire_owned() => p,
                    _ = dead(&mut killed) => break,
                };
                let Ok(permit) = permit else { break };
                permit.forget();
                if ctx.driver.send(DriverInput::Request { conn, id: env.id, request }).await.is_err() {
                    break;
                }
                None
            }
        };
        if let Some(r) = local
            && !send_local(r).await
        {
            break;
        }
    }
    // From now on the session's replies are held for a reattach; let the writer flush what is
    // queued (bounded), then stop it, and only then tell the sim thread the connection is gone
    // (a reattach waiting for this connection then sees every reply it did not write).
    let _ = ctx.driver.send(DriverInput::Detach { conn }).await;
    drop(local_tx);
    if tokio::time::timeout(Duration::from_secs(2), &mut writer).await.is_err() {
        kill.send_replace(true);
        let _ = writer.await;
    }
    let _ = ctx.driver.send(DriverInput::Closed { conn, goodbye }).await;
    ctx.metrics.connections.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    tracing::debug!(conn, "connection closed");
}

struct WriterCtx {
    permits: Arc<Semaphore>,
    metrics: Arc<crate::metrics::Metrics>,
    kill: Arc<watch::Sender<bool>>,
    ring: RingCell,
    write_timeout: Duration,
}

/// Encode and write replies until the channel closes, a write fails or stalls past the write
/// timeout, or the connection is killed. Every reply handed to the socket is kept in the
/// session's replay ring; the ones still queued when the writer stops are put there unwritten.
async fn write_replies<S>(
    mut sink: futures_util::stream::SplitSink<WebSocketStream<S>, Message>,
    mut rx: mpsc::Receiver<Outgoing>,
    w: WriterCtx,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut killed = w.kill.subscribe();
    let encode = |out: Outgoing, metrics: &crate::metrics::Metrics| -> Option<Bytes> {
        match out.payload {
            Payload::Replay(bytes) => Some(bytes),
            Payload::Reply(env) => {
                if !out.counted {
                    super::count_errors(&env.msg, metrics);
                }
                match grove_protocol::encode(&env) {
                    Ok(b) => {
                        let bytes = Bytes::from(b);
                        // A Welcome is no request's reply; everything else may be owed again.
                        if !matches!(env.msg, Response::Welcome(_))
                            && let Some(ring) = w.ring.get()
                        {
                            ring.lock().unwrap_or_else(|p| p.into_inner()).push(env.id, bytes.clone());
                        }
                        Some(bytes)
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot encode a reply");
                        None
                    }
                }
            }
        }
    };
    loop {
        let out = tokio::select! {
            biased;
            _ = dead(&mut killed) => break,
            out = rx.recv() => match out { Some(o) => o, None => break },
        };
        let counted = out.counted;
        let Some(bytes) = encode(out, &w.metrics) else { continue };
        if counted {
            w.permits.add_permits(1);
        }
        let sent = tokio::select! {
            _ = dead(&mut killed) => false,
            r = tokio::time::timeout(w.write_timeout, sink.send(Message::Binary(bytes))) => matches!(r, Ok(Ok(()))),
        };
        if !sent {
            break;
        }
    }
    // Nothing more is written: what is queued goes to the replay ring, a reader waiting for a
    // permit wakes up to a closed semaphore, and the reader stops.
    rx.close();
    while let Ok(out) = rx.try_recv() {
        let _ = encode(out, &w.metrics);
    }
    w.permits.close();
    w.kill.send_replace(true);
    let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
}

/// Resolves once the connection has been killed (or its kill switch is gone).
async fn dead(killed: &mut watch::Receiver<bool>) {
    let _ = killed.wait_for(|k| *k).await;
}
