//! Per-token log-probabilities and entropies of responses under the model, in micro-batches,
//! with or without autograd: what the policy-gradient loss, the reference model's KL term and
//! SFT need.
//!
//! The distribution scored is the one the rollout sampled from: the logits divided by the
//! sampling temperature (spec §5.1; the reference samples at T = 1, where the two agree). So
//! the first PPO ratio of a rollout token is 1 up to rounding at any temperature. Only response
//! positions are projected to the vocabulary.

use tch::{Device, Kind, Tensor};

use crate::model::{CausalLm, token_logprobs_and_entropy};

/// A sequence to score: a prompt (context only) and a response (scored).
#[derive(Debug, Clone, Copy)]
pub struct Span<'a> {
    pub prompt: &'a [u32],
    pub response: &'a [u32],
}

/// For each response token t: `log p(t | everything before it)` and the entropy of that
/// predictive distribution (`[response_len]` each, f32).
#[derive(Debug)]
pub struct Scored {
    pub logprobs: Tensor,
    pub entropy: Tensor,
}

/// How to score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreOptions {
    /// Sequences per forward pass.
    pub micro_batch: usize,
    /// The sampling temperature the logits are divided by (1 = the model's own distribution).
    pub temperature: f64,
    /// Record the graph for backward.
    pub with_grad: bool,
}

impl Default for ScoreOptions {
    fn default() -> Self {
        Self { micro_batch: 8, temperature: 1.0, with_grad: false }
    }
}

/// Score `spans` in micro-batches (right-padded inside a batch). A span with an empty prompt
/// scores its response from the second token on (the first has no context): its first value is
/// 0 with entropy 0.
pub fn score_spans(model: &CausalLm, spans: &[Span<'_>], opts: ScoreOptions) -> Vec<Scored> {
    let mut out = Vec::with_capacity(spans.len());
    for chunk in spans.chunks(opts.micro_batch.max(1)) {
        let run = || score_batch(model, chunk, opts.temperature);
        if opts.with_grad {
            out.extend(run());
        } else {
            out.extend(tch::no_grad(run));
        }
    }
    out
}

/// Score whole sequences: log-probs of tokens 1..n given their prefixes (`n - 1` values each).
pub fn score_sequences(model: &CausalLm, seqs: &[Vec<u32>], opts: ScoreOptions) -> Vec<Scored> {
    let spans: Vec<Span<'_>> =
        seqs.iter().map(|s| Span { prompt: &s[..s.len().min(1)], response: &s[s.len().min(1)..] }).collect();
    score_spans(model, &spans, opts)
}

fn score_batch(model: &CausalLm, chunk: &[Span<'_>], temperature: f64) -> Vec<Scored> {
    let device: Device = model.device();
    let lens: Vec<usize> = chunk.iter().map(|s| s.prompt.len() + s.response.len()).collect();
    let longest = lens.iter().copied().max().unwrap_or(0).max(2) as i64;
    let b = chunk.len() as i64;
    let mut ids = vec![0i64; (b * longest) as usize];
    let mut mask = vec![0i64; (b * longest) as usize];
    for (r, span) in chunk.iter().enumerate() {
        for (t, tok) in span.prompt.iter().chain(span.response).enumerate() {
            ids[r * longest as usize + t] = i64::from(*tok);
            mask[r * longest as usize + t] = 1;
        }
    }
    let ids = Tensor::from_slice(&ids).view([b, longest]).to_device(device);
    let mask = Tensor::from_slice(&mask).view([b, longest]).to_device(device);
    let pos = Tensor::arange(longest, (Kind::Int64, device)).unsqueeze(0).repeat([b, 1]);
    let hidden = model.hidden(&ids, &pos, &mask, None);
    // Position p predicts token p + 1: the first scored prediction of a row sits at prompt - 1.
    let first = chunk.iter().map(|s| s.prompt.len().max(1) - 1).min().unwrap_or(0) as i64;
    let n = longest - 1 - first;
    let logits = model.logits(&hidden.narrow(1, first, n));
    let scale = if temperature > 0.0 { temperature } else { 1.0 };
    let (lp, ent) = token_logprobs_and_entropy(&(logits / scale), &ids.narrow(1, first + 1, n));
    chunk
        .iter()
        .enumerate()
        .map(|(r, span)| {
            let len = span.response.len() as i64;
            if span.prompt.is_empty() {
                // The first response token has no context: nothing predicts it.
                let pad = Tensor::zeros([len.min(1)], (Kind::Float, device));
                let rest = (len - 1).max(0);
                let lp = Tensor::cat(&[&pad, &lp.get(r as i64).narrow(0, 0, rest)], 0);
                let ent = Tensor::cat(&[&pad, &ent.get(r as i64).narrow(0, 0, rest)], 0);
                return Scored { logprobs: lp, entropy: ent };
            }
            let start = span.prompt.len() as i64 - 1 - first;
            Scored {
                logprobs: lp.get(r as i64).narrow(0, start, len),
                entropy: ent.get(r as i64).narrow(0, start, len),
            }
        })
        .collect()
}
