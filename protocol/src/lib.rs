//! Grove's wire protocol, version 1.
//!
//! Every WebSocket binary frame carries one MessagePack-encoded [`Envelope`]: `{id, msg}`. Clients
//! send `Envelope<Request>`; the server answers with `Envelope<Response>` carrying the same `id`.
//! Replies may arrive out of order, and many requests may be in flight on one connection.
//!
//! Encoding rules (checked by tests, and by a Python decoder in `cargo xtask test`):
//! - structs are MessagePack maps keyed by field name ([`rmp_serde::to_vec_named`]);
//! - enums are externally tagged: a unit variant is a string (`"Stats"`), any other variant is a
//!   one-entry map `{"Variant": payload}`;
//! - `Option` fields that are `None` are written as `nil` and may be omitted by other clients.
//!
//! This crate is the only one in the workspace with wire types; it depends on no other Grove crate.

#[cfg(feature = "client")]
pub mod client;
mod codec;
mod error;
pub mod examples;
mod forest;
mod ids;
mod messages;

pub use codec::{DecodeError, EncodeError, decode, decode_request, decode_response, encode, peek_id};
pub use error::{ErrorCode, ErrorInfo};
pub use forest::*;
pub use messages::*;

/// The protocol version this crate speaks. A server accepts a `Hello` whose major version equals
/// its own; anything else is answered with [`ErrorCode::UnsupportedVersion`].
pub const PROTOCOL_VERSION: u32 = 1;
