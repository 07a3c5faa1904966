//! The policy loss of spec §5.2: dual-clip PPO (clip 0.2 / 0.2, c = 3) on token ratios, plus the
//! k3 ("low_var_kl") KL to a frozen reference and an entropy bonus, aggregated over the tokens
//! whose loss mask is 1 (generated tokens; observation tokens are 0).

use tch::{Kind, Tensor};

/// How per-token terms become one number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Aggregation {
    /// Sum over every masked token of the micro-batch / number of masked tokens (the reference).
    TokenMean,
    /// Mean over sequences of each sequence's token mean (the paper's Eq. 8).
    SeqMeanTokenMean,
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

fn aggregate(x: &Tensor, mask: &Tensor, how: Aggregation) -> Tensor {
    match how {
        Aggregation::TokenMean => (x * mask).sum(Kind::Float) / mask.sum(Kind::Float).clamp_min(1.0),
        Aggregation::SeqMeanTokenMean => {
            let per_seq = (x * mask).sum_dim_intlist(-1, false, Kind::Float)
                / mask.sum_dim_intlist(-1, false, Kind::Float).clamp_min(1.0);
            per_seq.mean(Kind::Float)
        }
    }
}

/// All token tensors are `[batch, t]`; `advantages` is `[batch]`; `mask` is 1 on generated tokens.
/// `logp` and `entropy` carry the graph; `old_logp` and `ref_logp` are constants.
pub fn policy_loss(
    logp: &Tensor,
    old_logp: &Tensor,
    ref_logp: &Tensor,
    entropy: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    cfg: &LossConfig,
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
    let pg_agg = aggregate(&pg, &mask, cfg.aggregation);
    let kl_agg = aggregate(&kl, &mask, cfg.aggregation);
    let ent_agg = aggregate(entropy, &mask, cfg.aggregation);
    let loss = &pg_agg - &ent_agg * cfg.entropy_coef + &kl_agg * cfg.kl_coef;
    let clip_fraction =
        aggregate(&l2.gt_tensor(&l1).to_kind(Kind::Float), &mask, Aggregation::TokenMean).double_value(&[]);
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
        let p =
            policy_loss(&logp, &old, &reference, &ent, &Tensor::from_slice(&[2.0f64]), &mask, &LossConfig::default());
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
        let p = policy_loss(&logp, &logp, &reference, &ent, &Tensor::from_slice(&[0.0f64]), &mask, &cfg);
        assert!((p.kl - (k3[0] + k3[1]) / 2.0).abs() < 1e-6);
        assert!((p.entropy - 1.0).abs() < 1e-6);
        let total = p.loss.double_value(&[]);
        assert!((total - (0.0 - 0.01 * 1.0 + 0.1 * p.kl)).abs() < 1e-6);
        // Token-mean vs sequence-mean: two rows of 1 and 3 tokens.
        let x = Tensor::from_slice(&[1.0f64, 0.0, 0.0, 3.0, 3.0, 3.0]).view([2, 3]).to_kind(Kind::Float);
        let m = Tensor::from_slice(&[1.0f64, 0.0, 0.0, 1.0, 1.0, 1.0]).view([2, 3]).to_kind(Kind::Float);
        assert!((aggregate(&x, &m, Aggregation::TokenMean).double_value(&[]) - 2.5).abs() < 1e-6);
        assert!((aggregate(&x, &m, Aggregation::SeqMeanTokenMean).double_value(&[]) - 2.0).abs() < 1e-6);
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
        );
        p.loss.backward();
        let g: Vec<f32> = Vec::try_from(logp.grad().view([-1])).unwrap();
        assert_eq!(g[1], 0.0, "observation token");
        assert!(g[0] < 0.0 && g[2] < 0.0, "{g:?}");
    }
}
