//! Supervised fine-tuning on agent trajectories: the prompt (rendered with the chat template),
//! then each step's action (trained) and observation (masked out of the loss). Used to warm-start
//! small policies before RL.
//!
//! Trajectory JSONL, one per line: `{"prompt": "...", "steps": [{"action": "...",
//! "observation": "..."}, ...]}`; the same fields an env-server transcript has.

use std::io::BufRead;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::engine::logprobs::{ScoreOptions, Span, score_spans};
use crate::engine::model::CausalLm;
use crate::engine::optim::AdamW;
use crate::engine::tokenizer::{ChatMessage, Tokenizer, TokenizerError};
use crate::rl::rows::TrainingRow;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SftStep {
    pub action: String,
    #[serde(default)]
    pub observation: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trajectory {
    pub prompt: String,
    pub steps: Vec<SftStep>,
}

#[derive(Debug, thiserror::Error)]
pub enum SftError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Row { path: String, line: usize, message: String },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

/// Read trajectory JSONL; a bad line is an error naming it.
pub fn load_trajectories(path: &Path) -> Result<Vec<Trajectory>, SftError> {
    let io = |source| SftError::Io { path: path.display().to_string(), source };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        let t: Trajectory = serde_json::from_str(&line).map_err(|e| SftError::Row {
            path: path.display().to_string(),
            line: i + 1,
            message: e.to_string(),
        })?;
        out.push(t);
    }
    Ok(out)
}

/// Tokenise a trajectory: chat-templated prompt, then actions (mask 1) and observations (mask 0).
pub fn tokenize(tok: &Tokenizer, t: &Trajectory) -> Result<TrainingRow, SftError> {
    let prompt = tok.encode(&tok.apply_chat_template(&[ChatMessage::new("user", t.prompt.clone())], true)?)?;
    let mut response = Vec::new();
    let mut loss_mask = Vec::new();
    for step in &t.steps {
        let a = tok.encode(&step.action)?;
        loss_mask.extend(std::iter::repeat_n(1u8, a.len()));
        response.extend(a);
        if !step.observation.is_empty() {
            let o = tok.encode(&step.observation)?;
            loss_mask.extend(std::iter::repeat_n(0u8, o.len()));
            response.extend(o);
        }
    }
    Ok(TrainingRow {
        prompt,
        response,
        loss_mask,
        sampled_logprobs: Vec::new(),
        reward: 0.0,
        metric: 0.0,
        prompt_group: 0,
        tree_group: 0,
        leaf: 0,
        failure: None,
    })
}

/// Mean negative log-likelihood of the masked (action) tokens of `rows`.
fn masked_nll(model: &CausalLm, rows: &[&TrainingRow], with_grad: bool) -> Tensor {
    let spans: Vec<Span<'_>> = rows.iter().map(|r| Span::masked(&r.prompt, &r.response, &r.loss_mask)).collect();
    let scored =
        score_spans(model, &spans, ScoreOptions { micro_batch: rows.len().max(1), temperature: 1.0, with_grad });
    let mut sums = Vec::with_capacity(rows.len());
    let mut count = 0usize;
    for (s, r) in scored.iter().zip(rows) {
        let lp = &s.logprobs;
        let mask = Tensor::from_slice(&r.loss_mask.iter().map(|m| f32::from(*m)).collect::<Vec<_>>())
            .to_device(model.device());
        sums.push((lp * &mask).sum(Kind::Float));
        count += r.loss_mask.iter().filter(|m| **m == 1).count();
    }
    if sums.is_empty() {
        return Tensor::zeros([], (Kind::Float, model.device()));
    }
    -Tensor::stack(&sums, 0).sum(Kind::Float) / count.max(1) as f64
}

/// One SFT epoch over `rows`, shuffled with `seed`, in batches of `batch`; returns the loss of
/// each optimiser step, and tells `on_step` each one as it happens (for progress bars).
pub fn sft_epoch(
    model: &CausalLm,
    opt: &mut AdamW,
    rows: &[TrainingRow],
    (batch, lr, seed): (usize, f64, u64),
    on_step: &mut dyn FnMut(f64),
) -> Vec<f64> {
    use rand::SeedableRng;
    use rand::seq::SliceRandom;
    let mut usable: Vec<&TrainingRow> =
        rows.iter().filter(|r| !r.prompt.is_empty() && !r.response.is_empty()).collect();
    usable.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed));
    let mut losses = Vec::new();
    for chunk in usable.chunks(batch.max(1)) {
        opt.zero_grad();
        let loss = masked_nll(model, chunk, true);
        let value = loss.double_value(&[]);
        losses.push(value);
        on_step(value);
        loss.backward();
        opt.step(lr);
    }
    losses
}

/// How an SFT run goes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SftConfig {
    pub epochs: usize,
    pub lr: f64,
    /// Trajectories per optimiser step.
    pub batch: usize,
    /// Measure the action NLL over the data before and after (two passes without grad).
    pub measure_nll: bool,
}

/// What an SFT run did: the action NLL before and after (when measured), and each epoch's mean
/// step loss.
#[derive(Debug, Clone, PartialEq)]
pub struct SftReport {
    pub nll_before: Option<f64>,
    pub nll_after: Option<f64>,
    pub epoch_losses: Vec<f64>,
}

/// Progress of an SFT run, for the command line's bar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SftProgress {
    Step { epoch: usize, loss: f64 },
    EpochDone { epoch: usize, mean_loss: f64 },
}

/// SFT for `cfg.epochs` epochs (epoch e shuffled with seed e), reporting each optimiser step.
pub fn train(
    model: &CausalLm,
    opt: &mut AdamW,
    rows: &[TrainingRow],
    cfg: SftConfig,
    on_progress: &mut dyn FnMut(SftProgress),
) -> SftReport {
    let nll = |model| cfg.measure_nll.then(|| evaluate_nll(model, rows, cfg.batch));
    let nll_before = nll(model);
    let mut epoch_losses = Vec::with_capacity(cfg.epochs);
    for epoch in 0..cfg.epochs {
        let mut on_step = |loss: f64| on_progress(SftProgress::Step { epoch, loss });
        let losses = sft_epoch(model, opt, rows, (cfg.batch, cfg.lr, epoch as u64), &mut on_step);
        let mean_loss = losses.iter().sum::<f64>() / losses.len().max(1) as f64;
        on_progress(SftProgress::EpochDone { epoch, mean_loss });
        epoch_losses.push(mean_loss);
    }
    SftReport { nll_before, nll_after: nll(model), epoch_losses }
}

/// Optimiser steps of one epoch over `rows` in batches of `batch`.
pub fn steps_per_epoch(rows: &[TrainingRow], batch: usize) -> usize {
    rows.iter().filter(|r| !r.prompt.is_empty() && !r.response.is_empty()).count().div_ceil(batch.max(1))
}

/// Mean action-token NLL of `rows`, without grad, scored `batch` rows at a time.
pub fn evaluate_nll(model: &CausalLm, rows: &[TrainingRow], batch: usize) -> f64 {
    let all: Vec<&TrainingRow> = rows.iter().filter(|r| !r.response.is_empty()).collect();
    let (mut total, mut count) = (0.0, 0usize);
    for chunk in all.chunks(batch.max(1)) {
        let n = chunk.iter().map(|r| r.loss_mask.iter().filter(|m| **m == 1).count()).sum::<usize>();
        total += tch::no_grad(|| masked_nll(model, chunk, false).double_value(&[])) * n as f64;
        count += n;
    }
    total / count.max(1) as f64
}
