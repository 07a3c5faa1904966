//! `cargo xtask soak --minutes N`: build the env-server and its soak client (`env-server-soak`,
//! the env-server's `soak` feature) in release and run the client, which keeps ~1,000 episodes
//! stepping and forking on an `env-server` process for N minutes and fails when the server's RSS
//! grows after warm-up.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

use crate::util;

#[derive(clap::Args)]
pub struct SoakArgs {
    /// Length of the run, in minutes.
    #[arg(long)]
    minutes: f64,
    /// Further `env-server-soak` arguments (--episodes, --connections, --interval-secs,
    /// --warmup-minutes, --scale, --max-turns, --think-ms, --seed, --drop-every-secs), passed
    /// through.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    rest: Vec<String>,
}

pub fn run(root: &Path, args: &SoakArgs) -> Result<()> {
    let build = [
        "build",
        "--release",
        "-p",
        "grove-env-server",
        "--features",
        "soak",
        "--bin",
        "env-server",
        "--bin",
        "env-server-soak",
    ];
    util::banner(&format!("cargo {}", build.join(" ")));
    util::run(root, "cargo", &build)?;
    let release = util::target_dir(root)?.join("release");
    let binary = |name: &str| release.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    util::banner(&format!("env-server-soak --minutes {}", args.minutes));
    util::run_cmd(
        Command::new(binary("env-server-soak"))
            .current_dir(root)
            .arg("--server")
            .arg(binary("env-server"))
            .arg("--minutes")
            .arg(args.minutes.to_string())
            .args(&args.rest),
    )
}
