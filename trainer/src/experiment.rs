//! Chain GRPO against Tree-GRPO at equal rollout budget (the paper's Table 3, §2.6 and §8.3 of
//! the spec), run so that it can tell:
//!
//! - every arm of a **regime** starts from that regime's checkpoint (e.g. a strong and a weak
//!   warm start), trains the same steps on the same prompts, and is evaluated greedily on the
//!   whole held-out set at several steps;
//! - seeds are **paired** across arms: seed `s` draws the same prompts at every step in every
//!   arm, and the runs go seed by seed, so an interrupted experiment leaves whole pairs;
//! - the learning rate is chosen per regime by a small **sweep judged on the training reward
//!   only** (its own seeds, no held-out question is loaded), the same rate for every arm;
//! - per budget, the **paired difference** tree − chain of held-out EM per seed, with its 95%
//!   confidence interval (Student t), per hop count and overall;
//! - every finished run is kept in its own run folder and **reused** when the command runs
//!   again with the same settings, so the experiment resumes where it stopped; with `record`,
//!   what reuse reads (each run's configuration, metrics and evaluations, the start's evaluation)
//!   is also copied into a folder that can be committed, and read back from there, so that an
//!   experiment longer than one session resumes on another machine.
//!
//! Writes `table.md`, `results.json` (everything, per step), and per regime the curves of held-out
//! EM, training reward and the fraction of zero-advantage groups.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use grove_rundir::RunDir;
use serde::{Deserialize, Serialize};

use crate::algo::advantage::Estimator;
use crate::env::connect_all;
use crate::eval::{EvalPoint, EvalReport, eval_point, format_eval_point};
use crate::method::Method;
use crate::model::load_model;
use crate::tokenizer::Tokenizer;
use crate::train::{RunOptions, RunSummary, StepMetrics, TrainConfig, held_out};

/// One arm: a rollout method (and, for ablations, an estimator other than the method's own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Arm {
    /// Default: the method's label (`tree (2,2,1)`, `chain n=4`), with the estimator when it is
    /// not the method's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    pub method: Method,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimator: Option<Estimator>,
}

impl Arm {
    pub fn new(method: Method) -> Self {
        Self { label: None, method, estimator: None }
    }

    pub fn label(&self) -> String {
        if let Some(l) = &self.label {
            return l.clone();
        }
        match self.estimator {
            Some(e) if e != self.method.default_estimator() => format!("{} [{e}]", self.method.label()),
            _ => self.method.label(),
        }
    }

    fn apply(&self, cfg: &mut TrainConfig) {
        cfg.method = self.method;
        cfg.estimator = self.estimator;
    }

    fn is_tree(&self) -> bool {
        matches!(self.method, Method::Tree(_))
    }
}

/// A starting checkpoint every arm trains from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Regime {
    /// A short name, used as its folder (`strong`, `weak`).
    pub name: String,
    /// HF folder of the starting policy (and frozen reference).
    pub model: PathBuf,
    /// How the checkpoint was made, for the table.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

/// The learning-rate sweep: every candidate trains the sweep's arms with the sweep's seeds, and
/// the candidate with the highest mean training reward over the last `judge_last` of the steps
/// is used by every arm of the regime. No held-out question is loaded by a sweep run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LrSweep {
    pub lrs: Vec<f64>,
    /// Seeds of the sweep runs; they must differ from the experiment's.
    #[serde(default = "LrSweep::default_seeds")]
    pub seeds: Vec<u64>,
    /// Sweep the arms of this budget (default: the largest budget of the experiment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<f64>,
    /// The fraction of final steps whose training reward judges a rate.
    #[serde(default = "LrSweep::default_judge_last")]
    pub judge_last: f64,
}

impl LrSweep {
    fn default_seeds() -> Vec<u64> {
        vec![1000]
    }

    fn default_judge_last() -> f64 {
        0.5
    }
}

/// `trainer experiment --config FILE`: `[train]` holds the settings every arm shares (data,
/// steps, learning rate, ...), `[[regimes]]` the starting checkpoints (default: one, `train.model`),
/// `seeds` and `[[arms]]` the grid, `[lr_sweep]` the optional learning-rate sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExperimentConfig {
    pub train: TrainConfig,
    pub seeds: Vec<u64>,
    pub arms: Vec<Arm>,
    pub regimes: Vec<Regime>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr_sweep: Option<LrSweep>,
    /// A folder mirroring `train.out_dir` that keeps, of every finished run, what reuse reads
    /// (`config.toml`, `metrics.jsonl`, `eval-*.json`; no checkpoint) and each regime's
    /// `start.json`: restored into `out_dir` where a run folder is missing, written as each run
    /// finishes. Where it lives is not a setting of the experiment, so it is not written back.
    #[serde(skip_serializing)]
    pub record: Option<PathBuf>,
    /// The pre-registered analysis (`[analysis]`), written into `table.md` per regime.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub analysis: Option<crate::analysis::Analysis>,
    /// Train nothing: report the finished runs in the output folder (or the record) only, so an
    /// experiment stopped by its protocol's wall-time rule is analysed once on its complete pairs.
    #[serde(skip)]
    pub report_only: bool,
}

impl Default for ExperimentConfig {
    /// The grid: chain n=2 against tree (1,2,1), chain n=4 against tree (2,2,1), 5 seeds.
    fn default() -> Self {
        Self {
            train: TrainConfig::default(),
            seeds: vec![0, 1, 2, 3, 4],
            arms: [Method::chain(2), Method::tree(1, 2, 1, 3), Method::chain(4), Method::tree(2, 2, 1, 3)]
                .into_iter()
                .map(Arm::new)
                .collect(),
            regimes: Vec::new(),
            lr_sweep: None,
            record: None,
            analysis: None,
            report_only: false,
        }
    }
}

impl ExperimentConfig {
    /// The regimes to run: the configured ones, or one named `main` starting from `train.model`.
    pub fn regimes(&self) -> Vec<Regime> {
        if self.regimes.is_empty() {
            vec![Regime { name: "main".into(), model: self.train.model.clone(), note: String::new() }]
        } else {
            self.regimes.clone()
        }
    }

    /// Everything that can be checked before a run starts.
    pub fn check(&self) -> Result<()> {
        if self.seeds.is_empty() {
            bail!("`seeds` is empty: at least one seed");
        }
        if self.arms.is_empty() {
            bail!("no `[[arms]]`");
        }
        for arm in &self.arms {
            let mut train = self.train.clone();
            arm.apply(&mut train);
            train.step_config().with_context(|| format!("arm {}", arm.label()))?;
        }
        let mut labels: Vec<String> = self.arms.iter().map(Arm::label).collect();
        labels.sort();
        if let Some(w) = labels.windows(2).find(|w| w[0] == w[1]) {
            bail!("two arms are labelled `{}`: give one a `label`", w[0]);
        }
        let regimes = self.regimes();
        for (i, r) in regimes.iter().enumerate() {
            if r.name.is_empty() || slug(&r.name) != r.name {
                bail!("regime name `{}`: use letters, digits and '-' only", r.name);
            }
            if regimes[..i].iter().any(|o| o.name == r.name) {
                bail!("two regimes are named `{}`", r.name);
            }
        }
        if self.train.eval_data.is_none() {
            bail!("the experiment needs `eval_data` (held-out questions)");
        }
        if self.train.eval_every == 0 {
            bail!("`eval_every` = 0: the experiment evaluates at several steps");
        }
        if let Some(a) = &self.analysis {
            a.check()?;
        }
        if let Some(s) = &self.lr_sweep {
            if s.lrs.is_empty() {
                bail!("`lr_sweep.lrs` is empty");
            }
            if let Some(lr) = s.lrs.iter().find(|lr| !(**lr > 0.0 && lr.is_finite())) {
                bail!("`lr_sweep.lrs`: {lr} is not a learning rate");
            }
            if s.seeds.is_empty() {
                bail!("`lr_sweep.seeds` is empty");
            }
            if let Some(seed) = s.seeds.iter().find(|s| self.seeds.contains(s)) {
                bail!(
                    "seed {seed} is both a sweep seed and an experiment seed: the runs that choose the learning \
                     rate must not be the runs reported"
                );
            }
            if !(s.judge_last > 0.0 && s.judge_last <= 1.0) {
                bail!("`lr_sweep.judge_last` = {}: must be in (0, 1]", s.judge_last);
            }
            if self.sweep_arms(s).is_empty() {
                bail!("`lr_sweep.budget` = {:?}: no arm has that budget", s.budget);
            }
        }
        Ok(())
    }

    fn sweep_arms(&self, s: &LrSweep) -> Vec<Arm> {
        let budget =
            s.budget.unwrap_or_else(|| self.arms.iter().map(|a| a.method.budget()).fold(f64::NEG_INFINITY, f64::max));
        self.arms.iter().filter(|a| a.method.budget() == budget).cloned().collect()
    }
}

/// One finished (arm, seed) run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmRun {
    pub arm: String,
    pub seed: u64,
    pub summary: RunSummary,
}

/// The learning-rate sweep of one regime.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepResult {
    /// Per candidate: the mean training reward over the judged steps, over the sweep's runs.
    pub reward: Vec<(f64, f64)>,
    pub chosen: f64,
    /// The judged steps (the last ones of each run).
    pub judged_steps: u64,
    pub runs: Vec<(f64, ArmRun)>,
}

/// Everything one regime measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegimeResults {
    pub regime: Regime,
    /// The starting checkpoint on the held-out questions.
    pub start: EvalPoint,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<SweepResult>,
    /// The learning rate every arm trained with.
    pub lr: f64,
    pub runs: Vec<ArmRun>,
}

/// Everything the experiment measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExperimentResults {
    pub config: ExperimentConfig,
    pub regimes: Vec<RegimeResults>,
}

/// Run (or reuse) every regime's sweep and every arm with every seed, then write the table,
/// the raw results and the plots into `train.out_dir`.
pub fn run_experiment(cfg: &ExperimentConfig, progress: bool) -> Result<ExperimentResults> {
    cfg.check()?;
    let out = cfg.train.out_dir.clone();
    std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
    std::fs::write(out.join("experiment.toml"), toml::to_string_pretty(cfg)?)?;
    let mut regimes = Vec::new();
    for regime in cfg.regimes() {
        let dir = out.join(&regime.name);
        let mut train = cfg.train.clone();
        train.model = regime.model.clone();
        let record = Record { out: &out, root: cfg.record.as_deref() };
        record.restore(&dir.join("start.json"))?;
        if cfg.report_only && !dir.join("start.json").exists() {
            bail!("regime {}: no recorded start (start.json) to report against", regime.name);
        }
        let start = evaluate_start(&train, &dir.join("start.json"), progress)
            .with_context(|| format!("regime {}: the starting checkpoint", regime.name))?;
        record.keep(&dir.join("start.json"))?;
        let sweep = match &cfg.lr_sweep {
            Some(s) => Some(run_sweep(cfg, s, &train, &dir.join("sweep"), &regime.name, record, progress)?),
            None => None,
        };
        let lr = sweep.as_ref().map_or(train.lr, |s| s.chosen);
        train.lr = lr;
        let mut runs = Vec::new();
        // Seed by seed, so an interrupted experiment leaves whole pairs.
        for &seed in &cfg.seeds {
            for arm in &cfg.arms {
                let mut t = train.clone();
                arm.apply(&mut t);
                t.seed = seed;
                t.out_dir = dir.join(slug(&arm.label())).join(format!("seed-{seed}"));
                t.eval_before = false;
                let label = format!("{} {} seed {seed}", regime.name, arm.label());
                let summary = if cfg.report_only {
                    match finished_run(&t, record)? {
                        Some(s) => s,
                        None => continue,
                    }
                } else {
                    run_or_reuse(&t, &label, record, progress)?
                };
                if progress {
                    let em = summary.evals.last().map_or(0.0, EvalPoint::greedy_all);
                    eprintln!("{label}: held-out EM {em:.3}");
                }
                runs.push(ArmRun { arm: arm.label(), seed, summary });
            }
        }
        regimes.push(RegimeResults { regime, start, sweep, lr, runs });
        // The outputs so far, so that a long experiment can be read while it runs.
        write_outputs(&ExperimentResults { config: cfg.clone(), regimes: regimes.clone() }, &out)?;
    }
    let results = ExperimentResults { config: cfg.clone(), regimes };
    write_outputs(&results, &out)?;
    Ok(results)
}

/// The sweep of one regime: each candidate rate trains the sweep arms with the sweep seeds, with
/// no held-out data; the best mean training reward over the judged steps wins.
fn run_sweep(
    cfg: &ExperimentConfig,
    s: &LrSweep,
    train: &TrainConfig,
    dir: &Path,
    regime: &str,
    record: Record<'_>,
    progress: bool,
) -> Result<SweepResult> {
    let judged = ((train.steps as f64 * s.judge_last).ceil() as u64).clamp(1, train.steps.max(1));
    let mut reward = Vec::new();
    let mut runs = Vec::new();
    for &lr in &s.lrs {
        let mut judged_rewards = Vec::new();
        for &seed in &s.seeds {
            for arm in cfg.sweep_arms(s) {
                let mut t = train.clone();
                arm.apply(&mut t);
                t.lr = lr;
                t.seed = seed;
                t.eval_data = None;
                t.eval_before = false;
                t.out_dir = dir.join(format!("lr-{lr:e}")).join(slug(&arm.label())).join(format!("seed-{seed}"));
                let label = format!("{regime} sweep lr {lr:e} {} seed {seed}", arm.label());
                let summary = if cfg.report_only {
                    finished_run(&t, record)?.with_context(|| {
                        format!("{label}: report only, but this sweep run has not finished; run the experiment first")
                    })?
                } else {
                    run_or_reuse(&t, &label, record, progress)?
                };
                let tail: Vec<f64> =
                    summary.metrics.iter().filter(|m| m.step + judged >= train.steps).map(|m| m.reward_mean).collect();
                judged_rewards.push(mean_std(&tail).0);
                runs.push((lr, ArmRun { arm: arm.label(), seed, summary }));
            }
        }
        let r = mean_std(&judged_rewards).0;
        if progress {
            eprintln!("{regime} sweep: lr {lr:e} -> training reward {r:.4} over the last {judged} steps");
        }
        reward.push((lr, r));
    }
    // The first of the best (candidates are tried in the order given).
    let chosen =
        reward.iter().fold((f64::NAN, f64::NEG_INFINITY), |best, &(lr, r)| if r > best.1 { (lr, r) } else { best }).0;
    if !chosen.is_finite() {
        bail!("{regime} sweep: no candidate produced a training reward");
    }
    if progress {
        eprintln!("{regime}: learning rate {chosen:e} for every arm");
    }
    Ok(SweepResult { reward, chosen, judged_steps: judged, runs })
}

/// The settings that decide what a run computes (not where it writes or which port the
/// env-server listens on), for comparing a run folder with the run asked for.
fn settings_of(cfg: &TrainConfig) -> TrainConfig {
    TrainConfig { env: crate::train::EnvUrls(Vec::new()), out_dir: PathBuf::new(), ..cfg.clone() }
}

/// Run `cfg`, or read the run back when its folder holds a finished run of the same settings.
/// A finished run of other settings is an error (nothing is overwritten); an unfinished one is
/// started again.
/// Every step done, and the last evaluation written when the run evaluates.
fn finished(cfg: &TrainConfig, run: &RunDir, metrics: &[StepMetrics]) -> bool {
    metrics.len() as u64 == cfg.steps
        && (cfg.eval_data.is_none() || cfg.eval_every == 0 || run.eval_path(cfg.steps).exists())
}

/// A finished run of `cfg` in its folder (restored from the record if missing), or `None`.
fn finished_run(cfg: &TrainConfig, record: Record<'_>) -> Result<Option<RunSummary>> {
    let run = RunDir::new(&cfg.out_dir);
    if !run.config_path().exists() {
        record.restore_run(&cfg.out_dir)?;
    }
    if !run.config_path().exists() {
        return Ok(None);
    }
    let metrics = run.metrics()?;
    if !finished(cfg, &run, &metrics) || settings_of(&TrainConfig::from_file(&run.config_path())?) != settings_of(cfg) {
        return Ok(None);
    }
    Ok(Some(RunSummary { metrics, evals: run.evals()?, out_dir: cfg.out_dir.clone() }))
}

fn run_or_reuse(cfg: &TrainConfig, label: &str, record: Record<'_>, progress: bool) -> Result<RunSummary> {
    let run = RunDir::new(&cfg.out_dir);
    if !run.config_path().exists() {
        record.restore_run(&cfg.out_dir)?;
    }
    if run.config_path().exists() {
        let existing = TrainConfig::from_file(&run.config_path())?;
        let metrics = run.metrics()?;
        if finished(cfg, &run, &metrics) {
            if settings_of(&existing) != settings_of(cfg) {
                bail!(
                    "{} holds a finished run with other settings than this experiment's; move it away or choose \
                     another output folder",
                    cfg.out_dir.display()
                );
            }
            if progress {
                eprintln!("{label}: reusing the finished run in {}", cfg.out_dir.display());
            }
            record.keep_run(&cfg.out_dir)?;
            return Ok(RunSummary { metrics, evals: run.evals()?, out_dir: cfg.out_dir.clone() });
        }
        if progress {
            eprintln!("{label}: {} holds an unfinished run; starting it again", cfg.out_dir.display());
        }
        std::fs::remove_dir_all(&cfg.out_dir).with_context(|| format!("remove {}", cfg.out_dir.display()))?;
    }
    let opts = RunOptions { resume: false, progress, label: label.to_string() };
    let summary = crate::train::run(cfg, &opts).with_context(|| label.to_string())?;
    record.keep_run(&cfg.out_dir)?;
    Ok(summary)
}

/// The experiment's `record` folder (see [`ExperimentConfig::record`]): paths under `out` map to
/// the same relative paths under `root`. Without a root every method does nothing.
#[derive(Debug, Clone, Copy)]
struct Record<'a> {
    out: &'a Path,
    root: Option<&'a Path>,
}

impl Record<'_> {
    fn mirror(&self, path: &Path) -> Result<Option<PathBuf>> {
        let Some(root) = self.root else { return Ok(None) };
        let rel = path
            .strip_prefix(self.out)
            .with_context(|| format!("{} is not under the output folder {}", path.display(), self.out.display()))?;
        Ok(Some(root.join(rel)))
    }

    /// Copy the recorded file over `path` when `path` is missing.
    fn restore(&self, path: &Path) -> Result<()> {
        match self.mirror(path)? {
            Some(kept) if kept.exists() && !path.exists() => copy_file(&kept, path),
            _ => Ok(()),
        }
    }

    /// Copy `path` into the record (replacing what was there).
    fn keep(&self, path: &Path) -> Result<()> {
        match self.mirror(path)? {
            Some(kept) => copy_file(path, &kept),
            None => Ok(()),
        }
    }

    /// Fill a missing run folder from the record, when the record holds that run.
    fn restore_run(&self, dir: &Path) -> Result<()> {
        let Some(kept) = self.mirror(dir)? else { return Ok(()) };
        if !RunDir::new(&kept).config_path().exists() {
            return Ok(());
        }
        for file in RunDir::new(&kept).summary_files()? {
            let name = file.file_name().context("a recorded file has no name")?;
            copy_file(&file, &dir.join(name))?;
        }
        Ok(())
    }

    /// Copy a finished run's configuration, metrics and evaluations into the record.
    fn keep_run(&self, dir: &Path) -> Result<()> {
        let Some(kept) = self.mirror(dir)? else { return Ok(()) };
        // What a finished run of other settings left there must not mix with this one's files.
        if kept.exists() {
            std::fs::remove_dir_all(&kept).with_context(|| format!("remove {}", kept.display()))?;
        }
        for file in RunDir::new(dir).summary_files()? {
            let name = file.file_name().context("a run file has no name")?;
            copy_file(&file, &kept.join(name))?;
        }
        Ok(())
    }
}

fn copy_file(from: &Path, to: &Path) -> Result<()> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    std::fs::copy(from, to).with_context(|| format!("copy {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// The starting checkpoint on the held-out questions, evaluated once and kept in `path`.
fn evaluate_start(train: &TrainConfig, path: &Path, progress: bool) -> Result<EvalPoint> {
    if let Ok(text) = std::fs::read_to_string(path) {
        let point: EvalPoint = serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
        return Ok(point);
    }
    let placement = crate::device::place_with(train.device, train.precision)?;
    let (_vs, model) = load_model(&train.model, placement.device, placement.kind)?;
    let tok = Tokenizer::from_dir(train.tokenizer.as_deref().unwrap_or(&train.model))?;
    let (tasks, selection) = held_out(train)?;
    let envs = connect_all(&train.env.0)?;
    let agent = train.agent(train.prompt_template_text()?);
    let point = eval_point(&model, &tok, &envs, (&tasks, selection), &agent, train.eval_sampled, 0, train.seed)?;
    if progress {
        eprint!("{}", format_eval_point(&point, &agent));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(&point)?)?;
    Ok(point)
}

fn slug(label: &str) -> String {
    let s: String = label.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    s.split('-').filter(|p| !p.is_empty()).collect::<Vec<_>>().join("-")
}

pub use grove_rundir::stats::{PairedDiff, mean_std, t_975};

fn score(report: &EvalReport, source: &str) -> f64 {
    report.get(source).map_or(0.0, |s| s.score)
}

/// The held-out EM of a run at `step` (the last evaluation when `None`).
fn em_at(run: &ArmRun, step: Option<u64>, source: &str) -> Option<f64> {
    let p = match step {
        Some(s) => run.summary.evals.iter().find(|p| p.step == s)?,
        None => run.summary.evals.last()?,
    };
    Some(score(&p.greedy, source))
}

/// One row of a regime's table: an arm's numbers over its seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableRow {
    pub label: String,
    pub budget: f64,
    pub seeds: usize,
    /// Final held-out EM, mean and standard deviation over seeds, per data source (and `all`).
    pub em: BTreeMap<String, (f64, f64)>,
    pub tool_calls_per_question: f64,
    /// Measured rollout cost per prompt, averaged over steps and seeds: training rows,
    /// generated tokens and tool calls.
    pub trajectories_per_prompt: f64,
    pub generated_tokens_per_prompt: f64,
    pub tool_calls_per_prompt: f64,
    /// Fraction of prompt groups whose rewards were all equal (zero advantage), over steps.
    pub zero_advantage_groups: f64,
    /// Mean distinct trajectories among a tree's leaves (1 for a chain), over steps.
    pub distinct_leaves_per_tree: f64,
    /// Training reward over the last half of the steps.
    pub final_training_reward: f64,
}

/// The held-out data sources of a regime (`all` last).
fn sources(r: &RegimeResults) -> Vec<String> {
    let mut s: Vec<String> = r.start.greedy.keys().filter(|k| *k != "all").cloned().collect();
    s.push("all".into());
    s
}

/// Aggregate the runs of each arm of a regime (in the config's order).
pub fn table_rows(cfg: &ExperimentConfig, r: &RegimeResults) -> Vec<TableRow> {
    let prompts = cfg.train.prompts_per_step.max(1) as f64;
    let sources = sources(r);
    cfg.arms
        .iter()
        .map(|arm| {
            let label = arm.label();
            let runs: Vec<&ArmRun> = r.runs.iter().filter(|x| x.arm == label).collect();
            let em = sources
                .iter()
                .map(|s| (s.clone(), mean_std(&runs.iter().filter_map(|x| em_at(x, None, s)).collect::<Vec<_>>())))
                .collect();
            let finals: Vec<&EvalReport> =
                runs.iter().filter_map(|x| x.summary.evals.last().map(|p| &p.greedy)).collect();
            let tools = mean_std(
                &finals.iter().map(|x| x.get("all").map_or(0.0, |s| s.tool_calls_per_question)).collect::<Vec<_>>(),
            )
            .0;
            let steps: Vec<&StepMetrics> = runs.iter().flat_map(|x| x.summary.metrics.iter()).collect();
            let over_steps =
                |f: &dyn Fn(&StepMetrics) -> f64| steps.iter().map(|m| f(m)).sum::<f64>() / steps.len().max(1) as f64;
            let half = cfg.train.steps.div_ceil(2);
            let tail: Vec<f64> = runs
                .iter()
                .map(|x| {
                    let t: Vec<f64> = x
                        .summary
                        .metrics
                        .iter()
                        .filter(|m| m.step + half >= cfg.train.steps)
                        .map(|m| m.reward_mean)
                        .collect();
                    mean_std(&t).0
                })
                .collect();
            TableRow {
                label,
                budget: arm.method.budget(),
                seeds: finals.len(),
                em,
                tool_calls_per_question: tools,
                trajectories_per_prompt: over_steps(&|m| m.rows as f64) / prompts,
                generated_tokens_per_prompt: over_steps(&|m| m.generated_tokens as f64) / prompts,
                tool_calls_per_prompt: over_steps(&|m| m.tool_calls as f64) / prompts,
                zero_advantage_groups: over_steps(&|m| m.zero_advantage_groups),
                distinct_leaves_per_tree: over_steps(&|m| m.distinct_leaves_per_tree),
                final_training_reward: mean_std(&tail).0,
            }
        })
        .collect()
}

/// Tree − chain at one budget, per held-out source, at the final evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub budget: f64,
    pub tree: String,
    pub chain: String,
    /// Paired over the seeds both arms finished.
    pub diff: BTreeMap<String, PairedDiff>,
    /// The same for every evaluation step: (step, all-source difference).
    pub by_step: Vec<(u64, PairedDiff)>,
}

/// Every (tree arm, chain arm) pair of equal budget in a regime.
pub fn comparisons(cfg: &ExperimentConfig, r: &RegimeResults) -> Vec<Comparison> {
    let mut out = Vec::new();
    for tree in cfg.arms.iter().filter(|a| a.is_tree()) {
        for chain in cfg.arms.iter().filter(|a| !a.is_tree() && a.method.budget() == tree.method.budget()) {
            let (tl, cl) = (tree.label(), chain.label());
            let pairs: Vec<(&ArmRun, &ArmRun)> = r
                .runs
                .iter()
                .filter(|x| x.arm == tl)
                .filter_map(|t| r.runs.iter().find(|c| c.arm == cl && c.seed == t.seed).map(|c| (t, c)))
                .collect();
            let diffs = |step: Option<u64>, s: &str| -> Vec<f64> {
                pairs.iter().filter_map(|(t, c)| Some(em_at(t, step, s)? - em_at(c, step, s)?)).collect()
            };
            let diff = sources(r).iter().map(|s| (s.clone(), PairedDiff::of(&diffs(None, s)))).collect();
            let mut steps: Vec<u64> = pairs.iter().flat_map(|(t, _)| t.summary.evals.iter().map(|p| p.step)).collect();
            steps.sort_unstable();
            steps.dedup();
            let by_step = steps.into_iter().map(|s| (s, PairedDiff::of(&diffs(Some(s), "all")))).collect();
            out.push(Comparison { budget: tree.method.budget(), tree: tl, chain: cl, diff, by_step });
        }
    }
    out
}

/// Whether an arm's curves have flattened by its last evaluation, by the rule the 2026-12-06
/// follow-up fixed in advance: the mean over seeds of held-out EM moves by less than
/// [`FLAT_EM`] between the last two evaluations, **and** the 95% interval over seeds of the
/// change in mean training reward between the last two blocks of `eval_every` steps contains 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Flatness {
    pub label: String,
    /// The two evaluation steps compared (the last two).
    pub steps: (u64, u64),
    /// Mean over seeds of the held-out EM change between them.
    pub em_change: f64,
    /// Per seed, mean training reward over the last block of steps minus the block before
    /// (blocks of `eval_every` steps, 1-based `steps.0 - eval_every + 1 ..= steps.0` against
    /// `steps.0 + 1 ..= steps.1`), with its interval over seeds.
    pub reward_change: PairedDiff,
    pub flat: bool,
}

/// A change of mean held-out EM smaller than this between the last two evaluations counts as flat.
pub const FLAT_EM: f64 = 0.01;

/// The flatness of each arm of a regime; none for an arm with fewer than two evaluations.
pub fn flatness(cfg: &ExperimentConfig, r: &RegimeResults) -> Vec<Flatness> {
    let mut out = Vec::new();
    for arm in &cfg.arms {
        let label = arm.label();
        let runs: Vec<&ArmRun> = r.runs.iter().filter(|x| x.arm == label).collect();
        let Some(first) = runs.first() else { continue };
        let evals: Vec<u64> = first.summary.evals.iter().map(|p| p.step).collect();
        let [.., a, b] = evals[..] else { continue };
        let em: Vec<f64> =
            runs.iter().filter_map(|x| Some(em_at(x, Some(b), "all")? - em_at(x, Some(a), "all")?)).collect();
        let em_change = mean_std(&em).0;
        // Metrics count steps from 0: 1-based step s is metric step s - 1.
        let block = |x: &ArmRun, lo: u64, hi: u64| {
            let v: Vec<f64> =
                x.summary.metrics.iter().filter(|m| m.step + 1 >= lo && m.step < hi).map(|m| m.reward_mean).collect();
            mean_std(&v).0
        };
        let width = b - a;
        let reward: Vec<f64> =
            runs.iter().map(|x| block(x, a + 1, b) - block(x, (a + 1).saturating_sub(width), a)).collect();
        let reward_change = PairedDiff::of(&reward);
        let flat = em_change.abs() < FLAT_EM && reward_change.lo <= 0.0 && reward_change.hi >= 0.0;
        out.push(Flatness { label, steps: (a, b), em_change, reward_change, flat });
    }
    out
}

/// Per evaluation step and held-out source, the paired difference tree − chain of one comparison.
fn diffs_by_step(r: &RegimeResults, c: &Comparison) -> Vec<(u64, BTreeMap<String, PairedDiff>)> {
    let pairs: Vec<(&ArmRun, &ArmRun)> = r
        .runs
        .iter()
        .filter(|x| x.arm == c.tree)
        .filter_map(|t| r.runs.iter().find(|x| x.arm == c.chain && x.seed == t.seed).map(|x| (t, x)))
        .collect();
    c.by_step
        .iter()
        .map(|(step, _)| {
            let per = sources(r)
                .into_iter()
                .map(|s| {
                    let d: Vec<f64> = pairs
                        .iter()
                        .filter_map(|(t, x)| Some(em_at(t, Some(*step), &s)? - em_at(x, Some(*step), &s)?))
                        .collect();
                    (s, PairedDiff::of(&d))
                })
                .collect();
            (*step, per)
        })
        .collect()
}

fn fmt_diff(d: &PairedDiff) -> String {
    if d.n < 2 {
        return format!("{:+.3} (n={})", d.mean, d.n);
    }
    format!("{:+.3} [{:+.3}, {:+.3}]", d.mean, d.lo, d.hi)
}

/// The tables of every regime as Markdown.
pub fn format_table(results: &ExperimentResults) -> String {
    let cfg = &results.config;
    let mut s = String::new();
    for r in &results.regimes {
        let srcs = sources(r);
        let _ = writeln!(
            s,
            "## Regime `{}`{}\n",
            r.regime.name,
            if r.regime.note.is_empty() { String::new() } else { format!(": {}", r.regime.note) }
        );
        match &r.sweep {
            Some(sw) => {
                let cands: Vec<String> = sw.reward.iter().map(|(lr, x)| format!("{lr:e}: {x:.4}")).collect();
                let _ = writeln!(
                    s,
                    "Learning rate {:e}, chosen on the training reward of the last {} steps (sweep: {}).\n",
                    r.lr,
                    sw.judged_steps,
                    cands.join(", ")
                );
            }
            None => {
                let _ = writeln!(s, "Learning rate {:e} (no sweep).\n", r.lr);
            }
        }
        s.push_str("| budget | method | seeds |");
        for src in &srcs {
            let _ = write!(s, " {src} EM |");
        }
        s.push_str(" tools/question | train reward (last half) | zero-adv. groups | distinct leaves/tree | trajectories/prompt | generated tokens/prompt | tool calls/prompt |\n|---|---|---|");
        for _ in 0..srcs.len() + 7 {
            s.push_str("---|");
        }
        s.push('\n');
        let _ = write!(s, "| - | start (before RL) | - |");
        for src in &srcs {
            let _ = write!(s, " {:.3} |", score(&r.start.greedy, src));
        }
        let _ = writeln!(
            s,
            " {:.2} | - | - | - | - | - | - |",
            r.start.greedy.get("all").map_or(0.0, |x| x.tool_calls_per_question)
        );
        for row in table_rows(cfg, r) {
            let _ = write!(s, "| ≈{} | {} | {} |", row.budget, row.label, row.seeds);
            for src in &srcs {
                let (m, sd) = row.em.get(src).copied().unwrap_or_default();
                let _ = write!(s, " {m:.3} ± {sd:.3} |");
            }
            let _ = writeln!(
                s,
                " {:.2} | {:.3} | {:.2} | {:.2} | {:.2} | {:.0} | {:.2} |",
                row.tool_calls_per_question,
                row.final_training_reward,
                row.zero_advantage_groups,
                row.distinct_leaves_per_tree,
                row.trajectories_per_prompt,
                row.generated_tokens_per_prompt,
                row.tool_calls_per_prompt
            );
        }
        s.push_str(
            "\nPaired difference tree − chain of final held-out EM, mean [95% CI] over seeds (wins/losses):\n\n",
        );
        table_header(&mut s, &["budget", "tree", "chain", "pairs"], &srcs);
        for c in comparisons(cfg, r) {
            let n = c.diff.get("all").map_or(0, |d| d.n);
            let _ = write!(s, "| ≈{} | {} | {} | {n} |", c.budget, c.tree, c.chain);
            diff_cells(&mut s, &c.diff, &srcs);
        }
        s.push('\n');
        format_by_step(&mut s, cfg, r, &srcs);
        if let Some(a) = &cfg.analysis {
            let floor = world_floor(&cfg.train.train_data);
            s.push_str(&crate::analysis::format(cfg, r, a, floor.as_ref()));
        }
    }
    s
}

/// The no-search floor of the world whose training questions are `train_data`, when they are a
/// `trainer world` folder's.
fn world_floor(train_data: &Path) -> Option<crate::world::Floor> {
    let dir = train_data.parent()?;
    let spec = crate::world::WorldSpec::read(dir).ok()?;
    Some(spec.floor())
}

/// A markdown table's header and separator rows: the `fixed` columns, then one per `cols`.
fn table_header<T: std::fmt::Display>(s: &mut String, fixed: &[&str], cols: &[T]) {
    s.push('|');
    for c in fixed {
        let _ = write!(s, " {c} |");
    }
    for c in cols {
        let _ = write!(s, " {c} |");
    }
    s.push_str("\n|");
    for _ in 0..fixed.len() + cols.len() {
        s.push_str("---|");
    }
    s.push('\n');
}

/// The rest of a row: each source's paired difference with its wins and losses (`-` when the
/// source has none), then the end of the line.
fn diff_cells(s: &mut String, diffs: &BTreeMap<String, PairedDiff>, srcs: &[String]) {
    for src in srcs {
        match diffs.get(src) {
            Some(d) => {
                let _ = write!(s, " {} ({}/{}) |", fmt_diff(d), d.wins, d.losses);
            }
            None => s.push_str(" - |"),
        }
    }
    s.push('\n');
}

/// Per evaluation step: each arm's mean held-out EM over seeds, the paired differences per
/// source, and each arm's flatness by the rule of [`flatness`].
fn format_by_step(s: &mut String, cfg: &ExperimentConfig, r: &RegimeResults, srcs: &[String]) {
    let comps = comparisons(cfg, r);
    if comps.iter().all(|c| c.by_step.len() < 2) {
        return;
    }
    s.push_str("Held-out EM (all) by evaluation step, mean ± sd over seeds:\n\n");
    let mut steps: Vec<u64> = comps.iter().flat_map(|c| c.by_step.iter().map(|(k, _)| *k)).collect();
    steps.sort_unstable();
    steps.dedup();
    table_header(s, &["method", "0 (start)"], &steps);
    for arm in &cfg.arms {
        let label = arm.label();
        let _ = write!(s, "| {label} | {:.3} |", score(&r.start.greedy, "all"));
        for k in &steps {
            let v: Vec<f64> =
                r.runs.iter().filter(|x| x.arm == label).filter_map(|x| em_at(x, Some(*k), "all")).collect();
            let (m, sd) = mean_std(&v);
            let _ = write!(s, " {m:.3} ± {sd:.3} |");
        }
        s.push('\n');
    }
    for c in &comps {
        let _ = write!(
            s,
            "\nPaired difference {} − {} of held-out EM by evaluation step, mean [95% CI] (wins/losses):\n\n",
            c.tree, c.chain
        );
        table_header(s, &["step", "pairs"], srcs);
        for (step, per) in diffs_by_step(r, c) {
            let n = per.get("all").map_or(0, |d| d.n);
            let _ = write!(s, "| {step} | {n} |");
            diff_cells(s, &per, srcs);
        }
    }
    let flat = flatness(cfg, r);
    if flat.is_empty() {
        return;
    }
    let _ = write!(
        s,
        "\nFlat by the last evaluation? Flat when mean held-out EM moves by less than {FLAT_EM} between \
         the last two evaluations and the 95% CI over seeds of the change in mean training reward \
         between the last two blocks of steps contains 0:\n\n| method | evaluations | EM change | \
         training reward change [95% CI] | flat |\n|---|---|---|---|---|\n"
    );
    for f in &flat {
        let _ = writeln!(
            s,
            "| {} | {} → {} | {:+.3} | {} | {} |",
            f.label,
            f.steps.0,
            f.steps.1,
            f.em_change,
            fmt_diff(&f.reward_change),
            if f.flat { "yes" } else { "no, still moving" }
        );
    }
    s.push('\n');
}

/// Per evaluation step, the mean over seeds of each arm's held-out EM (the start at step 0).
fn em_series(cfg: &ExperimentConfig, r: &RegimeResults) -> Vec<(String, Vec<(f64, f64)>)> {
    cfg.arms
        .iter()
        .map(|arm| {
            let label = arm.label();
            let mut by: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
            by.entry(0).or_default().push(score(&r.start.greedy, "all"));
            for x in r.runs.iter().filter(|x| x.arm == label) {
                for p in &x.summary.evals {
                    by.entry(p.step).or_default().push(score(&p.greedy, "all"));
                }
            }
            (label, by.into_iter().map(|(k, v)| (k as f64, mean_std(&v).0)).collect())
        })
        .collect()
}

/// Per step, the mean over seeds of a step metric of each arm.
fn step_series(
    cfg: &ExperimentConfig,
    r: &RegimeResults,
    f: fn(&StepMetrics) -> f64,
) -> Vec<(String, Vec<(f64, f64)>)> {
    cfg.arms
        .iter()
        .map(|arm| {
            let label = arm.label();
            let mut by: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
            for x in r.runs.iter().filter(|x| x.arm == label) {
                for m in &x.summary.metrics {
                    by.entry(m.step + 1).or_default().push(f(m));
                }
            }
            (label, by.into_iter().map(|(k, v)| (k as f64, mean_std(&v).0)).collect())
        })
        .collect()
}

/// The plots of each regime, by file name.
const PLOTS: [&str; 3] = ["em_vs_step.svg", "reward_vs_step.svg", "zero_advantage_vs_step.svg"];

/// `table.md`, `results.json`, and per regime `<regime>-em_vs_step.svg`,
/// `<regime>-reward_vs_step.svg` and `<regime>-zero_advantage_vs_step.svg` (means over seeds).
pub fn write_outputs(results: &ExperimentResults, out: &Path) -> Result<()> {
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(results)?)?;
    std::fs::write(out.join("table.md"), format_table(results))?;
    let cfg = &results.config;
    for r in &results.regimes {
        let name = &r.regime.name;
        let charts = [
            (format!("{name}: held-out EM (greedy, mean over seeds)"), em_series(cfg, r)),
            (format!("{name}: training reward (mean over seeds)"), step_series(cfg, r, |m| m.reward_mean)),
            (
                format!("{name}: fraction of groups with equal rewards (mean over seeds)"),
                step_series(cfg, r, |m| m.zero_advantage_groups),
            ),
        ];
        for (file, (title, series)) in PLOTS.iter().zip(charts) {
            let series: Vec<(&str, Vec<(f64, f64)>)> = series.iter().map(|(l, p)| (l.as_str(), p.clone())).collect();
            std::fs::write(
                out.join(format!("{name}-{file}")),
                crate::plots::multi_line_chart(&title, "training step", &series),
            )?;
        }
    }
    Ok(())
}

/// Where the experiment writes, for printing.
pub fn outputs(cfg: &ExperimentConfig) -> Vec<PathBuf> {
    let out = &cfg.train.out_dir;
    let mut v = vec![out.join("table.md"), out.join("results.json")];
    for r in cfg.regimes() {
        v.extend(PLOTS.iter().map(|f| out.join(format!("{}-{f}", r.name))));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_keeps_what_reuse_reads_and_restores_it_into_an_empty_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let (out, kept) = (tmp.path().join("out"), tmp.path().join("record"));
        let run = out.join("strong").join("chain-n-4").join("seed-0");
        std::fs::create_dir_all(run.join("checkpoint-40")).unwrap();
        for (name, text) in [
            ("config.toml", "steps = 40\n"),
            ("metrics.jsonl", "{}\n"),
            ("eval-10.json", "{\"a\":1}"),
            ("eval-40.json", "{\"a\":2}"),
            ("rollouts-3.jsonl", "big"),
            ("checkpoint-40/model.safetensors", "weights"),
        ] {
            std::fs::write(run.join(name), text).unwrap();
        }
        std::fs::write(out.join("strong").join("start.json"), "{}").unwrap();
        let record = Record { out: &out, root: Some(&kept) };
        // A stale file of an earlier run in the record goes.
        std::fs::create_dir_all(kept.join("strong/chain-n-4/seed-0")).unwrap();
        std::fs::write(kept.join("strong/chain-n-4/seed-0/eval-20.json"), "old").unwrap();
        record.keep_run(&run).unwrap();
        record.keep(&out.join("strong").join("start.json")).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(kept.join("strong/chain-n-4/seed-0"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["config.toml", "eval-10.json", "eval-40.json", "metrics.jsonl"]);

        // Another machine: an empty output folder is filled from the record.
        std::fs::remove_dir_all(&out).unwrap();
        record.restore(&out.join("strong").join("start.json")).unwrap();
        record.restore_run(&run).unwrap();
        assert_eq!(std::fs::read_to_string(run.join("eval-40.json")).unwrap(), "{\"a\":2}");
        assert_eq!(std::fs::read_to_string(run.join("config.toml")).unwrap(), "steps = 40\n");
        assert!(out.join("strong").join("start.json").exists());
        assert!(!run.join("checkpoint-40").exists());
        // A run the record does not hold is left to be trained.
        let other = out.join("strong").join("tree").join("seed-0");
        record.restore_run(&other).unwrap();
        assert!(!other.exists());
        // A path outside the output folder is an error, not a silent miss.
        assert!(record.keep(&tmp.path().join("elsewhere.json")).is_err());
        // Without a record nothing happens.
        Record { out: &out, root: None }.keep_run(&run).unwrap();
    }

    #[test]
    fn the_record_folder_is_read_from_the_toml_and_not_written_back() {
        let cfg: ExperimentConfig = toml::from_str("record = \"kept\"\nseeds = [0]\n").unwrap();
        assert_eq!(cfg.record.as_deref(), Some(Path::new("kept")));
        assert!(!toml::to_string_pretty(&cfg).unwrap().contains("kept"));
        assert!(toml::from_str::<ExperimentConfig>("recrod = \"kept\"\n").is_err());
    }

    #[test]
    fn paired_differences_have_t_intervals() {
        // Five pairs: mean 0.02, sd 0.01581, half-width t(4) 2.776 x sd / sqrt(5) = 0.01963.
        let d = PairedDiff::of(&[0.01, 0.02, 0.03, 0.0, 0.04]);
        assert!((d.mean - 0.02).abs() < 1e-12);
        assert!((d.hi - d.mean - 2.776 * 0.0158113883 / 5f64.sqrt()).abs() < 1e-6, "{d:?}");
        assert_eq!((d.wins, d.losses, d.n), (4, 0, 5));
        let one = PairedDiff::of(&[0.1]);
        assert!(one.hi.is_infinite() && one.lo.is_infinite(), "one pair has no interval");
        assert_eq!(t_975(1), 12.706);
        assert!((t_975(40) - 2.021).abs() < 0.002 && (t_975(120) - 1.980).abs() < 0.002);
    }

    /// A run of 40 steps evaluated every 10, with EM `em[i]` at step 10(i+1) and training reward
    /// `reward(step)` (1-based step).
    fn run(arm: &str, seed: u64, em: [f64; 4], reward: impl Fn(u64) -> f64) -> ArmRun {
        let point = |step: u64, score: f64| {
            let mut greedy = EvalReport::new();
            greedy.insert("all".into(), grove_rundir::SourceScore { questions: 200, score, ..Default::default() });
            greedy.insert("hop2".into(), grove_rundir::SourceScore { questions: 100, score, ..Default::default() });
            EvalPoint { step, greedy, sampled: None, selection: None }
        };
        let metrics =
            (0..40).map(|m| StepMetrics { step: m, reward_mean: reward(m + 1), ..Default::default() }).collect();
        let evals = em.iter().enumerate().map(|(i, e)| point(10 * (i as u64 + 1), *e)).collect();
        ArmRun { arm: arm.into(), seed, summary: RunSummary { metrics, evals, out_dir: PathBuf::new() } }
    }

    #[test]
    fn flatness_follows_the_rule_fixed_before_the_follow_up() {
        let cfg = ExperimentConfig {
            arms: vec![Arm::new(Method::chain(4)), Arm::new(Method::tree(2, 2, 1, 3))],
            ..Default::default()
        };
        let (chain, tree) = (cfg.arms[0].label(), cfg.arms[1].label());
        let mut runs = Vec::new();
        for seed in 0..5u64 {
            let noise = [0.01, -0.02, 0.0, 0.02, -0.01][seed as usize];
            // Chain: EM moves 0.005 and the reward is flat after step 20 up to seed noise, whose
            // sign flips between the blocks, so its interval straddles 0.
            runs.push(run(&chain, seed, [0.40, 0.45, 0.470, 0.475], |s| {
                if s <= 20 {
                    0.3
                } else if s <= 30 {
                    0.5 + noise
                } else {
                    0.5 - noise
                }
            }));
            // Tree: still climbing, by 0.03 EM and 0.05 reward in every seed.
            runs.push(run(&tree, seed, [0.40, 0.45, 0.48, 0.51 + noise / 10.0], |s| {
                if s <= 30 { 0.5 } else { 0.55 + noise / 10.0 }
            }));
        }
        let start = run(&chain, 0, [0.3; 4], |_| 0.0).summary.evals[0].clone();
        let r = RegimeResults {
            regime: Regime { name: "strong".into(), model: PathBuf::new(), note: String::new() },
            start: EvalPoint { step: 0, ..start },
            sweep: None,
            lr: 3e-4,
            runs,
        };
        let f = flatness(&cfg, &r);
        assert_eq!(f.len(), 2);
        assert_eq!((f[0].label.as_str(), f[0].steps), (chain.as_str(), (30, 40)));
        assert!((f[0].em_change - 0.005).abs() < 1e-9, "{:?}", f[0]);
        // Per seed the change is -2 x noise: mean 0, an interval around 0.
        assert!(f[0].reward_change.mean.abs() < 1e-9 && f[0].reward_change.lo < 0.0 && f[0].reward_change.hi > 0.0);
        assert!(f[0].flat);
        assert!((f[1].em_change - 0.03).abs() < 1e-9 && f[1].reward_change.lo > 0.04, "{:?}", f[1]);
        assert!(!f[1].flat);

        let table = format_table(&ExperimentResults { config: cfg, regimes: vec![r] });
        assert!(table.contains("| 40 | 5 | +0.035 ["), "{table}");
        assert!(table.contains(&format!("| {chain} | 30 → 40 | +0.005 |")), "{table}");
        assert!(table.contains("no, still moving"), "{table}");
    }
}
