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
pub mod device;
pub mod eval;
pub mod experiment;
pub mod generate;
pub mod gguf;
pub mod import;
pub mod logprobs;
pub mod model;
pub mod openai;
pub mod optim;
pub mod plots;
pub mod rollout;
pub mod run;
pub mod scratch;
pub mod scripted;
pub mod sft;
pub mod tokenizer;
pub mod train;
pub mod world;
