//! MessagePack encoding of envelopes.

use serde::{Deserialize, Serialize, de::DeserializeOwned, de::IgnoredAny};

use crate::messages::{Envelope, Request, RequestId, Response};

#[derive(Debug, thiserror::Error)]
#[error("cannot encode message: {0}")]
pub struct EncodeError(#[from] rmp_serde::encode::Error);

/// A frame that is not a valid envelope. `id` is the request id when at least that much could be
/// read, so the error reply can still be matched to its request.
#[derive(Debug, thiserror::Error)]
#[error("malformed frame{}: {source}", id.map(|i| format!(" (request {i})")).unwrap_or_default())]
pub struct DecodeError {
    pub id: Option<RequestId>,
    #[source]
    pub source: rmp_serde::decode::Error,
}

/// Encode with field names (structs as maps), as the protocol requires.
pub fn encode<M: Serialize>(envelope: &Envelope<M>) -> Result<Vec<u8>, EncodeError> {
    Ok(rmp_serde::to_vec_named(envelope)?)
}

/// Deepest nesting of arrays and maps a frame may have. Decoding recurses once per level, and
/// rmp-serde's own default (1024) overflows a 2 MiB thread stack in debug builds with
/// `serde_json::Value` tool arguments; no protocol message needs more than a dozen levels, so
/// deeper frames are malformed.
pub const MAX_DEPTH: usize = 64;

/// Deserialize from a slice with the depth limit. Declared lengths are checked against the bytes
/// that are really there before anything is allocated.
fn from_slice<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> Result<T, rmp_serde::decode::Error> {
    let mut de = rmp_serde::Deserializer::from_read_ref(bytes);
    de.set_max_depth(MAX_DEPTH);
    T::deserialize(&mut de)
}

/// Decode an envelope of any message type.
pub fn decode<M: DeserializeOwned>(bytes: &[u8]) -> Result<Envelope<M>, DecodeError> {
    from_slice(bytes).map_err(|source| DecodeError { id: peek_id(bytes), source })
}

pub fn decode_request(bytes: &[u8]) -> Result<Envelope<Request>, DecodeError> {
    decode(bytes)
}

pub fn decode_response(bytes: &[u8]) -> Result<Envelope<Response>, DecodeError> {
    decode(bytes)
}

/// Read just the `id` of an envelope whose `msg` may be unreadable or unwanted.
pub fn peek_id(bytes: &[u8]) -> Option<RequestId> {
    #[derive(Deserialize)]
    struct IdOnly {
        id: RequestId,
        #[serde(rename = "msg")]
        _msg: Option<IgnoredAny>,
    }
    from_slice::<IdOnly>(bytes).ok().map(|e| e.id)
}
