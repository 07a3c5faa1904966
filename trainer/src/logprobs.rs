//! Per-token log-probabilities and entropies of given sequences under the model, in
//! micro-batches, with or without autograd: what the policy-gradient loss and the reference
//! model's KL term need.

use tch::{Device, Kind, Tensor};

use crate::model::{CausalLm, token_logprobs_and_entropy};

/// For each sequence of `n` tokens: `log p(token[t] | token[..t])` and the entropy of that
/// predictive distribution, for t in 1..n (`n - 1` values each, f32).
#[derive(Debug)]
pub struct Scored {
    pub logprobs: Tensor,
    pub entropy: Tensor,
}

/// Score `seqs` in micro-batches of `micro_batch` sequences (right-padded inside a batch).
/// Without `with_grad` nothing is recorded for backward.
pub fn score_sequences(model: &CausalLm, seqs: &[Vec<u32>], micro_batch: usize, with_grad: bool) -> Vec<Scored> {
    let mut out = Vec::with_capacity(seqs.len());
    for chunk in seqs.chunks(micro_batch.max(1)) {
        let run = || score_batch(model, chunk);
        if with_grad {
            out.extend(run());
        } else {
            out.extend(tch::no_grad(run));
        }
    }
    out
}

fn score_batch(model: &CausalLm, chunk: &[Vec<u32>]) -> Vec<Scored> {
    let device: Device = model.device();
    let longest = chunk.iter().map(Vec::len).max().unwrap_or(0).max(2) as i64;
    let b = chunk.len() as i64;
    let mut ids = vec![0i64; (b * longest) as usize];
    let mut mask = vec![0i64; (b * longest) as usize];
    for (r, seq) in chunk.iter().enumerate() {
        for (t, tok) in seq.iter().enumerate() {
            ids[r * longest as usize + t] = i64::from(*tok);
            mask[r * longest as usize + t] = 1;
        }
    }
    let ids = Tensor::from_slice(&ids).view([b, longest]).to_device(device);
    let mask = Tensor::from_slice(&mask).view([b, longest]).to_device(device);
    let pos = Tensor::arange(longest, (Kind::Int64, device)).unsqueeze(0).repeat([b, 1]);
    let logits = model.forward(&ids, &pos, &mask, None);
    let (lp, ent) = token_logprobs_and_entropy(&logits.narrow(1, 0, longest - 1), &ids.narrow(1, 1, longest - 1));
    chunk
        .iter()
        .enumerate()
        .map(|(r, seq)| {
            let n = (seq.len() as i64 - 1).max(0);
            Scored { logprobs: lp.get(r as i64).narrow(0, 0, n), entropy: ent.get(r as i64).narrow(0, 0, n) }
        })
        .collect()
}
