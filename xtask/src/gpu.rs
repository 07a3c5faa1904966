//! `cargo xtask gpu-check`: lay out, in one ignored folder, everything the GPU device machine
//! needs to check Grove there (the recipe of `../shared/gpu/README.md`): the release binaries,
//! stripped (they run on the device's own libtorch with libtorch_cuda preloaded); the golden
//! tiny models for parity; the Qwen2.5 tokenizer (random-weight models of real shapes are made
//! on the device by `make_model.py`); a small synthetic world for rollouts; the HF scripts; and
//! `check.sh`, which runs it all. `--cpu` then runs the same script here in its CPU mode (what
//! `cargo xtask test` does, so that the script cannot rot).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::util;

/// What travels to the device must stay under this (the device tool carries at most 64 MiB).
const CARRY_LIMIT: u64 = 64 << 20;

#[derive(Debug, Clone, clap::Args)]
pub struct GpuArgs {
    /// The folder to lay out (relative to the repository root; keep it ignored by git).
    #[arg(long, default_value = ".gpu")]
    pub out: PathBuf,
    /// Run the script here afterwards, in its CPU mode (tiny model, no transformers needed).
    #[arg(long)]
    pub cpu: bool,
    /// Use the debug build instead of a stripped release build (for the CPU mode).
    #[arg(long)]
    pub debug: bool,
}

fn copy(from: &Path, to: &Path) -> Result<u64> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    std::fs::copy(from, to).with_context(|| format!("copy {} to {}", from.display(), to.display()))
}

fn size_of(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() { size_of(&p) } else { e.metadata().map(|m| m.len()).unwrap_or(0) }
        })
        .sum()
}

pub fn run(root: &Path, args: &GpuArgs) -> Result<()> {
    let out = if args.out.is_absolute() { args.out.clone() } else { root.join(&args.out) };
    crate::libtorch::ensure(root, crate::libtorch::Variant::Cpu)?;
    crate::assets::ensure_all(false)?;
    util::banner(if args.debug { "build: trainer and env-server" } else { "build: trainer and env-server (release)" });
    let mut build = vec!["build", "-p", "grove-trainer", "-p", "grove-env-server", "--bins"];
    if !args.debug {
        build.push("--release");
    }
    util::run(root, "cargo", &build)?;
    let bins = crate::demo::target_dir(root)?.join(if args.debug { "debug" } else { "release" });
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("remove {}", out.display()))?;
    }
    std::fs::create_dir_all(&out)?;
    util::banner(&format!("lay out {}", out.display()));
    for bin in ["trainer", "env-server"] {
        let to = out.join(bin);
        copy(&bins.join(bin), &to)?;
        if !args.debug {
            util::run_cmd(Command::new("strip").arg(&to)).context("strip (binutils) the release binaries")?;
        }
    }
    std::fs::write(out.join("check.sh"), include_str!("../gpu/check.sh"))?;
    let shared = root.join("..").join("shared");
    for script in ["make_model.py", "hf_bench.py"] {
        let from = shared.join("gpu").join(script);
        if from.exists() {
            copy(&from, &out.join(script))?;
        } else {
            eprintln!("warning: {} is missing: the device run cannot make models or run transformers", from.display());
        }
    }
    for model in ["qwen2-tiny", "llama3-tiny"] {
        for file in ["config.json", "model.safetensors", "cases.safetensors"] {
            copy(&shared.join("golden").join(model).join(file), &out.join("golden").join(model).join(file))?;
        }
    }
    let tok = grove_datasets::assets::qwen25_tokenizer_dir();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        copy(&tok.join(file), &out.join("tok").join(file))?;
    }
    util::run_cmd(
        Command::new(out.join("trainer"))
            .args(["world", "--train", "8", "--test", "40", "--out"])
            .arg(out.join("world")),
    )?;
    let bytes = size_of(&out);
    println!("{} holds {:.1} MiB", out.display(), bytes as f64 / (1 << 20) as f64);
    if bytes > CARRY_LIMIT && !args.debug {
        bail!("{} is {bytes} bytes: more than the 64 MiB the device tool carries", out.display());
    }
    let rel = out.strip_prefix(root).unwrap_or(&out).display().to_string();
    println!("on the device: carry [\"{rel}\"], run `bash {rel}/check.sh` (results in $OUT/summary.txt and all.log)");
    if args.cpu {
        util::banner("the device script in its CPU mode");
        let results = out.join("out");
        util::run_cmd(
            Command::new("bash").arg(out.join("check.sh")).env("DEV", "cpu").env("OUT", &results).current_dir(root),
        )?;
        let summary = std::fs::read_to_string(results.join("summary.txt"))?;
        let failed: Vec<&str> = summary.lines().filter(|l| l.contains(" rc=") && !l.contains(" rc=0 ")).collect();
        if !failed.is_empty() || !summary.lines().any(|l| l.trim() == "done") {
            let log = std::fs::read_to_string(results.join("all.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(80).collect::<Vec<_>>().into_iter().rev().collect();
            bail!(
                "the GPU check script failed in CPU mode:\n{}\n--- all.log (tail)\n{}",
                failed.join("\n"),
                tail.join("\n")
            );
        }
        println!("CPU mode: every step passed ({} steps)", summary.lines().filter(|l| l.contains(" rc=0 ")).count());
    }
    Ok(())
}

/// Where `cargo xtask test` lays the CPU-mode check out.
pub fn ci_dir(root: &Path) -> PathBuf {
    root.join("target").join("gpu-check")
}
