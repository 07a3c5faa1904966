//! An async client: one WebSocket connection, many requests in flight, replies matched to their
//! requests by id whatever order they come back in.
//!
//! The connection survives a blip: the client sends a WebSocket ping whenever it has been silent
//! for the server's heartbeat period, treats a connection that brings back nothing for twice
//! that as dropped, and on a drop reconnects (a bounded number of tries, with backoff) and
//! reattaches to its session with the token from the `Welcome`, listing the requests it still
//! waits for. The server replays the replies it holds for them and names the ones it never
//! received, which the client sends again with the same ids; every request is answered exactly
//! once. If the session cannot be reattached, every waiting request fails with
//! [`ClientError::Disconnected`], which says why.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::{self, Bytes, Message, client::IntoClientRequest, http::HeaderValue};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::*;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("websocket: {0}")]
    WebSocket(#[from] tungstenite::Error),
    #[error("invalid server url or token: {0}")]
    BadRequest(String),
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The server answered with an error reply.
    #[error("server error: {0}")]
    Server(ErrorInfo),
    #[error("unexpected reply to {request}: {reply:?}")]
    Unexpected { request: &'static str, reply: Box<Response> },
    #[error("connection closed")]
    Closed,
    /// The connection dropped and could not be reattached; the text says what was tried.
    #[error("disconnected: {0}")]
    Disconnected(String),
}

impl ClientError {
    /// The server's error code, when the server sent one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Server(e) => Some(e.code),
            _ => None,
        }
    }
}
/// A request waiting for its reply, with its frame for sending it again after a reattach.
struct Waiter {
    reply: oneshot::Sender<Response>,
    frame: Bytes,
    /// Handed to a connection (so a reattach lists it as pending); requests still queued are
    /// simply sent on the new connection.
    sent: bool,
}

/// State shared by the client handle and its connection task.
#[derive(Default)]
struct Shared {
    /// Waiters by request id; `None` once the client is closed for good.
    pending: Mutex<Option<HashMap<RequestId, Waiter>>>,
    /// Why the client closed, for the errors of requests made afterwards.
    closed_because: Mutex<Option<String>>,
    reconnects: AtomicU64,
    replayed: AtomicU64,
    resent: AtomicU64,
    next_id: AtomicU64,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<HashMap<RequestId, Waiter>>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deliver(&self, env: Envelope<Response>) {
        // A reply for an id nobody waits for (a duplicate after a replay) is dropped.
        if let Some(w) = self.lock().as_mut().and_then(|p| p.remove(&env.id)) {
            let _ = w.reply.send(env.msg);
        }
    }

    /// Fail every waiter and refuse new requests.
    fn close(&self, why: String) {
        *self.closed_because.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        self.lock().take();
    }

    fn error(&self) -> ClientError {
        match self.closed_because.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            Some(why) => ClientError::Disconnected(why),
            None => ClientError::Closed,
        }
    }
}

/// A connected, handshaken client. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Client {
    outgoing: mpsc::Sender<RequestId>,
    shared: Arc<Shared>,
    welcome: Welcome,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("server", &self.welcome.server).finish_non_exhaustive()
    }
}

/// How to connect.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// Sent as `Authorization: Bearer <token>` on the WebSocket handshake.
    pub token: Option<String>,
    /// Shown in the server's logs.
    pub name: Option<String>,
    /// What to do when the connection drops.
    pub reconnect: Reconnect,
}

/// Reconnection after a drop.
#[derive(Debug, Clone)]
pub struct Reconnect {
    /// Connection attempts after a drop before giving up (0: no reattach; a drop fails every
    /// waiting request).
    pub tries: u32,
    /// The wait before the first attempt, doubled after each failure up to `max_delay`.
    pub first_delay: Duration,
    pub max_delay: Duration,
    /// The heartbeat period; `None` takes the server's (`Limits::heartbeat_ms`).
    pub heartbeat: Option<Duration>,
}

impl Default for Reconnect {
    fn default() -> Self {
        Reconnect {
            tries: 8,
            first_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(5),
            heartbeat: None,
        }
    }
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Open the WebSocket (no handshake yet).
async fn open(url: &str, options: &ClientOptions) -> Result<Ws, ClientError> {
    let mut request = url.into_client_request()?;
    if let Some(token) = &options.token {
        let value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| ClientError::BadRequest("token is not a valid header value".into()))?;
        request.headers_mut().insert("authorization", value);
    }
    let config = tungstenite::protocol::WebSocketConfig::default().read_buffer_size(4096).write_buffer_size(4096);
    let (ws, _) = tokio_tungstenite::connect_async_with_config(request, Some(config), true).await?;
    Ok(ws)
}

/// Send `Hello` and wait for its reply; frames before it (none are expected) are delivered.
async fn handshake(ws: &mut Ws, shared: &Shared, hello: Hello) -> Result<Welcome, ClientError> {
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let bytes = encode(&Envelope::new(id, Request::Hello(hello)))?;
    ws.send(Message::Binary(bytes.into())).await?;
    loop {
        let msg = match ws.next().await {
            Some(Ok(msg)) => msg,
            Some(Err(e)) => return Err(e.into()),
            None => return Err(ClientError::Closed),
        };
        let Message::Binary(bytes) = msg else { continue };
        let Ok(env) = decode_response(&bytes) else { continue };
        if env.id != id {
            shared.deliver(env);
            continue;
        }
        return match env.msg {
            Response::Welcome(w) => Ok(w),
            Response::Error(e) => Err(ClientError::Server(e)),
            other => Err(ClientError::Unexpected { request: "Hello", reply: Box::new(other) }),
        };
    }
}

impl Client {
    /// Connect to `ws://host:port/...` and perform the `Hello` handshake.
    pub async fn connect(url: &str, options: ClientOptions) -> Result<Client, ClientError> {
        let shared = Arc::new(Shared { next_id: AtomicU64::new(1), ..Default::default() });
        *shared.lock() = Some(HashMap::new());
        let mut ws = open(url, &options).await?;
        let name = options.name.clone().unwrap_or_else(|| format!("grove-protocol/{}", env!("CARGO_PKG_VERSION")));
        let hello = Hello { protocol_version: PROTOCOL_VERSION, client: name.clone(), resume: None };
        let welcome = handshake(&mut ws, &shared, hello).await?;
        let (outgoing, rx) = mpsc::channel::<RequestId>(1024);
        let conn = Connection { url: url.to_owned(), options, name, welcome: welcome.clone(), shared: shared.clone() };
        tokio::spawn(conn.run(ws, rx));
        Ok(Client { outgoing, shared, welcome })
    }

    /// How many times the connection dropped and was reattached.
    pub fn reconnects(&self) -> u64 {
        self.shared.reconnects.load(Ordering::Relaxed)
    }

    /// Over all reattaches: replies the server replayed, and requests sent again because the
    /// server never received them.
    pub fn recovered(&self) -> (u64, u64) {
        (self.shared.replayed.load(Ordering::Relaxed), self.shared.resent.load(Ordering::Relaxed))
    }

    /// What the server said in its `Welcome`, including its limits.
    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    /// Send one request and wait for its reply. An `Error` reply becomes `ClientError::Server`.
    pub async fn request(&self, msg: Request) -> Result<Response, ClientError> {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = Bytes::from(encode(&Envelope::new(id, msg))?);
        let (tx, rx) = oneshot::channel();
        match self.shared.lock().as_mut() {
            Some(p) => p.insert(id, Waiter { reply: tx, frame, sent: false }),
            None => return Err(self.shared.error()),
        };
        if self.outgoing.send(id).await.is_err() {
            return Err(self.shared.error());
        }
        match rx.await.map_err(|_| self.shared.error())? {
            Response::Error(e) => Err(ClientError::Server(e)),
            other => Ok(other),
        }
    }

    pub async fn create_episodes(
        &self,
        tasks: Vec<TaskSpec>,
        options: EpisodeOptions,
    ) -> Result<Vec<Result<EpisodeStart, ErrorInfo>>, ClientError> {
        match self.request(Request::CreateEpisodes(CreateEpisodes { tasks, options })).await? {
            Response::EpisodesCreated(c) => Ok(c.episodes),
            other => Err(ClientError::Unexpected { request: "CreateEpisodes", reply: Box::new(other) }),
        }
    }

    pub async fn step(&self, actions: Vec<StepAction>) -> Result<Vec<Result<Observation, ErrorInfo>>, ClientError> {
        match self.request(Request::Step(Step { actions })).await? {
            Response::Stepped(s) => Ok(s.results),
            other => Err(ClientError::Unexpected { request: "Step", reply: Box::new(other) }),
        }
    }

    /// Step one episode with model text.
    pub async fn step_text(&self, episode: EpisodeId, text: &str) -> Result<Observation, ClientError> {
        let action = StepAction { episode, action: Action::Text(text.to_string()), data: None };
        let mut results = self.step(vec![action]).await?;
        match results.pop() {
            Some(Ok(obs)) => Ok(obs),
            Some(Err(e)) => Err(ClientError::Server(e)),
            None => Err(ClientError::Closed),
        }
    }

    pub async fn fork(&self, forks: Vec<ForkSpec>) -> Result<Vec<Result<ForkResult, ErrorInfo>>, ClientError> {
        match self.request(Request::Fork(Fork { forks })).await? {
            Response::Forked(f) => Ok(f.results),
            other => Err(ClientError::Unexpected { request: "Fork", reply: Box::new(other) }),
        }
    }

    pub async fn close(&self, episodes: Vec<EpisodeId>) -> Result<Vec<Result<EpisodeId, ErrorInfo>>, ClientError> {
        match self.request(Request::Close(Close { episodes })).await? {
            Response::Closed(c) => Ok(c.results),
            other => Err(ClientError::Unexpected { request: "Close", reply: Box::new(other) }),
        }
    }

    pub async fn transcript(&self, episode: EpisodeId) -> Result<Transcript, ClientError> {
        match self.request(Request::GetTranscript(GetTranscript { episode })).await? {
            Response::Transcript(t) => Ok(t),
            other => Err(ClientError::Unexpected { request: "GetTranscript", reply: Box::new(other) }),
        }
    }

    pub async fn stats(&self) -> Result<ServerStats, ClientError> {
        match self.request(Request::Stats).await? {
            Response::Stats(s) => Ok(s),
            other => Err(ClientError::Unexpected { request: "Stats", reply: Box::new(other) }),
        }
    }

    /// Join a forest as its next row (PROTOCOL.md §8.7); an expansion's reply waits until its
    /// node is ready.
    pub async fn join_forest(&self, join: JoinForest) -> Result<ForestRole, ClientError> {
        match self.request(Request::JoinForest(join)).await? {
            Response::ForestJoined(r) => Ok(r),
            other => Err(ClientError::Unexpected { request: "JoinForest", reply: Box::new(other) }),
        }
    }

    pub async fn ping(&self, nonce: u64) -> Result<u64, ClientError> {
        match self.request(Request::Ping(Ping { nonce })).await? {
            Response::Pong(p) => Ok(p.nonce),
            other => Err(ClientError::Unexpected { request: "Ping", reply: Box::new(other) }),
        }
    }
}

/// The task that owns the WebSocket: writes requests, reads replies, keeps the heartbeat, and
/// reattaches after a drop.
struct Connection {
    url: String,
    options: ClientOptions,
    name: String,
    welcome: Welcome,
    shared: Arc<Shared>,
}

enum Turn {
    Send(RequestId),
    Frame(Message),
    Done,
    Dropped(String),
    Ping,
}

impl Connection {
    fn heartbeat(&self) -> Option<Duration> {
        let announced = Duration::from_millis(self.welcome.limits.heartbeat_ms);
        self.options.reconnect.heartbeat.or((!announced.is_zero()).then_some(announced))
    }

    async fn run(mut self, mut ws: Ws, mut requests: mpsc::Receiver<RequestId>) {
        loop {
            let why = self.serve(&mut ws, &mut requests).await;
            let Some(why) = why else {
                // A normal closure (1000): the server ends the session now, not after its grace.
                let goodbye = tungstenite::protocol::CloseFrame {
                    code: tungstenite::protocol::frame::coding::CloseCode::Normal,
                    reason: "".into(),
                };
                let _ = ws.close(Some(goodbye)).await;
                self.shared.close("the client was dropped".into());
                return;
            };
            match self.reattach(&why).await {
                Ok(new) => ws = new,
                Err(e) => {
                    self.shared.close(e);
                    return;
                }
            }
        }
    }

    /// Serve one connection; `None` when the client handle is gone, else why it dropped.
    async fn serve(&mut self, ws: &mut Ws, requests: &mut mpsc::Receiver<RequestId>) -> Option<String> {
        let heartbeat = self.heartbeat();
        let mut last_sent = Instant::now();
        let mut last_heard = Instant::now();
        let far = Duration::from_secs(365 * 24 * 3600);
        loop {
            let ping_at = last_sent + heartbeat.unwrap_or(far);
            let dead_at = last_heard + heartbeat.map_or(far, |h| h * 2);
            let turn = tokio::select! {
                r = requests.recv() => r.map_or(Turn::Done, Turn::Send),
                m = ws.next() => match m {
                    Some(Ok(m)) => Turn::Frame(m),
                    Some(Err(e)) => Turn::Dropped(format!("read failed: {e}")),
                    None => Turn::Dropped("the server closed the connection".into()),
                },
                _ = tokio::time::sleep_until(ping_at) => Turn::Ping,
                _ = tokio::time::sleep_until(dead_at) => {
                    Turn::Dropped(format!("nothing heard for {:?} (heartbeat)", heartbeat.unwrap_or(far) * 2))
                }
            };
            match turn {
                Turn::Done => return None,
                Turn::Send(id) => {
                    let frame = match self.shared.lock().as_mut().and_then(|p| p.get_mut(&id)) {
                        Some(w) => {
                            w.sent = true;
                            w.frame.clone()
                        }
                        None => continue,
                    };
                    if let Err(e) = ws.send(Message::Binary(frame)).await {
                        // The request stays pending and is sent again after the reattach.
                        return Some(format!("write failed: {e}"));
                    }
                    last_sent = Instant::now();
                }
                Turn::Ping => {
                    if let Err(e) = ws.send(Message::Ping(Bytes::new())).await {
                        return Some(format!("heartbeat failed: {e}"));
                    }
                    last_sent = Instant::now();
                }
                Turn::Frame(msg) => {
                    last_heard = Instant::now();
                    match msg {
                        Message::Binary(bytes) => {
                            if let Ok(env) = decode_response(&bytes) {
                                // A connection-level error (no request's id) ends the session.
                                if env.id == 0
                                    && let Response::Error(e) = &env.msg
                                {
                                    return Some(format!("the server said {e}"));
                                }
                                self.shared.deliver(env);
                            }
                        }
                        Message::Close(_) => return Some("the server closed the connection".into()),
                        _ => {}
                    }
                }
                Turn::Dropped(why) => return Some(why),
            }
        }
    }

    /// Reconnect and reattach, with backoff; the new connection, or why it failed.
    async fn reattach(&mut self, why: &str) -> Result<Ws, String> {
        let policy = self.options.reconnect.clone();
        let Some(session) = self.welcome.session.clone().filter(|s| s.grace_ms > 0 && policy.tries > 0) else {
            return Err(format!("connection lost ({why}); the server offers no reattach"));
        };
        let mut delay = policy.first_delay;
        let mut last = String::new();
        for attempt in 1..=policy.tries {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(policy.max_delay);
            let mut ws = match open(&self.url, &self.options).await {
                Ok(ws) => ws,
                Err(e) => {
                    last = format!("attempt {attempt}: {e}");
                    continue;
                }
            };
            let pending: Vec<RequestId> = {
                let guard = self.shared.lock();
                let Some(p) = guard.as_ref() else { return Err("the client was closed".into()) };
                let mut ids: Vec<RequestId> = p.iter().filter(|(_, w)| w.sent).map(|(id, _)| *id).collect();
                ids.sort_unstable();
                ids
            };
            let hello = Hello {
                protocol_version: PROTOCOL_VERSION,
                client: self.name.clone(),
                resume: Some(Resume { token: session.token.clone(), pending }),
            };
            let welcome = match handshake(&mut ws, &self.shared, hello).await {
                Ok(w) => w,
                Err(ClientError::Server(e)) if e.code == ErrorCode::SessionExpired => {
                    return Err(format!("connection lost ({why}) and the session could not be reattached: {e}"));
                }
                Err(e) => {
                    last = format!("attempt {attempt}: {e}");
                    continue;
                }
            };
            let resend = welcome.resumed.as_ref().map(|r| r.resend.clone()).unwrap_or_default();
            let replayed = welcome.resumed.as_ref().map_or(0, |r| u64::from(r.replayed));
            let frames: Vec<Bytes> = {
                let guard = self.shared.lock();
                let Some(p) = guard.as_ref() else { return Err("the client was closed".into()) };
                resend.iter().filter_map(|id| p.get(id).map(|w| w.frame.clone())).collect()
            };
            let mut ok = true;
            for frame in frames {
                if let Err(e) = ws.send(Message::Binary(frame)).await {
                    last = format!("attempt {attempt}: resending failed: {e}");
                    ok = false;
                    break;
                }
            }
            if !ok {
                continue;
            }
            self.welcome = Welcome { session: welcome.session.or(Some(session.clone())), ..welcome };
            self.shared.reconnects.fetch_add(1, Ordering::Relaxed);
            self.shared.replayed.fetch_add(replayed, Ordering::Relaxed);
            self.shared.resent.fetch_add(resend.len() as u64, Ordering::Relaxed);
            return Ok(ws);
        }
        Err(format!("connection lost ({why}); {} reconnect attempts failed, the last: {last}", policy.tries))
    }
}
