//! The env-server's integration tests, one binary (one link instead of seven): a module per
//! area, the shared server and tasks in `common`. `dense` is compiled only with the `dense`
//! feature (`cargo test -p grove-env-server --features dense`); without it the binary has no such
//! module.

mod cli;
mod common;
#[cfg(feature = "dense")]
mod dense;
mod episodes;
mod errors;
mod forest;
mod hostile;
mod http;
mod web;
