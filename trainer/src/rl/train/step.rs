//! One training step: sample prompts, roll out (tree or chain), score, compute advantages,
//! update; return the step's metrics.
//!
//! Every random choice of step `s` comes from a generator seeded with (seed, s), so a run resumed
//! from a checkpoint makes exactly the choices the uninterrupted run would have made.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Instant;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use crate::engine::generate::Engine;
use crate::engine::model::CausalLm;
use crate::engine::optim::AdamW;
use crate::engine::tokenizer::Tokenizer;
use crate::rl::algo::advantage::{Estimator, row_advantages};
use crate::rl::algo::schedule::WarmupConstant;
use crate::rl::algo::update::{UpdateConfig, UpdateStats, ppo_update};
use crate::rl::env::EnvClient;
use crate::rl::method::Method;
use crate::rl::rollout::agent::{AgentConfig, PromptRollout, RolloutCost, RolloutError};
use crate::rl::rollout::drive::{Driver, Visit, drive};
use crate::rl::rollout::leaves::training_rows;
use crate::rl::rows::TrainingRow;
use crate::rl::train::trees::{TreeRecording, capture, fill_advantages};

pub use grove_rundir::StepMetrics;

#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    Rollout(#[from] RolloutError),
    #[error("no training tasks")]
    NoTasks,
}

/// What one training step does (checked settings: see `TrainConfig::step_config`).
#[derive(Debug, Clone, PartialEq)]
pub struct StepConfig {
    pub prompts_per_step: usize,
    /// Prompts rolled out together, their generations batched (0: all prompts of a step).
    pub rollout_batch_prompts: usize,
    pub method: Method,
    pub estimator: Estimator,
    pub agent: AgentConfig,
    pub update: UpdateConfig,
    pub schedule: WarmupConstant,
    pub seed: u64,
    /// Which steps keep their rollout trees (`StepResult::trees`), and how many prompts.
    pub trees: TreeRecording,
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

/// The rollouts of one step, flattened into rows (prompt order), with their cost.
struct Rolled {
    rows: Vec<TrainingRow>,
    cost: RolloutCost,
    reward_check_mismatches: u64,
    /// The trees of the first `record` prompts (advantages not filled in yet).
    trees: Vec<grove_rundir::PromptTrees>,
}

/// Roll out the step's prompts: sharded over the env-servers (a prompt's forks stay on its
/// server), each server's prompts in batches whose generations run together; one `Close` per
/// batch.
#[allow(clippy::too_many_arguments)]
fn roll_out(
    policy: &CausalLm,
    tok: &Tokenizer,
    envs: &[EnvClient],
    tasks: &[grove_protocol::TaskSpec],
    prompts: &[usize],
    cfg: &StepConfig,
    step: u64,
    record: usize,
    rng: &mut ChaCha8Rng,
) -> Result<Rolled, StepError> {
    let shape = cfg.method.shape();
    let mut cost = RolloutCost::default();
    let mut mismatches = 0u64;
    let mut per_prompt: Vec<Vec<TrainingRow>> = vec![Vec::new(); prompts.len()];
    let mut recorded: Vec<Option<grove_rundir::PromptTrees>> = vec![None; prompts.len()];
    let mut engine = Engine::new(policy);
    // The rows, reward checks and recorded trees of each prompt, as the driver shows its rollout.
    struct Collect<'c> {
        mine: &'c [(usize, usize)],
        tasks: &'c [grove_protocol::TaskSpec],
        tok: &'c Tokenizer,
        cfg: &'c StepConfig,
        step: u64,
        record: usize,
        per_prompt: &'c mut [Vec<TrainingRow>],
        recorded: &'c mut [Option<grove_rundir::PromptTrees>],
        mismatches: u64,
    }
    impl Visit for Collect<'_> {
        fn prompt(&mut self, index: usize, rollout: &PromptRollout, rng: &mut ChaCha8Rng) -> Result<(), RolloutError> {
            let (p, task) = self.mine[index];
            let (cfg, k) = (self.cfg, self.cfg.method.shape().k);
            self.per_prompt[p] = training_rows(rollout, k, p, cfg.agent.max_response_tokens, rng)?;
            self.mismatches += reward_mismatches(self.tok, &self.tasks[task], rollout)?;
            if p < self.record {
                let rows = &self.per_prompt[p];
                let trees =
                    capture(self.tok, &self.tasks[task], rollout, rows, self.step, p, &cfg.method, cfg.estimator);
                self.recorded[p] = Some(trees);
            }
            Ok(())
        }
    }
    for (e, env) in envs.iter().enumerate() {
        let mine: Vec<(usize, usize)> =
            prompts.iter().copied().enumerate().filter(|(p, _)| p % envs.len() == e).collect();
        let batch_tasks: Vec<_> = mine.iter().map(|&(_, t)| tasks[t].clone()).collect();
        let mut collect = Collect {
            mine: &mine,
            tasks,
            tok,
            cfg,
            step,
            record,
            per_prompt: &mut per_prompt,
            recorded: &mut recorded,
            mismatches: 0,
        };
        let mut driver = Driver { engine: &mut engine, tok, env, config: &cfg.agent };
        cost.add(&drive(&mut driver, &batch_tasks, cfg.rollout_batch_prompts, shape, rng, &mut collect)?);
        mismatches += collect.mismatches;
    }
    Ok(Rolled {
        rows: per_prompt.into_iter().flatten().collect(),
        cost,
        reward_check_mismatches: mismatches,
        trees: recorded.into_iter().flatten().collect(),
    })
}

/// What a step did: its metrics line, and its training rows with the advantage each got.
#[derive(Debug)]
pub struct StepResult {
    pub metrics: StepMetrics,
    pub rows: Vec<TrainingRow>,
    pub advantages: Vec<f64>,
    /// The recorded prompts' rollout trees, with their leaves' advantages (empty on steps that
    /// record none).
    pub trees: Vec<grove_rundir::PromptTrees>,
}

impl StepResult {
    /// The rows as the run folder keeps them (responses decoded).
    pub fn records(
        &self,
        tok: &Tokenizer,
        tasks: &[grove_protocol::TaskSpec],
        prompts: &[usize],
    ) -> Vec<grove_rundir::RolloutRecord> {
        self.rows
            .iter()
            .zip(&self.advantages)
            .map(|(r, a)| grove_rundir::RolloutRecord {
                step: self.metrics.step,
                prompt: r.prompt_group,
                tree: r.tree_group,
                task_id: prompts.get(r.prompt_group).and_then(|&t| tasks.get(t)).and_then(|t| t.task_id.clone()),
                reward: r.reward,
                metric: r.metric,
                advantage: *a,
                generated_tokens: r.generated_tokens(),
                failure: r.failure.as_ref().map(|f| f.key()),
                response: tok.decode(&r.response, false).unwrap_or_default(),
            })
            .collect()
    }
}

/// Run training step `step`: roll out, update `policy`, return the metrics line and the rows.
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
) -> Result<StepResult, StepError> {
    if tasks.is_empty() || envs.is_empty() {
        return Err(StepError::NoTasks);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(step_seed(cfg.seed, step));
    let started = Instant::now();
    let prompts = prompts_for_step(tasks.len(), cfg.prompts_per_step, cfg.seed, step);
    let record = cfg.trees.prompts_at(step);
    let Rolled { rows, cost, reward_check_mismatches, mut trees } =
        roll_out(policy, tok, envs, tasks, &prompts, cfg, step, record, &mut rng)?;
    let rollout_seconds = started.elapsed().as_secs_f64();
    let adv = row_advantages(&rows, cfg.estimator);
    fill_advantages(&mut trees, &rows, &adv, cfg.estimator);
    let lr = cfg.schedule.lr_at(step);
    let t = Instant::now();
    let u: UpdateStats = ppo_update(policy, reference, opt, lr, &rows, &adv, &cfg.update);
    let trained: Vec<&TrainingRow> = rows.iter().filter(|r| r.trains()).collect();
    let n = trained.len().max(1) as f64;
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    for f in rows.iter().filter_map(|r| r.failure.as_ref()) {
        *failures.entry(f.key()).or_default() += 1;
    }
    let metrics = StepMetrics {
        step,
        lr,
        reward_mean: trained.iter().map(|r| r.reward).sum::<f64>() / n,
        metric_mean: trained.iter().map(|r| r.metric).sum::<f64>() / n,
        rows: rows.len(),
        loss: u.loss,
        policy_loss: u.policy,
        kl: u.kl,
        entropy: u.entropy,
        clip_fraction: u.clip_fraction,
        grad_norm: u.grad_norm,
        skipped_steps: u.skipped_steps,
        generated_tokens: cost.generated_tokens,
        prefill_tokens: cost.prefill_tokens,
        trained_tokens: u.tokens,
        tool_calls: cost.tool_calls,
        forks: cost.forks,
        zero_advantage_groups: zero_advantage_groups(&trained),
        distinct_leaves_per_tree: distinct_leaves_per_tree(&trained),
        masked_rows: rows.len() as u64 - trained.len() as u64,
        failures,
        tool_errors: cost.tool_errors,
        first_ratio_max_dev: u.first_ratio_max_dev,
        reward_check_mismatches,
        rollout_seconds,
        update_seconds: t.elapsed().as_secs_f64(),
    };
    Ok(StepResult { metrics, rows, advantages: adv, trees })
}

/// Fraction of prompt groups whose rows all carry the same reward (their advantages are 0).
fn zero_advantage_groups(rows: &[&TrainingRow]) -> f64 {
    let mut groups: HashMap<usize, Vec<f64>> = HashMap::new();
    for r in rows {
        groups.entry(r.prompt_group).or_default().push(r.reward);
    }
    let flat = groups.values().filter(|g| g.iter().all(|x| *x == g[0])).count();
    flat as f64 / groups.len().max(1) as f64
}

/// Mean number of distinct trajectories (by generated tokens) among each tree's kept leaves.
fn distinct_leaves_per_tree(rows: &[&TrainingRow]) -> f64 {
    let mut trees: HashMap<usize, HashSet<&[u32]>> = HashMap::new();
    for r in rows {
        trees.entry(r.tree_group).or_default().insert(&r.response);
    }
    trees.values().map(|s| s.len()).sum::<usize>() as f64 / trees.len().max(1) as f64
}

/// Recompute each finished leaf's reward from its decoded tokens with the `datasets` reward
/// functions (training table) and count the leaves where the answer, its EM / F1, the format
/// verdict or the training score differs from the env-server's. Leaves whose observations the
/// trainer cut (`max_obs_tokens`) hold other text than the server scored and are not compared.
pub fn reward_mismatches(
    tok: &Tokenizer,
    task: &grove_protocol::TaskSpec,
    rollout: &PromptRollout,
) -> Result<u64, RolloutError> {
    use grove_datasets::metrics::{RewardConfig, Scored, compute_reward};
    let metric = grove_datasets::task_metric(task);
    let mut mismatches = 0;
    for tree in &rollout.trees {
        for leaf in tree.leaves() {
            let path = tree.path(leaf);
            let Some(server) = path.last().and_then(|s| s.outcome.as_ref()) else { continue };
            if path.iter().any(|s| s.observation_truncated) {
                continue;
            }
            let tokens: Vec<u32> = path.iter().flat_map(|s| s.response.iter().chain(&s.observation)).copied().collect();
            let text = tok.decode(&tokens, true)?;
            let local = compute_reward(Scored::Response(&text), &task.golden_answers, metric, RewardConfig::TRAINING);
            let same = local.answer == server.answer
                && (local.metric_value - server.metric_value).abs() < 1e-9
                && local.format_valid == server.format_valid
                && (local.score - server.score).abs() < 1e-9;
            if !same {
                tracing::warn!(?local, ?server, "reward recomputed from the tokens differs from the env-server's");
                mismatches += 1;
            }
        }
    }
    Ok(mismatches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rl::rows::{Failure, Refused};

    fn row(prompt_group: usize, tree_group: usize, reward: f64, response: Vec<u32>) -> TrainingRow {
        TrainingRow {
            prompt: vec![1],
            loss_mask: vec![1; response.len()],
            sampled_logprobs: vec![0.0; response.len()],
            response,
            reward,
            metric: reward,
            prompt_group,
            tree_group,
            leaf: 0,
            failure: None,
        }
    }

    #[test]
    fn refused_rows_join_no_group_and_get_no_advantage() {
        let mut rows = vec![row(0, 0, 1.0, vec![5]), row(0, 1, 0.0, vec![6]), row(0, 2, 0.0, vec![7])];
        let info = grove_protocol::ErrorInfo::new(grove_protocol::ErrorCode::ActionTooLong, "long");
        rows[2].failure = Some(Failure::new(Refused::Step, &info));
        let adv = row_advantages(&rows, Estimator::Grpo);
        // Two trained rows (1, 0): mean 0.5, std 0.7071.
        assert!((adv[0] - 0.5 / (0.5f64.sqrt() + 1e-6)).abs() < 1e-9, "{adv:?}");
        assert!((adv[0] + adv[1]).abs() < 1e-12);
        assert_eq!(adv[2], 0.0);
    }

    #[test]
    fn group_diagnostics() {
        let rows = [row(0, 0, 1.0, vec![1]), row(0, 0, 1.0, vec![1]), row(1, 1, 0.0, vec![2]), row(1, 1, 1.0, vec![3])];
        let refs: Vec<&TrainingRow> = rows.iter().collect();
        assert_eq!(zero_advantage_groups(&refs), 0.5);
        assert_eq!(distinct_leaves_per_tree(&refs), 1.5);
    }
}
