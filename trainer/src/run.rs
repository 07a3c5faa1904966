//! The training loop behind `trainer train` and `trainer experiment`: load the policy and its
//! frozen reference, connect to the env-servers, run `train_step`s with checkpoints, metrics,
//! plots and periodic evaluation, and hand back what happened.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::device::place;
use crate::eval::{EvalReport, evaluate, format_report};
use crate::generate::SamplingParams;
use crate::model::{CausalLm, load_model};
use crate::optim::{AdamW, AdamWConfig};
use crate::rollout::agent::{AgentConfig, EnvClient, RolloutError};
use crate::tokenizer::Tokenizer;
use crate::train::{
    StepMetrics, TrainConfig, TrainError, TrainState, append_metrics, latest_checkpoint, load_checkpoint, load_tasks,
    save_checkpoint, train_step,
};

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

/// One evaluation of the policy on the held-out questions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalPoint {
    /// Training steps done before this evaluation (0: the initial policy).
    pub step: u64,
    pub greedy: EvalReport,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled: Option<EvalReport>,
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub metrics: Vec<StepMetrics>,
    pub evals: Vec<EvalPoint>,
    pub out_dir: PathBuf,
}

/// One client per env-server URL of `cfg`.
pub fn connect_envs(cfg: &TrainConfig) -> Result<Vec<EnvClient>> {
    Ok(cfg.env.0.iter().map(|u| EnvClient::connect(u, Default::default())).collect::<Result<_, _>>()?)
}

/// The evaluation questions of `cfg` (at most `eval_max_questions`; none without `eval_data`).
pub fn held_out_tasks(cfg: &TrainConfig) -> Result<Vec<grove_protocol::TaskSpec>> {
    let mut tasks = match &cfg.eval_data {
        Some(p) => load_tasks(p, &cfg.data_source)?,
        None => Vec::new(),
    };
    tasks.truncate(cfg.eval_max_questions);
    Ok(tasks)
}

/// The agent settings of `cfg`, with its prompt template file read.
pub fn agent_config(cfg: &TrainConfig) -> Result<AgentConfig> {
    Ok(AgentConfig { prompt_template: cfg.prompt_template_text()?, ..cfg.agent() })
}

/// Evaluate `model` on `tasks` greedily (and sampled with the run's settings when asked), as
/// the point of `step`.
pub fn eval_point(
    model: &CausalLm,
    tok: &Tokenizer,
    envs: &[EnvClient],
    tasks: &[grove_protocol::TaskSpec],
    agent: &AgentConfig,
    sampled: bool,
    (step, seed): (u64, u64),
) -> Result<EvalPoint> {
    let greedy_agent = AgentConfig {
        sampling: SamplingParams { temperature: 0.0, top_p: 1.0, ..agent.sampling.clone() },
        ..agent.clone()
    };
    let greedy = evaluate(model, tok, envs, tasks, &greedy_agent, 16, seed)?;
    let sampled = if sampled { Some(evaluate(model, tok, envs, tasks, agent, 16, seed)?) } else { None };
    Ok(EvalPoint { step, greedy, sampled })
}

/// Human-readable form of an evaluation point.
pub fn format_eval_point(p: &EvalPoint, agent: &AgentConfig) -> String {
    let mut s = format!("eval after step {} (greedy):\n{}", p.step, format_report(&p.greedy));
    if let Some(r) = &p.sampled {
        s.push_str(&format!(
            "(sampled, T={} top-p={}):\n{}",
            agent.sampling.temperature,
            agent.sampling.top_p,
            format_report(r)
        ));
    }
    s
}

/// Keep the lines of `metrics.jsonl` for steps before `next_step` (an interrupted run may have
/// written later ones that the resumed run redoes).
pub fn truncate_metrics(dir: &Path, next_step: u64) -> Result<()> {
    let path = dir.join("metrics.jsonl");
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(()) };
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v.get("step").and_then(serde_json::Value::as_u64))
                .is_some_and(|s| s < next_step)
        })
        .collect();
    let tmp = dir.join(".metrics.jsonl.tmp");
    std::fs::write(&tmp, kept.iter().map(|l| format!("{l}\n")).collect::<String>())?;
    std::fs::rename(&tmp, &path)?;
    Ok(())
}

/// A failed step or evaluation, said so that a user knows what was lost and how to go on: when
/// an env-server went away, its episodes of this step are lost, no update of the step was
/// applied, and `--resume` continues from the last checkpoint once the server is back.
fn explain_failure(e: anyhow::Error, step: u64, cfg: &TrainConfig) -> anyhow::Error {
    // `TrainError::Rollout` is transparent: the rollout error is not a link of the chain itself.
    let lost = e.chain().find_map(|c| {
        let rollout = c.downcast_ref::<RolloutError>().or_else(|| match c.downcast_ref::<TrainError>() {
            Some(TrainError::Rollout(r)) => Some(r),
            _ => None,
        });
        match rollout {
            Some(RolloutError::EnvLost { url, live, .. }) => Some((url.clone(), *live)),
            _ => None,
        }
    });
    let Some((url, live)) = lost else { return e.context(format!("step {step} failed")) };
    let resume = match latest_checkpoint(&cfg.out_dir) {
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

/// Train as `cfg` says. Writes `config.toml`, `metrics.jsonl`, `eval-<step>.json`, the SVG plots
/// and checkpoints into `cfg.out_dir`.
pub fn run(cfg: &TrainConfig, opts: &RunOptions) -> Result<RunSummary> {
    let placement = place(cfg.device.parse().map_err(anyhow::Error::msg)?)?;
    let (vs, policy) = load_model(&cfg.model, placement.device, placement.kind)
        .with_context(|| format!("load {}", cfg.model.display()))?;
    let (mut ref_vs, reference) = load_model(&cfg.model, placement.device, placement.kind)?;
    ref_vs.freeze();
    let tok_dir = cfg.tokenizer.clone().unwrap_or_else(|| cfg.model.clone());
    let tok = Tokenizer::from_dir(&tok_dir).with_context(|| format!("tokenizer of {}", tok_dir.display()))?;
    let envs = connect_envs(cfg)?;
    let tasks = load_tasks(&cfg.train_data, &cfg.data_source)?;
    let eval_tasks = held_out_tasks(cfg)?;
    let mut opt = AdamW::new(&vs, AdamWConfig::default());
    let mut start = 0;
    if opts.resume
        && let Some(ckpt) = latest_checkpoint(&cfg.out_dir)
    {
        start = load_checkpoint(&ckpt, &vs, &mut opt)?.next_step;
        eprintln!("resumed from {} at step {start}", ckpt.display());
    }
    let model_config = std::fs::read_to_string(cfg.model.join("config.json"))?;
    let tokenizer_files: Vec<PathBuf> =
        ["tokenizer.json", "tokenizer_config.json"].iter().map(|f| tok_dir.join(f)).filter(|p| p.exists()).collect();
    std::fs::create_dir_all(&cfg.out_dir)?;
    std::fs::write(cfg.out_dir.join("config.toml"), toml::to_string_pretty(cfg)?)?;
    let mut step_cfg = cfg.step_config();
    step_cfg.agent = agent_config(cfg)?;
    let bar = if opts.progress { indicatif::ProgressBar::new(cfg.steps) } else { indicatif::ProgressBar::hidden() };
    bar.set_position(start);
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{} {{bar:30}} {{pos}}/{{len}} {{msg}} ({{eta}})",
            if opts.label.is_empty() { "train" } else { &opts.label }
        ))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut summary = RunSummary { out_dir: cfg.out_dir.clone(), ..Default::default() };
    let record = |point: EvalPoint, summary: &mut RunSummary| -> Result<()> {
        if opts.progress {
            // `suspend`, not `println`: the table must print when stderr is not a terminal too.
            bar.suspend(|| eprint!("{}", format_eval_point(&point, &step_cfg.agent)));
        }
        let path = cfg.out_dir.join(format!("eval-{}.json", point.step));
        std::fs::write(&path, serde_json::to_string_pretty(&point)?)?;
        summary.evals.push(point);
        Ok(())
    };
    if cfg.eval_before && start == 0 && !eval_tasks.is_empty() {
        let p = eval_point(&policy, &tok, &envs, &eval_tasks, &step_cfg.agent, cfg.eval_sampled, (0, cfg.seed))?;
        record(p, &mut summary)?;
    }
    if start > 0 {
        // Steps after the checkpoint were done by the interrupted run and are redone now.
        truncate_metrics(&cfg.out_dir, start)?;
    }
    for step in start..cfg.steps {
        let m = train_step(&policy, &reference, &mut opt, &tok, &envs, &tasks, &step_cfg, step)
            .map_err(|e| explain_failure(e.into(), step, cfg))?;
        append_metrics(&cfg.out_dir, &m)?;
        bar.set_message(format!("reward {:.3} EM {:.3} kl {:.4}", m.reward_mean, m.metric_mean, m.kl));
        bar.inc(1);
        summary.metrics.push(m);
        let last = step + 1 == cfg.steps;
        if !eval_tasks.is_empty() && cfg.eval_every > 0 && ((step + 1) % cfg.eval_every == 0 || last) {
            let p =
                eval_point(&policy, &tok, &envs, &eval_tasks, &step_cfg.agent, cfg.eval_sampled, (step + 1, cfg.seed))
                    .map_err(|e| explain_failure(e, step + 1, cfg))?;
            record(p, &mut summary)?;
        }
        if (cfg.save_every > 0 && (step + 1) % cfg.save_every == 0) || last {
            crate::plots::write_training_plots(&cfg.out_dir, &crate::plots::read_metrics(&cfg.out_dir)?)?;
            let state = TrainState { next_step: step + 1, seed: cfg.seed };
            save_checkpoint(&cfg.out_dir, &vs, &model_config, &tokenizer_files, &opt, &state)?;
        }
    }
    bar.finish_and_clear();
    Ok(summary)
}
