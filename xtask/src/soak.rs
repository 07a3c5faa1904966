//! `cargo xtask soak --minutes N`: build the env-server in release and run `env-server soak`,
//! which keeps ~1,000 episodes stepping and forking on a server process for N minutes and fails
//! when the server's RSS grows after warm-up.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

use crate::util;

#[derive(clap::Args)]
pub struct SoakArgs {
    /// Length of the run, in minutes.
    #[arg(long)]
    minutes: f64,
    /// Further `env-server soak` arguments (--episodes, --connections, --interval-secs,
    /// --warmup-minutes, --scale, --max-turns, --think-ms, --seed), passed through.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    rest: Vec<String>,
}

pub fn run(root: &Path, args: &SoakArgs) -> Result<()> {
    util::banner("cargo build --release -p grove-env-server --bin env-server");
    util::run(root, "cargo", &["build", "--release", "-p", "grove-env-server", "--bin", "env-server"])?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map(|d| root.join(d))
        .unwrap_or_else(|| root.join("target"));
    let binary = target.join("release").join(format!("env-server{}", std::env::consts::EXE_SUFFIX));
    util::banner(&format!("env-server soak --minutes {}", args.minutes));
    util::run_cmd(
        Command::new(&binary)
            .current_dir(root)
            .arg("soak")
            .arg("--minutes")
            .arg(args.minutes.to_string())
            .args(&args.rest),
    )
}
