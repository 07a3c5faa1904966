//! The policy loss of spec §5.2: dual-clip PPO (clip 0.2 / 0.2, c = 3) on token ratios, plus the
//! k3 ("low_var_kl") KL to a frozen reference and an entropy bonus, over the generated tokens
//! (observation tokens are never scored).
//!
//! The loss is a weighted sum of per-token terms, `sum_t w_t (pg_t - c_H H_t + c_KL kl_t)`: every
//! aggregation of the spec is a choice of weights ([`token_weights`]), which is what lets the
//! update compute it chunk by chunk of positions without ever holding all the logits. The
//! weights normalise over the whole mini-batch (one optimiser step), not the micro-batch, so the
//! accumulated gradient is the same whatever the micro-batch split; the reference's
//! per-micro-batch token-mean, whose value depends on the split (spec §5.2), is an option.

use tch::{Kind, Tensor};

/// How per-token terms become one number per mini-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Aggregation {
    /// Sum over every generated token of the mini-batch / their number (the default).
    TokenMean,
    /// Mean over the mini-batch's sequences of each sequence's token mean (the paper's Eq. 8).
    SeqMeanTokenMean,
    /// The reference code: token-mean within each micro-batch, averaged over the micro-batches
    /// (a token's weight depends on how the mini-batch was split).
    MicroBatchTokenMean,
}

impl Aggregation {
    pub fn name(&self) -> &'static str {
        match self {
            Aggregation::TokenMean => "token-mean",
            Aggregation::SeqMeanTokenMean => "seq-mean-token-mean",
            Aggregation::MicroBatchTokenMean => "micro-batch-token-mean",
        }
    }
}

/// The weight of each generated token of a mini-batch: `tokens[r]` is the generated-token count
/// of row r, `micro` the mini-batch's split into micro-batches as row ranges. One weight vector
/// per row, in row order.
pub fn token_weights(tokens: &[usize], micro: &[(usize, usize)], how: Aggregation) -> Vec<f64> {
    let total: usize = tokens.iter().sum();
    let rows = tokens.len();
    let mut per_row = vec![0.0; rows];
    for &(s, e) in micro {
        let micro_tokens: usize = tokens[s..e].iter().sum();
        for r in s..e {
            per_row[r] = match how {
                Aggregation::TokenMean => 1.0 / total.max(1) as f64,
                Aggregation::SeqMeanTokenMean => 1.0 / (rows.max(1) * tokens[r].max(1)) as f64,
                Aggregation::MicroBatchTokenMean => 1.0 / (micro_tokens.max(1) * micro.len().max(1)) as f64,
            };
        }
    }
    per_row
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossConfig {
    pub clip_low: f64,
    pub clip_high: f64,
    /// Dual-clip bound for negative advantages.
    pub clip_c: f64,
    pub kl_coef: f64,
    pub entropy_coef: f64,
    pub aggregation: Aggregation,
}

impl Default for LossConfig {
    fn default() -> Self {
        Self {
            clip_low: 0.2,
            clip_high: 0.2,
            clip_c: 3.0,
            kl_coef: 0.001,
            entropy_coef: 0.001,
            aggregation: Aggregation::TokenMean,
        }
    }
}

/// The loss of some tokens (with autograd) and its parts, each a weighted sum over those tokens.
#[derive(Debug)]
pub struct LossParts {
    pub loss: Tensor,
    /// `[4]` f64 on the loss's device, no graph: the policy term, the KL, the entropy, and the
    /// tokens where the clipped term was the active one. Left on the device so that a caller
    /// sums many chunks' parts and reads them once ([`LossParts::read`] reads one).
    pub parts: Tensor,
}

/// The parts of a loss, on the host.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PartValues {
    pub policy: f64,
    pub kl: f64,
    pub entropy: f64,
    /// Tokens where the clipped term was the active one.
    pub clipped_tokens: f64,
}

impl PartValues {
    /// Values of a `[4]` parts tensor (one transfer).
    pub fn of(parts: &Tensor) -> Self {
        let v: Vec<f64> =
            Vec::try_from(crate::engine::device::transfers::to_host(&parts.to_kind(Kind::Double))).unwrap_or_default();
        let get = |i: usize| v.get(i).copied().unwrap_or(f64::NAN);
        PartValues { policy: get(0), kl: get(1), entropy: get(2), clipped_tokens: get(3) }
    }
}

impl LossParts {
    /// This loss's parts on the host (one transfer).
    pub fn read(&self) -> PartValues {
        PartValues::of(&self.parts)
    }
}

/// Per-token tensors, all `[n]`: `logp` and `entropy` carry the graph; `old_logp`, `ref_logp`,
/// `advantages` (the row's advantage, tiled) and `weights` are constants.
#[allow(clippy::too_many_arguments)]
pub fn policy_loss(
    logp: &Tensor,
    old_logp: &Tensor,
    ref_logp: &Tensor,
    entropy: &Tensor,
    advantages: &Tensor,
    weights: &Tensor,
    cfg: &LossConfig,
) -> LossParts {
    let adv = advantages.to_kind(Kind::Float);
    let w = weights.to_kind(Kind::Float);
    let ratio = (logp - old_logp).clamp(-20.0, 20.0).exp();
    let l1 = -&adv * &ratio;
    let l2 = -&adv * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high);
    let clipped = l1.maximum(&l2);
    let dual = clipped.minimum(&(-&adv * cfg.clip_c));
    let pg = dual.where_self(&adv.lt(0.0), &clipped);
    let d = (ref_logp - logp).clamp(-20.0, 20.0);
    let kl = (d.exp() - &d - 1.0).clamp(-10.0, 10.0);
    let sum = |x: &Tensor| (x * &w).sum(Kind::Float);
    let (pg_agg, kl_agg, ent_agg) = (sum(&pg), sum(&kl), sum(entropy));
    let loss = &pg_agg - &ent_agg * cfg.entropy_coef + &kl_agg * cfg.kl_coef;
    // The four numbers the metrics need, left on the device (no transfer per chunk).
    let parts = Tensor::stack(
        &[pg_agg.detach(), kl_agg.detach(), ent_agg.detach(), l2.gt_tensor(&l1).to_kind(Kind::Float).sum(Kind::Float)],
        0,
    )
    .to_kind(Kind::Double);
    LossParts { loss, parts }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f64]) -> Tensor {
        Tensor::from_slice(v).to_kind(Kind::Float)
    }

    /// Hand-computed: ratios e^0 = 1, e^0.5 = 1.6487, e^-1 = 0.3679.
    #[test]
    fn dual_clip_ppo_by_hand() {
        let old = t(&[-1.0, -1.0, -1.0]);
        let logp = t(&[-1.0, -0.5, -2.0]);
        let ent = t(&[0.0, 0.0, 0.0]);
        let w = t(&[1.0 / 3.0; 3]);
        // Positive advantage 2: l1 = -2r, l2 = -2 clip(r); max picks the clipped (less negative)
        // term when r > 1.2: tokens: -2, -2.4 (clipped), -0.7358 (r < 0.8: l1 = -0.7358, l2 = -1.6, max = l1).
        let p = policy_loss(&logp, &old, &logp, &ent, &t(&[2.0; 3]), &w, &LossConfig::default());
        let want = (-2.0 - 2.4 - 2.0 * (-1.0f64).exp()) / 3.0;
        assert!((p.read().policy - want).abs() < 1e-6, "{} vs {want}", p.read().policy);
        // Only the r > 1.2 token is clipped (for r < 0.8 with A > 0 the unclipped term is larger).
        assert_eq!(p.read().clipped_tokens, 1.0);
        assert!(p.read().kl.abs() < 1e-9, "same policy as the reference: KL 0");
        // Negative advantage -1 with a huge ratio: dual clip caps the loss at -A * 3 = 3.
        let big = t(&[2.0]);
        let p = policy_loss(&big, &t(&[-1.0]), &big, &t(&[0.0]), &t(&[-1.0]), &t(&[1.0]), &LossConfig::default());
        assert!((p.read().policy - 3.0).abs() < 1e-6, "{}", p.read().policy);
    }

    #[test]
    fn k3_kl_entropy_and_weights() {
        let logp = t(&[-1.0, -2.0]);
        let reference = t(&[-1.5, -1.0]);
        let d = [-0.5f64, 1.0];
        let k3: Vec<f64> = d.iter().map(|d| d.exp() - d - 1.0).collect();
        let ent = t(&[0.5, 1.5]);
        let cfg = LossConfig { kl_coef: 0.1, entropy_coef: 0.01, ..Default::default() };
        let p = policy_loss(&logp, &logp, &reference, &ent, &t(&[0.0, 0.0]), &t(&[0.5, 0.5]), &cfg);
        assert!((p.read().kl - (k3[0] + k3[1]) / 2.0).abs() < 1e-6);
        assert!((p.read().entropy - 1.0).abs() < 1e-6);
        let total = p.loss.double_value(&[]);
        assert!((total - (0.0 - 0.01 * 1.0 + 0.1 * p.read().kl)).abs() < 1e-6);
    }

    #[test]
    fn aggregations_as_weights() {
        // Two rows of 1 and 3 generated tokens, values 1 and 3, 3, 3.
        let tokens = [1usize, 3];
        let weighted = |w: &[f64]| 1.0 * w[0] + 3.0 * 3.0 * w[1];
        let whole = [(0, 2)];
        let split = [(0, 1), (1, 2)];
        let tm = token_weights(&tokens, &whole, Aggregation::TokenMean);
        assert!((weighted(&tm) - 2.5).abs() < 1e-12, "(1 + 9) / 4");
        let sm = token_weights(&tokens, &whole, Aggregation::SeqMeanTokenMean);
        assert!((weighted(&sm) - 2.0).abs() < 1e-12, "(1 + 3) / 2");
        // Token-mean and sequence-mean do not depend on the split; the reference's does.
        assert_eq!(token_weights(&tokens, &split, Aggregation::TokenMean), tm);
        assert_eq!(token_weights(&tokens, &split, Aggregation::SeqMeanTokenMean), sm);
        let mm_whole = token_weights(&tokens, &whole, Aggregation::MicroBatchTokenMean);
        let mm_split = token_weights(&tokens, &split, Aggregation::MicroBatchTokenMean);
        assert!((weighted(&mm_whole) - 2.5).abs() < 1e-12);
        assert!((weighted(&mm_split) - 2.0).abs() < 1e-12, "(1/1 + 9/3) / 2");
    }

    #[test]
    fn the_loss_reaches_only_what_it_weighs() {
        let logp = t(&[-1.0, -1.0, -1.0]).set_requires_grad(true);
        let p = policy_loss(
            &logp,
            &t(&[-1.0, -1.0, -1.0]),
            &t(&[-1.0, -1.0, -1.0]),
            &t(&[0.0, 0.0, 0.0]),
            &t(&[1.0, 1.0, 1.0]),
            &t(&[0.5, 0.0, 0.5]),
            &LossConfig::default(),
        );
        p.loss.backward();
        let g: Vec<f32> = Vec::try_from(logp.grad()).unwrap();
        assert_eq!(g[1], 0.0, "weight 0");
        assert!(g[0] < 0.0 && g[2] < 0.0, "{g:?}");
    }
}
