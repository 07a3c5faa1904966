//! The network layer: one listener serving WebSocket (the protocol) and HTTP (`/retrieve`,
//! `/health`, `/metrics`), and the thread that owns the [`Sim`] and drives its ticks.
//!
//! Data flow: a connection's reader task decodes frames and sends requests to the sim thread over
//! a bounded channel (a slow sim slows readers down); the sim thread runs a tick whenever
//! something arrives, sends replies to each connection's bounded outbound channel, and hands
//! search batches to backends on the tokio runtime, whose results come back as messages.

mod http;
mod session;
mod ws;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use grove_protocol::{Envelope, ErrorCode, Request, RequestId, Response, Welcome};
use hyper::body::Bytes;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};

use crate::backends::Backends;
use crate::config::ServerConfig;
use crate::metrics::Metrics;
use crate::search::SearchError;
use crate::sim::{BatchId, ConnId, SearchResult, Sim, Tool};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
    #[error("the sim thread stopped unexpectedly")]
    SimThread,
}

/// A reply on its way to a connection. `counted` replies hold one in-flight permit of their
/// connection (replies of the sim to requests that arrived on it, and the reader's own replies)
/// and give it back when written; the writer counts the errors of uncounted ones in the metrics.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub payload: Payload,
    pub counted: bool,
}

#[derive(Debug)]
#[expect(clippy::large_enum_variant, reason = "one per reply in a bounded channel; boxing would allocate per reply")]
pub(crate) enum Payload {
    Reply(Envelope<Response>),
    /// A reply already encoded and written once, replayed after a reattach.
    Replay(Bytes),
}

pub(crate) enum DriverInput {
    Open {
        conn: ConnId,
        tx: mpsc::Sender<Outgoing>,
        kill: Arc<watch::Sender<bool>>,
        ring: session::RingCell,
    },
    /// A `Hello` of the right version; `done` says whether the connection is now handshaken.
    Hello {
        conn: ConnId,
        id: RequestId,
        resume: Option<grove_protocol::Resume>,
        done: oneshot::Sender<bool>,
    },
    Request {
        conn: ConnId,
        id: RequestId,
        request: Request,
    },
    /// The connection is closing; replies for its session are held from now on.
    Detach {
        conn: ConnId,
    },
    /// The connection has closed and its writer has stopped; `goodbye` when the client closed
    /// it normally (its session ends now instead of waiting for a reattach).
    Closed {
        conn: ConnId,
        goodbye: bool,
    },
}

struct SearchDone {
    batch: BatchId,
    result: SearchResult,
    elapsed: Duration,
}

/// Shared by every connection task.
pub(crate) struct Ctx {
    pub config: ServerConfig,
    pub token: Option<String>,
    pub driver: mpsc::Sender<DriverInput>,
    pub metrics: Arc<Metrics>,
    pub backends: Backends,
    pub shutdown: watch::Receiver<bool>,
    pub connection_slots: Arc<Semaphore>,
    /// Connections over the budget that are told so (a typed refusal) before they are closed;
    /// beyond these, connections are closed at accept.
    pub refusal_slots: Arc<Semaphore>,
    pub next_conn: AtomicU64,
}

impl Ctx {
    pub fn new_conn_id(&self) -> ConnId {
        self.next_conn.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// Serve until `shutdown` resolves. Tests bind `127.0.0.1:0` and pass the listener.
pub async fn run(
    listener: TcpListener,
    config: ServerConfig,
    backends: Backends,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServerError> {
    let metrics = Arc::new(Metrics::default());
    let (driver_tx, driver_rx) = mpsc::channel(4096);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut sim = Sim::new(config.limits.clone(), &config.episodes, backends.names());
    sim.configure_tools(&backends.renders(), backends.pages.is_some());
    let welcome = Welcome {
        protocol_version: grove_protocol::PROTOCOL_VERSION,
        server: format!("grove-env-server/{}", env!("CARGO_PKG_VERSION")),
        limits: config.limits.to_wire(config.episodes.max_turns),
        session: None,
        resumed: None,
    };
    let sessions = session::Sessions::new(
        welcome.clone(),
        Duration::from_secs(config.limits.reattach_grace_secs),
        config.limits.replay_buffer_bytes,
        session::ReplayBudget::new(metrics.clone(), config.limits.max_replay_bytes_total),
        config.limits.max_in_flight_per_connection,
    );
    let sim_thread = {
        let backends = backends.clone();
        let metrics = metrics.clone();
        let handle = tokio::runtime::Handle::current();
        std::thread::Builder::new()
            .name("grove-sim".into())
            .spawn(move || drive(sim, sessions, driver_rx, &backends, &metrics, &handle))?
    };
    let (slots, refusals) = connection_budget(config.limits.max_connections);
    let ctx = Arc::new(Ctx {
        token: config.resolved_token(),
        connection_slots: Arc::new(Semaphore::new(slots)),
        refusal_slots: Arc::new(Semaphore::new(refusals)),
        config,
        driver: driver_tx,
        metrics,
        backends,
        shutdown: stop_rx,
        next_conn: AtomicU64::new(0),
    });
    tracing::info!(addr = %listener.local_addr()?, "env-server listening");
    tokio::pin!(shutdown);
    // Accept errors (out of file descriptors and the like) back off, 10 ms doubling to 1 s.
    let mut backoff = Duration::ZERO;
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    backoff = Duration::ZERO;
                    let slot = if let Ok(p) = ctx.connection_slots.clone().try_acquire_owned() {
                        Slot::Budget(Held::new(p, ctx.metrics.clone()))
                    } else if let Ok(p) = ctx.refusal_slots.clone().try_acquire_owned() {
                        Slot::Refusing { _held: p }
                    } else {
                        ctx.metrics.connections_refused.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(%peer, "connection closed at accept: over the connection budget");
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(http::serve_connection(stream, peer, ctx.clone(), slot));
                }
                Err(e) => {
                    backoff = (backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
                    tracing::warn!(error = %e, backoff_ms = backoff.as_millis() as u64, "accept failed; backing off");
                    tokio::time::sleep(backoff).await;
                }
            },
        }
    }
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    drop(ctx);
    // Connection tasks see the stop signal, send their last replies and drop their senders; the
    // sim thread ends when every sender is gone and no search is out.
    tokio::task::spawn_blocking(move || sim_thread.join())
        .await
        .map_err(|_| ServerError::SimThread)?
        .map_err(|_| ServerError::SimThread)?;
    Ok(())
}

/// A connection's place in the one connection budget that HTTP and WebSocket connections share.
#[derive(Debug)]
pub(crate) enum Slot {
    /// A slot of `max_connections`, held until the connection closes (by the WebSocket task
    /// after an upgrade).
    Budget(Held),
    /// Over the budget: every request is answered with `too_many_connections` and the
    /// connection closed.
    Refusing { _held: OwnedSemaphorePermit },
}

/// A slot of the budget, counted in `grove_tcp_connections` while it lives (by the WebSocket
/// task after an upgrade).
#[derive(Debug)]
pub(crate) struct Held {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Held {
    pub(crate) fn new(permit: OwnedSemaphorePermit, metrics: Arc<Metrics>) -> Held {
        metrics.tcp_connections.fetch_add(1, Ordering::Relaxed);
        Held { _permit: permit, metrics }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.metrics.tcp_connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The connection budget and its refusal overflow, within the process's open-file limit: each
/// connection is one descriptor, and a server out of descriptors cannot even answer `/health`.
pub fn connection_budget(configured: usize) -> (usize, usize) {
    let refusals = (configured / 8).clamp(1, 64);
    let Some(limit) = open_files_limit() else { return (configured, refusals) };
    // Descriptors for everything else: listener, index files, logs, backend connections.
    let usable = limit.saturating_sub(64) as usize;
    let slots = configured.min(usable.saturating_sub(refusals)).max(1);
    if slots < configured {
        tracing::warn!(
            configured,
            slots,
            open_files_limit = limit,
            "max_connections lowered to fit the open-file limit (raise it with `ulimit -n`)"
        );
    }
    (slots, refusals)
}

/// The soft limit on open files (`Max open files` in `/proc/self/limits`), where there is one.
pub fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// The sim thread: wait for input, drain what is there, tick, deliver.
fn drive(
    mut sim: Sim,
    mut sessions: session::Sessions,
    mut inputs: mpsc::Receiver<DriverInput>,
    backends: &Backends,
    metrics: &Metrics,
    handle: &tokio::runtime::Handle,
) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_time().build() else {
        tracing::error!("cannot start the sim thread's timer runtime");
        return;
    };
    let (search_tx, mut search_rx) = mpsc::unbounded_channel::<SearchDone>();
    let mut inputs_open = true;
    // How often idle episodes are looked for when nothing else happens.
    let reap_every = Duration::from_secs(1);
    const MAX_DRAIN: usize = 16_384;
    loop {
        if !inputs_open && sim.searches_in_flight() == 0 {
            break;
        }
        let first = rt.block_on(async {
            tokio::select! {
                biased;
                done = search_rx.recv() => done.map(Wake::Search),
                input = inputs.recv(), if inputs_open => Some(input.map_or(Wake::InputsClosed, Wake::Input)),
                _ = tokio::time::sleep(reap_every) => Some(Wake::Timer),
            }
        });
        let Some(first) = first else { continue };
        inputs_open &= apply(first, &mut sim, &mut sessions, metrics);
        let mut drained = 0;
        while drained < MAX_DRAIN {
            let Ok(done) = search_rx.try_recv() else { break };
            apply(Wake::Search(done), &mut sim, &mut sessions, metrics);
            drained += 1;
        }
        while drained < MAX_DRAIN && inputs_open {
            let wake = match inputs.try_recv() {
                Ok(input) => Wake::Input(input),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => Wake::InputsClosed,
            };
            inputs_open &= apply(wake, &mut sim, &mut sessions, metrics);
            drained += 1;
        }
        let now = Instant::now();
        sessions.expire(now, &mut sim, metrics);
        let out = sim.tick(now);
        // Counters first: a client that has its reply may read /metrics at once and must see
        // the work that produced it.
        let stats = sim.stats();
        metrics.episodes_live.store(stats.episodes_live, Ordering::Relaxed);
        metrics.episodes_created.store(stats.episodes_created, Ordering::Relaxed);
        metrics.steps.store(stats.steps, Ordering::Relaxed);
        metrics.forks.store(stats.forks, Ordering::Relaxed);
        metrics.searches.store(stats.searches, Ordering::Relaxed);
        for mut reply in out.replies {
            count_errors(&reply.envelope.msg, metrics);
            if let Response::Stats(s) = &mut reply.envelope.msg {
                s.providers = backends.usage();
            }
            if let Some(latency) = reply.latency {
                metrics.step_latency.observe(latency);
            }
            // The sim's owner is the session; it routes the reply to the session's connection,
            // or holds it for a reattach.
            sessions.route(reply.conn, reply.envelope);
        }
        for batch in out.searches {
            let tx = search_tx.clone();
            let n = batch.queries.len();
            let work = match batch.tool {
                Tool::Search => backends.get(batch.backend).map(|b| b.search_each(batch.queries, batch.topk as usize)),
                Tool::Open => backends.pages.clone().map(|p| p.open_each(batch.queries)),
            };
            let Some(work) = work else {
                let why = SearchError::Config("no such tool on this server".into());
                let _ = tx.send(SearchDone { batch: batch.id, result: vec![Err(why); n], elapsed: Duration::ZERO });
                continue;
            };
            handle.spawn(async move {
                let started = Instant::now();
                let result = work.await;
                let _ = tx.send(SearchDone { batch: batch.id, result, elapsed: started.elapsed() });
            });
        }
    }
}

/// Feed one input to the sim. Returns false once the input channel has closed.
fn apply(wake: Wake, sim: &mut Sim, sessions: &mut session::Sessions, metrics: &Metrics) -> bool {
    match wake {
        Wake::Search(done) => {
            metrics.search_latency.observe(done.elapsed);
            let failed = done.result.iter().filter(|r| r.is_err()).count();
            metrics.search_errors.fetch_add(failed as u64, Ordering::Relaxed);
            sim.deliver_search(done.batch, done.result);
        }
        Wake::Input(DriverInput::Open { conn, tx, kill, ring }) => sessions.open(conn, tx, kill, ring),
        Wake::Input(DriverInput::Hello { conn, id, resume, done }) => sessions.hello(conn, id, resume, done, metrics),
        Wake::Input(DriverInput::Request { conn, id, request }) => {
            if let Some(owner) = sessions.request(conn, id) {
                sim.submit(owner, id, request);
            }
        }
        Wake::Input(DriverInput::Detach { conn }) => sessions.detach(conn),
        Wake::Input(DriverInput::Closed { conn, goodbye }) => sessions.closed(conn, goodbye, sim, metrics),
        Wake::InputsClosed => return false,
        Wake::Timer => {}
    }
    true
}

enum Wake {
    Search(SearchDone),
    Input(DriverInput),
    InputsClosed,
    Timer,
}

/// Count error replies and per-item errors by code.
pub(crate) fn count_errors(msg: &Response, metrics: &Metrics) {
    fn each<T>(items: &[Result<T, grove_protocol::ErrorInfo>], metrics: &Metrics) {
        for e in items.iter().filter_map(|r| r.as_ref().err()) {
            metrics.error(e.code);
        }
    }
    match msg {
        Response::Error(e) => metrics.error(e.code),
        Response::EpisodesCreated(c) => each(&c.episodes, metrics),
        Response::Stepped(s) => {
            each(&s.results, metrics);
            // Failed tool calls reported inside observations count by their code too.
            for e in s.results.iter().filter_map(|r| r.as_ref().ok()).filter_map(|o| o.error.as_ref()) {
                metrics.error(e.code);
            }
        }
        Response::Forked(f) => each(&f.results, metrics),
        Response::Closed(c) => each(&c.results, metrics),
        _ => {}
    }
}

/// An error reply for a frame the reader could not forward.
pub(crate) fn error_reply(id: Option<RequestId>, code: ErrorCode, message: impl Into<String>) -> Outgoing {
    let envelope = Envelope::new(id.unwrap_or(0), Response::Error(grove_protocol::ErrorInfo::new(code, message)));
    Outgoing { payload: Payload::Reply(envelope), counted: false }
}
