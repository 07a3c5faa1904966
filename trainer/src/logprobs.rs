//! Per-token log-probabilities and entropies of responses under the model, in micro-batches,
//! with or without autograd: what the policy-gradient loss, the reference model's KL term and
//! SFT need.
//!
//! - The distribution scored is the one the rollout sampled from: the logits divided by the
//!   sampling temperature (spec §5.1; the reference samples at T = 1, where the two agree). So
//!   the first PPO ratio of a rollout token is 1 up to rounding at any temperature.
//! - Only the positions that are scored are projected to the vocabulary: response tokens, and of
//!   those only the ones a mask selects (the generated tokens; observations are attended to but
//!   never scored). In a search agent's rows most tokens are observations.
//! - Without autograd the projection runs in chunks of positions, so no `[batch, t, vocab]`
//!   tensor is ever built.

use tch::{Device, Kind, Tensor};

use crate::model::{CausalLm, token_logprobs_and_entropy};

/// A sequence to score: a prompt (context only) and a response whose tokens are scored where
/// `mask` is 1 (all of them without a mask).
#[derive(Debug, Clone, Copy)]
pub struct Span<'a> {
    pub prompt: &'a [u32],
    pub response: &'a [u32],
    pub mask: Option<&'a [u8]>,
}

impl<'a> Span<'a> {
    pub fn new(prompt: &'a [u32], response: &'a [u32]) -> Self {
        Self { prompt, response, mask: None }
    }

    pub fn masked(prompt: &'a [u32], response: &'a [u32], mask: &'a [u8]) -> Self {
        Self { prompt, response, mask: Some(mask) }
    }

    /// Is response token `i` scored? The first token of a sequence has no context: never.
    fn scored(&self, i: usize) -> bool {
        (!self.prompt.is_empty() || i > 0) && self.mask.is_none_or(|m| m.get(i).copied().unwrap_or(0) == 1)
    }
}

/// For each response token t: `log p(t | everything before it)` and the entropy of that
/// predictive distribution (`[response_len]` each, f32; 0 where the token is not scored).
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

/// Vocabulary projections per chunk without autograd: at most this many logits at once.
const CHUNK_LOGITS: i64 = 1 << 25;

/// Score `spans` in micro-batches (right-padded inside a batch).
pub fn score_spans(model: &CausalLm, spans: &[Span<'_>], opts: ScoreOptions) -> Vec<Scored> {
    let mut out = Vec::with_capacity(spans.len());
    for chunk in spans.chunks(opts.micro_batch.max(1)) {
        let run = || score_batch(model, chunk, opts.temperature, opts.with_grad);
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
    let spans: Vec<Span<'_>> = seqs.iter().map(|s| Span::new(&s[..s.len().min(1)], &s[s.len().min(1)..])).collect();
    score_spans(model, &spans, opts)
}

fn score_batch(model: &CausalLm, chunk: &[Span<'_>], temperature: f64, with_grad: bool) -> Vec<Scored> {
    let device: Device = model.device();
    let longest = chunk.iter().map(|s| s.prompt.len() + s.response.len()).max().unwrap_or(0).max(1);
    let b = chunk.len();
    let mut ids = vec![0i64; b * longest];
    let mut mask = vec![0i64; b * longest];
    // Flat positions (row * longest + p) whose next token is scored, that token, and where the
    // result goes in the concatenation of all responses.
    let (mut at, mut targets, mut slots) = (Vec::new(), Vec::new(), Vec::new());
    let mut offset = 0i64;
    for (r, span) in chunk.iter().enumerate() {
        for (t, tok) in span.prompt.iter().chain(span.response).enumerate() {
            ids[r * longest + t] = i64::from(*tok);
            mask[r * longest + t] = 1;
        }
        for (i, tok) in span.response.iter().enumerate() {
            if span.scored(i) {
                at.push((r * longest + span.prompt.len() + i - 1) as i64);
                targets.push(i64::from(*tok));
                slots.push(offset + i as i64);
            }
        }
        offset += span.response.len() as i64;
    }
    let zeros = || Tensor::zeros([offset], (Kind::Float, device));
    let (lp_all, ent_all) = if at.is_empty() {
        (zeros(), zeros())
    } else {
        let (l, b) = (longest as i64, b as i64);
        let ids_t = Tensor::from_slice(&ids).view([b, l]).to_device(device);
        let mask_t = Tensor::from_slice(&mask).view([b, l]).to_device(device);
        let pos = Tensor::arange(l, (Kind::Int64, device)).unsqueeze(0).repeat([b, 1]);
        let hidden = model.hidden(&ids_t, &pos, &mask_t, None);
        let hidden = hidden.view([b * l, -1]);
        let scale = if temperature > 0.0 { temperature } else { 1.0 };
        let n = at.len() as i64;
        let step = if with_grad { n } else { (CHUNK_LOGITS / model.config.vocab_size.max(1)).max(1) };
        let (mut lps, mut ents) = (Vec::new(), Vec::new());
        for start in (0..n).step_by(step as usize) {
            let len = step.min(n - start);
            let idx = Tensor::from_slice(&at[start as usize..(start + len) as usize]).to_device(device);
            let tgt = Tensor::from_slice(&targets[start as usize..(start + len) as usize]).to_device(device);
            let logits = model.logits(&hidden.index_select(0, &idx)) / scale;
            let (lp, ent) = token_logprobs_and_entropy(&logits, &tgt);
            lps.push(lp);
            ents.push(ent);
        }
        let slots = Tensor::from_slice(&slots).to_device(device);
        let place = |parts: Vec<Tensor>| zeros().index_copy(0, &slots, &Tensor::cat(&parts, 0));
        (place(lps), place(ents))
    };
    let mut out = Vec::with_capacity(chunk.len());
    let mut start = 0i64;
    for span in chunk {
        let len = span.response.len() as i64;
        out.push(Scored { logprobs: lp_all.narrow(0, start, len), entropy: ent_all.narrow(0, start, len) });
        start += len;
    }
    out
}
