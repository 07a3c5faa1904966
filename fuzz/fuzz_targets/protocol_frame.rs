//! Wire frames: `decode_request`, `decode_response` and `peek_id` on arbitrary bytes. A frame
//! that decodes must survive encode → decode unchanged, and re-encode to the same bytes.
#![no_main]

use std::fmt::Debug;

use grove_protocol::{DecodeError, Envelope, decode_request, decode_response, encode, peek_id};
use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;

fn check<M>(
    data: &[u8],
    decoded: Result<Envelope<M>, DecodeError>,
    decode: fn(&[u8]) -> Result<Envelope<M>, DecodeError>,
) where
    M: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let env = match decoded {
        Ok(env) => env,
        Err(e) => {
            // The error carries whatever id could be read, and renders.
            assert_eq!(e.id, peek_id(data));
            let _ = e.to_string();
            return;
        }
    };
    assert_eq!(peek_id(data), Some(env.id), "a decodable frame must have a readable id");
    let bytes = encode(&env).expect("a decoded envelope must encode");
    let back = decode(&bytes).unwrap_or_else(|e| panic!("re-encoded frame does not decode: {e}\n{env:?}"));
    // NaN is the one value that is not equal to itself; the bytes still must be.
    if !format!("{env:?}").contains("NaN") {
        assert_eq!(back, env, "round trip changed the message");
    }
    assert_eq!(encode(&back).expect("encode"), bytes, "encoding is not a fixed point");
    assert_eq!(peek_id(&bytes), Some(env.id));
}

fuzz_target!(|data: &[u8]| {
    check(data, decode_request(data), decode_request);
    check(data, decode_response(data), decode_response);
});
