//! `cargo xtask bench`: the project's headline figures, measured in one run, in one table. Builds
//! the two binaries in release, runs `env-server bench --json` (steps over WebSocket against the
//! HTTP `/retrieve` baseline, fork cost, BM25) and `trainer bench --json` on SmolLM2-135M-Instruct
//! on the CPU (generation, training, KV-prefix reuse against re-encoding), and a real tree vs chain
//! rollout of a small tool-calling policy through an env-server over the synthetic world, then
//! prints the table under a header naming the machine and writes it as markdown.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::util;

/// Knobs of the bench (`cargo xtask bench --help`); the defaults keep it to a few minutes on two
/// cores once the binaries are built.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Markdown output (default: <target>/bench/bench.md).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Seconds of each env-server stepping phase (saturated, paced, HTTP baseline).
    #[arg(long, default_value_t = 4.0)]
    seconds: f64,
    /// Seconds of each BM25-alone measurement.
    #[arg(long, default_value_t = 2.0)]
    bm25_seconds: f64,
    /// Concurrent episodes (and concurrent HTTP requests in the baseline).
    #[arg(long, default_value_t = 256)]
    episodes: usize,
    /// Tokens per sequence of the trainer's generation figures.
    #[arg(long, default_value_t = 64)]
    new_tokens: usize,
    /// Tokens per sequence of the training forward + backward (batch 4).
    #[arg(long, default_value_t = 256)]
    train_len: usize,
    /// Turns of the KV-prefix reuse vs re-encoding baseline.
    #[arg(long, default_value_t = 4)]
    turns: usize,
    /// Batch sizes of the generation figures (this engine against the one before).
    #[arg(long, default_value = "1,8,64")]
    gen_batches: String,
    /// Timed runs per trainer figure (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Peak memory of one training micro-batch of BxT tokens with the Qwen2.5 vocabulary, chunked
    /// against full logits ("" to skip; the full path needs about 12 GB at 1x4096).
    #[arg(long, default_value = "1x4096")]
    train_memory: String,
    /// Held-out synthetic questions of the real tree vs chain rollout (0: the budget arithmetic
    /// instead).
    #[arg(long, default_value_t = 16)]
    budget_prompts: usize,
    /// Folder with the tool-calling policy of that rollout: `world/` (the synthetic world) and
    /// `sft/` (a policy trained on it), the layout `cargo xtask demo` and `experiment` write.
    /// Default: <target>/bench/policy, warm-started there (scripted play, SFT) when missing.
    #[arg(long)]
    policy_dir: Option<PathBuf>,
    /// Skip the trainer part (no libtorch, no model).
    #[arg(long)]
    skip_trainer: bool,
    /// Skip the env-server part.
    #[arg(long)]
    skip_env_server: bool,
}

/// One line of the table.
struct Row {
    section: &'static str,
    figure: String,
    value: String,
    unit: String,
    note: String,
}

pub fn run(root: &Path, args: &BenchArgs) -> Result<()> {
    let started = Instant::now();
    let mut build = vec!["build", "--release", "-p", "grove-env-server", "--bin", "env-server"];
    if !args.skip_trainer {
        util::banner("setup: libtorch and assets");
        crate::libtorch::ensure(root, crate::libtorch::Variant::Cpu)?;
        crate::assets::ensure_all(false).context(
            "the SmolLM2 / mini-Wikipedia / FanOutQA assets are missing and could not be fetched; \
             run `cargo xtask assets` (or pass --skip-trainer)",
        )?;
        build.extend(["-p", "grove-trainer", "--bin", "trainer", "--features", "grove-trainer/bench-baseline"]);
    }
    util::banner(&format!("cargo {}", build.join(" ")));
    util::run(root, "cargo", &build)?;
    let target = util::target_dir(root)?;
    let bin = |name: &str| target.join("release").join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let (env_server, trainer) = (bin("env-server"), bin("trainer"));

    let mut rows = Vec::new();
    if !args.skip_env_server {
        util::banner("env-server bench");
        let mut cmd = Command::new(&env_server);
        cmd.current_dir(root).args(["bench", "--json"]).args([
            "--seconds",
            &args.seconds.to_string(),
            "--bm25-seconds",
            &args.bm25_seconds.to_string(),
            "--episodes",
            &args.episodes.to_string(),
        ]);
        rows.extend(json_rows("env-server", &mut cmd)?);
    }
    let mut threads = String::from("-");
    if !args.skip_trainer {
        let hf = crate::demo::smollm2_hf(&trainer)?;
        // The real tree vs chain rollout: a small policy that calls tools (SmolLM2-135M rarely
        // does) on held-out questions of the synthetic world, through an env-server over its
        // corpus.
        let policy = if args.budget_prompts > 0 {
            let dir = args.policy_dir.as_ref().map_or_else(|| target.join("bench").join("policy"), |d| root.join(d));
            let ctx = crate::demo::Ctx::new(dir, trainer.clone(), env_server)?;
            util::banner("env-server serve over the synthetic world (for the tree vs chain rollout)");
            let server = ctx.world_server(50)?;
            if !ctx.out.join("sft/model.safetensors").exists() {
                ctx.warm_start(&server.url, 2, 2)?;
            }
            Some((server, ctx.out))
        } else {
            None
        };
        util::banner("trainer bench (SmolLM2-135M-Instruct, CPU)");
        let mut cmd = Command::new(&trainer);
        cmd.current_dir(root).arg("bench").arg("--model").arg(&hf).args(["--device", "cpu", "--json"]).args([
            "--new-tokens",
            &args.new_tokens.to_string(),
            "--train-len",
            &args.train_len.to_string(),
            "--turns",
            &args.turns.to_string(),
            "--prompts",
            &args.budget_prompts.to_string(),
            "--gen-batches",
            &args.gen_batches,
            "--repeats",
            &args.repeats.to_string(),
        ]);
        if !args.train_memory.is_empty() {
            cmd.args(["--train-memory", &args.train_memory]);
        }
        if let Some((server, dir)) = &policy {
            cmd.args(["--env", &server.url, "--data-source", "synthetic", "--data"])
                .arg(dir.join("world/test.jsonl"))
                .arg("--policy")
                .arg(dir.join("sft"))
                .arg("--prompt-template")
                .arg(dir.join("world/prompt.txt"))
                .args(["--topk", "1", "--temperature", "0.7", "--max-turns", "4", "--max-new-tokens", "48"]);
        }
        let mut trainer_rows = json_rows("trainer", &mut cmd)?;
        drop(policy);
        if let Some(i) = trainer_rows.iter().position(|r| r.figure == "libtorch threads") {
            threads = trainer_rows.remove(i).value;
        }
        // The budget rows get their own section.
        for r in &mut trainer_rows {
            if r.figure.starts_with("tree")
                || r.figure.starts_with("chain")
                || r.figure.starts_with("  tree")
                || r.figure == "rollout policy"
            {
                r.section = "budget";
            }
        }
        rows.extend(trainer_rows);
    }

    let header = machine(&threads, root);
    let md = markdown(&header, &rows);
    print_table(&header, &rows);
    let out = args.out.clone().unwrap_or_else(|| target.join("bench").join("bench.md"));
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, md).with_context(|| format!("write {}", out.display()))?;
    println!("\nwritten to {} ({:.1} min)", out.display(), started.elapsed().as_secs_f64() / 60.0);
    Ok(())
}

/// Run a bench command with `--json` and read its rows from stdout (stderr passes through).
fn json_rows(section: &'static str, cmd: &mut Command) -> Result<Vec<Row>> {
    let shown = format!("{cmd:?}");
    let out = cmd.stderr(Stdio::inherit()).output().with_context(|| format!("cannot start {shown}"))?;
    if !out.status.success() {
        bail!("{shown} exited with {}", out.status);
    }
    let mut rows = Vec::new();
    for line in out.stdout.as_slice().lines() {
        let line = line?;
        let Some(r) = grove_rundir::bench::BenchRow::from_json_line(&line) else {
            eprintln!("{line}");
            continue;
        };
        rows.push(Row { section, figure: r.figure, value: r.value, unit: r.unit, note: r.note });
    }
    if rows.is_empty() {
        bail!("{shown} printed no rows");
    }
    Ok(rows)
}

/// `(key, value)` lines naming the machine and the commit.
fn machine(threads: &str, root: &Path) -> Vec<(&'static str, String)> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_string()))
        .unwrap_or_else(|| "unknown".into());
    let logical = cpuinfo.lines().filter(|l| l.starts_with("processor")).count();
    let usable = std::thread::available_parallelism().map_or(0, usize::from);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let ram = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.split_whitespace().next()?.parse::<f64>().ok())
        .map_or_else(|| "unknown".into(), |kb| format!("{:.1} GiB", kb / 1024.0 / 1024.0));
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    // Read-only: no index refresh.
    let dirty =
        git(&["--no-optional-locks", "status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    vec![
        ("CPU", model),
        ("cores", format!("{logical} logical, {usable} usable by this process")),
        ("RAM", ram),
        ("libtorch threads", threads.to_string()),
        ("git commit", if dirty { format!("{commit} (with uncommitted changes)") } else { commit }),
    ]
}

fn print_table(header: &[(&str, String)], rows: &[Row]) {
    util::banner("cargo xtask bench");
    for (k, v) in header {
        println!("{k:<17} {v}");
    }
    let w = rows.iter().map(|r| r.figure.len()).max().unwrap_or(0).max(6);
    let vw = rows.iter().map(|r| r.value.len()).max().unwrap_or(0).max(5);
    let uw = rows.iter().map(|r| r.unit.len()).max().unwrap_or(0).max(4);
    println!();
    println!("{:<10} {:<w$} {:>vw$} {:<uw$} baseline / ratio / note", "part", "figure", "value", "unit");
    println!("{}", "-".repeat(10 + w + vw + uw + 30));
    for r in rows {
        println!("{:<10} {:<w$} {:>vw$} {:<uw$} {}", r.section, r.figure, r.value, r.unit, r.note);
    }
}

fn markdown(header: &[(&str, String)], rows: &[Row]) -> String {
    let esc = |s: &str| s.trim().replace('|', "\\|");
    let mut md = String::from("# cargo xtask bench\n\n");
    for (k, v) in header {
        md.push_str(&format!("- {k}: {}\n", esc(v)));
    }
    md.push_str("\n| part | figure | value | unit | baseline / ratio / note |\n|---|---|---:|---|---|\n");
    for r in rows {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            r.section,
            esc(&r.figure),
            esc(&r.value),
            esc(&r.unit),
            esc(&r.note)
        ));
    }
    md
}
