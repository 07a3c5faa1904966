//! The policy loss of spec §5.2: dual-clip PPO (clip 0.2 / 0.2, c = 3) on token ratios, plus the
//! k3 ("low_var_kl") KL to a frozen reference and an entropy bonus, aggregated over the tokens
//! whose loss mask is 1 (generated tokens; observation tokens are 0).
//!
//! Aggregation is over the whole mini-batch (one optimiser step), not the micro-batch: each
//! micro-batch's loss is its share of the mini-batch objective, so the accumulated gradient is
//! the same whatever the micro-batch split. The reference's per-micro-batch token-mean, whose
//! value depends on the split (spec §5.2), is kept as an option.

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

/// The sizes a micro-batch's sums are divided by: its mini-batch's generated tokens and
/// sequences, and the number of micro-batches in it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normaliser {
    pub tokens: f64,
    pub sequences: f64,
    pub micro_batches: f64,
}

impl Normaliser {
    /// A micro-batch that is its own mini-batch.
    pub fn alone(mask: &Tensor) -> Self {
        Self {
            tokens: mask.to_kind(Kind::Float).sum(Kind::Float).double_value(&[]),
            sequences: mask.size()[0] as f64,
            micro_batches: 1.0,
        }
    }
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

/// The loss (with autograd) and its parts (for metrics).
#[derive(Debug)]
pub struct LossParts {
    pub loss: Tensor,
    pub policy: f64,
    pub kl: f64,
    pub entropy: f64,
    /// Fraction of masked tokens where the clipped term was the active one.
    pub clip_fraction: f64,
}

/// This micro-batch's share of the mini-batch aggregate of `x`.
fn aggregate(x: &Tensor, mask: &Tensor, how: Aggregation, norm: &Normaliser) -> Tensor {
    match how {
        Aggregation::TokenMean => (x * mask).sum(Kind::Float) / norm.tokens.max(1.0),
        Aggregation::SeqMeanTokenMean => {
            let per_seq = (x * mask).sum_dim_intlist(-1, false, Kind::Float)
                / mask.sum_dim_intlist(-1, false, Kind::Float).clamp_min(1.0);
            per_seq.sum(Kind::Float) / norm.sequences.max(1.0)
        }
        Aggregation::MicroBatchTokenMean => {
            (x * mask).sum(Kind::Float) / mask.sum(Kind::Float).clamp_min(1.0) / norm.micro_batches.max(1.0)
        }
    }
}

/// All token tensors are `[batch, t]`; `advantages` is `[batch]`; `mask` is 1 on generated tokens.
/// `logp` and `entropy` carry the graph; `old_logp` and `ref_logp` are constants. The parts are
/// this micro-batch's shares of its mini-batch's aggregates (`norm`); summed over a mini-batch's
/// micro-batches they give the mini-batch's values. `clip_fraction` is a token-weighted share
/// the same way.
#[allow(clippy::too_many_arguments)]
pub fn policy_loss(
    logp: &Tensor,
    old_logp: &Tensor,
    ref_logp: &Tensor,
    entropy: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    cfg: &LossConfig,
    norm: &Normaliser,
) -> LossParts {
    let mask = mask.to_kind(Kind::Float);
    let adv = advantages.to_kind(Kind::Float).unsqueeze(-1).expand_as(logp);
    let ratio = (logp - old_logp).clamp(-20.0, 20.0).exp();
    let l1 = -&adv * &ratio;
    let l2 = -&adv * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high);
    let clipped = l1.maximum(&l2);
    let dual = clipped.minimum(&(-&adv * cfg.clip_c));
    let pg = dual.where_self(&adv.lt(0.0), &clipped);
    let d = (ref_logp - logp).clamp(-20.0, 20.0);
    let kl = (d.exp() - &d - 1.0).clamp(-10.0, 10.0);
    let pg_agg = aggregate(&pg, &mask, cfg.aggregation, norm);
    let kl_agg = aggregate(&kl, &mask, cfg.aggregation, norm);
    let ent_agg = aggregate(entropy, &mask, cfg.aggregation, norm);
    let loss = &pg_agg - &ent_agg * cfg.entropy_coef + &kl_agg * cfg.kl_coef;
    let clip_fraction =
        aggregate(&l2.gt_tensor(&l1).to_kind(Kind::Float), &mask, Aggregation::TokenMean, norm).double_value(&[]);
    LossParts {
        policy: pg_agg.double_value(&[]),
        kl: kl_agg.double_value(&[]),
        entropy: ent_agg.double_value(&[]),
        clip_fraction,
        loss,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f64]) -> Tensor {
        Tensor::from_slice(v).view([1, -1]).to_kind(Kind::Float)
    }

    /// Hand-computed: ratios e^0 = 1, e^0.5 = 1.6487, e^-1 = 0.3679, e^2 = 7.389 (masked out).
    #[test]
    fn dual_clip_ppo_by_hand() {
        let old = t(&[-1.0, -1.0, -1.0, -1.0]);
        let logp = t(&[-1.0, -0.5, -2.0, 1.0]);
        let reference = logp.shallow_clone();
        let ent = t(&[0.0, 0.0, 0.0, 0.0]);
        let mask = t(&[1.0, 1.0, 1.0, 0.0]);
        // Positive advantage 2: l1 = -2r, l2 = -2 clip(r); max picks the clipped (less negative)
        // term when r > 1.2: tokens: -2, -2.4 (clipped), -0.7358 (r < 0.8: l1 = -0.7358, l2 = -1.6, max = l1).
        let p = policy_loss(
            &logp,
            &old,
            &reference,
            &ent,
            &Tensor::from_slice(&[2.0f64]),
            &mask,
            &LossConfig::default(),
            &Normaliser::alone(&mask),
        );
        let want = (-2.0 - 2.4 - 2.0 * (-1.0f64).exp()) / 3.0;
        assert!((p.policy - want).abs() < 1e-6, "{} vs {want}", p.policy);
        // Only the r > 1.2 token is clipped (for r < 0.8 with A > 0 the unclipped term is larger).
        assert!((p.clip_fraction - 1.0 / 3.0).abs() < 1e-6, "{}", p.clip_fraction);
        assert!(p.kl.abs() < 1e-9, "same policy as the reference: KL 0");
        // Negative advantage -1 with a huge ratio: dual clip caps the loss at -A * 3 = 3.
        let big = t(&[2.0]);
        let p = policy_loss(
            &big,
            &t(&[-1.0]),
            &big,
            &t(&[0.0]),
            &Tensor::from_slice(&[-1.0f64]),
            &t(&[1.0]),
            &LossConfig::default(),
            &Normaliser::alone(&t(&[1.0])),
        );
        assert!((p.policy - 3.0).abs() < 1e-6, "{}", p.policy);
    }

    #[test]
    fn k3_kl_entropy_and_aggregation() {
        let logp = t(&[-1.0, -2.0]);
        let reference = t(&[-1.5, -1.0]);
        let d = [-0.5f64, 1.0];
        let k3: Vec<f64> = d.iter().map(|d| d.exp() - d - 1.0).collect();
        let ent = t(&[0.5, 1.5]);
        let mask = t(&[1.0, 1.0]);
        let cfg = LossConfig { kl_coef: 0.1, entropy_coef: 0.01, ..Default::default() };
        let p = policy_loss(
            &logp,
            &logp,
            &reference,
            &ent,
            &Tensor::from_slice(&[0.0f64]),
            &mask,
            &cfg,
            &Normaliser::alone(&mask),
        );
        assert!((p.kl - (k3[0] + k3[1]) / 2.0).abs() < 1e-6);
        assert!((p.entropy - 1.0).abs() < 1e-6);
        let total = p.loss.double_value(&[]);
        assert!((total - (0.0 - 0.01 * 1.0 + 0.1 * p.kl)).abs() < 1e-6);
        // Token-mean vs sequence-mean: two rows of 1 and 3 tokens.
        let x = Tensor::from_slice(&[1.0f64, 0.0, 0.0, 3.0, 3.0, 3.0]).view([2, 3]).to_kind(Kind::Float);
        let m = Tensor::from_slice(&[1.0f64, 0.0, 0.0, 1.0, 1.0, 1.0]).view([2, 3]).to_kind(Kind::Float);
        let alone = Normaliser::alone(&m);
        assert!((aggregate(&x, &m, Aggregation::TokenMean, &alone).double_value(&[]) - 2.5).abs() < 1e-6);
        assert!((aggregate(&x, &m, Aggregation::SeqMeanTokenMean, &alone).double_value(&[]) - 2.0).abs() < 1e-6);
        assert!((aggregate(&x, &m, Aggregation::MicroBatchTokenMean, &alone).double_value(&[]) - 2.5).abs() < 1e-6);
        // The same two rows as halves of a mini-batch split in two micro-batches: the shares of
        // the mini-batch aggregates add up to the whole; the reference's micro-mean does not.
        let split = Normaliser { tokens: 4.0, sequences: 2.0, micro_batches: 2.0 };
        let (x0, x1) = (x.narrow(0, 0, 1), x.narrow(0, 1, 1));
        let (m0, m1) = (m.narrow(0, 0, 1), m.narrow(0, 1, 1));
        for (how, whole) in [(Aggregation::TokenMean, 2.5), (Aggregation::SeqMeanTokenMean, 2.0)] {
            let parts =
                aggregate(&x0, &m0, how, &split).double_value(&[]) + aggregate(&x1, &m1, how, &split).double_value(&[]);
            assert!((parts - whole).abs() < 1e-6, "{how:?}: {parts}");
        }
        let micro = aggregate(&x0, &m0, Aggregation::MicroBatchTokenMean, &split).double_value(&[])
            + aggregate(&x1, &m1, Aggregation::MicroBatchTokenMean, &split).double_value(&[]);
        assert!((micro - 2.0).abs() < 1e-6, "(1 + 3) / 2 micro-batches: {micro}");
    }

    #[test]
    fn masked_tokens_get_no_gradient() {
        let logp = t(&[-1.0, -1.0, -1.0]).set_requires_grad(true);
        let p = policy_loss(
            &logp,
            &t(&[-1.0, -1.0, -1.0]),
            &t(&[-1.0, -1.0, -1.0]),
            &t(&[0.0, 0.0, 0.0]),
            &Tensor::from_slice(&[1.0f64]),
            &t(&[1.0, 0.0, 1.0]),
            &LossConfig::default(),
            &Normaliser::alone(&t(&[1.0, 0.0, 1.0])),
        );
        p.loss.backward();
        let g: Vec<f32> = Vec::try_from(logp.grad().view([-1])).unwrap();
        assert_eq!(g[1], 0.0, "observation token");
        assert!(g[0] < 0.0 && g[2] < 0.0, "{g:?}");
    }
}
