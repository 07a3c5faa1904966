//! A PPO update moves probability towards positive-advantage trajectories and away from negative
//! ones, starts with zero KL to the reference, and trains only on generated tokens.

use std::path::PathBuf;

use grove_trainer::algo::update::{UpdateConfig, ppo_update};
use grove_trainer::logprobs::score_sequences;
use grove_trainer::model::load_model;
use grove_trainer::optim::{AdamW, AdamWConfig};
use grove_trainer::rollout::agent::TrainingRow;
use tch::{Device, Kind};

fn row(response: Vec<u32>, mask: Vec<u8>, reward: f64) -> TrainingRow {
    TrainingRow { prompt: vec![130, 192, 140], response, loss_mask: mask, reward, prompt_group: 0, tree_group: 0 }
}

/// Mean log-prob of the masked response tokens of a row.
fn masked_mean_logprob(lm: &grove_trainer::model::CausalLm, r: &TrainingRow) -> f64 {
    let seq = [r.prompt.as_slice(), r.response.as_slice()].concat();
    let lp = &score_sequences(lm, &[seq], 1, false)[0].logprobs;
    let lp: Vec<f32> = Vec::try_from(lp.narrow(0, r.prompt.len() as i64 - 1, r.response.len() as i64)).unwrap();
    let picked: Vec<f64> = lp.iter().zip(&r.loss_mask).filter(|(_, m)| **m == 1).map(|(l, _)| f64::from(*l)).collect();
    picked.iter().sum::<f64>() / picked.len() as f64
}

#[test]
fn ppo_update_follows_the_advantages() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/qwen2-tiny");
    let (vs, policy) = load_model(&dir, Device::Cpu, Kind::Float).unwrap();
    let (_ref_vs, reference) = load_model(&dir, Device::Cpu, Kind::Float).unwrap();
    let rows = vec![
        row(vec![10, 11, 12, 50, 51, 13], vec![1, 1, 1, 0, 0, 1], 1.0),
        row(vec![20, 21, 22, 60, 61, 23, 24], vec![1, 1, 1, 0, 0, 1, 1], 0.0),
    ];
    let advantages = [1.0, -1.0];
    let before: Vec<f64> = rows.iter().map(|r| masked_mean_logprob(&policy, r)).collect();
    let mut opt = AdamW::new(&vs, AdamWConfig { weight_decay: 0.0, ..Default::default() });
    let cfg = UpdateConfig { mini_batches: 1, micro_batch: 1, ..Default::default() };
    let first = ppo_update(&policy, &reference, &mut opt, 1e-2, &rows, &advantages, &cfg);
    assert!(first.kl.abs() < 1e-9, "the first update starts on the reference: KL {}", first.kl);
    assert_eq!(first.tokens, 4 + 5, "only generated tokens are trained on");
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
