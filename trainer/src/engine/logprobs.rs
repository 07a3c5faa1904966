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
//!   tensor is ever built. With autograd, [`backward_spans`] does the same for a loss that is a
//!   sum of per-token terms: each chunk's logits live only while that chunk's gradient is taken,
//!   and the decoder's layers can be recomputed one at a time (activation checkpointing).
//! - [`score_spans_full`] is the path before that: logits and log-softmax of every position of
//!   the batch in f32, kept for the benchmark's baseline and the equality tests.

use std::ops::Range;

use tch::{Device, Kind, Tensor};

use crate::engine::device::transfers;
use crate::engine::model::{CausalLm, token_logprobs_and_entropy};

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

/// A micro-batch laid out for one forward pass: right-padded ids and mask `[b, l]`, and the
/// scored positions in flat order (rows in order, positions in order): where each is in the
/// `[b * l]` flattening, the token it predicts, and where its value goes in the concatenation of
/// the responses.
struct Layout {
    ids: Tensor,
    mask: Tensor,
    pos: Tensor,
    at: Vec<i64>,
    /// `at` and the targets on the device, uploaded once (chunks are views of them).
    at_device: Tensor,
    targets: Tensor,
    slots: Vec<i64>,
    /// Response tokens in all (the length of the concatenation).
    total: i64,
}

impl Layout {
    fn new(chunk: &[Span<'_>], device: Device) -> Self {
        let longest = chunk.iter().map(|s| s.prompt.len() + s.response.len()).max().unwrap_or(0).max(1);
        let b = chunk.len();
        let mut ids = vec![0i64; b * longest];
        let mut mask = vec![0i64; b * longest];
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
        let (l, b) = (longest as i64, b as i64);
        Layout {
            ids: transfers::to_device(&Tensor::from_slice(&ids).view([b, l]), device),
            mask: transfers::to_device(&Tensor::from_slice(&mask).view([b, l]), device),
            pos: Tensor::arange(l, (Kind::Int64, device)).unsqueeze(0).repeat([b, 1]),
            at_device: transfers::to_device(&Tensor::from_slice(&at), device),
            targets: transfers::to_device(&Tensor::from_slice(&targets), device),
            at,
            slots,
            total: offset,
        }
    }

    /// Where the scored positions `range` are in the `[b * l]` flattening, and their targets:
    /// views of the tensors uploaded once.
    fn index(&self, range: Range<usize>) -> (Tensor, Tensor) {
        let (start, n) = (range.start as i64, range.len() as i64);
        (self.at_device.narrow(0, start, n), self.targets.narrow(0, start, n))
    }

    /// Per-span views of values given in flat scored order (0 where not scored).
    fn split(&self, chunk: &[Span<'_>], flat: &Tensor, device: Device) -> Vec<Tensor> {
        let slots = transfers::to_device(&Tensor::from_slice(&self.slots), device);
        let all = Tensor::zeros([self.total], (Kind::Float, device)).index_copy(0, &slots, flat);
        let mut out = Vec::with_capacity(chunk.len());
        let mut start = 0i64;
        for span in chunk {
            let len = span.response.len() as i64;
            out.push(all.narrow(0, start, len));
            start += len;
        }
        out
    }
}

fn scale(temperature: f64) -> f64 {
    if temperature > 0.0 { temperature } else { 1.0 }
}

fn score_batch(model: &CausalLm, chunk: &[Span<'_>], temperature: f64, with_grad: bool) -> Vec<Scored> {
    let device: Device = model.device();
    let layout = Layout::new(chunk, device);
    let n = layout.at.len();
    let (lp, ent) = if n == 0 {
        (Tensor::zeros([0], (Kind::Float, device)), Tensor::zeros([0], (Kind::Float, device)))
    } else {
        let hidden = model.hidden_with(&layout.ids, &layout.pos, crate::engine::model::Masking::Causal, None);
        let hidden = hidden.view([-1, hidden.size()[2]]);
        let step = if with_grad { n } else { (CHUNK_LOGITS / model.config.vocab_size.max(1)).max(1) as usize };
        let (mut lps, mut ents) = (Vec::new(), Vec::new());
        for start in (0..n).step_by(step) {
            let (idx, tgt) = layout.index(start..(start + step).min(n));
            let logits = model.logits(&hidden.index_select(0, &idx)) / scale(temperature);
            let (lp, ent) = token_logprobs_and_entropy(&logits, &tgt);
            lps.push(lp);
            ents.push(ent);
        }
        (Tensor::cat(&lps, 0), Tensor::cat(&ents, 0))
    };
    let (lps, ents) = (layout.split(chunk, &lp, device), layout.split(chunk, &ent, device));
    lps.into_iter().zip(ents).map(|(logprobs, entropy)| Scored { logprobs, entropy }).collect()
}

/// How [`backward_spans`] runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainPass {
    pub temperature: f64,
    /// Scored positions projected to the vocabulary at once (their logits are the largest
    /// tensor of the pass).
    pub chunk: usize,
    /// Keep only each decoder layer's input and recompute the layer during backward.
    pub checkpoint: bool,
}

impl Default for TrainPass {
    fn default() -> Self {
        Self { temperature: 1.0, chunk: 512, checkpoint: false }
    }
}

/// Backpropagate a loss that is a sum of per-token terms over the scored positions of `spans`
/// (one micro-batch, one forward pass), without ever holding the logits of more than
/// `pass.chunk` positions. `loss` gets each chunk's log-probs and entropies `[n]` (with grad) and
/// the chunk's range in the flat scored order (rows in order, scored positions in order), and
/// returns that chunk's scalar share of the loss; its gradient reaches every parameter. The
/// hidden states of the scored positions are detached, each chunk's loss is backpropagated into
/// them and into the head, then the accumulated gradient goes through the decoder once (or layer
/// by layer from the stored inputs, with `checkpoint`).
pub fn backward_spans(
    model: &CausalLm,
    spans: &[Span<'_>],
    pass: TrainPass,
    loss: &mut dyn FnMut(&Tensor, &Tensor, Range<usize>) -> Tensor,
) {
    let device = model.device();
    let layout = Layout::new(spans, device);
    let n = layout.at.len();
    if n == 0 {
        return;
    }
    // Right padding only: plain causal attention is exact for every real token.
    let (x0, p) = model.begin_with(&layout.ids, &layout.pos, crate::engine::model::Masking::Causal, 0);
    // The decoder: with grad, or without it keeping each layer's input for recomputation.
    let (last, inputs) = if pass.checkpoint {
        let mut inputs = Vec::with_capacity(model.num_layers());
        let mut x = x0.detach();
        tch::no_grad(|| {
            for i in 0..model.num_layers() {
                let next = model.layer_forward(i, &x, &p);
                inputs.push(std::mem::replace(&mut x, next));
            }
        });
        (x.detach().set_requires_grad(true), inputs)
    } else {
        let mut x = x0;
        for i in 0..model.num_layers() {
            x = model.layer_forward(i, &x, &p);
        }
        (x, Vec::new())
    };
    let hidden = model.final_norm(&last);
    let hidden = hidden.view([-1, hidden.size()[2]]);
    let (all_idx, _) = layout.index(0..n);
    let selected = hidden.index_select(0, &all_idx);
    let detached = selected.detach().set_requires_grad(true);
    // Below f32, the head's gradient is summed over the chunks in f32: each chunk projects
    // through a cast of an f32 copy of the weight, whose gradient accumulates in f32 and reaches
    // the parameter once, instead of being rounded to the parameter's dtype once per chunk.
    let head = model.head_weight();
    let head32 = (head.kind() != Kind::Float).then(|| head.detach().to_kind(Kind::Float).set_requires_grad(true));
    let step = pass.chunk.max(1);
    for start in (0..n).step_by(step) {
        let end = (start + step).min(n);
        let (_, tgt) = layout.index(start..end);
        let h = detached.narrow(0, start as i64, (end - start) as i64);
        let logits = match &head32 {
            Some(w) => h.matmul(&w.to_kind(head.kind()).tr()).to_kind(Kind::Float),
            None => model.logits(&h),
        } / scale(pass.temperature);
        let (lp, ent) = token_logprobs_and_entropy(&logits, &tgt);
        let part = loss(&lp, &ent, start..end);
        if part.requires_grad() {
            part.backward();
        }
    }
    if let Some(w) = &head32 {
        let g = w.grad();
        if g.defined() {
            // The parameter's gradient (the tied embedding's too) gets the f32 sum, rounded once.
            (head * g.to_kind(head.kind())).sum(Kind::Float).backward();
        }
    }
    let grad = detached.grad();
    if !grad.defined() {
        return;
    }
    (&selected * grad.detach()).sum(Kind::Float).backward();
    if pass.checkpoint {
        let mut grad_out = last.grad();
        for (i, input) in inputs.iter().enumerate().rev() {
            if !grad_out.defined() {
                return;
            }
            let x = input.detach().set_requires_grad(true);
            let out = model.layer_forward(i, &x, &p);
            (out * grad_out.detach()).sum(Kind::Float).backward();
            grad_out = x.grad();
        }
        if grad_out.defined() {
            (model.embed(&layout.ids) * grad_out.detach()).sum(Kind::Float).backward();
        }
    }
}

/// The scoring path before [`backward_spans`]: one forward over the whole micro-batch, the
/// logits and log-softmax of every position in f32, then the responses' values picked out
/// (all response positions, scored or not, as a `Scored` each). Kept as the benchmark's
/// baseline and for the tests that check the chunked path against it.
pub fn score_spans_full(model: &CausalLm, spans: &[Span<'_>], temperature: f64) -> Vec<Scored> {
    let device = model.device();
    let layout = Layout::new(spans, device);
    let l = layout.ids.size()[1];
    let logits = model.forward(&layout.ids, &layout.pos, &layout.mask, None) / scale(temperature);
    // Position t predicts token t + 1; a zero column in front stands for the first token, which
    // nothing predicts.
    let (lp, ent) = token_logprobs_and_entropy(&logits.narrow(1, 0, l - 1), &layout.ids.narrow(1, 1, l - 1));
    let front = |x: Tensor| Tensor::cat(&[&Tensor::zeros([x.size()[0], 1], (Kind::Float, device)), &x], 1);
    let (lp, ent) = (front(lp), front(ent));
    spans
        .iter()
        .enumerate()
        .map(|(r, span)| {
            let (p, len) = (span.prompt.len() as i64, span.response.len() as i64);
            let keep = |x: &Tensor| {
                let row = x.get(r as i64).narrow(0, p, len);
                match span.mask {
                    Some(m) => {
                        let m: Vec<f32> = m.iter().map(|v| f32::from(*v)).collect();
                        row * Tensor::from_slice(&m).to_device(device)
                    }
                    None => row,
                }
            };
            Scored { logprobs: keep(&lp), entropy: keep(&ent) }
        })
        .collect()
}
