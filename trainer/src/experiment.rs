//! Chain GRPO against Tree-GRPO at equal rollout budget (the paper's Table 3, §2.6 of the spec):
//! from one starting checkpoint, every arm trains the same number of steps on the same prompts
//! with several seeds, then is evaluated greedily on held-out questions. Writes a table
//! (`table.md`), the raw numbers (`results.json`) and plots (EM and reward against step).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
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
}

/// `trainer experiment --config FILE`: `[train]` holds the settings every arm shares (model =
/// the starting checkpoint, data, steps, learning rate, ...); `seeds` and `[[arms]]` the grid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExperimentConfig {
    pub train: TrainConfig,
    pub seeds: Vec<u64>,
    pub arms: Vec<Arm>,
}

impl Default for ExperimentConfig {
    /// The grid: chain n=2 against tree (1,2,1), chain n=4 against tree (2,2,1), 3 seeds.
    fn default() -> Self {
        Self {
            train: TrainConfig::default(),
            seeds: vec![0, 1, 2],
            arms: [Method::chain(2), Method::tree(1, 2, 1, 3), Method::chain(4), Method::tree(2, 2, 1, 3)]
                .into_iter()
                .map(Arm::new)
                .collect(),
        }
    }
}

/// One finished (arm, seed) run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmRun {
    pub arm: String,
    pub seed: u64,
    pub summary: RunSummary,
}

/// Everything the experiment measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExperimentResults {
    pub config: ExperimentConfig,
    /// The starting checkpoint on the held-out questions.
    pub start: EvalPoint,
    pub runs: Vec<ArmRun>,
}

/// Run every arm with every seed (each in `<out>/<arm>/seed-<s>`), then write the table, the
/// raw results and the plots into `out`.
pub fn run_experiment(cfg: &ExperimentConfig, progress: bool) -> Result<ExperimentResults> {
    let out = cfg.train.out_dir.clone();
    // Every arm's settings are checked before anything runs.
    for arm in &cfg.arms {
        let mut train = cfg.train.clone();
        arm.apply(&mut train);
        train.step_config().with_context(|| format!("arm {}", arm.label()))?;
    }
    std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
    std::fs::write(out.join("experiment.toml"), toml::to_string_pretty(cfg)?)?;
    let start = evaluate_start(&cfg.train)?;
    if progress {
        eprint!("{}", format_eval_point(&start, &cfg.train.agent(None)));
    }
    let mut runs = Vec::new();
    for arm in &cfg.arms {
        for &seed in &cfg.seeds {
            let mut train = cfg.train.clone();
            arm.apply(&mut train);
            train.seed = seed;
            train.out_dir = out.join(slug(&arm.label())).join(format!("seed-{seed}"));
            train.eval_before = false;
            let opts = RunOptions { resume: false, progress, label: format!("{} seed {seed}", arm.label()) };
            let summary = crate::train::run(&train, &opts)?;
            if progress {
                let em = summary.evals.last().map_or(0.0, EvalPoint::greedy_all);
                eprintln!("{} seed {seed}: held-out EM {em:.3}", arm.label());
            }
            runs.push(ArmRun { arm: arm.label(), seed, summary });
        }
    }
    let results = ExperimentResults { config: cfg.clone(), start, runs };
    write_outputs(&results, &out)?;
    Ok(results)
}

fn evaluate_start(train: &TrainConfig) -> Result<EvalPoint> {
    let placement = crate::device::place_with(train.device, train.precision)?;
    let (_vs, model) = load_model(&train.model, placement.device, placement.kind)?;
    let tok = Tokenizer::from_dir(train.tokenizer.as_deref().unwrap_or(&train.model))?;
    if train.eval_data.is_none() {
        anyhow::bail!("the experiment needs eval_data (held-out questions)");
    }
    let (tasks, selection) = held_out(train)?;
    let envs = connect_all(&train.env.0)?;
    let agent = train.agent(train.prompt_template_text()?);
    Ok(eval_point(&model, &tok, &envs, (&tasks, selection), &agent, false, 0, train.seed)?)
}

fn slug(label: &str) -> String {
    let s: String = label.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    s.split('-').filter(|p| !p.is_empty()).collect::<Vec<_>>().join("-")
}

/// Mean and sample standard deviation.
pub fn mean_std(xs: &[f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 { xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

fn score(report: &EvalReport, source: &str) -> f64 {
    report.get(source).map_or(0.0, |s| s.score)
}

/// One row of the table: an arm's numbers over its seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableRow {
    pub label: String,
    pub budget: f64,
    pub seeds: usize,
    /// Mean and standard deviation over seeds, per held-out data source (and `all`).
    pub em: BTreeMap<String, (f64, f64)>,
    pub tool_calls_per_question: f64,
    /// Measured rollout cost per prompt, averaged over steps and seeds: training rows,
    /// generated tokens and tool calls.
    pub trajectories_per_prompt: f64,
    pub generated_tokens_per_prompt: f64,
    pub tool_calls_per_prompt: f64,
}

/// Aggregate the runs of each arm (in the config's order).
pub fn table_rows(results: &ExperimentResults) -> Vec<TableRow> {
    let sources: Vec<String> = results.start.greedy.keys().cloned().collect();
    let prompts = results.config.train.prompts_per_step.max(1) as f64;
    results
        .config
        .arms
        .iter()
        .map(|arm| {
            let label = arm.label();
            let runs: Vec<&ArmRun> = results.runs.iter().filter(|r| r.arm == label).collect();
            let finals: Vec<&EvalReport> =
                runs.iter().filter_map(|r| r.summary.evals.last().map(|p| &p.greedy)).collect();
            let em = sources
                .iter()
                .map(|s| (s.clone(), mean_std(&finals.iter().map(|r| score(r, s)).collect::<Vec<_>>())))
                .collect();
            let tools = mean_std(
                &finals.iter().map(|r| r.get("all").map_or(0.0, |s| s.tool_calls_per_question)).collect::<Vec<_>>(),
            )
            .0;
            let steps: Vec<&StepMetrics> = runs.iter().flat_map(|r| r.summary.metrics.iter()).collect();
            let per_prompt = |f: &dyn Fn(&StepMetrics) -> f64| {
                steps.iter().map(|m| f(m)).sum::<f64>() / steps.len().max(1) as f64 / prompts
            };
            TableRow {
                label,
                budget: arm.method.budget(),
                seeds: finals.len(),
                em,
                tool_calls_per_question: tools,
                trajectories_per_prompt: per_prompt(&|m| m.rows as f64),
                generated_tokens_per_prompt: per_prompt(&|m| m.generated_tokens as f64),
                tool_calls_per_prompt: per_prompt(&|m| m.tool_calls as f64),
            }
        })
        .collect()
}

/// The table as Markdown: EM per held-out source (mean ± std over seeds), tool calls per
/// question, and what the rollouts cost.
pub fn format_table(results: &ExperimentResults) -> String {
    let sources: Vec<String> = results.start.greedy.keys().filter(|k| *k != "all").cloned().collect();
    let mut s = String::from("| budget | method | seeds |");
    for src in &sources {
        let _ = write!(s, " {src} EM |");
    }
    s.push_str(
        " all EM | tools/question | trajectories/prompt | generated tokens/prompt | tool calls/prompt |\n|---|---|---|",
    );
    for _ in 0..sources.len() + 5 {
        s.push_str("---|");
    }
    s.push('\n');
    let start = &results.start.greedy;
    let _ = write!(s, "| - | start (before RL) | - |");
    for src in &sources {
        let _ = write!(s, " {:.3} |", score(start, src));
    }
    let _ = writeln!(
        s,
        " {:.3} | {:.2} | - | - | - |",
        score(start, "all"),
        start.get("all").map_or(0.0, |x| x.tool_calls_per_question)
    );
    for row in table_rows(results) {
        let _ = write!(s, "| ≈{} | {} | {} |", row.budget, row.label, row.seeds);
        for src in sources.iter().chain(std::iter::once(&"all".to_string())) {
            let (m, sd) = row.em.get(src).copied().unwrap_or_default();
            let _ = write!(s, " {m:.3} ± {sd:.3} |");
        }
        let _ = writeln!(
            s,
            " {:.2} | {:.2} | {:.0} | {:.2} |",
            row.tool_calls_per_question,
            row.trajectories_per_prompt,
            row.generated_tokens_per_prompt,
            row.tool_calls_per_prompt
        );
    }
    s
}

/// `table.md`, `results.json`, `em_vs_step.svg` and `reward_vs_step.svg` (means over seeds).
pub fn write_outputs(results: &ExperimentResults, out: &Path) -> Result<()> {
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(results)?)?;
    std::fs::write(out.join("table.md"), format_table(results))?;
    let mut em_series = Vec::new();
    let mut reward_series = Vec::new();
    for arm in &results.config.arms {
        let label = arm.label();
        let runs: Vec<&ArmRun> = results.runs.iter().filter(|r| r.arm == label).collect();
        let mut em: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
        em.entry(0).or_default().push(score(&results.start.greedy, "all"));
        let mut reward: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
        for r in &runs {
            for p in &r.summary.evals {
                em.entry(p.step).or_default().push(score(&p.greedy, "all"));
            }
            for m in &r.summary.metrics {
                reward.entry(m.step + 1).or_default().push(m.reward_mean);
            }
        }
        let mean = |m: BTreeMap<u64, Vec<f64>>| -> Vec<(f64, f64)> {
            m.into_iter().map(|(k, v)| (k as f64, mean_std(&v).0)).collect()
        };
        em_series.push((label.clone(), mean(em)));
        reward_series.push((label, mean(reward)));
    }
    let em_series: Vec<(&str, Vec<(f64, f64)>)> = em_series.iter().map(|(l, p)| (l.as_str(), p.clone())).collect();
    let reward_series: Vec<(&str, Vec<(f64, f64)>)> =
        reward_series.iter().map(|(l, p)| (l.as_str(), p.clone())).collect();
    std::fs::write(
        out.join("em_vs_step.svg"),
        crate::plots::multi_line_chart("held-out EM (greedy, mean over seeds)", "training step", &em_series),
    )?;
    std::fs::write(
        out.join("reward_vs_step.svg"),
        crate::plots::multi_line_chart("training reward (mean over seeds)", "training step", &reward_series),
    )?;
    Ok(())
}

/// Where the experiment writes, for printing.
pub fn outputs(out: &Path) -> [PathBuf; 4] {
    ["table.md", "results.json", "em_vs_step.svg", "reward_vs_step.svg"].map(|f| out.join(f))
}
