//! The run folder of a Grove training run, and the typed records in it. This crate is the one
//! place that knows the layout; `trainer` writes through it, and `trainer` (resume, plots,
//! experiments) and `xtask` (the demo's summary) read through it.
//!
//! ```text
//! <run>/config.toml            the configuration the run was started with
//! <run>/metrics.jsonl          one StepMetrics per training step, in step order
//! <run>/eval-<step>.json       one EvalPoint per evaluation (step 0: before training)
//! <run>/rollouts-<step>.jsonl  the step's training rows, when the run keeps them
//! <run>/trees-<step>.jsonl.gz  the step's rollout trees for `trainer view` (see `trees`)
//! <run>/checkpoint-<step>/     an HF model folder + optimizer.safetensors + state.json
//! <run>/latest                 the name of the newest complete checkpoint
//! ```
//!
//! Checkpoints are written into a hidden staging folder and renamed into place, then `latest`
//! is replaced atomically: a run killed at any moment leaves either the old or the new
//! checkpoint, never half of one.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub mod bench;
pub mod stats;
mod trees;
pub use trees::{LeafRecord, NodeRecord, PromptTrees, TREES_VERSION, TreeRecord, read_trees};

#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Line { path: String, line: usize, message: String },
    #[error("{path}: {message}")]
    Format { path: String, message: String },
}

pub type Result<T> = std::result::Result<T, RunDirError>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RunDirError + '_ {
    move |source| RunDirError::Io { path: path.display().to_string(), source }
}

fn format_err(path: &Path, e: &dyn std::fmt::Display) -> RunDirError {
    RunDirError::Format { path: path.display().to_string(), message: e.to_string() }
}

/// One line of `metrics.jsonl`: what one training step did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StepMetrics {
    pub step: u64,
    pub lr: f64,
    /// Mean training reward of the rows that were trained on.
    pub reward_mean: f64,
    /// Pure EM / F1 of the rows' final answers (from the env-server's reward).
    pub metric_mean: f64,
    /// Training rows (kept leaves), including masked ones.
    pub rows: usize,
    /// The objective as optimised (policy - entropy_coef * entropy + kl_coef * kl).
    pub loss: f64,
    /// The clipped policy-gradient term alone.
    pub policy_loss: f64,
    pub kl: f64,
    pub entropy: f64,
    pub clip_fraction: f64,
    pub grad_norm: f64,
    /// Optimiser steps skipped for a non-finite gradient norm.
    pub skipped_steps: u32,
    pub generated_tokens: u64,
    pub prefill_tokens: u64,
    pub trained_tokens: u64,
    pub tool_calls: u64,
    pub forks: u64,
    /// Fraction of prompt groups whose trained rows all have the same reward (zero advantage).
    pub zero_advantage_groups: f64,
    /// Mean number of distinct kept leaves (by generated tokens) per tree.
    pub distinct_leaves_per_tree: f64,
    /// Rows left out of the loss because the env-server refused their episode (create, fork or
    /// step), by `<request>:<error code>`; see [`StepMetrics::masked_rows`].
    pub failures: BTreeMap<String, u64>,
    /// Training rows masked out of the loss (their trajectory was refused somewhere).
    pub masked_rows: u64,
    /// Tool calls that failed on the server (backend error, timeout, ...) by error code: the
    /// step happened, the model saw the server's error text, and the row is trained as usual.
    pub tool_errors: BTreeMap<String, u64>,
    /// Largest `|pi_theta(token) / pi_sampler(token) - 1|` over the trained tokens before the
    /// update (on-policy check: 0 up to rounding when log-probs use the sampling temperature).
    pub first_ratio_max_dev: f64,
    /// Leaves whose answer metric, recomputed here from the decoded tokens with the `datasets`
    /// reward functions, differs from the env-server's (should stay 0).
    pub reward_check_mismatches: u64,
    pub rollout_seconds: f64,
    pub update_seconds: f64,
}

/// One held-out data source's evaluation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SourceScore {
    pub questions: usize,
    /// Mean EM or F1, depending on the source.
    pub score: f64,
    pub tool_calls_per_question: f64,
    /// Questions whose trajectory ended with an answer.
    pub answered: usize,
}

/// Per data source, plus `"all"`.
pub type EvalReport = BTreeMap<String, SourceScore>;

/// Which questions an evaluation used: the whole file, or a seeded random sample of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum EvalSelection {
    All { questions: usize },
    Sample { questions: usize, of: usize, seed: u64 },
}

impl std::fmt::Display for EvalSelection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EvalSelection::All { questions } => write!(f, "all {questions} questions"),
            EvalSelection::Sample { questions, of, seed } => {
                write!(f, "a random sample of {questions} of {of} questions (seed {seed})")
            }
        }
    }
}

/// One evaluation of the policy on the held-out questions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalPoint {
    /// Training steps done before this evaluation (0: the initial policy).
    pub step: u64,
    pub greedy: EvalReport,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled: Option<EvalReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection: Option<EvalSelection>,
}

impl EvalPoint {
    /// The greedy score over all questions (0 when there were none).
    pub fn greedy_all(&self) -> f64 {
        self.greedy.get("all").map_or(0.0, |s| s.score)
    }
}

/// One training row of a step, as `rollouts-<step>.jsonl` keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutRecord {
    pub step: u64,
    /// The prompt's index within the step (the inter-tree group).
    pub prompt: usize,
    /// The tree's group id (the intra-tree group).
    pub tree: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    pub reward: f64,
    pub metric: f64,
    /// The advantage the update gave every generated token of the row.
    pub advantage: f64,
    pub generated_tokens: usize,
    /// `<request>:<error code>` when the env-server refused the trajectory (masked out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The response side, decoded (generated text and observations).
    pub response: String,
}

/// Checkpoint state besides weights and optimiser moments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainState {
    /// Training steps completed (the next step to run).
    pub next_step: u64,
    pub seed: u64,
}

/// A checkpoint being written: fill `path`, then [`RunDir::commit_checkpoint`].
#[derive(Debug)]
pub struct StagedCheckpoint {
    pub path: PathBuf,
    name: String,
}

/// A run folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDir {
    root: PathBuf,
}

const METRICS: &str = "metrics.jsonl";
const CONFIG: &str = "config.toml";
const LATEST: &str = "latest";
const STATE: &str = "state.json";
const MACHINE: &str = "machine.json";

impl RunDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    pub fn create(&self) -> Result<()> {
        std::fs::create_dir_all(&self.root).map_err(io(&self.root))
    }

    pub fn metrics_path(&self) -> PathBuf {
        self.root.join(METRICS)
    }

    pub fn config_path(&self) -> PathBuf {
        self.root.join(CONFIG)
    }

    pub fn eval_path(&self, step: u64) -> PathBuf {
        self.root.join(format!("eval-{step}.json"))
    }

    pub fn rollouts_path(&self, step: u64) -> PathBuf {
        self.root.join(format!("rollouts-{step}.jsonl"))
    }

    pub fn checkpoint_path(&self, step: u64) -> PathBuf {
        self.root.join(format!("checkpoint-{step}"))
    }

    /// The machine the run trained on (its CPU model and libtorch's thread counts), as JSON.
    pub fn machine_path(&self) -> PathBuf {
        self.root.join(MACHINE)
    }

    pub fn write_machine(&self, machine: &impl Serialize) -> Result<()> {
        self.create()?;
        let path = self.machine_path();
        let text = serde_json::to_string_pretty(machine).map_err(|e| format_err(&path, &e))?;
        write_atomic(&path, text.as_bytes())
    }

    /// The configuration the run was started with (TOML text, written by the trainer).
    pub fn write_config(&self, toml_text: &str) -> Result<()> {
        self.create()?;
        write_atomic(&self.config_path(), toml_text.as_bytes())
    }

    pub fn append_metrics(&self, m: &StepMetrics) -> Result<()> {
        self.create()?;
        let path = self.metrics_path();
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(io(&path))?;
        let line = serde_json::to_string(m).map_err(|e| format_err(&path, &e))?;
        writeln!(f, "{line}").map_err(io(&path))
    }

    /// Every step's metrics, in file order; a line that is not a metrics record is an error
    /// naming it. A missing file is an empty run.
    pub fn metrics(&self) -> Result<Vec<StepMetrics>> {
        let path = self.metrics_path();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&path)(e)),
        };
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l).map_err(|e| RunDirError::Line {
                    path: path.display().to_string(),
                    line: i + 1,
                    message: e.to_string(),
                })
            })
            .collect()
    }

    /// Keep the metrics of steps before `next_step` (a run killed after its last checkpoint
    /// wrote lines for steps that the resumed run does again).
    pub fn truncate_metrics(&self, next_step: u64) -> Result<()> {
        let kept: Vec<StepMetrics> = self.metrics()?.into_iter().filter(|m| m.step < next_step).collect();
        let mut text = String::new();
        for m in &kept {
            text.push_str(&serde_json::to_string(m).map_err(|e| format_err(&self.metrics_path(), &e))?);
            text.push('\n');
        }
        write_atomic(&self.metrics_path(), text.as_bytes())
    }

    pub fn write_eval(&self, point: &EvalPoint) -> Result<PathBuf> {
        self.create()?;
        let path = self.eval_path(point.step);
        let text = serde_json::to_string_pretty(point).map_err(|e| format_err(&path, &e))?;
        write_atomic(&path, text.as_bytes())?;
        Ok(path)
    }

    pub fn eval(&self, step: u64) -> Result<EvalPoint> {
        read_json(&self.eval_path(step))
    }

    /// The steps of the run's evaluations, in order.
    fn eval_steps(&self) -> Result<Vec<u64>> {
        let mut steps = Vec::new();
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&self.root)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io(&self.root))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(Ok(step)) = name.strip_prefix("eval-").and_then(|s| s.strip_suffix(".json")).map(str::parse) {
                steps.push(step);
            }
        }
        steps.sort_unstable();
        Ok(steps)
    }

    /// Every evaluation of the run, by step.
    pub fn evals(&self) -> Result<Vec<EvalPoint>> {
        self.eval_steps()?.into_iter().map(|s| self.eval(s)).collect()
    }

    /// The files [`metrics`](Self::metrics), [`evals`](Self::evals) and the configuration are
    /// read from (no checkpoint, rollout or tree): the metrics when there are any, the
    /// evaluations by step, and the configuration last, so that a copy made in this order and
    /// interrupted holds no configuration and so reads as no run.
    pub fn summary_files(&self) -> Result<Vec<PathBuf>> {
        let mut files: Vec<PathBuf> = Some(self.metrics_path()).filter(|p| p.is_file()).into_iter().collect();
        files.extend(self.eval_steps()?.into_iter().map(|s| self.eval_path(s)));
        files.push(self.config_path());
        files.extend(Some(self.machine_path()).filter(|p| p.is_file()));
        Ok(files)
    }

    /// Keep a step's training rows (replacing what an interrupted run wrote for that step).
    pub fn write_rollouts(&self, step: u64, records: &[RolloutRecord]) -> Result<PathBuf> {
        self.create()?;
        let path = self.rollouts_path(step);
        let mut text = String::new();
        for r in records {
            text.push_str(&serde_json::to_string(r).map_err(|e| format_err(&path, &e))?);
            text.push('\n');
        }
        write_atomic(&path, text.as_bytes())?;
        Ok(path)
    }

    /// The training rows kept for `step`.
    pub fn rollouts(&self, step: u64) -> Result<Vec<RolloutRecord>> {
        let path = self.rollouts_path(step);
        let text = std::fs::read_to_string(&path).map_err(io(&path))?;
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l).map_err(|e| RunDirError::Line {
                    path: path.display().to_string(),
                    line: i + 1,
                    message: e.to_string(),
                })
            })
            .collect()
    }

    /// An empty staging folder for the checkpoint after `state.next_step` steps.
    pub fn stage_checkpoint(&self, next_step: u64) -> Result<StagedCheckpoint> {
        self.create()?;
        let name = format!("checkpoint-{next_step}");
        let path = self.root.join(format!(".{name}.partial"));
        if path.exists() {
            std::fs::remove_dir_all(&path).map_err(io(&path))?;
        }
        std::fs::create_dir_all(&path).map_err(io(&path))?;
        Ok(StagedCheckpoint { path, name })
    }

    /// Write `state.json` into a filled staging folder, rename it into place and point `latest`
    /// at it.
    pub fn commit_checkpoint(&self, staged: StagedCheckpoint, state: &TrainState) -> Result<PathBuf> {
        let StagedCheckpoint { path: staging, name } = staged;
        let state_path = staging.join(STATE);
        let text = serde_json::to_string_pretty(state).map_err(|e| format_err(&state_path, &e))?;
        std::fs::write(&state_path, text).map_err(io(&state_path))?;
        let final_dir = self.root.join(&name);
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir).map_err(io(&final_dir))?;
        }
        std::fs::rename(&staging, &final_dir).map_err(io(&final_dir))?;
        write_atomic(&self.root.join(LATEST), name.as_bytes())?;
        Ok(final_dir)
    }

    /// The checkpoint `latest` names, if it is complete.
    pub fn latest_checkpoint(&self) -> Option<PathBuf> {
        let name = std::fs::read_to_string(self.root.join(LATEST)).ok()?;
        let path = self.root.join(name.trim());
        path.join(STATE).exists().then_some(path)
    }

    /// The state of a checkpoint folder.
    pub fn checkpoint_state(checkpoint: &Path) -> Result<TrainState> {
        read_json(&checkpoint.join(STATE))
    }
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    serde_json::from_str(&text).map_err(|e| format_err(path, &e))
}

/// Write a file through a temporary sibling and a rename.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(step: u64) -> StepMetrics {
        StepMetrics { step, reward_mean: step as f64 / 10.0, ..Default::default() }
    }

    #[test]
    fn metrics_append_read_and_truncate() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path().join("run"));
        assert!(run.metrics().unwrap().is_empty(), "no file yet: no steps");
        for s in 0..4 {
            run.append_metrics(&metrics(s)).unwrap();
        }
        assert_eq!(run.metrics().unwrap(), (0..4).map(metrics).collect::<Vec<_>>());
        run.truncate_metrics(2).unwrap();
        assert_eq!(run.metrics().unwrap(), vec![metrics(0), metrics(1)]);
        // A line from an older trainer without the newer fields still reads.
        std::fs::write(run.metrics_path(), "{\"step\": 7, \"lr\": 0.5}\n").unwrap();
        assert_eq!(run.metrics().unwrap()[0].step, 7);
        // A broken line is an error that names it.
        std::fs::write(run.metrics_path(), "{\"step\": 1}\nnot json\n").unwrap();
        let e = run.metrics().unwrap_err().to_string();
        assert!(e.contains("metrics.jsonl:2:"), "{e}");
    }

    #[test]
    fn evals_round_trip_in_step_order() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        for step in [10, 0, 2] {
            let mut greedy = EvalReport::new();
            greedy.insert("all".into(), SourceScore { questions: 3, score: step as f64 / 10.0, ..Default::default() });
            let selection = Some(EvalSelection::Sample { questions: 3, of: 9, seed: 4 });
            run.write_eval(&EvalPoint { step, greedy, sampled: None, selection }).unwrap();
        }
        let steps: Vec<u64> = run.evals().unwrap().iter().map(|p| p.step).collect();
        assert_eq!(steps, [0, 2, 10]);
        assert_eq!(run.eval(10).unwrap().greedy_all(), 1.0);
        assert!(run.eval(3).is_err());
        let shown = EvalSelection::Sample { questions: 3, of: 9, seed: 4 }.to_string();
        assert_eq!(shown, "a random sample of 3 of 9 questions (seed 4)");
    }

    #[test]
    fn rollouts_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        let record = |prompt, advantage| RolloutRecord {
            step: 4,
            prompt,
            tree: prompt * 2,
            task_id: Some("q".into()),
            reward: 1.0,
            metric: 1.0,
            advantage,
            generated_tokens: 3,
            failure: None,
            response: "<answer> x </answer>".into(),
        };
        let records = vec![record(0, 0.5), record(1, -0.5)];
        run.write_rollouts(4, &records).unwrap();
        assert_eq!(run.rollouts(4).unwrap(), records);
        assert!(run.rollouts(5).is_err());
    }

    #[test]
    fn checkpoints_appear_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        assert_eq!(run.latest_checkpoint(), None);
        let staged = run.stage_checkpoint(3).unwrap();
        std::fs::write(staged.path.join("model.safetensors"), b"weights").unwrap();
        // Until it is committed, nothing names it.
        assert_eq!(run.latest_checkpoint(), None);
        assert!(!run.checkpoint_path(3).exists());
        let state = TrainState { next_step: 3, seed: 9 };
        let path = run.commit_checkpoint(staged, &state).unwrap();
        assert_eq!(path, run.checkpoint_path(3));
        assert_eq!(run.latest_checkpoint(), Some(path.clone()));
        assert_eq!(RunDir::checkpoint_state(&path).unwrap(), state);
        assert!(path.join("model.safetensors").exists());
        // A second commit of the same step replaces it; a stale staging folder is cleared.
        let staged = run.stage_checkpoint(3).unwrap();
        assert!(std::fs::read_dir(&staged.path).unwrap().next().is_none(), "staging starts empty");
        run.commit_checkpoint(staged, &TrainState { next_step: 3, seed: 10 }).unwrap();
        assert_eq!(RunDir::checkpoint_state(&run.checkpoint_path(3)).unwrap().seed, 10);
    }
}
