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

use crate::engine::model::load_model;
use crate::engine::tokenizer::Tokenizer;
use crate::rl::algo::advantage::Estimator;
use crate::rl::env::connect_all;
use crate::rl::method::Method;
use crate::rl::train::{RunOptions, RunSummary, StepMetrics, TrainConfig, held_out};
use crate::workflows::eval::{EvalPoint, EvalReport, eval_point, format_eval_point};
pub use grove_rundir::stats::{PairedDiff, mean_std, t_975};

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
    pub analysis: Option<analysis::Analysis>,
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

pub mod analysis;
mod report;
mod runs;

pub use report::*;
use runs::{Record, evaluate_start, finished_run, run_or_reuse, slug};
