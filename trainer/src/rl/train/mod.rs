//! The training workflow behind `trainer train` and `trainer experiment`: load the policy and
//! its frozen reference, connect to the env-servers, run training steps with periodic
//! evaluation, metrics, plots and checkpoints in the run folder, resume from the latest one.
//!
//! - `config`: the TOML a user writes, checked into the settings of a step;
//! - `step`: one training step (rollout, advantages, update, metrics);
//! - `checkpoint`: weights and optimiser state through the run folder's atomic commit;
//! - this file: the loop.

pub mod checkpoint;
pub mod config;
pub mod step;
pub mod trees;

use std::path::PathBuf;

use anyhow::{Context, Result};
use grove_rundir::{RunDir, TrainState};
use serde::{Deserialize, Serialize};

pub use config::{ConfigError, EnvUrls, TrainConfig};
pub use step::{StepConfig, StepError, StepMetrics, StepResult, prompts_for_step, train_step};

use crate::engine::model::load_model;
use crate::engine::optim::{AdamW, AdamWConfig};
use crate::engine::tokenizer::Tokenizer;
use crate::rl::env::{EnvClient, connect_all};
use crate::rl::rollout::agent::RolloutError;
use crate::support::data::{load_tasks, select};
use crate::workflows::eval::{EvalPoint, EvalSelection, eval_point, format_eval_point};

/// How a run reports itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// Continue from the latest checkpoint in the output folder.
    pub resume: bool,
    /// Draw a progress bar on stderr (and print evaluation tables above it).
    pub progress: bool,
    /// A label shown before the progress bar.
    pub label: String,
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub metrics: Vec<StepMetrics>,
    pub evals: Vec<EvalPoint>,
    pub out_dir: PathBuf,
}

/// The held-out questions of `cfg` (all of them, or the configured seeded sample); none without
/// `eval_data`.
pub fn held_out(cfg: &TrainConfig) -> Result<(Vec<grove_protocol::TaskSpec>, EvalSelection)> {
    let all = match &cfg.eval_data {
        Some(p) => load_tasks(p, &cfg.data_source).with_context(|| format!("eval data {}", p.display()))?,
        None => Vec::new(),
    };
    Ok(select(&all, cfg.eval_max_questions, cfg.eval_seed.unwrap_or(cfg.seed)))
}

/// A failed step or evaluation, said so that a user knows what was lost and how to go on: when
/// an env-server went away, its episodes are lost, no update of the step was applied, and
/// `--resume` continues from the last checkpoint once the server is back.
fn explain_failure(e: anyhow::Error, step: u64, run: &RunDir) -> anyhow::Error {
    let lost = e.chain().find_map(|c| {
        let rollout = c.downcast_ref::<RolloutError>().or_else(|| match c.downcast_ref::<StepError>() {
            Some(StepError::Rollout(r)) => Some(r),
            _ => None,
        });
        rollout.and_then(|r| r.lost_server()).map(|(url, live)| (url.to_string(), live))
    });
    let Some((url, live)) = lost else { return e.context(format!("step {step} failed")) };
    let resume = match run.latest_checkpoint() {
        Some(ckpt) => format!(
            "the last checkpoint is {}; once the env-server is back, `trainer train --resume` continues from it",
            ckpt.display()
        ),
        None => "there is no checkpoint yet; once the env-server is back, run `trainer train` again".to_string(),
    };
    e.context(format!(
        "env-server {url} was lost during step {step}: {live} of its episodes are gone, the step's rollouts are \
         discarded and none of its updates was applied; {resume}"
    ))
}

fn progress_bar(opts: &RunOptions, steps: u64, start: u64) -> indicatif::ProgressBar {
    let bar = if opts.progress { indicatif::ProgressBar::new(steps) } else { indicatif::ProgressBar::hidden() };
    bar.set_position(start);
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{} {{bar:30}} {{pos}}/{{len}} {{msg}} ({{eta}})",
            if opts.label.is_empty() { "train" } else { &opts.label }
        ))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// Train as `cfg` says. Writes `config.toml`, `metrics.jsonl`, `eval-<step>.json`, the SVG plots
/// and checkpoints into `cfg.out_dir` (see `grove_rundir`).
pub fn run(cfg: &TrainConfig, opts: &RunOptions) -> Result<RunSummary> {
    let mut step_cfg = cfg.step_config()?;
    step_cfg.agent.prompt_template = cfg.prompt_template_text()?;
    let run_dir = RunDir::new(&cfg.out_dir);
    let placement = crate::engine::device::place_with(cfg.device, cfg.precision)?;
    let (vs, policy) = load_model(&cfg.model, placement.device, placement.kind)
        .with_context(|| format!("load {}", cfg.model.display()))?;
    let (mut ref_vs, reference) = load_model(&cfg.model, placement.device, placement.kind)?;
    ref_vs.freeze();
    let tok_dir = cfg.tokenizer.clone().unwrap_or_else(|| cfg.model.clone());
    let tok = Tokenizer::from_dir(&tok_dir).with_context(|| format!("tokenizer of {}", tok_dir.display()))?;
    let envs: Vec<EnvClient> = connect_all(&cfg.env.0)?;
    let tasks = load_tasks(&cfg.train_data, &cfg.data_source)
        .with_context(|| format!("training data {}", cfg.train_data.display()))?;
    let (eval_tasks, selection) = held_out(cfg)?;
    let mut opt = AdamW::new(&vs, AdamWConfig::with_state(cfg.optim_state));
    if opts.progress {
        eprintln!("optimiser: {:?}, {:.1} bytes per parameter", cfg.optim_state, opt.bytes_per_param());
    }
    let mut start = 0;
    if opts.resume
        && let Some(ckpt) = run_dir.latest_checkpoint()
    {
        start = checkpoint::load(&ckpt, &vs, &mut opt)?.next_step;
        eprintln!("resumed from {} at step {start}", ckpt.display());
    }
    let model_config = std::fs::read_to_string(cfg.model.join("config.json"))?;
    let tokenizer_files: Vec<PathBuf> =
        ["tokenizer.json", "tokenizer_config.json"].iter().map(|f| tok_dir.join(f)).filter(|p| p.exists()).collect();
    run_dir.write_config(&cfg.to_toml())?;
    run_dir.write_machine(&crate::engine::device::MachineRecord::current())?;
    if start > 0 {
        // Steps after the checkpoint were done by the interrupted run and are redone now.
        run_dir.truncate_metrics(start)?;
    }
    let bar = progress_bar(opts, cfg.steps, start);
    if opts.progress && !eval_tasks.is_empty() && (cfg.eval_every > 0 || cfg.eval_before) {
        bar.suspend(|| eprintln!("held-out evaluation on {selection}"));
    }
    let mut summary = RunSummary { out_dir: cfg.out_dir.clone(), ..Default::default() };
    let evaluate = |step: u64, summary: &mut RunSummary| -> Result<()> {
        let point = eval_point(
            &policy,
            &tok,
            &envs,
            (&eval_tasks, selection),
            &step_cfg.agent,
            cfg.eval_sampled,
            step,
            cfg.seed,
        )
        .map_err(|e| explain_failure(e.into(), step, &run_dir))?;
        if opts.progress {
            // `suspend`, not `println`: the table must print when stderr is not a terminal too.
            bar.suspend(|| eprint!("{}", format_eval_point(&point, &step_cfg.agent)));
        }
        run_dir.write_eval(&point)?;
        summary.evals.push(point);
        Ok(())
    };
    if cfg.eval_before && start == 0 && !eval_tasks.is_empty() {
        evaluate(0, &mut summary)?;
    }
    for step in start..cfg.steps {
        let result = train_step(&policy, &reference, &mut opt, &tok, &envs, &tasks, &step_cfg, step)
            .map_err(|e| explain_failure(e.into(), step, &run_dir))?;
        if cfg.save_rollouts {
            let prompts = prompts_for_step(tasks.len(), cfg.prompts_per_step, cfg.seed, step);
            run_dir.write_rollouts(step, &result.records(&tok, &tasks, &prompts))?;
        }
        if !result.trees.is_empty() {
            run_dir.write_trees(step, &result.trees)?;
        }
        let m = result.metrics;
        run_dir.append_metrics(&m)?;
        let masked = if m.masked_rows > 0 { format!(" masked {}", m.masked_rows) } else { String::new() };
        bar.set_message(format!("reward {:.3} EM {:.3} kl {:.4}{masked}", m.reward_mean, m.metric_mean, m.kl));
        bar.inc(1);
        summary.metrics.push(m);
        let last = step + 1 == cfg.steps;
        if !eval_tasks.is_empty() && cfg.eval_every > 0 && ((step + 1) % cfg.eval_every == 0 || last) {
            evaluate(step + 1, &mut summary)?;
        }
        if (cfg.save_every > 0 && (step + 1) % cfg.save_every == 0) || last {
            crate::support::plots::write_training_plots(run_dir.path(), &run_dir.metrics()?)?;
            let state = TrainState { next_step: step + 1, seed: cfg.seed };
            checkpoint::save(&run_dir, &vs, &model_config, &tokenizer_files, &opt, &state)?;
        }
    }
    bar.finish_and_clear();
    Ok(summary)
}
