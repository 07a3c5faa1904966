//! One policy update (spec §5): old log-probs from the policy that generated, reference log-probs
//! from the frozen initial model, then mini-batches of micro-batches with gradient accumulation,
//! one optimiser step per mini-batch. Every log-prob and entropy is of the sampling distribution
//! (logits / temperature). Rows that do not train (refused trajectories, empty sides) are left
//! out before anything is computed.

use tch::{Device, Kind, Tensor};

use super::loss::{LossConfig, Normaliser, policy_loss};
use crate::logprobs::{ScoreOptions, Span, score_spans};
use crate::model::CausalLm;
use crate::optim::AdamW;
use crate::rows::TrainingRow;

#[derive(Debug, Clone, PartialEq)]
pub struct UpdateConfig {
    /// Optimiser steps per training step (the batch is split into this many contiguous parts).
    pub mini_batches: usize,
    /// Rows per forward/backward (gradients accumulate over a mini-batch's micro-batches).
    pub micro_batch: usize,
    /// The rollout's sampling temperature: log-probs are those of logits / temperature.
    pub temperature: f64,
    pub loss: LossConfig,
}

impl Default for UpdateConfig {
    fn default() -> Self {
        Self { mini_batches: 1, micro_batch: 8, temperature: 1.0, loss: LossConfig::default() }
    }
}

/// What an update did: the loss parts are means over its mini-batches.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct UpdateStats {
    pub loss: f64,
    pub policy: f64,
    pub kl: f64,
    pub entropy: f64,
    pub clip_fraction: f64,
    /// The largest gradient norm of the update's optimiser steps.
    pub grad_norm: f64,
    /// Loss-masked (generated) tokens trained on.
    pub tokens: u64,
    /// Rows trained on.
    pub rows: usize,
    /// Optimiser steps skipped for a non-finite gradient norm.
    pub skipped_steps: u32,
    /// Largest `|exp(old - sampled) - 1|` over trained tokens whose sampling log-prob is known:
    /// how far the update's starting policy is from the distribution the rollout sampled.
    pub first_ratio_max_dev: f64,
}

fn spans<'a>(rows: &[&'a TrainingRow]) -> Vec<Span<'a>> {
    rows.iter().map(|r| Span::masked(&r.prompt, &r.response, &r.loss_mask)).collect()
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

fn mask_tensor(row: &TrainingRow, device: Device) -> Tensor {
    Tensor::from_slice(&row.loss_mask.iter().map(|m| f32::from(*m)).collect::<Vec<_>>()).to_device(device)
}

/// `max |exp(old - sampled) - 1|` over the generated tokens that carry a sampling log-prob.
fn ratio_deviation(rows: &[&TrainingRow], old: &[Tensor]) -> f64 {
    let mut worst = 0.0f64;
    for (row, old) in rows.iter().zip(old) {
        if row.sampled_logprobs.len() != row.response.len() {
            continue;
        }
        let old: Vec<f32> = Vec::try_from(old.to_device(Device::Cpu).to_kind(Kind::Float)).unwrap_or_default();
        for ((o, s), m) in old.iter().zip(&row.sampled_logprobs).zip(&row.loss_mask) {
            if *m == 1 {
                worst = worst.max((f64::from(*o) - f64::from(*s)).exp_m1().abs());
            }
        }
    }
    worst
}

/// Apply one PPO update to `policy` from `rows` with their `advantages` (one per row; rows that
/// do not train are skipped, their advantages ignored).
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
    let (all, advs): (Vec<&TrainingRow>, Vec<f64>) =
        rows.iter().zip(advantages).filter(|(r, _)| r.trains()).map(|(r, a)| (r, *a)).unzip();
    let score = |with_grad| ScoreOptions { micro_batch: cfg.micro_batch, temperature: cfg.temperature, with_grad };
    let old: Vec<Tensor> = score_spans(policy, &spans(&all), score(false)).into_iter().map(|s| s.logprobs).collect();
    let reference: Vec<Tensor> =
        score_spans(reference, &spans(&all), score(false)).into_iter().map(|s| s.logprobs).collect();
    let mut stats = UpdateStats { first_ratio_max_dev: ratio_deviation(&all, &old), ..Default::default() };
    let n = all.len();
    let per_mini = n.div_ceil(cfg.mini_batches.max(1)).max(1);
    let micro = cfg.micro_batch.max(1);
    let mut minis = 0u32;
    for mini in (0..n).step_by(per_mini) {
        let end = (mini + per_mini).min(n);
        let micros: Vec<(usize, usize)> = (mini..end).step_by(micro).map(|s| (s, (s + micro).min(end))).collect();
        let norm = Normaliser {
            tokens: all[mini..end].iter().map(|r| r.generated_tokens() as f64).sum(),
            sequences: (end - mini) as f64,
            micro_batches: micros.len() as f64,
        };
        opt.zero_grad();
        for &(s, e) in &micros {
            let chunk = &all[s..e];
            let scored = score_spans(policy, &spans(chunk), ScoreOptions { micro_batch: chunk.len(), ..score(true) });
            let longest = chunk.iter().map(|r| r.response.len()).max().unwrap_or(1) as i64;
            let logp = pad(&scored.iter().map(|s| s.logprobs.shallow_clone()).collect::<Vec<_>>(), longest);
            let ent = pad(&scored.iter().map(|s| s.entropy.shallow_clone()).collect::<Vec<_>>(), longest);
            let old_lp = pad(&old[s..e], longest);
            let ref_lp = pad(&reference[s..e], longest);
            let mask = pad(&chunk.iter().map(|r| mask_tensor(r, device)).collect::<Vec<_>>(), longest);
            let adv = Tensor::from_slice(&advs[s..e]).to_kind(Kind::Float).to_device(device);
            let parts = policy_loss(&logp, &old_lp, &ref_lp, &ent, &adv, &mask, &cfg.loss, &norm);
            parts.loss.backward();
            stats.loss += parts.policy - cfg.loss.entropy_coef * parts.entropy + cfg.loss.kl_coef * parts.kl;
            stats.policy += parts.policy;
            stats.kl += parts.kl;
            stats.entropy += parts.entropy;
            stats.clip_fraction += parts.clip_fraction;
            stats.tokens += chunk.iter().map(|r| r.generated_tokens() as u64).sum::<u64>();
        }
        let step = opt.step(lr);
        stats.grad_norm = stats.grad_norm.max(step.grad_norm);
        if !step.applied {
            stats.skipped_steps += 1;
        }
        minis += 1;
    }
    stats.rows = n;
    if minis > 0 {
        let m = f64::from(minis);
        stats.loss /= m;
        stats.policy /= m;
        stats.kl /= m;
        stats.entropy /= m;
        stats.clip_fraction /= m;
    }
    stats
}
