//! Project chores behind the commands the README names: `cargo xtask demo` (the whole system
//! learning on a laptop), `cargo xtask setup` (libtorch), `cargo xtask assets` (real tokenizer,
//! model, corpus and QA data), `cargo xtask test` (setup, then formatting, lints, the Rust suite
//! and the Python checks).

mod assets;
mod bench;
mod debian;
mod demo;
mod experiment;
mod fuzz;
mod gpu;
mod layers;
mod libtorch;
mod python;
mod soak;
mod tidy;
mod util;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Grove project chores")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fetch and verify libtorch 2.11.0 into the cache and link it for the build.
    Setup {
        /// The full CUDA libtorch (several GB) instead of the CPU libraries.
        #[arg(long)]
        cuda: bool,
        /// Re-hash every cached file against the manifest written at setup.
        #[arg(long)]
        verify: bool,
    },
    /// Fetch the real assets (tokenizer, SmolLM2 GGUF, Wikipedia summaries, FanOutQA) and
    /// convert them into Grove's formats in the cache.
    Assets {
        /// Convert again even if the outputs are present.
        #[arg(long)]
        force: bool,
    },
    /// Setup, assets, then fmt --check, clippy -D warnings, every Rust test and the Python tests.
    Test {
        /// Skip `cargo fmt --check` and clippy (for a quick local run; CI never skips).
        #[arg(long)]
        no_lint: bool,
        /// Extra arguments passed to `cargo test` (after `--`).
        #[arg(last = true)]
        cargo_test_args: Vec<String>,
    },
    /// Print the environment the build uses (for shells and IDEs).
    Env,
    /// The main job on embedded defaults: a small policy warm-started and trained with Tree-GRPO
    /// on a synthetic multi-hop world (EM before and after), then SmolLM2-135M-Instruct learning
    /// to search that world (held-out EM before and after a short SFT); --full adds SmolLM2 as a
    /// ReAct agent on FanOutQA over mini-Wikipedia.
    Demo(demo::DemoArgs),
    /// Chain GRPO against Tree-GRPO at equal budget (2 and 4), from a strong and a weak warm start
    /// on the synthetic world: learning-rate sweep on the training reward, 5 paired seeds, paired
    /// differences with 95% intervals, table and plots. Resumes where it stopped; --quick checks
    /// the whole path in a few minutes.
    Experiment(experiment::ExperimentArgs),
    /// Build the env-server in release and soak it: ~1,000 live episodes stepping and forking for
    /// --minutes, RSS and latency printed over time; fails if RSS is not flat after warm-up.
    Soak(soak::SoakArgs),
    /// The project's headline figures in one table, each with its same-run baseline: steps over
    /// WebSocket vs HTTP /retrieve, fork cost, BM25, SmolLM2 generation and training, KV-prefix
    /// reuse vs re-encoding, tree vs chain at equal budget (markdown in target/bench/bench.md).
    Bench(bench::BenchArgs),
    /// Lay out what the GPU device machine needs to check Grove there (stripped release
    /// binaries, golden models, tokenizer, a small world, the script); `--cpu` also runs the
    /// script here in its CPU mode.
    GpuCheck(gpu::GpuArgs),
    /// Check that every Rust file has a module doc and is on ARCHITECTURE.md's code map, that
    /// every subcommand is on it, and that no test is switched off (also a test of xtask).
    Tidy,
    /// Run the libFuzzer targets in fuzz/ (wire frames, action parser, dataset loaders, GGUF)
    /// for --seconds each with a persistent corpus in the cache; fails on any crash.
    Fuzz(fuzz::FuzzArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = workspace_root()?;
    match cli.command {
        Command::Setup { cuda, verify } => {
            let dir = libtorch::ensure(&root, libtorch::Variant::from_cuda_flag(cuda))?;
            if verify {
                libtorch::verify_full(&dir)?;
            }
            println!("libtorch ready: {}", dir.display());
        }
        Command::Assets { force } => assets::ensure_all(force)?,
        Command::Test { no_lint, cargo_test_args } => test(&root, no_lint, &cargo_test_args)?,
        Command::Demo(args) => demo::run(&root, &args)?,
        Command::Experiment(args) => experiment::run(&root, &args)?,
        Command::Soak(args) => soak::run(&root, &args)?,
        Command::Bench(args) => bench::run(&root, &args)?,
        Command::Fuzz(args) => fuzz::run(&root, &args)?,
        Command::GpuCheck(args) => gpu::run(&root, &args)?,
        Command::Tidy => tidy::run(&root)?,
        Command::Env => {
            let dir = libtorch::ensure(&root, libtorch::Variant::Cpu)?;
            println!("export LIBTORCH={}", dir.display());
            println!("export LIBTORCH_CXX11_ABI=1");
            println!("export GROVE_CACHE={}", grove_datasets::assets::cache_dir().display());
        }
    }
    Ok(())
}

/// Features `cargo xtask test` lints and tests with, beyond the defaults: the env-server's soak
/// binary and the trainer's baseline engine (what `cargo xtask soak` and `bench` build).
const LINT_AND_TEST_FEATURES: &str = "grove-env-server/soak,grove-trainer/bench-baseline";

/// The checkout `cargo xtask` was run in. `cargo run` tells the binary its manifest folder at run
/// time; the path compiled in is only a fallback (for the binary run by hand), since a binary
/// cargo reuses may have been built from another checkout sharing the target folder, and would
/// then build, run and write in that checkout.
fn workspace_root() -> Result<PathBuf> {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .filter(|m| m.join("Cargo.toml").is_file())
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    Ok(manifest.parent().context("xtask has no parent directory")?.to_path_buf())
}

fn test(root: &Path, no_lint: bool, cargo_test_args: &[String]) -> Result<()> {
    let started = Instant::now();
    let mut phases: Vec<(&str, f64)> = Vec::new();
    let mut phase = |name: &'static str, f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
        util::banner(name);
        let t = Instant::now();
        f().with_context(|| format!("`cargo xtask test` failed at: {name}"))?;
        phases.push((name, t.elapsed().as_secs_f64()));
        Ok(())
    };
    phase("libtorch", &mut || libtorch::ensure(root, libtorch::Variant::Cpu).map(drop))?;
    phase("assets", &mut || assets::ensure_all(false))?;
    let venv = python::venv_dir();
    phase("python venv", &mut || python::ensure_venv(&venv))?;
    let mut redis_server = PathBuf::new();
    phase("redis-server", &mut || {
        redis_server = debian::ensure(&debian::REDIS_SERVER)?;
        println!("redis-server: {}", redis_server.display());
        Ok(())
    })?;
    let mut chromium = PathBuf::new();
    phase("chromium", &mut || {
        chromium = debian::ensure(&debian::CHROMIUM)?;
        println!("chromium: {}", chromium.display());
        Ok(())
    })?;
    if !no_lint {
        phase("cargo fmt --check", &mut || util::run(root, "cargo", &["fmt", "--all", "--check"]))?;
        // With the env-server's `soak` feature and the trainer's `bench-baseline`, so that the soak
        // binary and the bench's baseline engine are linted too.
        phase("cargo clippy", &mut || {
            util::run(
                root,
                "cargo",
                &[
                    "clippy",
                    "--workspace",
                    "--all-targets",
                    "--features",
                    LINT_AND_TEST_FEATURES,
                    "--",
                    "-D",
                    "warnings",
                ],
            )
        })?;
    }
    phase("cargo test", &mut || {
        // Every test binary runs even after one fails, so a run reports all its failures at once.
        let mut args = vec!["test", "--workspace", "--no-fail-fast", "--features", LINT_AND_TEST_FEATURES];
        args.extend(cargo_test_args.iter().map(String::as_str));
        // The shared-cache tests start their own redis-servers from this program; the FAISS
        // file tests run faiss-cpu from the venv; grove-view's browser test drives this Chromium.
        util::run_cmd(
            std::process::Command::new("cargo")
                .current_dir(root)
                .args(&args)
                .env("GROVE_REDIS_SERVER", &redis_server)
                .env("GROVE_CHROMIUM", &chromium)
                .env("GROVE_PYTHON", python::python(&venv)),
        )
    })?;
    phase("gpu-check (CPU mode)", &mut || {
        let args = gpu::GpuArgs { out: gpu::ci_dir(root), cpu: true, debug: true };
        gpu::run(root, &args)
    })?;
    phase("fuzz (time-boxed)", &mut || fuzz::time_boxed(root))?;
    phase("python tests", &mut || {
        // The Python client's tests start a real env-server. `cargo test --workspace` built it
        // (for env-server's own integration tests); build it only when a filtered run did not, as
        // a plain `cargo build -p` unifies features differently and would rebuild half the tree.
        let env_server = python::env_server_binary(root)?;
        if !env_server.exists() {
            util::run(root, "cargo", &["build", "-p", "grove-env-server", "--bin", "env-server"])?;
        }
        python::pytest(
            &venv,
            root,
            &["protocol/tests/python", "clients/python/tests"],
            &[("GROVE_ENV_SERVER", env_server.as_path()), ("GROVE_REQUIRE_ENV_SERVER", Path::new("1"))],
        )
    })?;
    let verl_venv = python::verl_venv_dir();
    phase("verl venv", &mut || python::ensure_verl_venv(root, &verl_venv))?;
    phase("verl tests", &mut || {
        // verl's real agent-loop and estimator code against a real env-server, with SmolLM2
        // generating on the CPU (clients/verl/tests).
        let env_server = python::env_server_binary(root)?;
        let gguf = grove_datasets::assets::smollm2_gguf();
        python::pytest(
            &verl_venv,
            root,
            &["clients/verl/tests"],
            &[
                ("GROVE_ENV_SERVER", env_server.as_path()),
                ("GROVE_REQUIRE_ENV_SERVER", Path::new("1")),
                ("GROVE_SMOLLM2_GGUF", gguf.as_path()),
                // torch's own pool on top of the env-server and the test's processes oversubscribes
                // the CPU; one thread per process keeps the suite's time steady.
                ("OMP_NUM_THREADS", Path::new("1")),
            ],
        )
    })?;
    util::banner("summary");
    for (name, secs) in &phases {
        println!("  {name:<20} {secs:>8.1} s");
    }
    println!("  {:<20} {:>8.1} s", "total", started.elapsed().as_secs_f64());
    Ok(())
}
