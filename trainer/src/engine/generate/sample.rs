//! Sampling a decode step's tokens on the device: greedy, or temperature with top-k and top-p
//! (top-p on a candidate set, not a sort of the vocabulary), each row with its own uniform; the
//! result packed for the step's one transfer to the host.

use tch::{Kind, Tensor};

use super::SamplingParams;

/// One step's draw for every batch row, on the device.
pub(super) struct Drawn {
    /// `[rows]` token ids (int64), fed back as the next step's input.
    pub(super) tokens: Tensor,
    /// `[rows, 3]` (f64): token, its log-probability, 1 where the row's nucleus was truncated to
    /// the candidate set. What the host reads: one transfer.
    pub(super) packed: Tensor,
}

/// Draw one token per batch row from `logits` (`[rows, vocab]`): greedy at temperature 0, else
/// temperature, top-k and top-p, each row with its own uniform (`[rows, 1]`). All on the device.
pub(super) fn sample_batch(
    logits: &Tensor,
    params: &SamplingParams,
    uniforms: Option<&Tensor>,
    candidates: usize,
) -> Drawn {
    let scale = if params.temperature > 0.0 { params.temperature } else { 1.0 };
    let logp = (logits.to_kind(Kind::Float) / scale).log_softmax(-1, Kind::Float);
    let vocab = logp.size()[1];
    let (tokens, truncated) = match uniforms {
        Some(u) if params.temperature > 0.0 => {
            let probs = logp.exp();
            let (sorted, idx, from_candidates) = candidate_set(&probs, params, vocab, candidates);
            let mut keep = sorted.shallow_clone();
            let mut truncated = Tensor::zeros([probs.size()[0]], (Kind::Float, probs.device()));
            if params.top_p < 1.0 {
                // The smallest prefix whose mass reaches top_p (at least one token) per row.
                let before = sorted.cumsum(-1, Kind::Float) - &sorted;
                keep = sorted.where_self(&before.lt(params.top_p), &sorted.zeros_like());
                if from_candidates {
                    truncated = sorted.sum_dim_intlist(-1, false, Kind::Float).lt(params.top_p).to_kind(Kind::Float);
                }
            }
            let cum = keep.cumsum(-1, Kind::Float);
            let total = cum.narrow(1, cum.size()[1] - 1, 1);
            let target = u * &total;
            // The first rank whose running mass exceeds the target; clamped to the kept ranks.
            let rank = cum.le_tensor(&target).sum_dim_intlist(-1, true, Kind::Int64);
            let kept = keep.gt(0.0).sum_dim_intlist(-1, true, Kind::Int64).clamp_min(1);
            let rank = rank.minimum(&(kept - 1));
            (idx.gather(-1, &rank, false).squeeze_dim(-1), truncated)
        }
        _ => (logp.argmax(-1, false), Tensor::zeros([logp.size()[0]], (Kind::Float, logp.device()))),
    };
    let lp = logp.gather(-1, &tokens.unsqueeze(-1), false).squeeze_dim(-1);
    let packed =
        Tensor::stack(&[tokens.to_kind(Kind::Double), lp.to_kind(Kind::Double), truncated.to_kind(Kind::Double)], 1);
    Drawn { tokens, packed }
}

/// The tokens each row may draw from, in descending probability: the top-k when set; the whole
/// vocabulary in its own order without top-p (any order samples it); else the top `candidates`
/// (a partial selection, no sort of the vocabulary; the last value says so), or a full sort when
/// `candidates` is 0 or covers the vocabulary.
fn candidate_set(probs: &Tensor, params: &SamplingParams, vocab: i64, candidates: usize) -> (Tensor, Tensor, bool) {
    if params.top_k > 0 && (params.top_k as i64) < vocab {
        let (v, i) = probs.topk(params.top_k as i64, -1, true, true);
        return (v, i, false);
    }
    if params.top_p >= 1.0 {
        let order = Tensor::arange(vocab, (Kind::Int64, probs.device())).unsqueeze(0).expand_as(probs);
        return (probs.shallow_clone(), order, false);
    }
    let k = candidates as i64;
    if k > 0 && k < vocab {
        let (v, i) = probs.topk(k, -1, true, true);
        return (v, i, true);
    }
    let (v, i) = probs.sort(-1, true);
    (v, i, false)
}
