//! The statistics every report of runs uses (experiments, the demo's seeds, `trainer view`): mean
//! and sample standard deviation, Student t quantiles, and the paired difference with its 95%
//! interval. One copy, so a table and a page never disagree.

use serde::{Deserialize, Serialize};

/// Mean and sample standard deviation (divisor n − 1; 0 for fewer than two values).
pub fn mean_std(xs: &[f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 { xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

/// The 0.975 quantile of Student's t with `df` degrees of freedom (two-sided 95%).
pub fn t_975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => T[df - 1],
        // Within 0.002 of the exact quantile above 30 degrees of freedom.
        _ => 1.960 + 2.5 / df as f64,
    }
}

/// Mean of paired differences with its 95% confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PairedDiff {
    pub n: usize,
    pub mean: f64,
    pub lo: f64,
    pub hi: f64,
    /// Pairs where the first arm scored higher / lower.
    pub wins: usize,
    pub losses: usize,
}

impl PairedDiff {
    pub fn of(diffs: &[f64]) -> Self {
        let (mean, sd) = mean_std(diffs);
        let half =
            if diffs.len() > 1 { t_975(diffs.len() - 1) * sd / (diffs.len() as f64).sqrt() } else { f64::INFINITY };
        PairedDiff {
            n: diffs.len(),
            mean,
            lo: mean - half,
            hi: mean + half,
            wins: diffs.iter().filter(|d| **d > 0.0).count(),
            losses: diffs.iter().filter(|d| **d < 0.0).count(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paired_interval_by_hand() {
        // diffs 0.1, 0.2, 0.3: mean 0.2, sd 0.1, half-width 4.303 * 0.1 / sqrt(3) = 0.2484.
        let d = PairedDiff::of(&[0.1, 0.2, 0.3]);
        assert!((d.mean - 0.2).abs() < 1e-12 && (d.hi - 0.4484).abs() < 1e-4 && (d.lo + 0.0484).abs() < 1e-4);
        assert_eq!((d.wins, d.losses, d.n), (3, 0, 3));
        assert!(PairedDiff::of(&[0.5]).hi.is_infinite());
        assert_eq!(mean_std(&[]), (0.0, 0.0));
        assert!((t_975(200) - 1.9725).abs() < 0.002);
    }
}
