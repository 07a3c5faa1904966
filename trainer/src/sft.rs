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

use crate::logprobs::score_sequences;
use crate::model::CausalLm;
use crate::optim::AdamW;
use crate::rollout::agent::TrainingRow;
use crate::tokenizer::{ChatMessage, Tokenizer, TokenizerError};

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
    Ok(TrainingRow { prompt, response, loss_mask, reward: 0.0, prompt_group: 0, tree_group: 0 })
}

/// Mean negative log-likelihood of the masked (action) tokens of `rows`.
fn masked_nll(model: &CausalLm, rows: &[&TrainingRow], with_grad: bool) -> Tensor {
    let seqs: Vec<Vec<u32>> = rows.iter().map(|r| [r.prompt.as_slice(), r.response.as_slice()].concat()).collect();
    let scored = score_sequences(model, &seqs, rows.len().max(1), with_grad);
    let mut sums = Vec::with_capacity(rows.len());
    let mut count = 0usize;
    for (s, r) in scored.iter().zip(rows) {
        let start = r.prompt.len() as i64 - 1;
        let lp = s.logprobs.narrow(0, start, r.response.len() as i64);
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
