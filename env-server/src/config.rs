//! Server configuration: a TOML file with the same keys as the command-line flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use grove_datasets::metrics::RewardConfig;
use grove_protocol::Limits;
use serde::{Deserialize, Serialize};

pub use crate::cache::{CacheConfig, CacheMode, CacheStoreKind};
pub use crate::search::dense::{DenseConfig, DenseDevice, DensePooling, DenseSearch};
pub use crate::search::page::PageConfig;
pub use crate::search::web::{Provider, WebConfig};
pub use crate::search::{RemoteConfig, RenderFormat};

/// Everything `run` needs. Deserialised from TOML; every key has a default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address of the WebSocket + HTTP listener (used by the CLI; `run` takes a bound listener).
    pub bind: SocketAddr,
    /// wiki-18 JSONL corpus for the local BM25 backend.
    pub corpus: Option<PathBuf>,
    /// Where the tantivy index lives; default `<corpus>.index/` next to the corpus.
    pub index: Option<PathBuf>,
    /// `local` (BM25 over `corpus`) or `remote` (a Search-R1 `/retrieve` server at `remote_url`).
    pub backend: BackendKind,
    pub remote_url: Option<String>,
    /// Bearer token required on the WebSocket handshake and on HTTP. Prefer `token_env`.
    pub token: Option<String>,
    /// Name of an environment variable holding the token.
    pub token_env: Option<String>,
    pub limits: LimitsConfig,
    pub episodes: EpisodeDefaults,
    pub remote: RemoteConfig,
    /// The live web search provider (`backend = "web"`).
    pub web: WebConfig,
    /// The open-page tool (always on with `backend = "web"`, else when `pages.enabled`).
    pub pages: PageConfig,
    /// The persistent cache in front of web providers and page fetches (and of the remote
    /// retriever when `remote.cache` is set).
    pub cache: CacheConfig,
    /// Dense retrieval (`backend = "dense"` or `"hybrid"`): the encoder, the FAISS index and the
    /// fusion with BM25. Needs a server built with the `dense` feature.
    pub dense: DenseConfig,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 8000)),
            corpus: None,
            index: None,
            backend: BackendKind::Local,
            remote_url: None,
            token: None,
            token_env: None,
            limits: LimitsConfig::default(),
            episodes: EpisodeDefaults::default(),
            remote: RemoteConfig::default(),
            web: WebConfig::default(),
            pages: PageConfig::default(),
            cache: CacheConfig::default(),
            dense: DenseConfig::default(),
        }
    }
}

impl ServerConfig {
    pub fn from_toml(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }

    /// The token to require, from `token` or the variable named by `token_env`.
    pub fn resolved_token(&self) -> Option<String> {
        self.token
            .clone()
            .or_else(|| self.token_env.as_ref().and_then(|v| std::env::var(v).ok()))
            .filter(|t| !t.is_empty())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    Local,
    Remote,
    /// Live web search through a provider (`[web]`), with the page tool (`[pages]`) and the
    /// persistent cache (`[cache]`).
    Web,
    /// A BERT-family encoder (`dense.model`) and a FAISS flat index (`dense.index`) whose row i
    /// is passage i of `corpus`, searched exactly.
    Dense,
    /// BM25 over `corpus` and the dense backend, fused by reciprocal rank.
    Hybrid,
}

/// Limits, all enforced with typed errors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    pub max_frame_bytes: usize,
    pub max_connections: usize,
    pub max_episodes_per_connection: usize,
    pub max_episodes_total: usize,
    pub max_batch: usize,
    pub max_forks_per_request: usize,
    pub max_action_chars: usize,
    pub max_query_chars: usize,
    /// Requests a connection may have in flight before the server stops reading from it.
    pub max_in_flight_per_connection: usize,
    pub max_turns: u32,
    pub max_topk: u32,
    /// Episodes untouched for this long are reaped.
    pub idle_timeout_secs: u64,
    /// Episodes older than this are reaped, touched or not.
    pub max_episode_age_secs: u64,
    /// Connections that send nothing for this long are closed.
    pub connection_idle_secs: u64,
    /// Announced heartbeat period: clients ping when they have sent nothing for this long, and
    /// treat a connection silent for twice this as dropped.
    pub heartbeat_secs: u64,
    /// After a WebSocket drops, its session (episodes and owed replies) waits this long for the
    /// client to reattach with its resume token before its episodes are closed. 0: no reattach;
    /// a drop closes the episodes at once.
    pub reattach_grace_secs: u64,
    /// A reply that cannot be written within this long (a client that stopped reading, or a
    /// peer that vanished without a reset) ends its connection.
    pub write_timeout_secs: u64,
    /// Bytes of recent replies a session keeps for replay after a drop (the most recent reply
    /// is kept whatever its size). A reply pushed out before its client reattached is answered
    /// with `reply_lost`. Memory: up to this much per connection that moves that much data.
    pub replay_buffer_bytes: usize,
    /// Bytes of replies all sessions together keep for replay: past it, a session that adds a
    /// reply pushes out its own oldest ones first (each keeps its newest). Bounds the memory of
    /// `replay_buffer_bytes` x `max_connections` (4 GiB at the defaults).
    pub max_replay_bytes_total: usize,
    /// Documents in one HTTP `/retrieve` request.
    pub max_retrieve_queries: usize,
    /// An HTTP request head (the WebSocket upgrade included) must arrive in full within this
    /// long of the connection opening or of the previous response; otherwise the connection is
    /// closed (slowloris, and TCP connections that never send anything).
    pub http_header_timeout_secs: u64,
    /// A `/retrieve` body must arrive in full within this long of its head (which has
    /// `http_header_timeout_secs`), or the request is answered `408` and the connection closed;
    /// other routes do not read bodies and close a connection whose body they left unread.
    pub http_request_timeout_secs: u64,
    /// Bytes of client data one step may carry (`StepAction::data`), kept with the transcript.
    pub max_step_data_bytes: usize,
    /// Rows (m k) one forest may have.
    pub max_forest_rows: usize,
    /// Live forests at once.
    pub max_forests: usize,
    /// A forest expires (its waiting rows are answered `forest_expired`, its episodes closed)
    /// this long after its first row joined.
    pub forest_timeout_secs: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_frame_bytes: 1 << 20,
            max_connections: 1024,
            max_episodes_per_connection: 65_536,
            max_episodes_total: 262_144,
            max_batch: 8_192,
            max_forks_per_request: 8_192,
            max_action_chars: 32_768,
            max_query_chars: 2_048,
            max_in_flight_per_connection: 1_024,
            max_turns: 64,
            max_topk: 100,
            idle_timeout_secs: 600,
            max_episode_age_secs: 24 * 3600,
            connection_idle_secs: 900,
            heartbeat_secs: 15,
            reattach_grace_secs: 60,
            write_timeout_secs: 60,
            replay_buffer_bytes: 4 << 20,
            max_replay_bytes_total: 256 << 20,
            max_retrieve_queries: 4_096,
            http_header_timeout_secs: 30,
            http_request_timeout_secs: 60,
            max_step_data_bytes: 256 << 10,
            max_forest_rows: 64,
            max_forests: 4_096,
            forest_timeout_secs: 600,
        }
    }
}

impl LimitsConfig {
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs(self.idle_timeout_secs)
    }

    /// The limits as the protocol announces them in `Welcome`.
    pub fn to_wire(&self, max_turns_default: u32) -> Limits {
        let clamp = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        Limits {
            max_frame_bytes: self.max_frame_bytes as u64,
            max_episodes_per_connection: clamp(self.max_episodes_per_connection),
            max_episodes_total: clamp(self.max_episodes_total),
            max_batch: clamp(self.max_batch),
            max_forks_per_request: clamp(self.max_forks_per_request),
            max_action_chars: clamp(self.max_action_chars),
            max_query_chars: clamp(self.max_query_chars),
            max_turns: max_turns_default,
            idle_timeout_ms: self.idle_timeout_secs.saturating_mul(1000),
            connection_idle_ms: self.connection_idle_secs.saturating_mul(1000),
            heartbeat_ms: self.heartbeat_secs.saturating_mul(1000),
            max_in_flight: clamp(self.max_in_flight_per_connection),
            max_step_data_bytes: clamp(self.max_step_data_bytes),
            max_forest_rows: clamp(self.max_forest_rows),
            max_forests: clamp(self.max_forests),
            forest_timeout_ms: self.forest_timeout_secs.saturating_mul(1000),
        }
    }
}

/// Defaults for episodes whose `EpisodeOptions` leave a field unset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EpisodeDefaults {
    /// Tool turns before the forced final turn (3 for QA, 5 for web in the paper).
    pub max_turns: u32,
    /// Documents per search (3 for QA).
    pub topk: u32,
    /// Prompt template with a `{question}` placeholder; the default is [`DEFAULT_PROMPT`].
    pub prompt_template: String,
    /// `training` (format scores 0.2 / 0.1) or `validation` (pure EM / F1).
    pub reward: RewardMode,
    /// How a failed search or page fetch reaches the agent: `observation` (the step happens, the
    /// model reads `Search failed for query: …`, the observation carries the typed code) or
    /// `error` (the step item fails with the code and the episode is unchanged).
    pub tool_errors: ToolErrors,
    /// Rendering of search results; unset = the backend's own (`docs` for corpora and
    /// retrievers, `pages` for web providers).
    pub render: Option<RenderFormat>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum ToolErrors {
    Observation,
    Error,
}

impl Default for EpisodeDefaults {
    fn default() -> Self {
        Self {
            max_turns: 3,
            topk: 3,
            prompt_template: DEFAULT_PROMPT.to_string(),
            reward: RewardMode::Training,
            tool_errors: ToolErrors::Observation,
            render: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardMode {
    Training,
    Validation,
}

impl RewardMode {
    pub fn config(self) -> RewardConfig {
        match self {
            RewardMode::Training => RewardConfig::TRAINING,
            RewardMode::Validation => RewardConfig::VALIDATION,
        }
    }
}

/// Our wording of the Search-R1 instruction, with the same tags and the same example answer
/// (the answer extractor of full sequences relies on exactly one example in the prompt).
pub const DEFAULT_PROMPT: &str = "Answer the question below. Reason inside <think> and </think> first, and again \
every time you receive new information. If you find you lack some knowledge, you can call a search engine by \
writing <search> query </search>, and it will return the top results between <information> and </information>. \
You can search as many times as you want. If no further external knowledge is needed, give the answer inside \
<answer> and </answer>, without detailed illustrations, for example <answer> Beijing </answer>. Question: {question}\n";
