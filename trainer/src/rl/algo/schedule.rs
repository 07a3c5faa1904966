//! Constant learning rate with linear warmup, stepped once per training step (spec §5.3): the
//! multiplier of step s (from 0) is min(1, s / max(1, W)) with W = floor(ratio x total steps), so
//! the first step runs with lr = 0 unless there is no warmup.

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmupConstant {
    pub lr: f64,
    pub warmup_steps: u64,
}

impl WarmupConstant {
    pub fn from_ratio(lr: f64, warmup_ratio: f64, total_steps: u64) -> Self {
        Self { lr, warmup_steps: (warmup_ratio * total_steps as f64).floor() as u64 }
    }

    pub fn lr_at(&self, step: u64) -> f64 {
        if self.warmup_steps == 0 {
            return self.lr;
        }
        self.lr * (step as f64 / self.warmup_steps.max(1) as f64).min(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_schedules() {
        let tree = WarmupConstant::from_ratio(1e-6, 0.285, 180);
        assert_eq!(tree.warmup_steps, 51);
        assert_eq!(tree.lr_at(0), 0.0);
        assert!((tree.lr_at(1) - 1e-6 / 51.0).abs() < 1e-18);
        assert_eq!(tree.lr_at(51), 1e-6);
        assert_eq!(tree.lr_at(179), 1e-6);
        assert_eq!(WarmupConstant::from_ratio(1e-6, 0.5, 180).warmup_steps, 90);
        let web = WarmupConstant::from_ratio(1e-6, 0.0, 34);
        assert_eq!(web.lr_at(0), 1e-6);
    }
}
