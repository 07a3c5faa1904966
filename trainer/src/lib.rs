//! Grove's trainer: Hugging Face causal LMs in libtorch (through `tch`), tree and chain rollouts
//! against env-servers, and Tree-GRPO / GRPO updates.
//!
//! Architecture invariants: `model/` is pure tensor code (no I/O beyond loading and saving
//! weights); the env client, rollouts, algorithm, optimiser, loop and CLI are separate modules;
//! every tensor lives on one thread (tch `Tensor` is not `Sync`), other threads talk to it
//! through channels.

pub mod algo;
pub mod bench;
pub mod budget;
pub mod data;
pub mod device;
pub mod env;
pub mod eval;
pub mod experiment;
pub mod generate;
pub mod gguf;
pub mod import;
pub mod logprobs;
pub mod method;
pub mod model;
pub mod openai;
pub mod optim;
pub mod parity;
pub mod plan;
pub mod plots;
pub mod rollout;
pub mod rows;
pub mod scratch;
pub mod scripted;
pub mod sft;
pub mod timing;
pub mod tokenizer;
pub mod train;
pub mod warmstart;
pub mod world;

/// The run folder's layout and records (its own crate, so that `xtask` reads runs without libtorch).
pub use grove_rundir as rundir;
