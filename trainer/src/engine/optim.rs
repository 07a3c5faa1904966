//! AdamW whose state can be saved and restored exactly (checkpoints must resume bit for bit), with
//! global grad-norm clipping that skips the step when the norm is not finite (spec §5.3).
//!
//! For parameters stored in bf16 (CUDA), [`OptimState`] chooses what is kept per parameter:
//! bf16 weights and gradients (2 + 2 bytes) always, an f32 gradient accumulator (4) so that a
//! mini-batch's micro-batches are summed in f32, the moments, and how updates smaller than bf16's
//! spacing survive:
//!
//! | state | master weights | moments | bytes per parameter |
//! |---|---|---|---|
//! | `stochastic-rounding` (default) | none: each update is rounded to bf16 stochastically, so it survives in expectation | f32 | 16 |
//! | `f32-master` | f32 copy | f32 | 20 |
//! | `compact` | none (stochastic rounding) | bf16 | 12 |
//!
//! f32 parameters (the CPU) keep f32 weights, gradients and moments: 16 bytes, or 12 with
//! `compact`. The stochastic rounding is seeded by the step and the parameter (a hash of each
//! element's index), not by a random generator, so a resumed run repeats it bit for bit.

use std::collections::BTreeMap;
use std::path::Path;

use tch::{Kind, Tensor, nn};

/// What AdamW keeps per parameter (the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum OptimState {
    /// bf16 weights updated with stochastic rounding, f32 moments: 16 B/param.
    #[default]
    StochasticRounding,
    /// An f32 master copy of bf16 weights, f32 moments: 20 B/param.
    F32Master,
    /// Stochastic rounding and bf16 moments: 12 B/param.
    Compact,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Global L2 norm the gradients are clipped to; `None` disables clipping.
    pub max_grad_norm: Option<f64>,
    pub state: OptimState,
}

impl Default for AdamWConfig {
    /// The reference: betas (0.9, 0.999), eps 1e-8, weight decay 0.01, clip 1.0.
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: Some(1.0),
            state: OptimState::default(),
        }
    }
}

impl AdamWConfig {
    /// The reference's settings with `state`.
    pub fn with_state(state: OptimState) -> Self {
        Self { state, ..Self::default() }
    }
}

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// False when the norm was not finite: nothing was updated and the gradients were zeroed.
    pub applied: bool,
}

#[derive(Debug)]
pub struct AdamW {
    pub config: AdamWConfig,
    params: Vec<(String, Tensor)>,
    /// f32 master copies of parameters stored in lower precision (bf16 on CUDA), with
    /// [`OptimState::F32Master`]: updates too small for bf16 accumulate here instead of being
    /// rounded away.
    master: Vec<Option<Tensor>>,
    /// f32 gradient accumulators of those same parameters: [`AdamW::accumulate`] moves each
    /// micro-batch's low-precision gradient in here, so a mini-batch's sum is not rounded to
    /// bf16 at every micro-batch.
    grad_acc: Vec<Option<Tensor>>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    /// Optimiser steps taken (for bias correction).
    pub step: i64,
}

impl AdamW {
    /// Over every trainable variable of `vs`, in name order.
    pub fn new(vs: &nn::VarStore, config: AdamWConfig) -> Self {
        let trainable: Vec<Tensor> = vs.trainable_variables();
        let mut params: Vec<(String, Tensor)> = vs
            .variables()
            .into_iter()
            .filter(|(_, t)| trainable.iter().any(|p| p.data_ptr() == t.data_ptr()))
            .collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        let zeros = |p: &Tensor| Tensor::zeros_like(p).to_kind(Kind::Float);
        let moment_kind = match config.state {
            OptimState::Compact => Kind::BFloat16,
            OptimState::StochasticRounding | OptimState::F32Master => Kind::Float,
        };
        let exp_avg = params.iter().map(|(_, p)| zeros(p).to_kind(moment_kind)).collect();
        let exp_avg_sq = params.iter().map(|(_, p)| zeros(p).to_kind(moment_kind)).collect();
        let master = params
            .iter()
            .map(|(_, p)| {
                (p.kind() != Kind::Float && config.state == OptimState::F32Master)
                    .then(|| p.detach().to_kind(Kind::Float))
            })
            .collect();
        let grad_acc = params.iter().map(|(_, p)| (p.kind() != Kind::Float).then(|| zeros(p))).collect();
        Self { config, params, master, grad_acc, exp_avg, exp_avg_sq, step: 0 }
    }

    pub fn zero_grad(&mut self) {
        for (i, (_, p)) in self.params.iter_mut().enumerate() {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.zero_();
            }
            if let Some(acc) = &mut self.grad_acc[i] {
                let _ = acc.zero_();
            }
        }
    }

    /// Move the gradients of low-precision parameters into their f32 accumulators (call after
    /// each micro-batch's backward); f32 parameters accumulate in place already.
    pub fn accumulate(&mut self) {
        tch::no_grad(|| {
            for (i, (_, p)) in self.params.iter_mut().enumerate() {
                let (Some(acc), mut g) = (&mut self.grad_acc[i], p.grad()) else { continue };
                if g.defined() {
                    let _ = acc.g_add_(&g.to_kind(Kind::Float));
                    let _ = g.zero_();
                }
            }
        });
    }

    /// The f32 gradient of parameter `i` the next step uses, if it has one.
    fn gradient(&self, i: usize) -> Option<Tensor> {
        let g = self.params[i].1.grad();
        match &self.grad_acc[i] {
            // What was accumulated, plus anything backpropagated since the last `accumulate`.
            Some(acc) if g.defined() => Some(acc + g.to_kind(Kind::Float)),
            Some(acc) => Some(acc.shallow_clone()),
            None => g.defined().then(|| g.to_kind(Kind::Float)),
        }
    }

    /// The f32 gradient the next step would use for the parameter `name`.
    pub fn gradient_of(&self, name: &str) -> Option<Tensor> {
        let i = self.params.iter().position(|(n, _)| n == name)?;
        self.gradient(i)
    }

    /// Global L2 norm of the current gradients, with one transfer from the device.
    pub fn grad_norm(&self) -> f64 {
        let squares: Vec<Tensor> = (0..self.params.len())
            .filter_map(|i| self.gradient(i))
            .map(|g| g.pow_tensor_scalar(2).sum(Kind::Float))
            .collect();
        if squares.is_empty() {
            return 0.0;
        }
        Tensor::stack(&squares, 0).sum(Kind::Double).sqrt().double_value(&[])
    }

    /// Clip, then one AdamW update with learning rate `lr`.
    pub fn step(&mut self, lr: f64) -> StepReport {
        let grad_norm = self.grad_norm();
        if !grad_norm.is_finite() {
            self.zero_grad();
            return StepReport { grad_norm, applied: false };
        }
        let scale = match self.config.max_grad_norm {
            Some(max) if grad_norm > max => max / (grad_norm + 1e-6),
            _ => 1.0,
        };
        self.step += 1;
        let c = self.config;
        let bc1 = 1.0 - c.beta1.powi(self.step as i32);
        let bc2 = 1.0 - c.beta2.powi(self.step as i32);
        tch::no_grad(|| {
            for i in 0..self.params.len() {
                let Some(g) = self.gradient(i) else { continue };
                let g = g * scale;
                let p = &mut self.params[i].1;
                // f32 moments are updated in place; bf16 ones (`compact`) in f32, then stored.
                let (m, v) = if self.exp_avg[i].kind() == Kind::Float {
                    let _ = self.exp_avg[i].g_mul_scalar_(c.beta1).g_add_(&(&g * (1.0 - c.beta1)));
                    let _ = self.exp_avg_sq[i].g_mul_scalar_(c.beta2).g_add_(&(&g * &g * (1.0 - c.beta2)));
                    (self.exp_avg[i].shallow_clone(), self.exp_avg_sq[i].shallow_clone())
                } else {
                    let m = self.exp_avg[i].to_kind(Kind::Float) * c.beta1 + &g * (1.0 - c.beta1);
                    let v = self.exp_avg_sq[i].to_kind(Kind::Float) * c.beta2 + &g * &g * (1.0 - c.beta2);
                    self.exp_avg[i].copy_(&m);
                    self.exp_avg_sq[i].copy_(&v);
                    (m, v)
                };
                let denom = (&v / bc2).sqrt() + c.eps;
                let update = (&m / bc1) / denom;
                let kind = p.kind();
                let current = match &self.master[i] {
                    Some(m) => m.shallow_clone(),
                    None => p.to_kind(Kind::Float),
                };
                let new = current * (1.0 - lr * c.weight_decay) - update * lr;
                match &mut self.master[i] {
                    Some(m) => {
                        p.copy_(&new.to_kind(kind));
                        m.copy_(&new);
                    }
                    None if kind == Kind::BFloat16 => {
                        p.copy_(&stochastic_bf16(&new, self.step, i as i64));
                    }
                    None => {
                        p.copy_(&new.to_kind(kind));
                    }
                }
            }
        });
        StepReport { grad_norm, applied: true }
    }

    /// Bytes kept per parameter: weights, gradients, gradient accumulators, master copies and
    /// moments, over every trainable parameter (gradients counted at the parameter's size,
    /// allocated or not yet).
    pub fn bytes_per_param(&self) -> f64 {
        let size = |t: &Tensor| t.numel() as f64 * t.kind().elt_size_in_bytes() as f64;
        let mut bytes = 0.0;
        let mut count = 0.0;
        for (i, (_, p)) in self.params.iter().enumerate() {
            count += p.numel() as f64;
            bytes += 2.0 * size(p) + size(&self.exp_avg[i]) + size(&self.exp_avg_sq[i]);
            bytes += self.master[i].as_ref().map_or(0.0, size) + self.grad_acc[i].as_ref().map_or(0.0, size);
        }
        if count == 0.0 { 0.0 } else { bytes / count }
    }

    /// The f32 master copy of a parameter kept in lower precision, if it has one.
    pub fn master_copy(&self, name: &str) -> Option<&Tensor> {
        let i = self.params.iter().position(|(n, _)| n == name)?;
        self.master[i].as_ref()
    }

    /// Save the moments, the f32 master weights (if any) and the step count as safetensors.
    pub fn save(&self, path: &Path) -> Result<(), tch::TchError> {
        let mut out: Vec<(String, Tensor)> = Vec::new();
        for (i, (name, _)) in self.params.iter().enumerate() {
            out.push((format!("exp_avg.{name}"), self.exp_avg[i].to_device(tch::Device::Cpu)));
            out.push((format!("exp_avg_sq.{name}"), self.exp_avg_sq[i].to_device(tch::Device::Cpu)));
            if let Some(m) = &self.master[i] {
                out.push((format!("master.{name}"), m.to_device(tch::Device::Cpu)));
            }
        }
        out.push(("step".into(), Tensor::from_slice(&[self.step])));
        Tensor::write_safetensors(&out, path)
    }

    /// Restore what [`AdamW::save`] wrote; every moment must be present with its shape.
    pub fn load(&mut self, path: &Path) -> Result<(), OptimStateError> {
        let saved: BTreeMap<String, Tensor> = Tensor::read_safetensors(path)?.into_iter().collect();
        let step = saved.get("step").ok_or_else(|| OptimStateError::Missing("step".into()))?;
        for (i, (name, p)) in self.params.iter().enumerate() {
            for (key, slot) in [
                (format!("exp_avg.{name}"), &mut self.exp_avg[i]),
                (format!("exp_avg_sq.{name}"), &mut self.exp_avg_sq[i]),
            ] {
                let t = saved.get(&key).ok_or_else(|| OptimStateError::Missing(key.clone()))?;
                if t.size() != p.size() {
                    return Err(OptimStateError::Shape(key));
                }
                *slot = t.to_device(p.device()).to_kind(slot.kind());
            }
        }
        for (i, (name, p)) in self.params.iter().enumerate() {
            if let Some(slot) = &mut self.master[i] {
                let key = format!("master.{name}");
                let t = saved.get(&key).ok_or_else(|| OptimStateError::Missing(key.clone()))?;
                *slot = t.to_device(p.device()).to_kind(Kind::Float);
            }
        }
        self.step = step.int64_value(&[0]);
        Ok(())
    }
}

/// `x` (f32) rounded to bf16 stochastically: up with probability equal to the distance from the
/// bf16 value below, so that small updates survive in expectation. The 16 bits dropped are
/// compared with a hash of (step, parameter, element index) rather than a random draw, so the
/// rounding repeats exactly when a run resumes.
pub fn stochastic_bf16(x: &Tensor, step: i64, param: i64) -> Tensor {
    let shape = x.size();
    let flat = x.contiguous().view([-1]);
    let n = flat.size()[0];
    // A 32-bit integer hash (multiply, xor-shift), wrapping; only its low 16 bits are used.
    let salt = (step.wrapping_mul(0x2545_F491) ^ param.wrapping_mul(0x9E37_79B9)) & 0x7FFF_FFFF;
    let mut h = Tensor::arange(n, (Kind::Int, x.device()));
    h = (h * 0x045D_9F3B_i64 + salt).bitwise_and(0x7FFF_FFFF_i64);
    h = h.bitwise_xor_tensor(&h.bitwise_right_shift_tensor_scalar(15));
    h = (h * 0x2C1B_3C6D_i64).bitwise_and(0x7FFF_FFFF_i64);
    h = h.bitwise_xor_tensor(&h.bitwise_right_shift_tensor_scalar(13));
    let noise = h.bitwise_and(0xFFFF_i64);
    // Adding to the bit pattern moves the magnitude up by up to one bf16 step; clearing the low
    // 16 bits then truncates it, which is an exact bf16 value.
    let bits = flat.view_dtype(Kind::Int) + noise;
    let rounded = bits.bitwise_and(-65_536_i64).view_dtype(Kind::Float);
    rounded.to_kind(Kind::BFloat16).view(shape.as_slice())
}

#[derive(Debug, thiserror::Error)]
pub enum OptimStateError {
    #[error(transparent)]
    Read(#[from] tch::TchError),
    #[error("optimiser state has no `{0}`")]
    Missing(String),
    #[error("optimiser state `{0}` has the wrong shape")]
    Shape(String),
}
