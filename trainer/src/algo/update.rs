//! One policy update (spec §5): old log-probs from the policy that generated, reference log-probs
//! from the frozen initial model, then mini-batches of micro-batches with gradient accumulation,
//! one optimiser step per mini-batch.

use tch::{Device, Kind, Tensor};

use super::loss::{LossConfig, policy_loss};
use crate::logprobs::score_sequences;
use crate::model::CausalLm;
use crate::optim::AdamW;
use crate::rollout::agent::TrainingRow;

#[derive(Debug, Clone, PartialEq)]
pub struct UpdateConfig {
    /// Optimiser steps per training step (the batch is split into this many contiguous parts).
    pub mini_batches: usize,
    /// Rows per forward/backward (gradients accumulate over a mini-batch's micro-batches).
    pub micro_batch: usize,
    pub loss: LossConfig,
}

impl Default for UpdateConfig {
    fn default() -> Self {
        Self { mini_batches: 1, micro_batch: 8, loss: LossConfig::default() }
    }
}

/// Means over the update's micro-batches, for the metrics file.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct UpdateStats {
    pub loss: f64,
    pub policy: f64,
    pub kl: f64,
    pub entropy: f64,
    pub clip_fraction: f64,
    pub grad_norm: f64,
    /// Loss-masked (generated) tokens trained on.
    pub tokens: u64,
    /// Optimiser steps skipped for a non-finite gradient norm.
    pub skipped_steps: u32,
}

/// Log-probs of each row's response tokens, `[response_len]` each.
fn response_logprobs(
    model: &CausalLm,
    rows: &[&TrainingRow],
    micro_batch: usize,
    with_grad: bool,
) -> Vec<(Tensor, Tensor)> {
    let seqs: Vec<Vec<u32>> = rows.iter().map(|r| [r.prompt.as_slice(), r.response.as_slice()].concat()).collect();
    score_sequences(model, &seqs, micro_batch, with_grad)
        .into_iter()
        .zip(rows)
        .map(|(s, r)| {
            let start = r.prompt.len() as i64 - 1;
            let n = r.response.len() as i64;
            (s.logprobs.narrow(0, start, n), s.entropy.narrow(0, start, n))
        })
        .collect()
}

/// Right-pad per-row vectors into `[rows, longest]`.
fn pad(rows: &[Tensor], longest: i64) -> Tensor {
    let padded: Vec<Tensor> = rows
        .iter()
        .map(|t| {
            let n = t.size()[0];
            if n == longest {
                t.shallow_clone()
            } else {
                Tensor::cat(&[t, &Tensor::zeros([longest - n], (t.kind(), t.device()))], 0)
            }
        })
        .collect();
    Tensor::stack(&padded, 0)
}

/// Apply one PPO update to `policy` from `rows` with their `advantages`.
pub fn ppo_update(
    policy: &CausalLm,
    reference: &CausalLm,
    opt: &mut AdamW,
    lr: f64,
    rows: &[TrainingRow],
    advantages: &[f64],
    cfg: &UpdateConfig,
) -> UpdateStats {
    let device: Device = policy.device();
    let all: Vec<&TrainingRow> = rows.iter().filter(|r| !r.response.is_empty() && !r.prompt.is_empty()).collect();
    let advs: Vec<f64> = rows
        .iter()
        .zip(advantages)
        .filter(|(r, _)| !r.response.is_empty() && !r.prompt.is_empty())
        .map(|(_, a)| *a)
        .collect();
    let old: Vec<Tensor> =
        response_logprobs(policy, &all, cfg.micro_batch, false).into_iter().map(|(l, _)| l).collect();
    let reference: Vec<Tensor> =
        response_logprobs(reference, &all, cfg.micro_batch, false).into_iter().map(|(l, _)| l).collect();
    let mut stats = UpdateStats::default();
    let mut micro_count = 0u32;
    let n = all.len();
    let per_mini = n.div_ceil(cfg.mini_batches.max(1)).max(1);
    for mini in (0..n).step_by(per_mini) {
        let end = (mini + per_mini).min(n);
        let micros: Vec<(usize, usize)> =
            (mini..end).step_by(cfg.micro_batch.max(1)).map(|s| (s, (s + cfg.micro_batch.max(1)).min(end))).collect();
        opt.zero_grad();
        for &(s, e) in &micros {
            let chunk = &all[s..e];
            let scored = response_logprobs(policy, chunk, chunk.len(), true);
            let longest = chunk.iter().map(|r| r.response.len()).max().unwrap_or(1) as i64;
            let logp = pad(&scored.iter().map(|(l, _)| l.shallow_clone()).collect::<Vec<_>>(), longest);
            let ent = pad(&scored.iter().map(|(_, h)| h.shallow_clone()).collect::<Vec<_>>(), longest);
            let old_lp = pad(&old[s..e], longest);
            let ref_lp = pad(&reference[s..e], longest);
            let masks: Vec<Tensor> = chunk
                .iter()
                .map(|r| {
                    Tensor::from_slice(&r.loss_mask.iter().map(|m| f32::from(*m)).collect::<Vec<_>>()).to_device(device)
                })
                .collect();
            let mask = pad(&masks, longest);
            let adv = Tensor::from_slice(&advs[s..e]).to_kind(Kind::Float).to_device(device);
            let parts = policy_loss(&logp, &old_lp, &ref_lp, &ent, &adv, &mask, &cfg.loss);
            (parts.loss / micros.len() as f64).backward();
            stats.loss += parts.policy - cfg.loss.entropy_coef * parts.entropy + cfg.loss.kl_coef * parts.kl;
            stats.policy += parts.policy;
            stats.kl += parts.kl;
            stats.entropy += parts.entropy;
            stats.clip_fraction += parts.clip_fraction;
            stats.tokens += chunk.iter().map(|r| r.loss_mask.iter().filter(|m| **m == 1).count() as u64).sum::<u64>();
            micro_count += 1;
        }
        let step = opt.step(lr);
        stats.grad_norm = stats.grad_norm.max(step.grad_norm);
        if !step.applied {
            stats.skipped_steps += 1;
        }
    }
    if micro_count > 0 {
        let m = f64::from(micro_count);
        stats.loss /= m;
        stats.policy /= m;
        stats.kl /= m;
        stats.entropy /= m;
        stats.clip_fraction /= m;
    }
    stats
}
