//! The training loop: sample prompts, roll out (tree or chain), score, compute advantages, update;
//! write one metrics line per step and atomic, resumable checkpoints.
//!
//! Every random choice of step `s` comes from a generator seeded with (seed, s), so a run resumed
//! from a checkpoint makes exactly the choices the uninterrupted run would have made.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::{Kind, nn};

use crate::algo::advantage::{Estimator, advantages};
use crate::algo::schedule::WarmupConstant;
use crate::algo::update::{UpdateConfig, UpdateStats, ppo_update};
use crate::generate::Engine;
use crate::model::{CausalLm, save_model};
use crate::optim::AdamW;
use crate::rollout::agent::{
    AgentConfig, EnvClient, PromptRollout, Rollout, RolloutCost, RolloutError, TrainingRow, TreeShape, training_rows,
};
use crate::tokenizer::Tokenizer;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Rollout(#[from] RolloutError),
    #[error("checkpoint {path}: {message}")]
    Checkpoint { path: String, message: String },
    #[error("metrics file: {0}")]
    Metrics(std::io::Error),
    #[error("no training tasks")]
    NoTasks,
}

/// What one training step does.
#[derive(Debug, Clone, PartialEq)]
pub struct StepConfig {
    pub prompts_per_step: usize,
    /// Prompts rolled out together, their generations batched (0: all prompts of a step).
    pub rollout_batch_prompts: usize,
    pub shape: TreeShape,
    pub estimator: Estimator,
    pub agent: AgentConfig,
    pub update: UpdateConfig,
    pub schedule: WarmupConstant,
    pub seed: u64,
}

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    pub step: u64,
    pub lr: f64,
    pub reward_mean: f64,
    /// Pure EM / F1 of the rows' final answers (from the env-server's reward).
    pub metric_mean: f64,
    pub rows: usize,
    pub loss: f64,
    pub kl: f64,
    pub entropy: f64,
    pub clip_fraction: f64,
    pub grad_norm: f64,
    pub generated_tokens: u64,
    pub prefill_tokens: u64,
    pub trained_tokens: u64,
    pub tool_calls: u64,
    pub forks: u64,
    /// Leaves whose answer metric, recomputed here from the decoded tokens with the `datasets`
    /// reward functions, differs from the env-server's (should stay 0).
    pub reward_check_mismatches: u64,
    pub rollout_seconds: f64,
    pub update_seconds: f64,
}

/// Mixes a seed and a step into the seed of that step's generator.
fn step_seed(seed: u64, step: u64) -> u64 {
    let mut z = seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^ (z >> 27)
}

/// The prompts of step `step`: an epoch-wise shuffle of the task indices (drop-last).
pub fn prompts_for_step(n_tasks: usize, per_step: usize, seed: u64, step: u64) -> Vec<usize> {
    let per_epoch = (n_tasks / per_step.max(1)).max(1) as u64;
    let epoch = step / per_epoch;
    let mut order: Vec<usize> = (0..n_tasks).collect();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(step_seed(seed, u64::MAX - epoch)));
    let start = ((step % per_epoch) as usize) * per_step;
    order.iter().cycle().skip(start).take(per_step.min(n_tasks)).copied().collect()
}

/// Run training step `step`: roll out, update `policy`, return the metrics line.
#[allow(clippy::too_many_arguments)]
pub fn train_step(
    policy: &CausalLm,
    reference: &CausalLm,
    opt: &mut AdamW,
    tok: &Tokenizer,
    envs: &[EnvClient],
    tasks: &[grove_protocol::TaskSpec],
    cfg: &StepConfig,
    step: u64,
) -> Result<StepMetrics, TrainError> {
    if tasks.is_empty() || envs.is_empty() {
        return Err(TrainError::NoTasks);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(step_seed(cfg.seed, step));
    let started = Instant::now();
    let mut rows = Vec::new();
    let mut cost = RolloutCost::default();
    let mut metric_sum = 0.0;
    let mut mismatches = 0u64;
    let prompts = prompts_for_step(tasks.len(), cfg.prompts_per_step, cfg.seed, step);
    // Per prompt of the step, its training rows (kept in prompt order whatever the batching).
    let mut per_prompt: Vec<Vec<TrainingRow>> = vec![Vec::new(); prompts.len()];
    {
        let mut engine = Engine::new(policy);
        // Prompts are sharded over the env-servers (a prompt's forks stay on its server), and
        // each server's prompts are rolled out in batches whose generations run together.
        for (e, env) in envs.iter().enumerate() {
            let mine: Vec<(usize, usize)> =
                prompts.iter().copied().enumerate().filter(|(p, _)| p % envs.len() == e).collect();
            let batch = if cfg.rollout_batch_prompts == 0 { mine.len() } else { cfg.rollout_batch_prompts };
            for chunk in mine.chunks(batch.max(1)) {
                let batch_tasks: Vec<_> = chunk.iter().map(|&(_, t)| tasks[t].clone()).collect();
                let mut r = Rollout { engine: &mut engine, tok, env, config: &cfg.agent, cost: RolloutCost::default() };
                let rollouts = r.run_many(&batch_tasks, cfg.shape, &mut rng)?;
                let c = r.cost;
                cost.generated_tokens += c.generated_tokens;
                cost.prefill_tokens += c.prefill_tokens;
                cost.tool_calls += c.tool_calls;
                cost.forks += c.forks;
                for (&(p, task), rollout) in chunk.iter().zip(rollouts) {
                    let k = if cfg.shape.n == 0 { 1 } else { cfg.shape.k };
                    per_prompt[p] = training_rows(&rollout, k, p, cfg.agent.max_response_tokens, &mut rng)?;
                    mismatches += check_rewards(tok, &tasks[task], &rollout, &mut metric_sum)?;
                    rollout.release(&mut engine);
                    env.close(rollout.episodes.clone())?;
                }
            }
        }
    }
    rows.extend(per_prompt.into_iter().flatten());
    let rollout_seconds = started.elapsed().as_secs_f64();
    let rewards: Vec<f64> = rows.iter().map(|r| r.reward).collect();
    let prompt_groups: Vec<usize> = rows.iter().map(|r| r.prompt_group).collect();
    let tree_groups: Vec<usize> = rows.iter().map(|r| r.tree_group).collect();
    let adv = advantages(&rewards, &prompt_groups, &tree_groups, cfg.estimator);
    let lr = cfg.schedule.lr_at(step);
    let t = Instant::now();
    let u: UpdateStats = ppo_update(policy, reference, opt, lr, &rows, &adv, &cfg.update);
    let leaves = rows.len().max(1) as f64;
    Ok(StepMetrics {
        step,
        lr,
        reward_mean: rewards.iter().sum::<f64>() / leaves,
        metric_mean: metric_sum / leaves,
        rows: rows.len(),
        loss: u.loss,
        kl: u.kl,
        entropy: u.entropy,
        clip_fraction: u.clip_fraction,
        grad_norm: u.grad_norm,
        generated_tokens: cost.generated_tokens,
        prefill_tokens: cost.prefill_tokens,
        trained_tokens: u.tokens,
        tool_calls: cost.tool_calls,
        forks: cost.forks,
        reward_check_mismatches: mismatches,
        rollout_seconds,
        update_seconds: t.elapsed().as_secs_f64(),
    })
}

/// Recompute each leaf's answer metric from its decoded tokens with the `datasets` reward
/// functions and count the leaves where it differs from the env-server's (adding the server's to
/// `metric_sum`).
fn check_rewards(
    tok: &Tokenizer,
    task: &grove_protocol::TaskSpec,
    rollout: &PromptRollout,
    metric_sum: &mut f64,
) -> Result<u64, TrainError> {
    let metric = match task.metric {
        Some(grove_protocol::Metric::F1) => grove_datasets::Metric::F1,
        Some(grove_protocol::Metric::Em) => grove_datasets::Metric::Em,
        None => grove_datasets::metric_for_source(&task.data_source),
    };
    let mut mismatches = 0;
    for tree in &rollout.trees {
        for leaf in tree.leaves() {
            let path = tree.path(leaf);
            let server = path.last().and_then(|s| s.metric).unwrap_or(0.0);
            *metric_sum += server;
            let tokens: Vec<u32> = path.iter().flat_map(|s| s.response.iter().chain(&s.observation)).copied().collect();
            let text = tok.decode(&tokens, true).map_err(RolloutError::from)?;
            let local = grove_datasets::metrics::compute_reward(
                grove_datasets::metrics::Scored::Response(&text),
                &task.golden_answers,
                metric,
                grove_datasets::metrics::RewardConfig::VALIDATION,
            );
            if (local.metric_value - server).abs() > 1e-9 {
                mismatches += 1;
            }
        }
    }
    Ok(mismatches)
}

/// Append one JSON line to `metrics.jsonl` in `dir`.
pub fn append_metrics(dir: &Path, m: &StepMetrics) -> Result<(), TrainError> {
    std::fs::create_dir_all(dir).map_err(TrainError::Metrics)?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("metrics.jsonl"))
        .map_err(TrainError::Metrics)?;
    let line = serde_json::to_string(m).map_err(|e| TrainError::Metrics(std::io::Error::other(e)))?;
    writeln!(f, "{line}").map_err(TrainError::Metrics)
}

/// Checkpoint state besides weights and optimiser moments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Training steps completed (the next step to run).
    pub next_step: u64,
    pub seed: u64,
}

/// Write `<dir>/checkpoint-<step>` atomically: an HF model folder (weights, config, tokenizer
/// files) plus `optimizer.safetensors` and `state.json`, written in a temporary folder and
/// renamed into place; `<dir>/latest` then names it.
pub fn save_checkpoint(
    dir: &Path,
    vs: &nn::VarStore,
    config_json: &str,
    tokenizer_files: &[PathBuf],
    opt: &AdamW,
    state: &TrainState,
) -> Result<PathBuf, TrainError> {
    let name = format!("checkpoint-{}", state.next_step);
    let final_dir = dir.join(&name);
    let tmp = dir.join(format!(".{name}.partial"));
    let err = |p: &Path, e: &dyn std::fmt::Display| TrainError::Checkpoint {
        path: p.display().to_string(),
        message: e.to_string(),
    };
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| err(&tmp, &e))?;
    }
    save_model(vs, config_json, &tmp, Kind::Float, tokenizer_files).map_err(|e| err(&tmp, &e))?;
    opt.save(&tmp.join("optimizer.safetensors")).map_err(|e| err(&tmp, &e))?;
    let state_json = serde_json::to_string_pretty(state).map_err(|e| err(&tmp, &e))?;
    std::fs::write(tmp.join("state.json"), state_json).map_err(|e| err(&tmp, &e))?;
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir).map_err(|e| err(&final_dir, &e))?;
    }
    std::fs::rename(&tmp, &final_dir).map_err(|e| err(&final_dir, &e))?;
    let latest_tmp = dir.join(".latest.tmp");
    std::fs::write(&latest_tmp, &name).map_err(|e| err(&latest_tmp, &e))?;
    std::fs::rename(&latest_tmp, dir.join("latest")).map_err(|e| err(dir, &e))?;
    Ok(final_dir)
}

/// The checkpoint `<dir>/latest` names, if any.
pub fn latest_checkpoint(dir: &Path) -> Option<PathBuf> {
    let name = std::fs::read_to_string(dir.join("latest")).ok()?;
    let path = dir.join(name.trim());
    path.join("state.json").exists().then_some(path)
}

/// Restore weights into `vs`, moments into `opt`, and return the state of a checkpoint.
pub fn load_checkpoint(path: &Path, vs: &nn::VarStore, opt: &mut AdamW) -> Result<TrainState, TrainError> {
    let err =
        |e: &dyn std::fmt::Display| TrainError::Checkpoint { path: path.display().to_string(), message: e.to_string() };
    let weights = path.join("model.safetensors");
    let tensors = tch::Tensor::read_safetensors(&weights).map_err(|e| err(&e))?;
    let mut vars = vs.variables();
    tch::no_grad(|| -> Result<(), TrainError> {
        for (name, t) in tensors {
            if let Some(v) = vars.get_mut(&name) {
                v.f_copy_(&t.to_kind(v.kind())).map_err(|e| err(&e))?;
            }
        }
        Ok(())
    })?;
    opt.load(&path.join("optimizer.safetensors")).map_err(|e| err(&e))?;
    let text = std::fs::read_to_string(path.join("state.json")).map_err(|e| err(&e))?;
    serde_json::from_str(&text).map_err(|e| err(&e))
}

/// One URL or a list of URLs in the config file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "OneOrMany", into = "Vec<String>")]
pub struct EnvUrls(pub Vec<String>);

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl From<OneOrMany> for EnvUrls {
    fn from(v: OneOrMany) -> Self {
        match v {
            OneOrMany::One(s) => EnvUrls(vec![s]),
            OneOrMany::Many(v) => EnvUrls(v),
        }
    }
}

impl From<EnvUrls> for Vec<String> {
    fn from(v: EnvUrls) -> Self {
        v.0
    }
}

/// `trainer train --config FILE`: every key has a default (the spec's QA settings where the
/// machine allows).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// HF folder of the initial policy (also the frozen reference).
    pub model: PathBuf,
    /// Folder with tokenizer.json / tokenizer_config.json; default: `model`.
    pub tokenizer: Option<PathBuf>,
    /// env-server WebSocket URL, or a list of them (prompts are sharded over the servers).
    pub env: EnvUrls,
    /// Training questions: Search-R1 `.parquet`, or QA `.jsonl` (FlashRAG / Grove).
    pub train_data: PathBuf,
    /// Questions evaluated every `eval_every` steps (optional).
    pub eval_data: Option<PathBuf>,
    /// Data source of JSONL rows that do not name one.
    pub data_source: String,
    pub out_dir: PathBuf,
    pub steps: u64,
    pub prompts_per_step: usize,
    /// Prompts rolled out together with their generations batched (0: all prompts of a step):
    /// bounds the engine's batch at this many x M x N sequences.
    pub rollout_batch_prompts: usize,
    /// `tree` or `chain`.
    pub method: String,
    pub m: usize,
    pub n: usize,
    pub l: usize,
    pub k: usize,
    /// Trajectories per prompt for `chain`.
    pub chain_n: usize,
    pub estimator: Estimator,
    pub lr: f64,
    pub warmup_ratio: f64,
    pub max_turns: u32,
    pub max_obs_tokens: usize,
    pub max_new_tokens: usize,
    pub max_response_tokens: usize,
    /// Rolling context cap (the reference's `max_prompt_length`).
    pub max_context: usize,
    pub temperature: f64,
    pub top_p: f64,
    pub micro_batch: usize,
    pub mini_batches: usize,
    pub kl_coef: f64,
    pub entropy_coef: f64,
    pub eval_every: u64,
    pub eval_max_questions: usize,
    /// Evaluate the initial policy before the first step too.
    pub eval_before: bool,
    /// Evaluate sampled (the rollout settings) as well as greedy.
    pub eval_sampled: bool,
    pub save_every: u64,
    pub seed: u64,
    pub device: String,
    /// A file holding the agent prompt template (`{question}` placeholder); default: the
    /// env-server's.
    pub prompt_template: Option<PathBuf>,
    /// Search results per query; default: the env-server's.
    pub topk: Option<u32>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            model: PathBuf::new(),
            tokenizer: None,
            env: EnvUrls(vec!["ws://127.0.0.1:8000/".into()]),
            train_data: PathBuf::new(),
            eval_data: None,
            data_source: "nq".into(),
            out_dir: PathBuf::from("runs/default"),
            steps: 180,
            prompts_per_step: 512,
            rollout_batch_prompts: 32,
            method: "tree".into(),
            m: 2,
            n: 2,
            l: 1,
            k: 3,
            chain_n: 4,
            estimator: Estimator::Tree,
            lr: 1e-6,
            warmup_ratio: 0.285,
            max_turns: 3,
            max_obs_tokens: 500,
            max_new_tokens: 500,
            max_response_tokens: 4096,
            max_context: 4096,
            temperature: 1.0,
            top_p: 0.95,
            micro_batch: 8,
            mini_batches: 8,
            kl_coef: 0.001,
            entropy_coef: 0.001,
            eval_every: 60,
            eval_max_questions: 512,
            eval_before: false,
            eval_sampled: true,
            save_every: 60,
            seed: 0,
            device: "auto".into(),
            prompt_template: None,
            topk: None,
        }
    }
}

impl TrainConfig {
    /// The prompt template file's text, if one is configured.
    pub fn prompt_template_text(&self) -> std::io::Result<Option<String>> {
        self.prompt_template.as_ref().map(std::fs::read_to_string).transpose()
    }

    pub fn step_config(&self) -> StepConfig {
        let shape = if self.method == "chain" {
            TreeShape::chain(self.chain_n)
        } else {
            TreeShape { m: self.m, n: self.n, l: self.l, k: self.k }
        };
        StepConfig {
            prompts_per_step: self.prompts_per_step,
            rollout_batch_prompts: self.rollout_batch_prompts,
            shape,
            estimator: self.estimator,
            agent: self.agent(),
            update: UpdateConfig {
                mini_batches: self.mini_batches,
                micro_batch: self.micro_batch,
                loss: crate::algo::loss::LossConfig {
                    kl_coef: self.kl_coef,
                    entropy_coef: self.entropy_coef,
                    ..Default::default()
                },
            },
            schedule: WarmupConstant::from_ratio(self.lr, self.warmup_ratio, self.steps),
            seed: self.seed,
        }
    }

    pub fn agent(&self) -> AgentConfig {
        AgentConfig {
            max_turns: self.max_turns,
            max_obs_tokens: self.max_obs_tokens,
            max_response_tokens: self.max_response_tokens,
            sampling: crate::generate::SamplingParams {
                temperature: self.temperature,
                top_p: self.top_p,
                top_k: 0,
                max_new_tokens: self.max_new_tokens,
                stop: vec!["</search>".into(), "</answer>".into()],
            },
            prompt_template: None,
            max_context: self.max_context,
            topk: self.topk,
        }
    }
}

/// Questions from a Search-R1 parquet or a QA JSONL file, as env tasks.
pub fn load_tasks(
    path: &Path,
    data_source: &str,
) -> Result<Vec<grove_protocol::TaskSpec>, grove_datasets::DatasetError> {
    load_tasks_where(path, data_source, None)
}

/// As [`load_tasks`], keeping only rows whose metadata has `flag` set to true (e.g.
/// `answer_in_passage` for the FanOutQA questions the mini-Wikipedia corpus answers).
pub fn load_tasks_where(
    path: &Path,
    data_source: &str,
    flag: Option<&str>,
) -> Result<Vec<grove_protocol::TaskSpec>, grove_datasets::DatasetError> {
    use grove_datasets::loaders::{load_qa_jsonl, load_searchr1_parquet};
    let examples = if path.extension().is_some_and(|e| e == "parquet") {
        load_searchr1_parquet(path, grove_datasets::OnBadRow::Fail)?.items
    } else {
        load_qa_jsonl(path, data_source, None, grove_datasets::OnBadRow::Fail)?.items
    };
    Ok(examples
        .into_iter()
        .filter(|e| flag.is_none_or(|f| e.metadata.get(f).and_then(serde_json::Value::as_bool) == Some(true)))
        .map(|e| {
            let metric = match e.metric() {
                grove_datasets::Metric::Em => grove_protocol::Metric::Em,
                grove_datasets::Metric::F1 => grove_protocol::Metric::F1,
            };
            grove_protocol::TaskSpec {
                question: e.question,
                golden_answers: e.golden_answers,
                data_source: e.data_source,
                task_id: Some(e.id),
                metric: Some(metric),
            }
        })
        .collect())
}
