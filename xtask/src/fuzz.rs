//! `cargo xtask fuzz`: the libFuzzer targets of `fuzz/` (wire frames, agent actions, dataset
//! loaders, GGUF), each for a bounded time, with a persistent corpus and running totals kept in
//! the cache so that CI runs add up.
//!
//! Layout under `~/.cache/grove/fuzz/`: `corpus/<target>/` (what libFuzzer found; the committed
//! seeds in `fuzz/seeds/<target>/` are read too but never written), `target/` (the instrumented
//! builds), `logs/<target>.log` (the last run's full output) and `totals.json`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::util;

/// The targets in `fuzz/fuzz_targets/`, in the order they run.
pub const TARGETS: [&str; 4] = ["protocol_frame", "action_parser", "qa_loaders", "gguf_reader"];

/// Seconds per target in `cargo xtask test`: with the builds cached, the phase takes about a
/// minute; the corpus and totals carry over, so CI runs add up.
pub const TEST_SECONDS: u64 = 15;

const CARGO_FUZZ_VERSION: &str = "0.13.2";
const TOOLCHAIN: &str = "+nightly";

#[derive(clap::Args, Debug)]
pub struct FuzzArgs {
    /// Seconds of fuzzing per target.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Run only this target (default: all of them).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(TARGETS))]
    pub target: Option<String>,
}

pub fn run(root: &Path, args: &FuzzArgs) -> Result<()> {
    let targets: Vec<&str> = match &args.target {
        Some(t) => vec![t.as_str()],
        None => TARGETS.to_vec(),
    };
    fuzz(root, &targets, args.seconds)
}

/// The short phase of `cargo xtask test`: every target for [`TEST_SECONDS`].
pub fn time_boxed(root: &Path) -> Result<()> {
    fuzz(root, &TARGETS, TEST_SECONDS)
}

/// Build every target, run each for `seconds`, print the table; fail if any target failed.
pub fn fuzz(root: &Path, targets: &[&str], seconds: u64) -> Result<()> {
    let cargo_fuzz_bin = ensure_cargo_fuzz()?;
    let cache = fuzz_cache();
    let target_dir = cache.join("target");
    std::fs::create_dir_all(cache.join("logs"))?;

    // One build of all targets (better parallelism than one cargo per target); `fuzz run` then
    // finds everything fresh.
    let t = Instant::now();
    let mut build = cargo_fuzz(root, &cargo_fuzz_bin);
    build.args(["build", "--target-dir"]).arg(&target_dir);
    if targets.len() == 1 {
        build.arg(targets[0]);
    }
    util::run_cmd(&mut build).context("building the fuzz targets (needs the nightly toolchain)")?;
    println!("fuzz targets built in {:.1} s", t.elapsed().as_secs_f64());

    let mut totals = Totals::load(&cache.join("totals.json"));
    let mut outcomes = Vec::new();
    for target in targets {
        let outcome = run_target(root, &cargo_fuzz_bin, &cache, target, seconds)?;
        totals.add(target, outcome.runs, outcome.seconds);
        totals.save()?;
        outcomes.push(outcome);
    }

    println!();
    println!("{:<16} {:>14} {:>16} {:>8}  result", "target", "runs (now)", "runs (total)", "corpus");
    for o in &outcomes {
        println!("{:<16} {:>14} {:>16} {:>8}  {}", o.target, o.runs, totals.runs(&o.target), o.corpus, o.result);
    }
    println!("totals: {}", totals.path.display());

    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| o.result != "ok").collect();
    if failed.is_empty() {
        return Ok(());
    }
    for o in &failed {
        eprintln!("\n{}: {} (full output: {})", o.target, o.result, o.log.display());
        match &o.artifact {
            Some(a) => {
                eprintln!("  reproducer: {}", a.display());
                eprintln!("  reproduce:  cargo +nightly fuzz run {} {}", o.target, a.display());
                eprintln!(
                    "  (or: cargo xtask fuzz --target {} after fixing; minimise with `cargo +nightly fuzz tmin {} {}`)",
                    o.target,
                    o.target,
                    a.display()
                );
            }
            None => eprintln!("  no reproducer was written; see the log"),
        }
    }
    bail!("fuzzing failed: {}", failed.iter().map(|o| o.target.as_str()).collect::<Vec<_>>().join(", "))
}

struct Outcome {
    target: String,
    runs: u64,
    seconds: f64,
    corpus: usize,
    result: String,
    artifact: Option<PathBuf>,
    log: PathBuf,
}

fn run_target(root: &Path, cargo_fuzz_bin: &Path, cache: &Path, target: &str, seconds: u64) -> Result<Outcome> {
    util::banner(&format!("fuzz {target} ({seconds} s)"));
    let corpus = cache.join("corpus").join(target);
    std::fs::create_dir_all(&corpus)?;
    let seeds = root.join("fuzz/seeds").join(target);
    let log_path = cache.join("logs").join(format!("{target}.log"));
    let mut log = std::fs::File::create(&log_path).with_context(|| format!("create {}", log_path.display()))?;

    let mut cmd = cargo_fuzz(root, cargo_fuzz_bin);
    cmd.args(["run", "--target-dir"])
        .arg(cache.join("target"))
        .arg(target)
        .arg(&corpus)
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        // A single input taking this long is a hang, reported as a failure.
        .arg("-timeout=30")
        .arg("-rss_limit_mb=2048")
        .arg("-print_final_stats=1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let shown = format!("{cmd:?}");
    let started = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("cannot start {shown}"))?;

    // libFuzzer reports on stderr, cargo too; stdout carries anything the target prints. Both go
    // to the log; the terminal gets everything but the per-input progress lines.
    let stdout = child.stdout.take().context("no stdout")?;
    let read_stdout = std::thread::spawn(move || BufReader::new(stdout).lines().map_while(Result::ok).collect());
    let mut stats = Stats::default();
    for line in BufReader::new(child.stderr.take().context("no stderr")?).lines() {
        let line = line?;
        writeln!(log, "{line}")?;
        stats.read(&line);
        if !is_progress(&line) {
            eprintln!("{line}");
        }
    }
    let status = child.wait()?;
    let out: Vec<String> = read_stdout.join().unwrap_or_default();
    for line in &out {
        writeln!(log, "{line}")?;
        stats.read(line);
    }
    let elapsed = started.elapsed().as_secs_f64();

    let result = if status.success() {
        "ok".to_string()
    } else {
        stats.failure.clone().unwrap_or_else(|| format!("failed ({status})"))
    };
    if !status.success() && stats.failure.is_none() && stats.artifact.is_none() && stats.runs.is_none() {
        // Nothing fuzzed at all: a build or start-up problem, not a finding.
        bail!("{shown} exited with {status} before fuzzing; see {}", log_path.display());
    }
    Ok(Outcome {
        target: target.to_string(),
        runs: stats.runs.unwrap_or(0),
        seconds: stats.seconds.unwrap_or(elapsed),
        corpus: std::fs::read_dir(&corpus).map(|d| d.count()).unwrap_or(0),
        result,
        artifact: stats.artifact.map(|a| if a.is_absolute() { a } else { root.join(a) }),
        log: log_path,
    })
}

/// `cargo +nightly fuzz …` with the cached cargo-fuzz first on PATH, run from the repository
/// root (cargo-fuzz finds `fuzz/` there).
fn cargo_fuzz(root: &Path, cargo_fuzz_bin: &Path) -> Command {
    let mut cmd = Command::new("cargo");
    let bin_dir = cargo_fuzz_bin.parent().unwrap_or(Path::new("."));
    let path = std::env::var_os("PATH").unwrap_or_default();
    let path = std::env::join_paths(std::iter::once(bin_dir.to_path_buf()).chain(std::env::split_paths(&path)))
        .unwrap_or(path);
    cmd.current_dir(root)
        .env("PATH", path)
        // `cargo xtask` runs under the stable toolchain; let `+nightly` decide for every child.
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("CARGO_TARGET_DIR")
        .args([TOOLCHAIN, "fuzz"]);
    cmd
}

fn fuzz_cache() -> PathBuf {
    grove_cache().join("fuzz")
}

/// `~/.cache/grove`: the directory CI keeps between runs.
fn grove_cache() -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    home.join(".cache/grove")
}

/// The cached cargo-fuzz binary, installed there first if missing.
fn ensure_cargo_fuzz() -> Result<PathBuf> {
    let root = grove_cache().join("cargo-fuzz");
    let bin = root.join("bin/cargo-fuzz");
    if bin.is_file() {
        return Ok(bin);
    }
    util::banner(&format!("installing cargo-fuzz {CARGO_FUZZ_VERSION} into {}", root.display()));
    let mut cmd = Command::new("cargo");
    cmd.args(["install", "cargo-fuzz", "--locked", "--version", CARGO_FUZZ_VERSION, "--root"])
        .arg(&root)
        .env_remove("CARGO_TARGET_DIR");
    util::run_cmd(&mut cmd).context("cannot install cargo-fuzz")?;
    if !bin.is_file() {
        bail!("cargo install reported success but {} is missing", bin.display());
    }
    Ok(bin)
}

fn is_progress(line: &str) -> bool {
    // `#1234\tNEW    cov: …`, `#4096\tpulse …`: one per new input, thousands per minute.
    line.starts_with('#') && line[1..].starts_with(|c: char| c.is_ascii_digit())
}

/// What libFuzzer's output says about a run.
#[derive(Default, Debug)]
struct Stats {
    runs: Option<u64>,
    seconds: Option<f64>,
    failure: Option<String>,
    artifact: Option<PathBuf>,
}

impl Stats {
    fn read(&mut self, line: &str) {
        let line = line.trim();
        // `Done 123456 runs in 60 second(s)` at a normal end.
        if let Some(rest) = line.strip_prefix("Done ") {
            let mut words = rest.split_whitespace();
            if let (Some(n), Some("runs"), Some("in"), Some(s)) =
                (words.next(), words.next(), words.next(), words.next())
            {
                self.runs = n.parse().ok().or(self.runs);
                self.seconds = s.parse().ok().or(self.seconds);
            }
        } else if let Some(rest) = line.strip_prefix("stat::number_of_executed_units:") {
            self.runs = rest.trim().parse().ok().or(self.runs);
        } else if let Some(rest) = line.strip_prefix('#') {
            // `#8192\tpulse  cov: …`: the last progress line, when the run ends without `Done`.
            let n: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(n) = n.parse::<u64>() {
                self.runs = Some(self.runs.map_or(n, |r| r.max(n)));
            }
        } else if let Some(at) = line.find("Test unit written to ") {
            let path = line[at + "Test unit written to ".len()..].trim();
            self.artifact = Some(PathBuf::from(path));
        } else if self.failure.is_none() {
            self.failure = failure_kind(line).map(str::to_string);
        }
    }
}

fn failure_kind(line: &str) -> Option<&'static str> {
    const KINDS: [(&str, &str); 7] = [
        ("ERROR: libFuzzer: deadly signal", "crash (panic or abort)"),
        ("ERROR: libFuzzer: timeout", "timeout (hang)"),
        ("ERROR: libFuzzer: out-of-memory", "out of memory"),
        ("ERROR: libFuzzer: fuzz target exited", "target exited"),
        ("ERROR: libFuzzer: leak", "leak"),
        ("ERROR: AddressSanitizer", "memory error (ASan)"),
        ("ERROR: libFuzzer:", "crash"),
    ];
    KINDS.iter().find(|(pat, _)| line.contains(pat)).map(|(_, kind)| *kind)
}

/// Running totals per target, across sessions: `{"<target>": {"runs": N, "seconds": S,
/// "sessions": K}}`.
struct Totals {
    path: PathBuf,
    value: serde_json::Map<String, serde_json::Value>,
}

impl Totals {
    fn load(path: &Path) -> Totals {
        let value = std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v.as_object().cloned())
            .unwrap_or_default();
        Totals { path: path.to_path_buf(), value }
    }

    fn get(&self, target: &str, key: &str) -> f64 {
        self.value.get(target).and_then(|t| t.get(key)).and_then(serde_json::Value::as_f64).unwrap_or(0.0)
    }

    fn runs(&self, target: &str) -> u64 {
        self.value.get(target).and_then(|t| t.get("runs")).and_then(serde_json::Value::as_u64).unwrap_or(0)
    }

    fn add(&mut self, target: &str, runs: u64, seconds: f64) {
        let entry = serde_json::json!({
            "runs": self.runs(target) + runs,
            "seconds": ((self.get(target, "seconds") + seconds) * 10.0).round() / 10.0,
            "sessions": self.get(target, "sessions") as u64 + 1,
        });
        self.value.insert(target.to_string(), entry);
    }

    fn save(&self) -> Result<()> {
        let tmp = self.path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(&self.value)? + "\n")
            .with_context(|| format!("write {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.path).with_context(|| format!("write {}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libfuzzer_output() {
        let mut s = Stats::default();
        for line in [
            "#2\tINITED cov: 10 ft: 11 corp: 1/1b exec/s: 0 rss: 30Mb",
            "#524288\tpulse  cov: 10 ft: 11 corp: 1/1b lim: 4096 exec/s: 262144 rss: 31Mb",
            "Done 1234567 runs in 61 second(s)",
            "stat::number_of_executed_units: 1234567",
        ] {
            s.read(line);
        }
        assert_eq!((s.runs, s.seconds, s.failure.as_deref()), (Some(1234567), Some(61.0), None));

        let mut s = Stats::default();
        for line in [
            "#1000\tNEW    cov: 10 ft: 11 corp: 1/1b",
            "==123== ERROR: libFuzzer: deadly signal",
            "artifact_prefix='/r/fuzz/artifacts/gguf_reader/'; Test unit written to /r/fuzz/artifacts/gguf_reader/crash-ab",
        ] {
            s.read(line);
        }
        assert_eq!(s.runs, Some(1000));
        assert_eq!(s.failure.as_deref(), Some("crash (panic or abort)"));
        assert_eq!(s.artifact, Some(PathBuf::from("/r/fuzz/artifacts/gguf_reader/crash-ab")));
        assert!(is_progress("#12\tREDUCE cov: 1") && !is_progress("#!/bin/sh") && !is_progress("INFO: x"));
    }
}
