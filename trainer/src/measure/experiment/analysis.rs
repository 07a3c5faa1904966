//! The pre-registered analysis of a paired experiment (`[analysis]` of an experiment's TOML): a
//! primary metric per run (the mean greedy held-out EM over the last few evaluations, which is
//! less noisy than the last one alone), the paired difference tree − chain over the **complete**
//! pairs with its 95% t interval, the decision rules fixed before the runs, the power the design
//! achieved from the spread it measured, and the world's no-search floor beside every EM.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::{Deserialize, Serialize};

use crate::measure::experiment::{ArmRun, ExperimentConfig, PairedDiff, RegimeResults, comparisons, mean_std, t_975};
use crate::support::world::Floor;
use crate::workflows::eval::EvalPoint;

/// The protocol's analysis settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Analysis {
    /// A run's primary metric is its mean greedy held-out EM over this many last evaluations.
    pub last_evals: usize,
    /// "No effect of this size or more" when the whole interval lies inside (−margin, +margin).
    pub no_effect_margin: f64,
}

impl Analysis {
    pub fn check(&self) -> anyhow::Result<()> {
        if self.last_evals == 0 {
            anyhow::bail!("`analysis.last_evals` = 0: the primary metric needs at least one evaluation");
        }
        if !(self.no_effect_margin > 0.0 && self.no_effect_margin < 1.0) {
            anyhow::bail!("`analysis.no_effect_margin` = {}: must be in (0, 1)", self.no_effect_margin);
        }
        Ok(())
    }
}

/// The decision rules, applied in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The chain did not learn (its change from the start is not above 0): nothing is said
    /// about trees.
    Uninformative,
    TreeBetter,
    ChainBetter,
    /// The interval lies inside (−margin, +margin).
    NoEffect,
    Inconclusive,
}

impl Verdict {
    pub fn describe(self, margin: f64) -> String {
        match self {
            Verdict::Uninformative => "uninformative: the chain did not learn".into(),
            Verdict::TreeBetter => "tree better than chain".into(),
            Verdict::ChainBetter => "chain better than tree".into(),
            Verdict::NoEffect => format!("no effect of {:.0} points or more", margin * 100.0),
            Verdict::Inconclusive => "inconclusive".into(),
        }
    }
}

/// One tree arm against the chain arm of its budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Primary {
    pub tree: String,
    pub chain: String,
    /// Per complete pair: (seed, tree's primary metric, chain's).
    pub pairs: Vec<(u64, f64, f64)>,
    /// Tree − chain of the primary metric, per held-out source (`all` is the primary figure).
    pub diff: BTreeMap<String, PairedDiff>,
    /// The same on sampled evaluations, where the runs have them.
    pub sampled: Option<PairedDiff>,
    /// Each arm's primary metric minus the start's greedy EM, over its seeds in the pairs.
    pub chain_change: PairedDiff,
    pub tree_change: PairedDiff,
    /// Standard deviation over pairs of the primary difference.
    pub sd: f64,
    /// The smallest true difference this many pairs detect with 80% power at that spread.
    pub detectable_80: f64,
    /// Power to detect a true difference of `no_effect_margin` at that spread.
    pub power_at_margin: f64,
    pub verdict: Verdict,
}

/// The 0.80 quantile of Student's t with `df` degrees of freedom (one-sided 80%, for power).
pub fn t_80(df: usize) -> f64 {
    const T: [f64; 30] = [
        1.376, 1.061, 0.978, 0.941, 0.920, 0.906, 0.896, 0.889, 0.883, 0.879, 0.876, 0.873, 0.870, 0.868, 0.866, 0.865,
        0.863, 0.862, 0.861, 0.860, 0.859, 0.858, 0.858, 0.857, 0.856, 0.856, 0.855, 0.855, 0.854, 0.854,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => T[df - 1],
        _ => 0.8416 + 0.36 / df as f64,
    }
}

/// Standard normal CDF (Abramowitz and Stegun 26.2.17, error below 1e-7).
fn phi(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.231_641_9 * x.abs());
    let poly =
        t * (0.319_381_530 + t * (-0.356_563_782 + t * (1.781_477_937 + t * (-1.821_255_978 + t * 1.330_274_429))));
    let tail = (-x * x / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt() * poly;
    if x >= 0.0 { 1.0 - tail } else { tail }
}

/// Approximate power of a two-sided paired t test at level 0.05 to detect `delta` with `n` pairs
/// whose differences have standard deviation `sd`.
pub fn power(delta: f64, sd: f64, n: usize) -> f64 {
    if n < 2 || sd <= 0.0 {
        return if n >= 2 && delta != 0.0 { 1.0 } else { 0.0 };
    }
    let se = sd / (n as f64).sqrt();
    phi(delta.abs() / se - t_975(n - 1))
}

/// A run's primary metric on `source`: the mean greedy (or sampled) EM over its last `k`
/// evaluations; `None` when it has fewer.
fn primary_of(run: &ArmRun, k: usize, source: &str, sampled: bool) -> Option<f64> {
    let evals = &run.summary.evals;
    if evals.len() < k {
        return None;
    }
    let pick = |p: &EvalPoint| -> Option<f64> {
        let report = if sampled { p.sampled.as_ref()? } else { &p.greedy };
        Some(report.get(source)?.score)
    };
    let v: Option<Vec<f64>> = evals[evals.len() - k..].iter().map(pick).collect();
    v.map(|v| mean_std(&v).0)
}

/// The analysis of every (tree, chain) comparison of a regime, over its complete pairs.
pub fn analyse(cfg: &ExperimentConfig, r: &RegimeResults, a: &Analysis) -> Vec<Primary> {
    let start = r.start.greedy.get("all").map_or(0.0, |s| s.score);
    let mut sources: Vec<String> = r.start.greedy.keys().cloned().collect();
    sources.sort_by_key(|s| (s == "all", s.clone()));
    let mut out = Vec::new();
    for c in comparisons(cfg, r) {
        let pairs: Vec<(&ArmRun, &ArmRun)> = r
            .runs
            .iter()
            .filter(|x| x.arm == c.tree)
            .filter_map(|t| r.runs.iter().find(|x| x.arm == c.chain && x.seed == t.seed).map(|x| (t, x)))
            .filter(|(t, x)| {
                primary_of(t, a.last_evals, "all", false).is_some()
                    && primary_of(x, a.last_evals, "all", false).is_some()
            })
            .collect();
        let metric = |run: &ArmRun, s: &str| primary_of(run, a.last_evals, s, false).unwrap_or(0.0);
        let diff: BTreeMap<String, PairedDiff> = sources
            .iter()
            .map(|s| {
                (s.clone(), PairedDiff::of(&pairs.iter().map(|(t, x)| metric(t, s) - metric(x, s)).collect::<Vec<_>>()))
            })
            .collect();
        let sampled: Option<Vec<f64>> = pairs
            .iter()
            .map(|(t, x)| Some(primary_of(t, a.last_evals, "all", true)? - primary_of(x, a.last_evals, "all", true)?))
            .collect();
        let sampled = sampled.filter(|v| !v.is_empty()).map(|v| PairedDiff::of(&v));
        let chain_change = PairedDiff::of(&pairs.iter().map(|(_, x)| metric(x, "all") - start).collect::<Vec<_>>());
        let tree_change = PairedDiff::of(&pairs.iter().map(|(t, _)| metric(t, "all") - start).collect::<Vec<_>>());
        let d: Vec<f64> = pairs.iter().map(|(t, x)| metric(t, "all") - metric(x, "all")).collect();
        let (_, sd) = mean_std(&d);
        let n = d.len();
        let detectable_80 = if n >= 2 { (t_975(n - 1) + t_80(n - 1)) * sd / (n as f64).sqrt() } else { f64::INFINITY };
        let primary = diff.get("all").copied().unwrap_or_else(|| PairedDiff::of(&[]));
        out.push(Primary {
            tree: c.tree.clone(),
            chain: c.chain.clone(),
            pairs: pairs.iter().map(|(t, x)| (t.seed, metric(t, "all"), metric(x, "all"))).collect(),
            diff,
            sampled,
            chain_change,
            tree_change,
            sd,
            detectable_80,
            power_at_margin: power(a.no_effect_margin, sd, n),
            verdict: verdict(&primary, &chain_change, a.no_effect_margin),
        });
    }
    out
}

/// The protocol's rules, in order.
pub fn verdict(primary: &PairedDiff, chain_change: &PairedDiff, margin: f64) -> Verdict {
    if primary.n < 2 || chain_change.lo <= 0.0 {
        return Verdict::Uninformative;
    }
    if primary.lo > 0.0 {
        Verdict::TreeBetter
    } else if primary.hi < 0.0 {
        Verdict::ChainBetter
    } else if primary.lo > -margin && primary.hi < margin {
        Verdict::NoEffect
    } else {
        Verdict::Inconclusive
    }
}

fn fmt(d: &PairedDiff) -> String {
    if d.n < 2 {
        return format!("{:+.3} (n={})", d.mean, d.n);
    }
    format!("{:+.3} [{:+.3}, {:+.3}]", d.mean, d.lo, d.hi)
}

/// The analysis section of `table.md`.
pub fn format(cfg: &ExperimentConfig, r: &RegimeResults, a: &Analysis, floor: Option<&Floor>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "### Pre-registered analysis\n\nPrimary metric: each run's mean greedy held-out EM over its last {} \
         evaluations; complete pairs only. Start (greedy): {:.3}.{}\n",
        a.last_evals,
        r.start.greedy.get("all").map_or(0.0, |x| x.score),
        match floor {
            Some(f) => format!(" Floor (no-search answer-kind guess): {}.", f.describe()),
            None => String::new(),
        }
    );
    for p in analyse(cfg, r, a) {
        let primary = p.diff.get("all").copied().unwrap_or_else(|| PairedDiff::of(&[]));
        let _ = writeln!(s, "**{} − {}**, {} complete pairs:\n", p.tree, p.chain, p.pairs.len());
        let _ = writeln!(s, "| quantity | value |\n|---|---|");
        let _ = writeln!(
            s,
            "| primary difference (all), mean [95% t CI] | {} ({}/{}) |",
            fmt(&primary),
            primary.wins,
            primary.losses
        );
        for (src, d) in p.diff.iter().filter(|(k, _)| *k != "all") {
            let _ = writeln!(s, "| difference, {src} | {} |", fmt(d));
        }
        if let Some(d) = &p.sampled {
            let _ = writeln!(s, "| difference of sampled EM (all) | {} |", fmt(d));
        }
        let _ = writeln!(s, "| chain's change from the start | {} |", fmt(&p.chain_change));
        let _ = writeln!(s, "| tree's change from the start | {} |", fmt(&p.tree_change));
        let _ = writeln!(s, "| sd of the paired difference | {:.4} |", p.sd);
        let _ = writeln!(s, "| smallest difference detected with 80% power | {:.3} |", p.detectable_80);
        let _ = writeln!(s, "| power at ±{:.2} | {:.2} |", a.no_effect_margin, p.power_at_margin);
        let _ = writeln!(s, "| **verdict** | **{}** |\n", p.verdict.describe(a.no_effect_margin));
        let _ = writeln!(s, "| seed | tree | chain | tree − chain |\n|---|---|---|---|");
        for (seed, t, c) in &p.pairs {
            let _ = writeln!(s, "| {seed} | {t:.3} | {c:.3} | {:+.3} |", t - c);
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_quantiles_and_power_match_their_tables() {
        // (t(0.975, 29) + t(0.80, 29)) * 0.036 / sqrt(30) = 0.019, the protocol's power table.
        let mde = (t_975(29) + t_80(29)) * 0.036 / 30f64.sqrt();
        assert!((mde - 0.019).abs() < 5e-4, "{mde}");
        assert!((phi(0.0) - 0.5).abs() < 1e-7 && (phi(1.96) - 0.975).abs() < 1e-4);
        // At the detectable difference the power is about 0.8 (normal approximation).
        let p = power(mde, 0.036, 30);
        assert!((p - 0.8).abs() < 0.03, "{p}");
        assert_eq!(power(0.05, 0.0, 1), 0.0);
    }

    #[test]
    fn the_rules_apply_in_order() {
        let d = |mean: f64, lo: f64, hi: f64| PairedDiff { n: 30, mean, lo, hi, wins: 0, losses: 0 };
        let learns = d(0.05, 0.02, 0.08);
        assert_eq!(verdict(&d(0.05, 0.02, 0.08), &d(0.0, -0.01, 0.01), 0.03), Verdict::Uninformative);
        assert_eq!(verdict(&d(0.05, 0.02, 0.08), &learns, 0.03), Verdict::TreeBetter);
        assert_eq!(verdict(&d(-0.05, -0.08, -0.02), &learns, 0.03), Verdict::ChainBetter);
        assert_eq!(verdict(&d(0.0, -0.02, 0.02), &learns, 0.03), Verdict::NoEffect);
        assert_eq!(verdict(&d(0.01, -0.02, 0.04), &learns, 0.03), Verdict::Inconclusive);
    }
}
