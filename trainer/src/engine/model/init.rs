//! Seeded initialisation of a fresh model, independent of libtorch's global RNG: each parameter
//! is filled from its own ChaCha8 stream keyed by the seed and the parameter's name, so the same
//! seed gives the same weights whatever other threads do with libtorch meanwhile, and in any
//! order of construction.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Tensor, nn};

/// HF-style initialisation: every matrix (`*.weight` that is not a norm) from normal(0, `std`),
/// biases zero, norms one. Deterministic in (`seed`, parameter name).
pub fn init_normal(vs: &nn::VarStore, seed: u64, std: f64) {
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    tch::no_grad(|| {
        for (name, mut var) in vars {
            if name.ends_with("norm.weight") {
                let _ = var.fill_(1.0);
            } else if name.ends_with(".weight") {
                let values = normal_values(seed, &name, var.numel(), std);
                let t = Tensor::from_slice(&values).reshape(var.size()).to_kind(var.kind()).to_device(var.device());
                var.copy_(&t);
            } else {
                let _ = var.zero_();
            }
        }
    });
}

/// `n` draws from normal(0, `std`) (Box-Muller) on the stream of (`seed`, `name`).
fn normal_values(seed: u64, name: &str, n: usize, std: f64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(fnv1a(name));
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        // u1 in (0, 1]: ln never sees zero.
        let u1 = 1.0 - rng.random::<f64>();
        let u2 = rng.random::<f64>();
        let r = (-2.0 * u1.ln()).sqrt() * std;
        let theta = std::f64::consts::TAU * u2;
        out.push((r * theta.cos()) as f32);
        if out.len() < n {
            out.push((r * theta.sin()) as f32);
        }
    }
    out
}

/// 64-bit FNV-1a: a stable hash of a parameter name (std's hasher may change between releases).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::{CausalLm, ModelConfig};

    fn tiny() -> (nn::VarStore, CausalLm) {
        let cfg = r#"{"model_type": "qwen2", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": true}"#;
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let lm = CausalLm::new(&vs.root(), ModelConfig::from_json(cfg).unwrap());
        (vs, lm)
    }

    fn flat(vs: &nn::VarStore) -> Vec<(String, Vec<f32>)> {
        let mut v: Vec<_> =
            vs.variables().into_iter().map(|(k, t)| (k, Vec::<f32>::try_from(t.flatten(0, -1)).unwrap())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    #[test]
    fn the_same_seed_gives_the_same_weights_whatever_the_global_rng_does() {
        let (a, _) = tiny();
        tch::manual_seed(1);
        init_normal(&a, 7, 0.02);
        let (b, _) = tiny();
        tch::manual_seed(2);
        let _ = Tensor::randn([1000], (tch::Kind::Float, tch::Device::Cpu));
        init_normal(&b, 7, 0.02);
        assert_eq!(flat(&a), flat(&b));
        let (c, _) = tiny();
        init_normal(&c, 8, 0.02);
        assert_ne!(flat(&a), flat(&c));
    }

    #[test]
    fn matrices_are_normal_norms_one_biases_zero() {
        let (vs, _) = tiny();
        // Built: everything zero but the norms, and no RNG drawn.
        for (name, v) in flat(&vs) {
            let want = if name.ends_with("norm.weight") { 1.0 } else { 0.0 };
            assert!(v.iter().all(|x| *x == want), "{name}");
        }
        init_normal(&vs, 3, 0.02);
        for (name, v) in flat(&vs) {
            if name.ends_with("norm.weight") {
                assert!(v.iter().all(|x| *x == 1.0), "{name}");
            } else if name.ends_with("bias") {
                assert!(v.iter().all(|x| *x == 0.0), "{name}");
            } else {
                let n = v.len() as f64;
                let mean = v.iter().map(|x| *x as f64).sum::<f64>() / n;
                let sd = (v.iter().map(|x| (*x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
                assert!(mean.abs() < 0.006 && (sd - 0.02).abs() < 0.006, "{name}: mean {mean}, sd {sd}");
            }
        }
    }
}
