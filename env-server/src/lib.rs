//! Grove's environment server: QA and web-search episodes as entities of a `bevy_ecs` world,
//! forkable at any completed step, served over WebSocket (MessagePack) with a Search-R1
//! compatible HTTP side door.
//!
//! Architecture invariants: this crate never links libtorch; the ECS core does no I/O (sockets
//! and HTTP live in the net layer, search backends sit behind a trait and are called outside the
//! systems).
