//! Grove's trainer: Hugging Face causal LMs in libtorch (through `tch`), tree and chain rollouts
//! against env-servers, and Tree-GRPO / GRPO updates.
//!
//! The code is grouped by wing, each a folder: [`engine`] (the model and what runs it), [`rl`]
//! (rollouts, the algorithm, the training loop), [`workflows`] (SFT, warm starts, evaluation),
//! [`measure`] (bench, budgets, experiments) and [`support`]; ARCHITECTURE.md draws their layers
//! and `cargo xtask tidy` checks them.
//!
//! Architecture invariants: `model/` is pure tensor code (no I/O beyond loading and saving
//! weights); the env client, rollouts, algorithm, optimiser, loop and CLI are separate modules;
//! every tensor lives on one thread (tch `Tensor` is not `Sync`), other threads talk to it
//! through channels.

pub mod engine;
pub mod measure;
pub mod rl;
pub mod support;
pub mod workflows;

/// The run folder's layout and records (its own crate, so that `xtask` reads runs without libtorch).
pub use grove_rundir as rundir;
