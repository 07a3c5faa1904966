//! The trainer's handle on one env-server: blocking calls for the tensor thread over the async
//! protocol client, in as few requests as the server's limits allow.
//!
//! - Bulk calls (create, step, fork, close) send one request per call, split only where the
//!   server's announced `max_batch` / `max_forks_per_request` would be exceeded.
//! - An item the server refuses (an over-long query, a full episode table, an unknown episode)
//!   comes back as that item's `Err(ErrorInfo)`; a request refused as a whole is the same error
//!   for each of its items. Neither stops anything: the caller decides what a refused item means.
//! - Only a connection lost for good is fatal (a blip is survived: the protocol client reconnects
//!   and reattaches to its session): [`EnvError::Lost`] names the server and what was lost.
//! - The client's I/O runs on its own runtime thread, and a keep-alive task pings the server
//!   whenever the connection could otherwise fall silent for a third of the server's
//!   `connection_idle_ms`, so a long update, evaluation or checkpoint on the tensor thread never
//!   lets the server close the connection (and its episodes) as idle.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use grove_protocol::client::{Client, ClientError, ClientOptions};
use grove_protocol::{
    Action, EpisodeId, EpisodeOptions, EpisodeStart, ErrorCode, ErrorInfo, ForkSpec, Observation, StepAction, TaskSpec,
};

#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// The connection to an env-server broke and could not be reattached within the server's
    /// grace period (the server died, or the network stayed away): every episode this client
    /// held there is gone with it. A blip shorter than the grace period is survived (the
    /// protocol client reconnects and reattaches on its own).
    #[error("env-server {url} went away ({why}); {live} live episodes there are lost")]
    Lost { url: String, live: u64, why: String },
    #[error("cannot connect to env-server {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: ClientError,
    },
    #[error("env-server {url}: unexpected reply: {source}")]
    Protocol {
        url: String,
        #[source]
        source: ClientError,
    },
    #[error("cannot start the env client runtime: {0}")]
    Runtime(std::io::Error),
}

/// Requests sent, by kind (what the round-trip tests count).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestCounts {
    pub create: u64,
    pub step: u64,
    pub fork: u64,
    pub close: u64,
    pub ping: u64,
}

#[derive(Debug, Default)]
struct Counters {
    create: AtomicU64,
    step: AtomicU64,
    fork: AtomicU64,
    close: AtomicU64,
    ping: AtomicU64,
    /// Milliseconds since `epoch` of the last frame sent.
    last_sent_ms: AtomicU64,
}

/// A blocking handle on one env-server for the tensor thread.
#[derive(Debug)]
pub struct EnvClient {
    // Field order: the keep-alive task and the client go before the runtime that runs them.
    keepalive: Option<tokio::task::JoinHandle<()>>,
    client: Arc<Client>,
    rt: tokio::runtime::Runtime,
    url: String,
    /// Episodes created or forked through this handle and not closed yet.
    live: AtomicU64,
    counters: Arc<Counters>,
    epoch: Instant,
}

impl Drop for EnvClient {
    fn drop(&mut self) {
        if let Some(k) = self.keepalive.take() {
            k.abort();
        }
    }
}

/// How often to ping a server that closes connections silent for `idle_ms` (0: not announced).
fn ping_interval(idle_ms: u64) -> Duration {
    if idle_ms == 0 {
        return Duration::from_secs(60);
    }
    Duration::from_millis((idle_ms / 3).clamp(50, 60_000))
}

impl EnvClient {
    /// Connect and handshake. The handle starts its own runtime thread for the connection.
    pub fn connect(url: &str, options: ClientOptions) -> Result<Self, EnvError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("grove-env-client")
            .enable_all()
            .build()
            .map_err(EnvError::Runtime)?;
        let client = rt
            .block_on(Client::connect(url, options))
            .map(Arc::new)
            .map_err(|source| EnvError::Connect { url: url.to_string(), source })?;
        let counters = Arc::new(Counters::default());
        let epoch = Instant::now();
        let every = ping_interval(client.welcome().limits.connection_idle_ms);
        let keepalive = {
            let (client, counters) = (client.clone(), counters.clone());
            rt.spawn(async move {
                let mut nonce = 0u64;
                loop {
                    tokio::time::sleep(every / 2).await;
                    let since = epoch.elapsed().as_millis() as u64;
                    if since.saturating_sub(counters.last_sent_ms.load(Ordering::Relaxed)) < every.as_millis() as u64 {
                        continue;
                    }
                    nonce += 1;
                    counters.ping.fetch_add(1, Ordering::Relaxed);
                    counters.last_sent_ms.store(since, Ordering::Relaxed);
                    if client.ping(nonce).await.is_err() {
                        // The connection is gone; the next real request reports it.
                        break;
                    }
                }
            })
        };
        Ok(Self {
            keepalive: Some(keepalive),
            client,
            rt,
            url: url.to_string(),
            live: Default::default(),
            counters,
            epoch,
        })
    }

    /// The env-server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Episodes opened through this handle and not closed yet.
    pub fn live_episodes(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }

    pub fn requests(&self) -> RequestCounts {
        let c = &self.counters;
        RequestCounts {
            create: c.create.load(Ordering::Relaxed),
            step: c.step.load(Ordering::Relaxed),
            fork: c.fork.load(Ordering::Relaxed),
            close: c.close.load(Ordering::Relaxed),
            ping: c.ping.load(Ordering::Relaxed),
        }
    }

    fn sent(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
        self.counters.last_sent_ms.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// A transport failure means the server or the connection is gone; an error reply to the
    /// whole request is a refusal of each of its items.
    fn classify<T>(
        &self,
        r: Result<Vec<Result<T, ErrorInfo>>, ClientError>,
        n: usize,
    ) -> Result<Vec<Result<T, ErrorInfo>>, EnvError> {
        match r {
            Ok(items) if items.len() == n => Ok(items),
            Ok(items) => Err(EnvError::Protocol {
                url: self.url.clone(),
                source: ClientError::BadRequest(format!("{} results for {n} items", items.len())),
            }),
            Err(ClientError::Server(info)) => Ok((0..n).map(|_| Err(info.clone())).collect()),
            Err(e @ (ClientError::Closed | ClientError::WebSocket(_) | ClientError::Disconnected(_))) => {
                Err(EnvError::Lost { url: self.url.clone(), live: self.live_episodes(), why: e.to_string() })
            }
            Err(e) => Err(EnvError::Protocol { url: self.url.clone(), source: e }),
        }
    }

    fn max_batch(&self) -> usize {
        (self.client.welcome().limits.max_batch as usize).max(1)
    }

    /// Create one episode per task.
    pub fn create(
        &self,
        tasks: &[TaskSpec],
        options: &EpisodeOptions,
    ) -> Result<Vec<Result<EpisodeStart, ErrorInfo>>, EnvError> {
        let mut out = Vec::with_capacity(tasks.len());
        for chunk in tasks.chunks(self.max_batch()) {
            self.sent(&self.counters.create);
            let r = self.rt.block_on(self.client.create_episodes(chunk.to_vec(), options.clone()));
            let items = self.classify(r, chunk.len())?;
            self.opened(items.iter().filter(|r| r.is_ok()).count());
            out.extend(items);
        }
        Ok(out)
    }

    /// Step each episode with model text.
    pub fn step(&self, actions: &[(EpisodeId, String)]) -> Result<Vec<Result<Observation, ErrorInfo>>, EnvError> {
        let mut out = Vec::with_capacity(actions.len());
        for chunk in actions.chunks(self.max_batch()) {
            let items = step_actions(chunk);
            self.sent(&self.counters.step);
            let r = self.rt.block_on(self.client.step(items));
            out.extend(self.classify(r, chunk.len())?);
        }
        Ok(out)
    }

    /// Send a step of each episode and return at once; [`EnvClient::step_wait`] takes the
    /// results (what the continuous rollout does, so that decoding goes on while the server
    /// searches). One request per `max_batch` actions, as [`EnvClient::step`].
    pub fn step_start(&self, actions: &[(EpisodeId, String)]) -> PendingStep {
        let mut parts = Vec::new();
        for chunk in actions.chunks(self.max_batch()) {
            let items = step_actions(chunk);
            self.sent(&self.counters.step);
            let client = self.client.clone();
            parts.push((self.rt.spawn(async move { client.step(items).await }), chunk.len()));
        }
        PendingStep { parts }
    }

    /// The results of a [`EnvClient::step_start`], waiting for them if they have not come.
    pub fn step_wait(&self, pending: PendingStep) -> Result<Vec<Result<Observation, ErrorInfo>>, EnvError> {
        let mut out = Vec::new();
        for (handle, n) in pending.parts {
            let r = self.rt.block_on(handle).map_err(|e| EnvError::Lost {
                url: self.url.clone(),
                live: self.live_episodes(),
                why: format!("the step task ended: {e}"),
            })?;
            out.extend(self.classify(r, n)?);
        }
        Ok(out)
    }

    /// Fork each `(episode, at_step)` once: one child each, in order.
    pub fn fork(&self, at: &[(EpisodeId, u32)]) -> Result<Vec<Result<EpisodeId, ErrorInfo>>, EnvError> {
        let limits = &self.client.welcome().limits;
        let per_request = self.max_batch().min((limits.max_forks_per_request as usize).max(1));
        let mut out = Vec::with_capacity(at.len());
        for chunk in at.chunks(per_request) {
            let specs = chunk.iter().map(|&(episode, at_step)| ForkSpec { episode, at_step, n: 1 }).collect();
            self.sent(&self.counters.fork);
            let r = self.rt.block_on(self.client.fork(specs));
            for item in self.classify(r, chunk.len())? {
                out.push(item.and_then(|f| {
                    f.children
                        .first()
                        .copied()
                        .ok_or_else(|| ErrorInfo::new(ErrorCode::Internal, "fork returned no child"))
                }));
            }
        }
        self.opened(out.iter().filter(|r| r.is_ok()).count());
        Ok(out)
    }

    /// Close episodes (one request per `max_batch`). Episodes the server no longer knows (reaped,
    /// or closed with their connection) are not an error: they are gone either way.
    pub fn close(&self, episodes: &[EpisodeId]) -> Result<(), EnvError> {
        for chunk in episodes.chunks(self.max_batch()) {
            self.sent(&self.counters.close);
            let r = self.rt.block_on(self.client.close(chunk.to_vec()));
            let closed = self.classify(r, chunk.len())?.len() as u64;
            let _ = self.live.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| Some(l.saturating_sub(closed)));
        }
        Ok(())
    }

    fn opened(&self, n: usize) {
        self.live.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The protocol client, for calls this handle does not wrap (transcripts, stats).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Run an async call of the client on this handle's runtime.
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }
}

/// Step requests in flight (see [`EnvClient::step_start`]).
#[derive(Debug)]
pub struct PendingStep {
    parts: Vec<(tokio::task::JoinHandle<StepReply>, usize)>,
}

type StepReply = Result<Vec<Result<Observation, ErrorInfo>>, ClientError>;

impl PendingStep {
    /// Every reply has arrived ([`EnvClient::step_wait`] will not block).
    pub fn is_ready(&self) -> bool {
        self.parts.iter().all(|(h, _)| h.is_finished())
    }
}

/// The protocol's step items for `(episode, model text)` pairs.
fn step_actions(chunk: &[(EpisodeId, String)]) -> Vec<StepAction> {
    chunk
        .iter()
        .map(|(episode, text)| StepAction { episode: *episode, action: Action::Text(text.clone()), data: None })
        .collect()
}

/// One client per URL.
pub fn connect_all(urls: &[String]) -> Result<Vec<EnvClient>, EnvError> {
    urls.iter().map(|u| EnvClient::connect(u, ClientOptions::default())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pings_come_often_enough_and_not_too_often() {
        assert_eq!(ping_interval(900_000), Duration::from_secs(60));
        assert_eq!(ping_interval(1_000), Duration::from_millis(333));
        assert_eq!(ping_interval(30), Duration::from_millis(50));
        assert_eq!(ping_interval(0), Duration::from_secs(60));
    }
}
