"""Errors a Grove server reports, and the client's own."""

# Stable numbers of the protocol's error codes (see protocol/PROTOCOL.md, section 9). Only the
# name travels on the wire; the number is for logs and metrics.
ERROR_NUMBERS = {
    "malformed_frame": 100,
    "frame_too_large": 101,
    "unsupported_frame": 102,
    "unsupported_version": 103,
    "handshake_required": 104,
    "unauthorized": 105,
    "session_expired": 106,
    "reply_lost": 107,
    "unknown_episode": 200,
    "episode_done": 201,
    "invalid_step": 202,
    "invalid_action": 203,
    "duplicate_episode": 204,
    "not_owner": 205,
    "action_too_long": 300,
    "batch_too_large": 301,
    "too_many_episodes": 302,
    "too_many_connections": 303,
    "data_too_large": 306,
    "invalid_forest": 307,
    "forest_mismatch": 308,
    "forest_full": 309,
    "forest_expired": 310,
    "too_many_forests": 311,
    "unknown_backend": 400,
    "backend_error": 401,
    "backend_timeout": 402,
    "replay_miss": 403,
    "url_rejected": 404,
    "shutting_down": 500,
    "internal": 501,
}


class GroveError(Exception):
    """An error the server sent: `code` is the snake_case name, `number` its stable number."""

    def __init__(self, code, message="", episode=None):
        self.code = code
        self.number = ERROR_NUMBERS.get(code)
        self.message = message
        self.episode = episode
        where = f" (episode {episode})" if episode is not None else ""
        super().__init__(f"{code} [{self.number}]{where}: {message}")

    @classmethod
    def from_info(cls, info):
        """Build from a wire `ErrorInfo` map."""
        return cls(info.get("code", "internal"), info.get("message", ""), info.get("episode"))


class ConnectionClosed(Exception):
    """The connection to the server is gone; no reply will come."""


class UnexpectedReply(Exception):
    """The server answered with a reply of the wrong kind."""
