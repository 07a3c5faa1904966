//! `cargo xtask gpu-check`: lay out, in one ignored folder, everything the GPU device machine
//! needs to check Grove there (the recipe of `../shared/gpu/README.md`): the release binaries,
//! stripped and gzipped (they run on the device's own libtorch with libtorch_cuda preloaded); the
//! golden tiny models for parity; the Qwen2.5 tokenizer (random-weight models of real shapes are
//! made on the device by `make_model.py`); a small synthetic world for rollouts; the HF scripts;
//! and `check.sh`, which runs it all in two time-boxed parts, one device call each. The layout is
//! refused when the folder and the checkout that travels with it exceed [`CARRY_LIMIT`], or a
//! part's time box exceeds [`PART_LIMIT_S`]. `--cpu` then runs the same script here in its CPU
//! mode (what `cargo xtask test` does, so that the script cannot rot).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::util;

/// What travels to the device (this folder, and the checkout's tracked and unignored files) must
/// stay under this: the device tool carries at most 64 MiB, and some room is kept.
const CARRY_LIMIT: u64 = 60 << 20;

/// Seconds a part of the check may take on the device: a call runs at most 10 minutes, and the
/// machine's start and the transfers come on top.
const PART_LIMIT_S: u64 = 480;

/// The time box of each part, `check.sh`'s `BUDGET` on the device.
const PART_BUDGET_S: u64 = 450;

/// Expected seconds of each step on an H100/H200, by part: estimates from the first device run
/// (2026-12-04, the whole check then in about 6 minutes on the H200) and the shapes run since;
/// the time box, not these, is what keeps a part within its call.
const ESTIMATES: [(&str, &[(&str, u64)]); 2] = [
    ("1", &[("parity x4", 40), ("make 0.5b", 45), ("grove bench 0.5b", 150), ("hf bench 0.5b", 120), ("rollouts", 60)]),
    (
        "2",
        &[
            ("make 0.5b (fresh machine only)", 45),
            ("train 0.5b x3 paths", 150),
            ("hf train 0.5b", 50),
            ("make 3b", 80),
            ("train 3b x2", 80),
            ("hf train 3b", 40),
        ],
    ),
];

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

/// Replace `path` by `path.gz` (best compression; `check.sh` unpacks it on the device).
fn gzip(path: &Path) -> Result<()> {
    util::run_cmd(Command::new("gzip").args(["-9", "-f"]).arg(path)).with_context(|| format!("gzip {}", path.display()))
}

/// Bytes of the checkout that travel with a device call besides the folder: tracked files and
/// untracked ones git does not ignore.
fn checkout_bytes(root: &Path) -> Result<u64> {
    let out = Command::new("git")
        .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard"])
        .current_dir(root)
        .output()
        .context("git ls-files")?;
    if !out.status.success() {
        bail!("git ls-files failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(out
        .stdout
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .filter_map(|p| std::fs::metadata(root.join(String::from_utf8_lossy(p).as_ref())).ok())
        .map(|m| m.len())
        .sum())
}

pub fn run(root: &Path, args: &GpuArgs) -> Result<()> {
    let out = if args.out.is_absolute() { args.out.clone() } else { root.join(&args.out) };
    crate::libtorch::ensure(root, crate::libtorch::Variant::Cpu)?;
    crate::assets::ensure_all(false)?;
    util::banner(if args.debug { "build: trainer and env-server" } else { "build: trainer and env-server (release)" });
    // The bench on the device compares with the engine before (the `bench-baseline` feature).
    let mut build = vec![
        "build",
        "-p",
        "grove-trainer",
        "-p",
        "grove-env-server",
        "--bins",
        "--features",
        "grove-trainer/bench-baseline",
    ];
    if !args.debug {
        build.push("--release");
    }
    util::run(root, "cargo", &build)?;
    let bins = util::target_dir(root)?.join(if args.debug { "debug" } else { "release" });
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
            gzip(&to)?;
        }
    }
    std::fs::write(out.join("check.sh"), include_str!("../gpu/check.sh"))?;
    // Grove's own HF side (its training step includes an AdamW step, as Grove's does).
    std::fs::write(out.join("hf_bench.py"), include_str!("../gpu/hf_bench.py"))?;
    let shared = root.join("..").join("shared");
    let make_model = shared.join("gpu").join("make_model.py");
    if make_model.exists() {
        copy(&make_model, &out.join("make_model.py"))?;
    } else {
        eprintln!("warning: {} is missing: the device run cannot make models", make_model.display());
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
    if !args.debug {
        gzip(&out.join("tok/tokenizer.json"))?;
    }
    util::run_cmd(
        Command::new(bins.join("trainer"))
            .args(["world", "--train", "8", "--test", "40", "--out"])
            .arg(out.join("world")),
    )?;
    let bytes = size_of(&out);
    let checkout = checkout_bytes(root)?;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "{} holds {:.1} MiB; with the checkout's tracked and unignored files ({:.1} MiB) {:.1} MiB travel (limit {:.0} MiB)",
        out.display(),
        mib(bytes),
        mib(checkout),
        mib(bytes + checkout),
        mib(CARRY_LIMIT)
    );
    if bytes + checkout > CARRY_LIMIT && !args.debug {
        bail!("{:.1} MiB would travel: more than {:.0} MiB", mib(bytes + checkout), mib(CARRY_LIMIT));
    }
    if PART_BUDGET_S > PART_LIMIT_S {
        bail!("a part's time box ({PART_BUDGET_S} s) exceeds {PART_LIMIT_S} s");
    }
    for (part, steps) in ESTIMATES {
        let est: u64 = steps.iter().map(|(_, s)| s).sum();
        let list = steps.iter().map(|(n, s)| format!("{n} {s}")).collect::<Vec<_>>().join(", ");
        println!(
            "part {part}: about {:.1} min expected ({list} s), at most {:.1} min (time-boxed)",
            est as f64 / 60.0,
            PART_BUDGET_S as f64 / 60.0
        );
    }
    let rel = out.strip_prefix(root).unwrap_or(&out).display().to_string();
    println!(
        "on the device: two calls, each carrying [\"{rel}\"] with timeout_s 540: `bash {rel}/check.sh 1`, then \
         `bash {rel}/check.sh 2` (results in $OUT/summary.txt and all.log)"
    );
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
