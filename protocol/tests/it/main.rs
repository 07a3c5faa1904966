//! The protocol crate's integration tests, one binary: every message round-trips the wire with a
//! unique error number per code, and PROTOCOL.md agrees with the code.

mod protocol_doc;
mod wire;
