//! Our AdamW equals libtorch's, clips and skips like the reference, and resumes exactly.

use grove_trainer::engine::optim::{AdamW, AdamWConfig, OptimState, stochastic_bf16};
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

use crate::common::TORCH_RNG as RNG;

fn problem() -> (Tensor, Tensor) {
    let _guard = RNG.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(3);
    let x = Tensor::randn([64, 4], (Kind::Float, Device::Cpu));
    let y = x.matmul(&Tensor::from_slice(&[1.0f32, -2.0, 0.5, 3.0]).view([4, 1]));
    (x, y)
}

fn model(vs: &nn::VarStore) -> nn::Linear {
    let _guard = RNG.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(7);
    nn::linear(vs.root() / "fc", 4, 1, Default::default())
}

fn weights(vs: &nn::VarStore) -> Vec<f32> {
    let mut vars: Vec<_> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars.iter().flat_map(|(_, t)| Vec::<f32>::try_from(t.flatten(0, -1)).unwrap()).collect()
}

#[test]
fn matches_libtorch_adamw() {
    let (x, y) = problem();
    let cfg = AdamWConfig { max_grad_norm: None, ..Default::default() };
    let ours_vs = nn::VarStore::new(Device::Cpu);
    let ours = model(&ours_vs);
    let mut opt = AdamW::new(&ours_vs, cfg);
    let theirs_vs = nn::VarStore::new(Device::Cpu);
    let theirs = model(&theirs_vs);
    let mut topt =
        nn::AdamW { beta1: 0.9, beta2: 0.999, wd: 0.01, eps: 1e-8, amsgrad: false }.build(&theirs_vs, 0.05).unwrap();
    assert_eq!(weights(&ours_vs), weights(&theirs_vs));
    for _ in 0..20 {
        opt.zero_grad();
        ours.forward(&x).mse_loss(&y, tch::Reduction::Mean).backward();
        opt.step(0.05);
        topt.backward_step(&theirs.forward(&x).mse_loss(&y, tch::Reduction::Mean));
    }
    for (a, b) in weights(&ours_vs).iter().zip(weights(&theirs_vs)) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
}

#[test]
fn clipping_and_non_finite_gradients() {
    let (x, y) = problem();
    let vs = nn::VarStore::new(Device::Cpu);
    let m = model(&vs);
    let mut opt = AdamW::new(&vs, AdamWConfig::default());
    (m.forward(&x).mse_loss(&y, tch::Reduction::Mean) * 1000.0).backward();
    let norm = opt.grad_norm();
    assert!(norm > 1.0);
    let r = opt.step(0.01);
    assert!(r.applied && (r.grad_norm - norm).abs() < 1e-9);
    // A NaN gradient: the step is skipped and the gradients are zeroed.
    let before = weights(&vs);
    opt.zero_grad();
    (m.forward(&x).mse_loss(&y, tch::Reduction::Mean) * f64::NAN).backward();
    let r = opt.step(0.01);
    assert!(!r.applied);
    assert_eq!(weights(&vs), before);
    assert_eq!(opt.grad_norm(), 0.0);
    assert_eq!(opt.step, 1);
}

#[test]
fn save_and_resume_is_exact() {
    let (x, y) = problem();
    let run = |steps: usize, resume_at: Option<usize>| -> Vec<f32> {
        let vs = nn::VarStore::new(Device::Cpu);
        let m = model(&vs);
        let mut opt = AdamW::new(&vs, AdamWConfig::default());
        let dir = tempfile::tempdir().unwrap();
        for i in 0..steps {
            if Some(i) == resume_at {
                // Save everything, rebuild from scratch, load.
                let params = dir.path().join("p.safetensors");
                let state = dir.path().join("o.safetensors");
                vs.save(&params).unwrap();
                opt.save(&state).unwrap();
                let mut vs2 = nn::VarStore::new(Device::Cpu);
                let m2 = model(&vs2);
                vs2.load(&params).unwrap();
                let mut opt2 = AdamW::new(&vs2, AdamWConfig::default());
                opt2.load(&state).unwrap();
                for _ in i..steps {
                    opt2.zero_grad();
                    m2.forward(&x).mse_loss(&y, tch::Reduction::Mean).backward();
                    opt2.step(0.05);
                }
                return weights(&vs2);
            }
            opt.zero_grad();
            m.forward(&x).mse_loss(&y, tch::Reduction::Mean).backward();
            opt.step(0.05);
        }
        weights(&vs)
    };
    assert_eq!(run(10, None), run(10, Some(4)));
}

#[test]
fn bf16_parameters_keep_an_f32_master_copy() {
    let (x, y) = problem();
    let mut vs = nn::VarStore::new(Device::Cpu);
    let m = model(&vs);
    vs.set_kind(Kind::BFloat16);
    let config =
        AdamWConfig { weight_decay: 0.0, max_grad_norm: None, ..AdamWConfig::with_state(OptimState::F32Master) };
    let mut opt = AdamW::new(&vs, config);
    let weight = || vs.variables()["fc.weight"].to_kind(Kind::Float);
    let start = weight();
    assert_eq!(opt.master_copy("fc.weight").unwrap(), &start, "the master starts as the weights");
    opt.zero_grad();
    m.forward(&x.to_kind(Kind::BFloat16)).to_kind(Kind::Float).mse_loss(&y, tch::Reduction::Mean).backward();
    opt.step(1e-6);
    // A step far below bf16 resolution changes the f32 master but not the bf16 weights...
    let master = opt.master_copy("fc.weight").unwrap().shallow_clone();
    let moved = (&master - &start).abs().max().double_value(&[]);
    assert!(moved > 5e-7 && moved < 2e-6, "master moved by {moved}");
    assert_eq!(weight(), start);
    // ... and the weights are always the master rounded to bf16.
    assert_eq!(weight(), master.to_kind(Kind::BFloat16).to_kind(Kind::Float));
    // The master copy survives a save / load.
    let dir = tempfile::tempdir().unwrap();
    opt.save(&dir.path().join("o.safetensors")).unwrap();
    let mut opt2 = AdamW::new(&vs, AdamWConfig::with_state(OptimState::F32Master));
    opt2.load(&dir.path().join("o.safetensors")).unwrap();
    assert_eq!(opt2.master_copy("fc.weight").unwrap(), &master);
    assert_eq!(opt2.step, 1);
}

/// bf16 weights accumulate their gradients in f32 across micro-batches: a small second
/// micro-batch's gradient survives next to a large first one (bf16 alone would round
/// 1 + 0.001 back to 1), and the step and the gradient norm use the f32 sum.
#[test]
fn bf16_gradients_accumulate_in_f32() {
    let vs = nn::VarStore::new(Device::Cpu);
    let w = vs.root().ones("w", &[1]);
    let mut vs = vs;
    vs.bfloat16();
    let _ = w;
    let w = vs.variables()["w"].shallow_clone();
    assert_eq!(w.kind(), Kind::BFloat16);
    let mut opt = AdamW::new(&vs, AdamWConfig { max_grad_norm: None, ..Default::default() });
    opt.zero_grad();
    for scale in [1.0, 0.001] {
        (&w * scale).sum(Kind::Float).backward();
        opt.accumulate();
    }
    let g = opt.gradient_of("w").unwrap().double_value(&[0]);
    assert!((g - 1.001).abs() < 1e-5, "accumulated {g}");
    assert!((opt.grad_norm() - 1.001).abs() < 1e-5);
    // Without the f32 accumulator the same two backward passes sum in bf16.
    let plain_vs = nn::VarStore::new(Device::Cpu);
    let p = plain_vs.root().ones("p", &[1]);
    let mut plain_vs = plain_vs;
    plain_vs.bfloat16();
    let _ = p;
    let p = plain_vs.variables()["p"].shallow_clone();
    for scale in [1.0, 0.001] {
        (&p * scale).sum(Kind::Float).backward();
    }
    assert_eq!(p.grad().to_kind(Kind::Float).double_value(&[0]), 1.0, "bf16 rounds the sum");
    // A step clears nothing by itself; zero_grad clears the accumulator too.
    opt.step(0.1);
    opt.zero_grad();
    assert_eq!(opt.gradient_of("w").unwrap().double_value(&[0]), 0.0);
}

/// Stochastic rounding gives one of the two bf16 neighbours of each value, the same one for the
/// same (step, parameter), and rounds up about as often as the value's position between them
/// says: over many steps the mean is the f32 value.
#[test]
fn stochastic_rounding_is_exact_bf16_repeatable_and_unbiased() {
    // 1 + 0.3 ulp, -(1 + 0.75 ulp) (bf16's ulp at 1 is 2^-7), and an exact bf16 value.
    let ulp = 2f32.powi(-7);
    let x = Tensor::from_slice(&[1.0 + 0.3 * ulp, -(1.0 + 0.75 * ulp), 0.5f32]).repeat([4096]);
    let a = stochastic_bf16(&x, 3, 1);
    assert_eq!(a.kind(), Kind::BFloat16);
    assert_eq!(a, stochastic_bf16(&x, 3, 1), "the same step and parameter round the same way");
    assert_ne!(a, stochastic_bf16(&x, 4, 1), "another step rounds otherwise");
    let a = a.to_kind(Kind::Float).view([4096, 3]);
    let first: Vec<f32> = Vec::try_from(a.select(1, 0)).unwrap();
    assert!(first.iter().all(|v| *v == 1.0 || *v == 1.0 + ulp), "only the two neighbours");
    let up = first.iter().filter(|v| **v > 1.0).count() as f64 / first.len() as f64;
    assert!((up - 0.3).abs() < 0.03, "rounded up {up} of the time, not 0.3");
    let mean_neg = a.select(1, 1).mean(Kind::Double).double_value(&[]);
    assert!((mean_neg + 1.0 + 0.75 * ulp as f64).abs() < 0.03 * ulp as f64, "mean {mean_neg}");
    assert!(Vec::<f32>::try_from(a.select(1, 2)).unwrap().iter().all(|v| *v == 0.5), "exact values stay");
}

/// Updates far below bf16's spacing survive stochastic rounding in expectation, where plain
/// rounding would lose every one of them: 400 AdamW steps of about 1e-4 each move 1.0 to about
/// 0.96 with f32 master weights, and to about the same with stochastic rounding (16 bytes per
/// parameter) and with `compact` (12).
#[test]
fn small_updates_survive_without_a_master_copy() {
    let run = |state: OptimState| {
        let vs = nn::VarStore::new(Device::Cpu);
        let _w = vs.root().ones("w", &[256]);
        let mut vs = vs;
        vs.bfloat16();
        let w = vs.variables()["w"].shallow_clone();
        let mut opt =
            AdamW::new(&vs, AdamWConfig { weight_decay: 0.0, max_grad_norm: None, ..AdamWConfig::with_state(state) });
        for _ in 0..400 {
            opt.zero_grad();
            w.to_kind(Kind::Float).sum(Kind::Float).backward();
            opt.accumulate();
            opt.step(1e-4);
        }
        (w.to_kind(Kind::Float).mean(Kind::Double).double_value(&[]), opt.bytes_per_param())
    };
    let (master, master_bytes) = run(OptimState::F32Master);
    let (sr, sr_bytes) = run(OptimState::StochasticRounding);
    let (compact, compact_bytes) = run(OptimState::Compact);
    assert!((master - 0.96).abs() < 0.002, "f32 master: {master}");
    assert!((sr - master).abs() < 0.003, "stochastic rounding: {sr} against {master}");
    assert!((compact - master).abs() < 0.003, "compact: {compact} against {master}");
    assert_eq!((master_bytes, sr_bytes, compact_bytes), (20.0, 16.0, 12.0));
    // f32 parameters: weights, gradients and f32 moments, or bf16 moments.
    let f32_bytes = |state| {
        let vs = nn::VarStore::new(Device::Cpu);
        let _w = vs.root().ones("w", &[8]);
        AdamW::new(&vs, AdamWConfig::with_state(state)).bytes_per_param()
    };
    assert_eq!((f32_bytes(OptimState::StochasticRounding), f32_bytes(OptimState::Compact)), (16.0, 12.0));
}

/// `compact` keeps its moments in bf16 and a checkpoint restores them exactly.
#[test]
fn compact_state_saves_and_resumes_exactly() {
    let (x, y) = problem();
    let run = |steps: usize, restart_at: Option<usize>| {
        let mut vs = nn::VarStore::new(Device::Cpu);
        let m = model(&vs);
        vs.set_kind(Kind::BFloat16);
        let config = AdamWConfig::with_state(OptimState::Compact);
        let mut opt = AdamW::new(&vs, config);
        let dir = tempfile::tempdir().unwrap();
        for i in 0..steps {
            if restart_at == Some(i) {
                opt.save(&dir.path().join("o.safetensors")).unwrap();
                opt = AdamW::new(&vs, config);
                opt.load(&dir.path().join("o.safetensors")).unwrap();
            }
            opt.zero_grad();
            m.forward(&x.to_kind(Kind::BFloat16)).to_kind(Kind::Float).mse_loss(&y, tch::Reduction::Mean).backward();
            opt.accumulate();
            opt.step(1e-2);
        }
        vs.variables()["fc.weight"].to_kind(Kind::Float)
    };
    assert_eq!(run(6, None), run(6, Some(3)));
}
