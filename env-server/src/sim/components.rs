//! Episode components and the resources the systems share.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bevy_ecs::prelude::*;
use grove_datasets::Metric;
use grove_datasets::metrics::RewardConfig;
use grove_protocol::{Action, EpisodeId, ErrorInfo, Lineage, Observation, RequestId, Reward, TaskSpec};

use super::transcript::Transcript;
use crate::config::LimitsConfig;
use crate::config::ToolErrors;
use crate::search::{Hit, RenderFormat, SearchError};

/// Identifies a client connection.
pub type ConnId = u64;
/// Identifies an open Step request inside the sim.
pub type StepKey = u64;
/// Identifies a search batch handed to a backend.
pub type BatchId = u64;

/// The public id of an episode.
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpisodeKey(pub EpisodeId);

/// The task, shared by an episode and all its forks.
#[derive(Component, Debug, Clone)]
pub struct Task(pub Arc<TaskInfo>);

#[derive(Debug)]
pub struct TaskInfo {
    pub spec: TaskSpec,
    /// The rendered user prompt.
    pub prompt: String,
    pub metric: Metric,
}

#[derive(Component, Debug, Clone, Default)]
pub struct History(pub Transcript);

/// Tool turns used and allowed. When `used == max` the next step is the forced final turn.
#[derive(Component, Debug, Clone, Copy)]
pub struct Turns {
    pub used: u32,
    pub max: u32,
}

#[derive(Component, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Active,
    /// A search of this episode is out at a backend.
    Searching,
    Done,
}

#[derive(Component, Debug, Clone)]
pub struct LineageC(pub Lineage);

#[derive(Component, Debug, Clone, Copy)]
pub struct Owner(pub ConnId);

#[derive(Component, Debug, Clone, Copy)]
pub struct Clock {
    pub created: Instant,
    pub touched: Instant,
}

#[derive(Component, Debug, Clone, Default)]
pub struct Outcome(pub Option<Reward>);

/// Per-episode settings fixed at creation.
#[derive(Component, Debug, Clone, Copy)]
pub struct Settings {
    pub topk: u32,
    /// Index into [`SimSettings::backends`].
    pub backend: usize,
}

/// An action waiting to be resolved this tick.
#[derive(Component, Debug, Clone)]
pub struct PendingAction {
    pub step: StepKey,
    pub slot: usize,
    pub action: Action,
    pub data: Option<grove_protocol::StepData>,
}

/// A search that went out to a backend; the step completes when its batch comes back.
#[derive(Component, Debug, Clone)]
pub struct AwaitingSearch {
    pub step: StepKey,
    pub slot: usize,
    pub action: String,
    /// The query, or the URL of an `open`.
    pub query: String,
    pub tool: Tool,
    pub data: Option<grove_protocol::StepData>,
}

/// The tools that go out of the sim: a search at a backend, or a page fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tool {
    Search,
    Open,
}

/// Set on an episode whose last step ended it; the scoring system computes its reward.
#[derive(Component, Debug, Clone, Copy)]
pub struct Finished {
    pub step: StepKey,
    pub slot: usize,
}

/// Commands that arrived since the last tick.
#[derive(Resource, Debug, Default)]
pub struct Inbox(pub Vec<Incoming>);

#[derive(Debug)]
pub enum Incoming {
    Request { conn: ConnId, id: RequestId, request: grove_protocol::Request },
    Disconnected(ConnId),
    SearchDone { batch: BatchId, result: SearchResult },
}

/// What a tick produced for the outside world.
#[derive(Resource, Debug, Default)]
pub struct Outbox {
    pub replies: Vec<Reply>,
    pub searches: Vec<SearchBatch>,
}

#[derive(Debug)]
pub struct Reply {
    pub conn: ConnId,
    pub envelope: grove_protocol::Envelope<grove_protocol::Response>,
    /// How long the request spent inside the server (Step requests only).
    pub latency: Option<Duration>,
}

/// Queries for one backend with one top-k, to be searched together.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchBatch {
    pub id: BatchId,
    pub tool: Tool,
    /// For searches; page fetches ignore it.
    pub backend: usize,
    pub topk: u32,
    pub queries: Vec<String>,
}

/// Search results delivered since the last tick, by batch.
#[derive(Resource, Debug, Default)]
pub struct SearchInbox(pub Vec<(BatchId, SearchResult)>);

/// One outcome per query of a batch, in order: its result list, or why it failed. A page fetch
/// yields one hit whose `contents` is the rendered page.
pub type SearchResult = Vec<Result<Vec<Hit>, SearchError>>;

/// Searches (and page fetches) queued this tick, by (tool, backend, topk).
#[derive(Resource, Debug, Default)]
pub struct SearchQueue(pub HashMap<(Tool, usize, u32), Vec<(Entity, String)>>);

/// Batches out at backends: which episode each query belongs to.
#[derive(Resource, Debug, Default)]
pub struct Batches {
    pub next: BatchId,
    pub open: HashMap<BatchId, Vec<Entity>>,
}

/// Open Step requests: one slot per action, filled as actions resolve.
#[derive(Resource, Debug, Default)]
pub struct Steps {
    pub next: StepKey,
    pub open: HashMap<StepKey, OpenStep>,
}

#[derive(Debug)]
pub struct OpenStep {
    pub conn: ConnId,
    pub id: RequestId,
    pub slots: Vec<Option<Result<Observation, ErrorInfo>>>,
    pub remaining: usize,
    pub received: Instant,
}

impl Steps {
    pub fn fill(&mut self, step: StepKey, slot: usize, result: Result<Observation, ErrorInfo>) {
        if let Some(open) = self.open.get_mut(&step)
            && let Some(s) = open.slots.get_mut(slot).filter(|s| s.is_none())
        {
            *s = Some(result);
            open.remaining -= 1;
        }
    }

    pub fn observation_mut(&mut self, step: StepKey, slot: usize) -> Option<&mut Observation> {
        self.open.get_mut(&step)?.slots.get_mut(slot)?.as_mut()?.as_mut().ok()
    }
}

/// Episode id -> entity, and per-connection episode counts.
#[derive(Resource, Debug, Default)]
pub struct Directory {
    pub next_episode: EpisodeId,
    pub by_id: HashMap<EpisodeId, Entity>,
    pub per_conn: HashMap<ConnId, usize>,
}

impl Directory {
    pub fn live(&self) -> usize {
        self.by_id.len()
    }

    /// Forget a removed episode: its id, and one episode of its owner's count.
    pub fn forget(&mut self, episode: EpisodeId, owner: Option<ConnId>) {
        self.by_id.remove(&episode);
        if let Some(conn) = owner
            && let Some(n) = self.per_conn.get_mut(&conn)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_conn.remove(&conn);
            }
        }
    }
}

/// Server-wide counters.
#[derive(Resource, Debug, Default, Clone)]
pub struct Counters {
    pub created: u64,
    pub closed: u64,
    pub reaped: u64,
    pub steps: u64,
    pub forks: u64,
    pub searches: u64,
    pub search_errors: u64,
}

/// Fixed settings of the sim.
#[derive(Resource, Debug, Clone)]
pub struct SimSettings {
    pub limits: LimitsConfig,
    pub max_turns: u32,
    pub topk: u32,
    pub prompt_template: String,
    pub reward: RewardConfig,
    /// Backend names; episodes refer to them by index, 0 is the default.
    pub backends: Vec<String>,
    /// How each backend's results are rendered, parallel to `backends`.
    pub renders: Vec<RenderFormat>,
    /// Whether `open` (page fetch) is a tool of this environment.
    pub open: bool,
    /// Whether a failed tool call becomes an observation or an error item.
    pub tool_errors: ToolErrors,
    pub started: Instant,
}

/// The time of the current tick.
#[derive(Resource, Debug, Clone, Copy)]
pub struct Now(pub Instant);

/// Owners at or above this are forests, not sessions.
pub const FOREST_OWNER_FLOOR: ConnId = u64::MAX - (1 << 32);
