//! The trainer's integration tests, one binary (each test binary links libtorch; one link
//! instead of ten). A module per area; `faults.rs` stays its own binary (it has its own `main`
//! and re-executes itself as a server).

mod cli_train;
#[path = "../common/mod.rs"]
mod common;
mod generation;
mod logprobs;
mod model_parity;
mod optim;
mod running_batch;
mod scratch;
mod smollm2;
mod tch_link;
mod tokenizer;
mod update;
