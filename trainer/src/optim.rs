//! AdamW whose state can be saved and restored exactly (checkpoints must resume bit for bit), with
//! global grad-norm clipping that skips the step when the norm is not finite (spec §5.3).

use std::collections::BTreeMap;
use std::path::Path;

use tch::{Kind, Tensor, nn};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Global L2 norm the gradients are clipped to; `None` disables clipping.
    pub max_grad_norm: Option<f64>,
}

impl Default for AdamWConfig {
    /// The reference: betas (0.9, 0.999), eps 1e-8, weight decay 0.01, clip 1.0.
    fn default() -> Self {
        Self { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, max_grad_norm: Some(1.0) }
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
    /// f32 master copies of parameters stored in lower precision (bf16 on CUDA): updates too small
    /// for bf16 accumulate here instead of being rounded away.
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
        let exp_avg = params.iter().map(|(_, p)| zeros(p)).collect();
        let exp_avg_sq = params.iter().map(|(_, p)| zeros(p)).collect();
        let master =
            params.iter().map(|(_, p)| (p.kind() != Kind::Float).then(|| p.detach().to_kind(Kind::Float))).collect();
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
                let m = &mut self.exp_avg[i];
                let v = &mut self.exp_avg_sq[i];
                let _ = m.g_mul_scalar_(c.beta1).g_add_(&(&g * (1.0 - c.beta1)));
                let _ = v.g_mul_scalar_(c.beta2).g_add_(&(&g * &g * (1.0 - c.beta2)));
                let denom = (&*v / bc2).sqrt() + c.eps;
                let update = (&*m / bc1) / denom;
                let kind = p.kind();
                let current = match &self.master[i] {
                    Some(m) => m.shallow_clone(),
                    None => p.to_kind(Kind::Float),
                };
                let new = current * (1.0 - lr * c.weight_decay) - update * lr;
                p.copy_(&new.to_kind(kind));
                if let Some(m) = &mut self.master[i] {
                    m.copy_(&new);
                }
            }
        });
        StepReport { grad_norm, applied: true }
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
                *slot = t.to_device(p.device()).to_kind(Kind::Float);
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

#[derive(Debug, thiserror::Error)]
pub enum OptimStateError {
    #[error(transparent)]
    Read(#[from] tch::TchError),
    #[error("optimiser state has no `{0}`")]
    Missing(String),
    #[error("optimiser state `{0}` has the wrong shape")]
    Shape(String),
}
