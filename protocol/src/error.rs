//! Typed errors that travel on the wire.

use serde::{Deserialize, Serialize};

use crate::messages::EpisodeId;

/// Why a request (or one item of a bulk request) failed. Serialised as a snake_case string;
/// [`ErrorCode::number`] gives a stable numeric code for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The frame is not a MessagePack envelope of a known request.
    MalformedFrame,
    /// The frame is larger than `Limits::max_frame_bytes`.
    FrameTooLarge,
    /// A text frame, or another frame type the protocol does not use.
    UnsupportedFrame,
    /// `Hello` carried a protocol version this server does not speak.
    UnsupportedVersion,
    /// A request arrived before `Hello`, or `Hello` arrived twice.
    HandshakeRequired,
    Unauthorized,
    /// `Hello::resume` named a session that does not exist or whose grace period ran out; its
    /// episodes are closed.
    SessionExpired,
    /// After a reattach: the reply to this request was produced but no longer held (it fell out
    /// of the server's replay buffer). The request's work was done; do not send it again.
    ReplyLost,
    UnknownEpisode,
    /// The episode already finished; it can still be forked at an earlier step.
    EpisodeDone,
    /// `at_step` is beyond the episode's completed steps.
    InvalidStep,
    /// A tool call with an unknown name or missing arguments.
    InvalidAction,
    /// An action or query longer than the configured limit.
    ActionTooLong,
    /// More items in one request than `Limits::max_batch`, or more forks than allowed.
    BatchTooLarge,
    /// The episode limit (per connection or total) would be exceeded.
    TooManyEpisodes,
    TooManyConnections,
    /// The same episode appears twice in one Step request.
    DuplicateEpisode,
    /// The episode belongs to another connection.
    NotOwner,
    UnknownBackend,
    /// The search backend (or page fetch) failed.
    BackendError,
    /// The search or page fetch ran past its deadline.
    BackendTimeout,
    /// Replay mode: the call was never recorded in the cache.
    ReplayMiss,
    /// The open-page tool refused the URL (scheme, private address, redirects).
    UrlRejected,
    /// The server is shutting down and takes no new work.
    ShuttingDown,
    /// A bug on the server side; the message says more.
    Internal,
}

impl ErrorCode {
    /// Every code, in numbering order.
    pub const ALL: [ErrorCode; 25] = [
        ErrorCode::MalformedFrame,
        ErrorCode::FrameTooLarge,
        ErrorCode::UnsupportedFrame,
        ErrorCode::UnsupportedVersion,
        ErrorCode::HandshakeRequired,
        ErrorCode::Unauthorized,
        ErrorCode::SessionExpired,
        ErrorCode::ReplyLost,
        ErrorCode::UnknownEpisode,
        ErrorCode::EpisodeDone,
        ErrorCode::InvalidStep,
        ErrorCode::InvalidAction,
        ErrorCode::ActionTooLong,
        ErrorCode::BatchTooLarge,
        ErrorCode::TooManyEpisodes,
        ErrorCode::TooManyConnections,
        ErrorCode::DuplicateEpisode,
        ErrorCode::NotOwner,
        ErrorCode::UnknownBackend,
        ErrorCode::BackendError,
        ErrorCode::BackendTimeout,
        ErrorCode::ReplayMiss,
        ErrorCode::UrlRejected,
        ErrorCode::ShuttingDown,
        ErrorCode::Internal,
    ];

    /// Stable numeric code: 1xx frame/session, 2xx episode, 3xx limits, 4xx backend, 5xx server.
    pub fn number(self) -> u16 {
        match self {
            ErrorCode::MalformedFrame => 100,
            ErrorCode::FrameTooLarge => 101,
            ErrorCode::UnsupportedFrame => 102,
            ErrorCode::UnsupportedVersion => 103,
            ErrorCode::HandshakeRequired => 104,
            ErrorCode::Unauthorized => 105,
            ErrorCode::SessionExpired => 106,
            ErrorCode::ReplyLost => 107,
            ErrorCode::UnknownEpisode => 200,
            ErrorCode::EpisodeDone => 201,
            ErrorCode::InvalidStep => 202,
            ErrorCode::InvalidAction => 203,
            ErrorCode::DuplicateEpisode => 204,
            ErrorCode::NotOwner => 205,
            ErrorCode::ActionTooLong => 300,
            ErrorCode::BatchTooLarge => 301,
            ErrorCode::TooManyEpisodes => 302,
            ErrorCode::TooManyConnections => 303,
            ErrorCode::UnknownBackend => 400,
            ErrorCode::BackendError => 401,
            ErrorCode::BackendTimeout => 402,
            ErrorCode::ReplayMiss => 403,
            ErrorCode::UrlRejected => 404,
            ErrorCode::ShuttingDown => 500,
            ErrorCode::Internal => 501,
        }
    }

    /// The snake_case name used on the wire.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::MalformedFrame => "malformed_frame",
            ErrorCode::FrameTooLarge => "frame_too_large",
            ErrorCode::UnsupportedFrame => "unsupported_frame",
            ErrorCode::UnsupportedVersion => "unsupported_version",
            ErrorCode::HandshakeRequired => "handshake_required",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::SessionExpired => "session_expired",
            ErrorCode::ReplyLost => "reply_lost",
            ErrorCode::UnknownEpisode => "unknown_episode",
            ErrorCode::EpisodeDone => "episode_done",
            ErrorCode::InvalidStep => "invalid_step",
            ErrorCode::InvalidAction => "invalid_action",
            ErrorCode::ActionTooLong => "action_too_long",
            ErrorCode::BatchTooLarge => "batch_too_large",
            ErrorCode::TooManyEpisodes => "too_many_episodes",
            ErrorCode::TooManyConnections => "too_many_connections",
            ErrorCode::DuplicateEpisode => "duplicate_episode",
            ErrorCode::NotOwner => "not_owner",
            ErrorCode::UnknownBackend => "unknown_backend",
            ErrorCode::BackendError => "backend_error",
            ErrorCode::BackendTimeout => "backend_timeout",
            ErrorCode::ReplayMiss => "replay_miss",
            ErrorCode::UrlRejected => "url_rejected",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::Internal => "internal",
        }
    }
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
