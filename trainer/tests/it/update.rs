//! A PPO update moves probability towards positive-advantage trajectories and away from negative
//! ones, starts with zero KL to the reference, trains only on generated tokens, skips refused
//! rows, and computes the same gradient whatever the micro-batch split of a mini-batch.

use std::path::PathBuf;

use grove_trainer::engine::logprobs::{ScoreOptions, score_sequences};
use grove_trainer::engine::model::{CausalLm, load_model};
use grove_trainer::engine::optim::{AdamW, AdamWConfig};
use grove_trainer::rl::algo::loss::{Aggregation, LossConfig};
use grove_trainer::rl::algo::update::{LogitsPath, UpdateConfig, UpdateStats, ppo_update};
use grove_trainer::rl::rows::{Failure, Refused, TrainingRow};
use tch::{Device, Kind};

fn row(response: Vec<u32>, mask: Vec<u8>, reward: f64) -> TrainingRow {
    TrainingRow {
        prompt: vec![130, 192, 140],
        sampled_logprobs: Vec::new(),
        response,
        loss_mask: mask,
        reward,
        metric: reward,
        prompt_group: 0,
        tree_group: 0,
        leaf: 0,
        failure: None,
    }
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/qwen2-tiny")
}

/// Mean log-prob of the masked response tokens of a row.
fn masked_mean_logprob(lm: &CausalLm, r: &TrainingRow) -> f64 {
    let seq = [r.prompt.as_slice(), r.response.as_slice()].concat();
    let lp = &score_sequences(lm, &[seq], ScoreOptions::default())[0].logprobs;
    let lp: Vec<f32> = Vec::try_from(lp.narrow(0, r.prompt.len() as i64 - 1, r.response.len() as i64)).unwrap();
    let picked: Vec<f64> = lp.iter().zip(&r.loss_mask).filter(|(_, m)| **m == 1).map(|(l, _)| f64::from(*l)).collect();
    picked.iter().sum::<f64>() / picked.len() as f64
}

#[test]
fn ppo_update_follows_the_advantages() {
    let (vs, policy) = load_model(&golden_dir(), Device::Cpu, Kind::Float).unwrap();
    let (_ref_vs, reference) = load_model(&golden_dir(), Device::Cpu, Kind::Float).unwrap();
    let mut rows = vec![
        row(vec![10, 11, 12, 50, 51, 13], vec![1, 1, 1, 0, 0, 1], 1.0),
        row(vec![20, 21, 22, 60, 61, 23, 24], vec![1, 1, 1, 0, 0, 1, 1], 0.0),
        // Refused by the env-server: masked out, whatever advantage it is handed.
        row(vec![30, 31], vec![1, 1], 0.0),
    ];
    let info = grove_protocol::ErrorInfo::new(grove_protocol::ErrorCode::ActionTooLong, "too long");
    rows[2].failure = Some(Failure::new(Refused::Step, &info));
    let advantages = [1.0, -1.0, 5.0];
    let before: Vec<f64> = rows.iter().map(|r| masked_mean_logprob(&policy, r)).collect();
    let mut opt = AdamW::new(&vs, AdamWConfig { weight_decay: 0.0, ..Default::default() });
    let cfg = UpdateConfig { mini_batches: 1, micro_batch: 1, ..Default::default() };
    let first = ppo_update(&policy, &reference, &mut opt, 1e-2, &rows, &advantages, &cfg);
    assert!(first.kl.abs() < 1e-9, "the first update starts on the reference: KL {}", first.kl);
    assert_eq!(first.tokens, 4 + 5, "only generated tokens of rows that train are trained on");
    assert_eq!(first.rows, 2, "the refused row is left out");
    assert!(first.grad_norm > 0.0 && first.skipped_steps == 0);
    for _ in 0..4 {
        ppo_update(&policy, &reference, &mut opt, 1e-2, &rows, &advantages, &cfg);
    }
    let after: Vec<f64> = rows.iter().map(|r| masked_mean_logprob(&policy, r)).collect();
    assert!(after[0] > before[0] + 0.05, "positive advantage: {} -> {}", before[0], after[0]);
    assert!(after[1] < before[1] - 0.05, "negative advantage: {} -> {}", before[1], after[1]);
    let last = ppo_update(&policy, &reference, &mut opt, 1e-2, &rows, &advantages, &cfg);
    assert!(last.kl > 0.0, "the policy has moved away from the reference");
    // Two mini-batches take two optimiser steps.
    let steps = opt.step;
    ppo_update(&policy, &reference, &mut opt, 1e-2, &rows, &advantages, &UpdateConfig { mini_batches: 2, ..cfg });
    assert_eq!(opt.step, steps + 2);
}

/// The gradient one mini-batch leaves on the weights (an update at lr 0 changes nothing else).
fn gradient(rows: &[TrainingRow], advantages: &[f64], micro_batch: usize, aggregation: Aggregation) -> Vec<f32> {
    let cfg = UpdateConfig {
        mini_batches: 1,
        micro_batch,
        temperature: 0.8,
        loss: LossConfig { aggregation, ..Default::default() },
        ..Default::default()
    };
    gradient_with(rows, advantages, &cfg).0
}

fn gradient_with(rows: &[TrainingRow], advantages: &[f64], cfg: &UpdateConfig) -> (Vec<f32>, UpdateStats) {
    let (vs, policy) = load_model(&golden_dir(), Device::Cpu, Kind::Float).unwrap();
    let (_ref_vs, reference) = load_model(&golden_dir(), Device::Cpu, Kind::Float).unwrap();
    let mut opt = AdamW::new(&vs, AdamWConfig { max_grad_norm: None, ..Default::default() });
    let stats = ppo_update(&policy, &reference, &mut opt, 0.0, rows, advantages, cfg);
    let by_name: std::collections::BTreeMap<String, tch::Tensor> = vs.variables().into_iter().collect();
    let grads = by_name
        .values()
        .map(|t| t.grad())
        .filter(|g| g.defined())
        .flat_map(|g| Vec::<f32>::try_from(g.flatten(0, -1)).unwrap())
        .collect();
    (grads, stats)
}

fn max_relative_gap(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max) / scale
}

/// A mini-batch's loss is the token-mean over the whole mini-batch: splitting it into one,
/// two or four micro-batches gives the same gradient. The reference's per-micro-batch mean does
/// not (rows of unequal length weigh differently in each split), which is why it is an option.
#[test]
fn micro_batch_split_does_not_change_the_gradient() {
    let rows = vec![
        row(vec![10, 11, 12, 50, 51, 13], vec![1, 1, 1, 0, 0, 1], 1.0),
        row(vec![20, 21], vec![1, 1], 0.0),
        row(vec![30, 31, 32, 33, 34, 35, 36, 37], vec![1, 1, 1, 1, 0, 0, 1, 1], 0.5),
        row(vec![40], vec![1], 0.2),
    ];
    let advantages = [1.2, -0.7, 0.4, -0.9];
    let whole = gradient(&rows, &advantages, 4, Aggregation::TokenMean);
    assert!(whole.iter().any(|g| g.abs() > 0.0), "a gradient to compare");
    for micro in [1, 2] {
        let split = gradient(&rows, &advantages, micro, Aggregation::TokenMean);
        let gap = max_relative_gap(&whole, &split);
        assert!(gap < 1e-4, "micro-batch {micro}: relative gap {gap}");
    }
    let seq_whole = gradient(&rows, &advantages, 4, Aggregation::SeqMeanTokenMean);
    let seq_split = gradient(&rows, &advantages, 1, Aggregation::SeqMeanTokenMean);
    assert!(max_relative_gap(&seq_whole, &seq_split) < 1e-4);
    let reference_whole = gradient(&rows, &advantages, 4, Aggregation::MicroBatchTokenMean);
    let reference_split = gradient(&rows, &advantages, 1, Aggregation::MicroBatchTokenMean);
    assert!(max_relative_gap(&reference_whole, &reference_split) > 1e-2, "the reference's mean depends on the split");
    assert!(max_relative_gap(&whole, &reference_whole) < 1e-4, "one micro-batch: the two means agree");
}

/// The chunked logits path (a few positions' logits at a time, with or without recomputing each
/// decoder layer) gives the loss and gradient of the full path, which holds every position's f32
/// logits and log-softmax at once.
#[test]
fn chunked_logits_and_checkpointing_match_the_full_path() {
    let rows = vec![
        row(vec![10, 11, 12, 50, 51, 13], vec![1, 1, 1, 0, 0, 1], 1.0),
        row(vec![20, 21], vec![1, 1], 0.0),
        row(vec![30, 31, 32, 33, 34, 35, 36, 37], vec![1, 1, 1, 1, 0, 0, 1, 1], 0.5),
    ];
    let advantages = [1.2, -0.7, 0.4];
    let base = UpdateConfig { micro_batch: 2, temperature: 0.9, ..Default::default() };
    let (full, full_stats) = gradient_with(&rows, &advantages, &UpdateConfig { logits: LogitsPath::Full, ..base });
    assert!(full.iter().any(|g| g.abs() > 0.0));
    for (logits, checkpoint) in
        [(LogitsPath::Chunked(3), false), (LogitsPath::Chunked(1), true), (LogitsPath::Chunked(64), true)]
    {
        let cfg = UpdateConfig { logits, checkpoint, ..base };
        let (g, stats) = gradient_with(&rows, &advantages, &cfg);
        let gap = max_relative_gap(&full, &g);
        assert!(gap < 1e-4, "{logits:?} checkpoint {checkpoint}: relative gap {gap}");
        for (a, b) in
            [(full_stats.loss, stats.loss), (full_stats.entropy, stats.entropy), (full_stats.policy, stats.policy)]
        {
            assert!((a - b).abs() < 1e-5 * a.abs().max(1.0), "{logits:?}: {a} vs {b}");
        }
        assert_eq!(full_stats.tokens, stats.tokens);
    }
}

/// An update's host<->device transfers do not grow with its rows or its chunks: a fixed few per
/// micro-batch (the layout and its indices, the per-token constants) and one read of the loss
/// parts per mini-batch; no mask upload or `masked_select` per row, no index upload or loss read
/// per chunk of positions.
#[test]
fn an_update_makes_no_transfer_per_row_or_chunk() {
    use grove_trainer::engine::device::transfers;
    let made = |n: usize, chunk: usize| {
        let (vs, policy) = load_model(&golden_dir(), Device::Cpu, Kind::Float).unwrap();
        let (_ref_vs, reference) = load_model(&golden_dir(), Device::Cpu, Kind::Float).unwrap();
        let rows: Vec<TrainingRow> = (0..n)
            .map(|i| {
                let response: Vec<u32> = (0..12).map(|t| 10 + ((i * 7 + t) % 200) as u32).collect();
                row(response, vec![1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 1, 1], (i % 2) as f64)
            })
            .collect();
        let advantages: Vec<f64> = (0..n).map(|i| if i % 2 == 0 { 1.0 } else { -1.0 }).collect();
        let mut opt = AdamW::new(&vs, AdamWConfig::default());
        let cfg =
            UpdateConfig { mini_batches: 1, micro_batch: 8, logits: LogitsPath::Chunked(chunk), ..Default::default() };
        let before = transfers::count();
        ppo_update(&policy, &reference, &mut opt, 1e-3, &rows, &advantages, &cfg);
        transfers::count() - before
    };
    let base = made(2, 512);
    assert_eq!(made(8, 512), base, "8 rows in one micro-batch: as many transfers as 2");
    assert_eq!(made(8, 4), base, "chunks of 4 positions: as many transfers as one chunk");
    // Old and reference scoring, the layout, two picks, two tiles, one ratio read, one parts read.
    assert!(base <= 24, "{base} transfers for one micro-batch");
}
