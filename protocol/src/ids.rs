//! The ids every other protocol module names: requests and episodes.

/// Chosen by the client; echoed on the reply. Unique per connection while in flight.
pub type RequestId = u64;
/// Server-wide episode id. Never reused while the server runs.
pub type EpisodeId = u64;
