//! Typed errors that travel on the wire.

use serde::{Deserialize, Serialize};

use crate::ids::EpisodeId;

/// Declares [`ErrorCode`] from one table, `Variant = number, "wire_name";`, so the enum, its
/// numbers, its names and [`ErrorCode::ALL`] cannot drift apart.
macro_rules! error_codes {
    ($($(#[doc = $doc:literal])* $variant:ident = $number:literal, $name:literal;)+) => {
        /// Why a request (or one item of a bulk request) failed. Serialised as a snake_case
        /// string; [`ErrorCode::number`] gives a stable numeric code for logs and metrics.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum ErrorCode {
            $($(#[doc = $doc])* #[serde(rename = $name)] $variant,)+
        }

        impl ErrorCode {
            /// Every code, in numbering order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),+];

            /// Stable numeric code: 1xx frame/session, 2xx episode, 3xx limits, 4xx backend,
            /// 5xx server.
            pub fn number(self) -> u16 {
                match self {
                    $(ErrorCode::$variant => $number,)+
                }
            }

            /// The snake_case name used on the wire.
            pub fn name(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $name,)+
                }
            }
        }
    };
}

error_codes! {
    /// The frame is not a MessagePack envelope of a known request.
    MalformedFrame = 100, "malformed_frame";
    /// The frame is larger than `Limits::max_frame_bytes`.
    FrameTooLarge = 101, "frame_too_large";
    /// A text frame, or another frame type the protocol does not use.
    UnsupportedFrame = 102, "unsupported_frame";
    /// `Hello` carried a protocol version this server does not speak.
    UnsupportedVersion = 103, "unsupported_version";
    /// A request arrived before `Hello`, or `Hello` arrived twice.
    HandshakeRequired = 104, "handshake_required";
    Unauthorized = 105, "unauthorized";
    /// `Hello::resume` named a session that does not exist or whose grace period ran out; its
    /// episodes are closed.
    SessionExpired = 106, "session_expired";
    /// After a reattach: the reply to this request was produced but no longer held (it fell out
    /// of the server's replay buffer). The request's work was done; do not send it again.
    ReplyLost = 107, "reply_lost";
    UnknownEpisode = 200, "unknown_episode";
    /// The episode already finished; it can still be forked at an earlier step.
    EpisodeDone = 201, "episode_done";
    /// `at_step` is beyond the episode's completed steps.
    InvalidStep = 202, "invalid_step";
    /// A tool call with an unknown name or missing arguments.
    InvalidAction = 203, "invalid_action";
    /// The same episode appears twice in one Step request.
    DuplicateEpisode = 204, "duplicate_episode";
    /// The episode belongs to another connection.
    NotOwner = 205, "not_owner";
    /// An action or query longer than the configured limit.
    ActionTooLong = 300, "action_too_long";
    /// More items in one request than `Limits::max_batch`, or more forks than allowed.
    BatchTooLarge = 301, "batch_too_large";
    /// The episode limit (per connection or total) would be exceeded.
    TooManyEpisodes = 302, "too_many_episodes";
    TooManyConnections = 303, "too_many_connections";
    /// A step's client data is larger than `Limits::max_step_data_bytes`.
    DataTooLarge = 306, "data_too_large";
    /// A `JoinForest` that no forest can take: empty or long key, `m` = 0, `k` != 1 + n l, or
    /// more rows than `Limits::max_forest_rows`.
    InvalidForest = 307, "invalid_forest";
    /// A row of a live forest sent another shape, seed, task or options than the forest's first
    /// row.
    ForestMismatch = 308, "forest_mismatch";
    /// The forest already has all its rows, or has finished.
    ForestFull = 309, "forest_full";
    /// The forest ran past `Limits::forest_timeout_ms` before this row's node was ready; its
    /// episodes are closed.
    ForestExpired = 310, "forest_expired";
    /// The server holds `Limits::max_forests` forests.
    TooManyForests = 311, "too_many_forests";
    UnknownBackend = 400, "unknown_backend";
    /// The search backend (or page fetch) failed.
    BackendError = 401, "backend_error";
    /// The search or page fetch ran past its deadline.
    BackendTimeout = 402, "backend_timeout";
    /// Replay mode: the call was never recorded in the cache.
    ReplayMiss = 403, "replay_miss";
    /// The open-page tool refused the URL (scheme, private address, redirects).
    UrlRejected = 404, "url_rejected";
    /// The server is shutting down and takes no new work.
    ShuttingDown = 500, "shutting_down";
    /// A bug on the server side; the message says more.
    Internal = 501, "internal";
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An error reply: a code, a human-readable message and the episode it concerns, if any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo {
    pub code: ErrorCode,
    pub message: String,
    pub episode: Option<EpisodeId>,
}

impl ErrorInfo {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), episode: None }
    }

    pub fn for_episode(code: ErrorCode, episode: EpisodeId, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), episode: Some(episode) }
    }
}

impl std::fmt::Display for ErrorInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.episode {
            Some(e) => write!(f, "{} (episode {e}): {}", self.code, self.message),
            None => write!(f, "{}: {}", self.code, self.message),
        }
    }
}

impl std::error::Error for ErrorInfo {}
