//! Grove's cross-crate tests, one binary (it links libtorch once): data through the wire, the
//! scripted agent, rollout trees, reattaching, OpenAI-compatible evaluation, training end to end,
//! the experiment command, and `trainer view` on a real run's folder. A module per area; the
//! helpers they share are the `grove_tests` library.

mod data_to_wire;
mod experiment;
mod openai_eval;
mod reattach;
mod rollout_tree;
mod scripted_agent;
mod train_e2e;
mod view;
