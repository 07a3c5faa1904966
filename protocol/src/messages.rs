//! Requests, responses and the envelope that carries them.

use serde::{Deserialize, Serialize};

use crate::error::ErrorInfo;
use crate::forest::{ForestRole, JoinForest, StepData};
pub use crate::ids::{EpisodeId, RequestId};

/// One frame: a request or a reply with its id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope<M> {
    pub id: RequestId,
    pub msg: M,
}

impl<M> Envelope<M> {
    pub fn new(id: RequestId, msg: M) -> Self {
        Self { id, msg }
    }
}

/// Everything a client can ask of an env-server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Must be the first request on a connection.
    Hello(Hello),
    /// Spawn one episode per task.
    CreateEpisodes(CreateEpisodes),
    /// Act in many episodes at once; one result per action, in request order.
    Step(Step),
    /// Fork episodes at a completed step.
    Fork(Fork),
    /// Close episodes; their forks are unaffected.
    Close(Close),
    /// The full text history of one episode.
    GetTranscript(GetTranscript),
    /// Server-wide counters.
    Stats,
    Ping(Ping),
    /// Join the forest of one prompt as its next row (§8.7).
    JoinForest(JoinForest),
}

/// Every reply a server sends. `Error` answers a request that failed as a whole; bulk requests
/// report per-item failures inside their own reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Response {
    Welcome(Welcome),
    EpisodesCreated(EpisodesCreated),
    Stepped(Stepped),
    Forked(Forked),
    Closed(Closed),
    Transcript(Transcript),
    Stats(ServerStats),
    Pong(Ping),
    Error(ErrorInfo),
    /// The role of a row that joined a forest.
    ForestJoined(ForestRole),
}

/// Opens a session. Authentication, when configured, happens earlier: an
/// `Authorization: Bearer <token>` header on the WebSocket handshake.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol_version: u32,
    /// Free text naming the client, for logs.
    pub client: String,
    /// Reattach to the session of a connection that dropped, within its grace period, instead
    /// of opening a new one. Absent on a first connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Resume>,
}

/// Which session to reattach to and which replies the client still waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resume {
    /// `Session::token` from the `Welcome` of the dropped connection.
    pub token: String,
    /// Ids of the requests the client sent and has no reply for (at most
    /// `Limits::max_in_flight`). The server replays the replies it holds for them, once, right
    /// after the `Welcome`, and lists the ids it never received in `Resumed::resend`.
    pub pending: Vec<RequestId>,
}

/// The session a connection belongs to: its episodes, and the replies owed to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// Secret; presented in `Hello::resume` to reattach after a drop.
    pub token: String,
    /// How long after a drop the session's episodes wait for a reattach before they are
    /// closed. 0: reattach is off and a drop closes them at once.
    pub grace_ms: u64,
}

/// The outcome of a reattach, in its `Welcome`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resumed {
    /// Replies replayed after this `Welcome`.
    pub replayed: u32,
    /// Pending ids the server never received: send those requests again, with the same ids.
    /// Every other pending id is answered (replayed now, or later when its work completes).
    pub resend: Vec<RequestId>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    pub protocol_version: u32,
    /// Server name and version, for logs.
    pub server: String,
    pub limits: Limits,
    /// This connection's session; absent from servers without reattach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<Session>,
    /// Present when the `Hello` asked to resume and the session was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<Resumed>,
}

/// The limits a server enforces; exceeding one is answered with a typed error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub max_frame_bytes: u64,
    pub max_episodes_per_connection: u32,
    pub max_episodes_total: u32,
    /// Maximum number of items in one Create, Step or Close request.
    pub max_batch: u32,
    /// Maximum total children created by one Fork request.
    pub max_forks_per_request: u32,
    pub max_action_chars: u32,
    pub max_query_chars: u32,
    pub max_turns: u32,
    /// An episode not touched for this long is reaped.
    pub idle_timeout_ms: u64,
    /// A connection that sends no frame for this long is closed (with its episodes); a client
    /// that may stay silent longer keeps it open with `Ping`. 0: not announced (older servers).
    #[serde(default)]
    pub connection_idle_ms: u64,
    /// Heartbeat period: a client sends a WebSocket ping when it has sent nothing for this long,
    /// and treats a connection that brings back no frame at all (pong or reply) within twice
    /// this as dropped. 0: not announced.
    #[serde(default)]
    pub heartbeat_ms: u64,
    /// Requests one connection may have in flight before the server stops reading from it.
    /// 0: not announced.
    #[serde(default)]
    pub max_in_flight: u32,
    /// Bytes of client data one step may carry (`StepAction::data`). 0: not announced (older
    /// servers, which take none).
    #[serde(default)]
    pub max_step_data_bytes: u32,
    /// Rows (m k) one forest may have. 0: not announced (no forests).
    #[serde(default)]
    pub max_forest_rows: u32,
    /// Live forests the server holds at once.
    #[serde(default)]
    pub max_forests: u32,
    /// A forest expires this long after its first row joined.
    #[serde(default)]
    pub forest_timeout_ms: u64,
}

/// How an episode's answer is scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Exact match after normalisation, with the EM format table.
    Em,
    /// Token-level F1, with the F1 format table.
    F1,
}

/// One question for one episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskSpec {
    pub question: String,
    pub golden_answers: Vec<String>,
    /// e.g. `nq`, `hotpotqa`; also selects the metric when `metric` is `None`.
    pub data_source: String,
    /// The dataset's own id, echoed in transcripts.
    pub task_id: Option<String>,
    pub metric: Option<Metric>,
}

/// Per-request episode settings; `None` takes the server's configured default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpisodeOptions {
    /// Tool turns before the forced final turn.
    pub max_turns: Option<u32>,
    /// Documents per search.
    pub topk: Option<u32>,
    /// Name of a configured search backend.
    pub backend: Option<String>,
    /// Prompt template with a `{question}` placeholder.
    pub prompt_template: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateEpisodes {
    pub tasks: Vec<TaskSpec>,
    pub options: EpisodeOptions,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodesCreated {
    /// One entry per task, in request order.
    pub episodes: Vec<Result<EpisodeStart, ErrorInfo>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpisodeStart {
    pub episode: EpisodeId,
    /// The user-message text the agent starts from (before any chat template).
    pub prompt: String,
    pub max_turns: u32,
}

/// What an agent does in one turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Action {
    /// Model output, parsed with the Search-R1 tag grammar (first `<search>` or `<answer>`).
    Text(String),
    /// A structured tool call, for agents that do not write tags.
    Tool(ToolCall),
}

/// `name` is `search`, `open` or `answer`; `arguments` is a map such as `{"query": "..."}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub name: String,
    pub arguments: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepAction {
    pub episode: EpisodeId,
    pub action: Action,
    /// Opaque client bytes kept with the step and inherited by forks (e.g. the generated token
    /// ids and their log-probs), at most `Limits::max_step_data_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<StepData>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub actions: Vec<StepAction>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stepped {
    /// One entry per action, in request order.
    pub results: Vec<Result<Observation, ErrorInfo>>,
}

/// The kind of action a step resolved to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    Search,
    Open,
    Answer,
    /// No tool call could be parsed; the observation is the corrective message.
    Invalid,
}

/// The environment's answer to one action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    pub episode: EpisodeId,
    /// Number of completed steps after this one (the first step is step 1).
    pub step: u32,
    pub kind: ActionKind,
    /// Text to append to the agent's context; empty when `done`.
    pub text: String,
    pub done: bool,
    /// True when this was the forced final turn: no tool ran, the episode ended.
    pub forced_final: bool,
    /// Tool turns left before the forced final turn.
    pub turns_left: u32,
    /// Present when `done`.
    pub reward: Option<Reward>,
    /// Present when the tool call failed (search error, timeout, refused URL): the step still
    /// happened, `text` tells the model what went wrong, and this carries the typed code. Absent
    /// from the frame when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
}

/// The score of a finished episode, with the parts it was computed from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reward {
    /// Training reward: metric plus the format table of the spec.
    pub score: f64,
    pub metric: Metric,
    /// Pure EM or F1 of the extracted answer (0 when there is none).
    pub metric_value: f64,
    pub answer: Option<String>,
    pub format_valid: bool,
}

/// Fork `episode` as it was after `at_step` completed steps (0 = just the prompt), `n` times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkSpec {
    pub episode: EpisodeId,
    pub at_step: u32,
    pub n: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fork {
    pub forks: Vec<ForkSpec>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Forked {
    /// One entry per fork spec, in request order.
    pub results: Vec<Result<ForkResult, ErrorInfo>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkResult {
    pub parent: EpisodeId,
    pub at_step: u32,
    pub children: Vec<EpisodeId>,
    /// Lineage shared by every child.
    pub lineage: Lineage,
}

/// Where an episode comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lineage {
    /// The episode created by `CreateEpisodes` at the top of the tree.
    pub root: EpisodeId,
    pub parent: Option<EpisodeId>,
    /// Number of forks between the root and this episode.
    pub depth: u32,
    /// The parent's step this episode was forked at.
    pub fork_step: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Close {
    pub episodes: Vec<EpisodeId>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Closed {
    /// One entry per episode, in request order.
    pub results: Vec<Result<EpisodeId, ErrorInfo>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetTranscript {
    pub episode: EpisodeId,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpisodeStatus {
    Active,
    Done,
}

/// One completed step as the server recorded it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TranscriptStep {
    /// The action as sent (a tool call is rendered in tag form).
    pub action: String,
    pub kind: ActionKind,
    /// The parsed content: query, URL or answer.
    pub content: String,
    pub observation: String,
    /// The client data sent with the step's action, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<StepData>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transcript {
    pub episode: EpisodeId,
    pub task: TaskSpec,
    pub prompt: String,
    pub lineage: Lineage,
    pub status: EpisodeStatus,
    pub steps: Vec<TranscriptStep>,
    pub reward: Option<Reward>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStats {
    pub episodes_live: u64,
    pub episodes_created: u64,
    pub episodes_closed: u64,
    pub episodes_reaped: u64,
    pub steps: u64,
    pub forks: u64,
    pub searches: u64,
    pub connections: u64,
    pub uptime_ms: u64,
    /// Forests live now, finished (every row played) and expired since the start.
    #[serde(default)]
    pub forests_live: u64,
    #[serde(default)]
    pub forests_finished: u64,
    #[serde(default)]
    pub forests_expired: u64,
    /// Cost accounting per web provider, retriever and page fetcher (absent when the server has
    /// none).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub providers: std::collections::BTreeMap<String, ProviderUsage>,
}

/// Calls one provider received from this server, and what the cache saved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderUsage {
    /// HTTP requests sent to the provider, retries included.
    pub calls: u64,
    /// Tool calls that failed after retries.
    pub errors: u64,
    /// Retries after 429, 5xx or connection errors.
    pub retries: u64,
    /// Calls that waited for the rate limiter.
    pub throttled: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ping {
    pub nonce: u64,
}
