//! One policy update (spec §5): old log-probs from the policy that generated, reference log-probs
//! from the frozen initial model, then mini-batches of micro-batches with gradient accumulation,
//! one optimiser step per mini-batch. Every log-prob and entropy is of the sampling distribution
//! (logits / temperature), at the generated tokens only. Rows that do not train (refused
//! trajectories, empty sides) are left out before anything is computed.
//!
//! The loss is a weighted sum of per-token terms (`loss::token_weights`), so each micro-batch's
//! backward runs chunk by chunk of positions (`logprobs::backward_spans`): no `[batch, t,
//! vocab]` tensor exists, and with `checkpoint` the decoder keeps only each layer's input.

use tch::{Device, Kind, Tensor};

use super::loss::{LossConfig, PartValues, policy_loss, token_weights};
use crate::engine::device::transfers;
use crate::engine::logprobs::{ScoreOptions, Span, TrainPass, backward_spans, score_spans, score_spans_full};
use crate::engine::model::CausalLm;
use crate::engine::optim::AdamW;
use crate::rl::rows::TrainingRow;

/// How the policy's log-probs reach the loss during the update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsPath {
    /// The logits of at most this many positions at a time (the default, 512).
    Chunked(usize),
    /// Every position's logits and log-softmax in f32 at once (the path before chunking, kept as
    /// the benchmark's baseline).
    Full,
}

#[derive(Debug, Clone, PartialEq)]
pub struct UpdateConfig {
    /// Optimiser steps per training step (the batch is split into this many contiguous parts).
    pub mini_batches: usize,
    /// Rows per forward/backward (gradients accumulate over a mini-batch's micro-batches).
    pub micro_batch: usize,
    /// The rollout's sampling temperature: log-probs are those of logits / temperature.
    pub temperature: f64,
    pub logits: LogitsPath,
    /// Recompute each decoder layer during backward instead of keeping its activations.
    pub checkpoint: bool,
    pub loss: LossConfig,
}

impl Default for UpdateConfig {
    fn default() -> Self {
        Self {
            mini_batches: 1,
            micro_batch: 8,
            temperature: 1.0,
            logits: LogitsPath::Chunked(512),
            checkpoint: false,
            loss: LossConfig::default(),
        }
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

/// The generated-token values of `rows` from per-row `[response_len]` tensors, in flat order:
/// the rows concatenated on the device, then their loss-masked positions picked with one index
/// upload (no mask per row, no data-dependent `masked_select`).
fn flat(rows: &[&TrainingRow], per_row: &[Tensor], device: Device) -> Tensor {
    let mut picked = Vec::new();
    let mut offset = 0i64;
    for (r, t) in rows.iter().zip(per_row) {
        picked.extend(r.loss_mask.iter().enumerate().filter(|(_, m)| **m == 1).map(|(i, _)| offset + i as i64));
        offset += t.size()[0];
    }
    let idx = transfers::to_device(&Tensor::from_slice(&picked), device);
    Tensor::cat(per_row, 0).index_select(0, &idx)
}

/// Per-token constants of a row, tiled over its generated tokens, in flat order (one upload).
fn tiled(rows: &[&TrainingRow], value: &dyn Fn(usize) -> f64, device: Device) -> Tensor {
    let v: Vec<f32> =
        rows.iter().enumerate().flat_map(|(i, r)| std::iter::repeat_n(value(i) as f32, r.generated_tokens())).collect();
    transfers::to_device(&Tensor::from_slice(&v), device)
}

/// `max |exp(old - sampled) - 1|` over the generated tokens that carry a sampling log-prob (the
/// rows' old log-probs read in one transfer).
fn ratio_deviation(rows: &[&TrainingRow], old: &[Tensor]) -> f64 {
    let with: Vec<usize> =
        (0..rows.len()).filter(|&i| rows[i].sampled_logprobs.len() == rows[i].response.len()).collect();
    if with.is_empty() {
        return 0.0;
    }
    let parts: Vec<Tensor> = with.iter().map(|&i| old[i].to_kind(Kind::Float)).collect();
    let all: Vec<f32> = Vec::try_from(transfers::to_host(&Tensor::cat(&parts, 0))).unwrap_or_default();
    let mut worst = 0.0f64;
    let mut at = 0;
    for &i in &with {
        let (row, n) = (rows[i], old[i].size()[0] as usize);
        let old = all.get(at..at + n).unwrap_or_default();
        at += n;
        for ((o, s), m) in old.iter().zip(&row.sampled_logprobs).zip(&row.loss_mask) {
            if *m == 1 {
                worst = worst.max((f64::from(*o) - f64::from(*s)).exp_m1().abs());
            }
        }
    }
    worst
}

/// Sums of one mini-batch's loss parts, on the device (`[4]` f64: policy, KL, entropy, clipped
/// tokens), read once when the mini-batch is done.
#[derive(Debug)]
struct Sums {
    parts: Tensor,
}

impl Sums {
    fn new(device: Device) -> Self {
        Sums { parts: Tensor::zeros([4], (Kind::Double, device)) }
    }
}

/// Forward and backward of one micro-batch: its share (`weights`) of the mini-batch's loss.
#[allow(clippy::too_many_arguments)]
fn micro_backward(
    policy: &CausalLm,
    chunk: &[&TrainingRow],
    (old, reference, adv, weights): (&Tensor, &Tensor, &Tensor, &Tensor),
    cfg: &UpdateConfig,
    sums: &mut Sums,
) {
    let device = policy.device();
    let mut add = |parts: &super::loss::LossParts| {
        sums.parts += &parts.parts;
    };
    match cfg.logits {
        LogitsPath::Chunked(positions) => {
            let pass = TrainPass { temperature: cfg.temperature, chunk: positions, checkpoint: cfg.checkpoint };
            backward_spans(policy, &spans(chunk), pass, &mut |lp, ent, range| {
                let (s, n) = (range.start as i64, range.len() as i64);
                let cut = |t: &Tensor| t.narrow(0, s, n);
                let parts = policy_loss(lp, &cut(old), &cut(reference), ent, &cut(adv), &cut(weights), &cfg.loss);
                add(&parts);
                parts.loss
            });
        }
        LogitsPath::Full => {
            let scored = score_spans_full(policy, &spans(chunk), cfg.temperature);
            let lp = flat(chunk, &scored.iter().map(|s| s.logprobs.shallow_clone()).collect::<Vec<_>>(), device);
            let ent = flat(chunk, &scored.iter().map(|s| s.entropy.shallow_clone()).collect::<Vec<_>>(), device);
            let parts = policy_loss(&lp, old, reference, &ent, adv, weights, &cfg.loss);
            add(&parts);
            parts.loss.backward();
        }
    }
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
    let score = ScoreOptions { micro_batch: cfg.micro_batch, temperature: cfg.temperature, with_grad: false };
    let old: Vec<Tensor> = score_spans(policy, &spans(&all), score).into_iter().map(|s| s.logprobs).collect();
    let reference: Vec<Tensor> = score_spans(reference, &spans(&all), score).into_iter().map(|s| s.logprobs).collect();
    let mut stats = UpdateStats { first_ratio_max_dev: ratio_deviation(&all, &old), ..Default::default() };
    let n = all.len();
    let per_mini = n.div_ceil(cfg.mini_batches.max(1)).max(1);
    let micro = cfg.micro_batch.max(1);
    let mut minis = 0u32;
    for mini in (0..n).step_by(per_mini) {
        let end = (mini + per_mini).min(n);
        let rows = &all[mini..end];
        let micros: Vec<(usize, usize)> =
            (0..rows.len()).step_by(micro).map(|s| (s, (s + micro).min(rows.len()))).collect();
        let tokens: Vec<usize> = rows.iter().map(|r| r.generated_tokens()).collect();
        let weights = token_weights(&tokens, &micros, cfg.loss.aggregation);
        let mut sums = Sums::new(device);
        opt.zero_grad();
        for &(s, e) in &micros {
            let chunk = &rows[s..e];
            let (o, r) =
                (flat(chunk, &old[mini + s..mini + e], device), flat(chunk, &reference[mini + s..mini + e], device));
            let adv = tiled(chunk, &|i| advs[mini + s + i], device);
            let w = tiled(chunk, &|i| weights[s + i], device);
            micro_backward(policy, chunk, (&o, &r, &adv, &w), cfg, &mut sums);
            opt.accumulate();
            stats.tokens += tokens[s..e].iter().sum::<usize>() as u64;
        }
        let step = opt.step(lr);
        stats.grad_norm = stats.grad_norm.max(step.grad_norm);
        if !step.applied {
            stats.skipped_steps += 1;
        }
        let sums = PartValues::of(&sums.parts);
        stats.policy += sums.policy;
        stats.kl += sums.kl;
        stats.entropy += sums.entropy;
        stats.loss += sums.policy - cfg.loss.entropy_coef * sums.entropy + cfg.loss.kl_coef * sums.kl;
        stats.clip_fraction += sums.clipped_tokens / tokens.iter().sum::<usize>().max(1) as f64;
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
