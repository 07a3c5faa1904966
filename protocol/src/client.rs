//! An async client: one WebSocket connection, many requests in flight, replies matched to their
//! requests by id whatever order they come back in.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::{SinkExt, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::{self, Message, client::IntoClientRequest, http::HeaderValue};

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

/// Waiters by request id; `None` once the connection is gone.
type Pending = Arc<Mutex<Option<HashMap<RequestId, oneshot::Sender<Response>>>>>;

/// A connected, handshaken client. Cheap to share behind an `Arc`; every method takes `&self`.
#[derive(Debug)]
pub struct Client {
    outgoing: mpsc::Sender<Message>,
    pending: Pending,
    next_id: AtomicU64,
    welcome: Welcome,
}

/// How to connect.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// Sent as `Authorization: Bearer <token>` on the WebSocket handshake.
    pub token: Option<String>,
    /// Shown in the server's logs.
    pub name: Option<String>,
}

impl Client {
    /// Connect to `ws://host:port/...` and perform the `Hello` handshake.
    pub async fn connect(url: &str, options: ClientOptions) -> Result<Client, ClientError> {
        let mut request = url.into_client_request()?;
        if let Some(token) = &options.token {
            let value = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| ClientError::BadRequest("token is not a valid header value".into()))?;
            request.headers_mut().insert("authorization", value);
        }
        let config = tungstenite::protocol::WebSocketConfig::default().read_buffer_size(4096).write_buffer_size(4096);
        let (ws, _) = tokio_tungstenite::connect_async_with_config(request, Some(config), true).await?;
        let (mut sink, mut stream) = ws.split();
        let (outgoing, mut rx) = mpsc::channel::<Message>(1024);
        let pending: Pending = Arc::new(Mutex::new(Some(HashMap::new())));
        tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                if sink.send(msg).await.is_err() {
                    break;
                }
            }
            let _ = sink.close().await;
        });
        let reader_pending = pending.clone();
        tokio::spawn(async move {
            while let Some(Ok(msg)) = stream.next().await {
                let Message::Binary(bytes) = msg else { continue };
                let Ok(env) = decode_response(&bytes) else { continue };
                let waiter = reader_pending.lock().ok().and_then(|mut p| p.as_mut()?.remove(&env.id));
                if let Some(waiter) = waiter {
                    let _ = waiter.send(env.msg);
                }
            }
            // Wake every waiter, and refuse new requests: the connection is gone.
            if let Ok(mut p) = reader_pending.lock() {
                *p = None;
            }
        });
        let mut client = Client {
            outgoing,
            pending,
            next_id: AtomicU64::new(1),
            welcome: Welcome {
                protocol_version: 0,
                server: String::new(),
                limits: Limits {
                    max_frame_bytes: 0,
                    max_episodes_per_connection: 0,
                    max_episodes_total: 0,
                    max_batch: 0,
                    max_forks_per_request: 0,
                    max_action_chars: 0,
                    max_query_chars: 0,
                    max_turns: 0,
                    idle_timeout_ms: 0,
                    connection_idle_ms: 0,
                },
            },
        };
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            client: options.name.unwrap_or_else(|| format!("grove-protocol/{}", env!("CARGO_PKG_VERSION"))),
        };
        match client.request(Request::Hello(hello)).await? {
            Response::Welcome(w) => client.welcome = w,
            other => return Err(ClientError::Unexpected { request: "Hello", reply: Box::new(other) }),
        }
        Ok(client)
    }

    /// What the server said in its `Welcome`, including its limits.
    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    /// Send one request and wait for its reply. An `Error` reply becomes `ClientError::Server`.
    pub async fn request(&self, msg: Request) -> Result<Response, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let bytes = encode(&Envelope::new(id, msg))?;
        let (tx, rx) = oneshot::channel();
        self.pending.lock().map_err(|_| ClientError::Closed)?.as_mut().ok_or(ClientError::Closed)?.insert(id, tx);
        if self.outgoing.send(Message::Binary(bytes.into())).await.is_err() {
            return Err(ClientError::Closed);
        }
        match rx.await.map_err(|_| ClientError::Closed)? {
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
        let action = StepAction { episode, action: Action::Text(text.to_string()) };
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

    pub async fn ping(&self, nonce: u64) -> Result<u64, ClientError> {
        match self.request(Request::Ping(Ping { nonce })).await? {
            Response::Pong(p) => Ok(p.nonce),
            other => Err(ClientError::Unexpected { request: "Ping", reply: Box::new(other) }),
        }
    }
}
