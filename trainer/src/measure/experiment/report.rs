//! The experiment's report: per-arm tables, paired differences tree − chain with their t
//! intervals (overall, per hop count, per evaluation step), the flatness rule, the floor next to
//! every EM, `table.md`, `results.json` and the curves.

use super::*;

fn score(report: &EvalReport, source: &str) -> f64 {
    report.get(source).map_or(0.0, |s| s.score)
}

/// The held-out EM of a run at `step` (the last evaluation when `None`).
fn em_at(run: &ArmRun, step: Option<u64>, source: &str) -> Option<f64> {
    let p = match step {
        Some(s) => run.summary.evals.iter().find(|p| p.step == s)?,
        None => run.summary.evals.last()?,
    };
    Some(score(&p.greedy, source))
}

/// One row of a regime's table: an arm's numbers over its seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableRow {
    pub label: String,
    pub budget: f64,
    pub seeds: usize,
    /// Final held-out EM, mean and standard deviation over seeds, per data source (and `all`).
    pub em: BTreeMap<String, (f64, f64)>,
    pub tool_calls_per_question: f64,
    /// Measured rollout cost per prompt, averaged over steps and seeds: training rows,
    /// generated tokens and tool calls.
    pub trajectories_per_prompt: f64,
    pub generated_tokens_per_prompt: f64,
    pub tool_calls_per_prompt: f64,
    /// Fraction of prompt groups whose rewards were all equal (zero advantage), over steps.
    pub zero_advantage_groups: f64,
    /// Mean distinct trajectories among a tree's leaves (1 for a chain), over steps.
    pub distinct_leaves_per_tree: f64,
    /// Training reward over the last half of the steps.
    pub final_training_reward: f64,
}

/// The held-out data sources of a regime (`all` last).
fn sources(r: &RegimeResults) -> Vec<String> {
    let mut s: Vec<String> = r.start.greedy.keys().filter(|k| *k != "all").cloned().collect();
    s.push("all".into());
    s
}

/// Aggregate the runs of each arm of a regime (in the config's order).
pub fn table_rows(cfg: &ExperimentConfig, r: &RegimeResults) -> Vec<TableRow> {
    let prompts = cfg.train.prompts_per_step.max(1) as f64;
    let sources = sources(r);
    cfg.arms
        .iter()
        .map(|arm| {
            let label = arm.label();
            let runs: Vec<&ArmRun> = r.runs.iter().filter(|x| x.arm == label).collect();
            let em = sources
                .iter()
                .map(|s| (s.clone(), mean_std(&runs.iter().filter_map(|x| em_at(x, None, s)).collect::<Vec<_>>())))
                .collect();
            let finals: Vec<&EvalReport> =
                runs.iter().filter_map(|x| x.summary.evals.last().map(|p| &p.greedy)).collect();
            let tools = mean_std(
                &finals.iter().map(|x| x.get("all").map_or(0.0, |s| s.tool_calls_per_question)).collect::<Vec<_>>(),
            )
            .0;
            let steps: Vec<&StepMetrics> = runs.iter().flat_map(|x| x.summary.metrics.iter()).collect();
            let over_steps =
                |f: &dyn Fn(&StepMetrics) -> f64| steps.iter().map(|m| f(m)).sum::<f64>() / steps.len().max(1) as f64;
            let half = cfg.train.steps.div_ceil(2);
            let tail: Vec<f64> = runs
                .iter()
                .map(|x| {
                    let t: Vec<f64> = x
                        .summary
                        .metrics
                        .iter()
                        .filter(|m| m.step + half >= cfg.train.steps)
                        .map(|m| m.reward_mean)
                        .collect();
                    mean_std(&t).0
                })
                .collect();
            TableRow {
                label,
                budget: arm.method.budget(),
                seeds: finals.len(),
                em,
                tool_calls_per_question: tools,
                trajectories_per_prompt: over_steps(&|m| m.rows as f64) / prompts,
                generated_tokens_per_prompt: over_steps(&|m| m.generated_tokens as f64) / prompts,
                tool_calls_per_prompt: over_steps(&|m| m.tool_calls as f64) / prompts,
                zero_advantage_groups: over_steps(&|m| m.zero_advantage_groups),
                distinct_leaves_per_tree: over_steps(&|m| m.distinct_leaves_per_tree),
                final_training_reward: mean_std(&tail).0,
            }
        })
        .collect()
}

/// Tree − chain at one budget, per held-out source, at the final evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub budget: f64,
    pub tree: String,
    pub chain: String,
    /// Paired over the seeds both arms finished.
    pub diff: BTreeMap<String, PairedDiff>,
    /// The same for every evaluation step: (step, all-source difference).
    pub by_step: Vec<(u64, PairedDiff)>,
}

/// Every (tree arm, chain arm) pair of equal budget in a regime.
pub fn comparisons(cfg: &ExperimentConfig, r: &RegimeResults) -> Vec<Comparison> {
    let mut out = Vec::new();
    for tree in cfg.arms.iter().filter(|a| a.is_tree()) {
        for chain in cfg.arms.iter().filter(|a| !a.is_tree() && a.method.budget() == tree.method.budget()) {
            let (tl, cl) = (tree.label(), chain.label());
            let pairs: Vec<(&ArmRun, &ArmRun)> = r
                .runs
                .iter()
                .filter(|x| x.arm == tl)
                .filter_map(|t| r.runs.iter().find(|c| c.arm == cl && c.seed == t.seed).map(|c| (t, c)))
                .collect();
            let diffs = |step: Option<u64>, s: &str| -> Vec<f64> {
                pairs.iter().filter_map(|(t, c)| Some(em_at(t, step, s)? - em_at(c, step, s)?)).collect()
            };
            let diff = sources(r).iter().map(|s| (s.clone(), PairedDiff::of(&diffs(None, s)))).collect();
            let mut steps: Vec<u64> = pairs.iter().flat_map(|(t, _)| t.summary.evals.iter().map(|p| p.step)).collect();
            steps.sort_unstable();
            steps.dedup();
            let by_step = steps.into_iter().map(|s| (s, PairedDiff::of(&diffs(Some(s), "all")))).collect();
            out.push(Comparison { budget: tree.method.budget(), tree: tl, chain: cl, diff, by_step });
        }
    }
    out
}

/// Whether an arm's curves have flattened by its last evaluation, by the rule the 2026-12-06
/// follow-up fixed in advance: the mean over seeds of held-out EM moves by less than
/// [`FLAT_EM`] between the last two evaluations, **and** the 95% interval over seeds of the
/// change in mean training reward between the last two blocks of `eval_every` steps contains 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Flatness {
    pub label: String,
    /// The two evaluation steps compared (the last two).
    pub steps: (u64, u64),
    /// Mean over seeds of the held-out EM change between them.
    pub em_change: f64,
    /// Per seed, mean training reward over the last block of steps minus the block before
    /// (blocks of `eval_every` steps, 1-based `steps.0 - eval_every + 1 ..= steps.0` against
    /// `steps.0 + 1 ..= steps.1`), with its interval over seeds.
    pub reward_change: PairedDiff,
    pub flat: bool,
}

/// A change of mean held-out EM smaller than this between the last two evaluations counts as flat.
pub const FLAT_EM: f64 = 0.01;

/// The flatness of each arm of a regime; none for an arm with fewer than two evaluations.
pub fn flatness(cfg: &ExperimentConfig, r: &RegimeResults) -> Vec<Flatness> {
    let mut out = Vec::new();
    for arm in &cfg.arms {
        let label = arm.label();
        let runs: Vec<&ArmRun> = r.runs.iter().filter(|x| x.arm == label).collect();
        let Some(first) = runs.first() else { continue };
        let evals: Vec<u64> = first.summary.evals.iter().map(|p| p.step).collect();
        let [.., a, b] = evals[..] else { continue };
        let em: Vec<f64> =
            runs.iter().filter_map(|x| Some(em_at(x, Some(b), "all")? - em_at(x, Some(a), "all")?)).collect();
        let em_change = mean_std(&em).0;
        // Metrics count steps from 0: 1-based step s is metric step s - 1.
        let block = |x: &ArmRun, lo: u64, hi: u64| {
            let v: Vec<f64> =
                x.summary.metrics.iter().filter(|m| m.step + 1 >= lo && m.step < hi).map(|m| m.reward_mean).collect();
            mean_std(&v).0
        };
        let width = b - a;
        let reward: Vec<f64> =
            runs.iter().map(|x| block(x, a + 1, b) - block(x, (a + 1).saturating_sub(width), a)).collect();
        let reward_change = PairedDiff::of(&reward);
        let flat = em_change.abs() < FLAT_EM && reward_change.lo <= 0.0 && reward_change.hi >= 0.0;
        out.push(Flatness { label, steps: (a, b), em_change, reward_change, flat });
    }
    out
}

/// Per evaluation step and held-out source, the paired difference tree − chain of one comparison.
fn diffs_by_step(r: &RegimeResults, c: &Comparison) -> Vec<(u64, BTreeMap<String, PairedDiff>)> {
    let pairs: Vec<(&ArmRun, &ArmRun)> = r
        .runs
        .iter()
        .filter(|x| x.arm == c.tree)
        .filter_map(|t| r.runs.iter().find(|x| x.arm == c.chain && x.seed == t.seed).map(|x| (t, x)))
        .collect();
    c.by_step
        .iter()
        .map(|(step, _)| {
            let per = sources(r)
                .into_iter()
                .map(|s| {
                    let d: Vec<f64> = pairs
                        .iter()
                        .filter_map(|(t, x)| Some(em_at(t, Some(*step), &s)? - em_at(x, Some(*step), &s)?))
                        .collect();
                    (s, PairedDiff::of(&d))
                })
                .collect();
            (*step, per)
        })
        .collect()
}

fn fmt_diff(d: &PairedDiff) -> String {
    if d.n < 2 {
        return format!("{:+.3} (n={})", d.mean, d.n);
    }
    format!("{:+.3} [{:+.3}, {:+.3}]", d.mean, d.lo, d.hi)
}

/// The tables of every regime as Markdown.
pub fn format_table(results: &ExperimentResults) -> String {
    let cfg = &results.config;
    let mut s = String::new();
    for r in &results.regimes {
        let srcs = sources(r);
        let _ = writeln!(
            s,
            "## Regime `{}`{}\n",
            r.regime.name,
            if r.regime.note.is_empty() { String::new() } else { format!(": {}", r.regime.note) }
        );
        match &r.sweep {
            Some(sw) => {
                let cands: Vec<String> = sw.reward.iter().map(|(lr, x)| format!("{lr:e}: {x:.4}")).collect();
                let _ = writeln!(
                    s,
                    "Learning rate {:e}, chosen on the training reward of the last {} steps (sweep: {}).\n",
                    r.lr,
                    sw.judged_steps,
                    cands.join(", ")
                );
            }
            None => {
                let _ = writeln!(s, "Learning rate {:e} (no sweep).\n", r.lr);
            }
        }
        s.push_str("| budget | method | seeds |");
        for src in &srcs {
            let _ = write!(s, " {src} EM |");
        }
        s.push_str(" tools/question | train reward (last half) | zero-adv. groups | distinct leaves/tree | trajectories/prompt | generated tokens/prompt | tool calls/prompt |\n|---|---|---|");
        for _ in 0..srcs.len() + 7 {
            s.push_str("---|");
        }
        s.push('\n');
        let _ = write!(s, "| - | start (before RL) | - |");
        for src in &srcs {
            let _ = write!(s, " {:.3} |", score(&r.start.greedy, src));
        }
        let _ = writeln!(
            s,
            " {:.2} | - | - | - | - | - | - |",
            r.start.greedy.get("all").map_or(0.0, |x| x.tool_calls_per_question)
        );
        for row in table_rows(cfg, r) {
            let _ = write!(s, "| ≈{} | {} | {} |", row.budget, row.label, row.seeds);
            for src in &srcs {
                let (m, sd) = row.em.get(src).copied().unwrap_or_default();
                let _ = write!(s, " {m:.3} ± {sd:.3} |");
            }
            let _ = writeln!(
                s,
                " {:.2} | {:.3} | {:.2} | {:.2} | {:.2} | {:.0} | {:.2} |",
                row.tool_calls_per_question,
                row.final_training_reward,
                row.zero_advantage_groups,
                row.distinct_leaves_per_tree,
                row.trajectories_per_prompt,
                row.generated_tokens_per_prompt,
                row.tool_calls_per_prompt
            );
        }
        s.push_str(
            "\nPaired difference tree − chain of final held-out EM, mean [95% CI] over seeds (wins/losses):\n\n",
        );
        table_header(&mut s, &["budget", "tree", "chain", "pairs"], &srcs);
        for c in comparisons(cfg, r) {
            let n = c.diff.get("all").map_or(0, |d| d.n);
            let _ = write!(s, "| ≈{} | {} | {} | {n} |", c.budget, c.tree, c.chain);
            diff_cells(&mut s, &c.diff, &srcs);
        }
        s.push('\n');
        format_by_step(&mut s, cfg, r, &srcs);
        if let Some(a) = &cfg.analysis {
            let floor = world_floor(&cfg.train.train_data);
            s.push_str(&analysis::format(cfg, r, a, floor.as_ref()));
        }
    }
    s
}

/// The no-search floor of the world whose training questions are `train_data`, when they are a
/// `trainer world` folder's.
fn world_floor(train_data: &Path) -> Option<crate::support::world::Floor> {
    let dir = train_data.parent()?;
    let spec = crate::support::world::WorldSpec::read(dir).ok()?;
    Some(spec.floor())
}

/// A markdown table's header and separator rows: the `fixed` columns, then one per `cols`.
fn table_header<T: std::fmt::Display>(s: &mut String, fixed: &[&str], cols: &[T]) {
    s.push('|');
    for c in fixed {
        let _ = write!(s, " {c} |");
    }
    for c in cols {
        let _ = write!(s, " {c} |");
    }
    s.push_str("\n|");
    for _ in 0..fixed.len() + cols.len() {
        s.push_str("---|");
    }
    s.push('\n');
}

/// The rest of a row: each source's paired difference with its wins and losses (`-` when the
/// source has none), then the end of the line.
fn diff_cells(s: &mut String, diffs: &BTreeMap<String, PairedDiff>, srcs: &[String]) {
    for src in srcs {
        match diffs.get(src) {
            Some(d) => {
                let _ = write!(s, " {} ({}/{}) |", fmt_diff(d), d.wins, d.losses);
            }
            None => s.push_str(" - |"),
        }
    }
    s.push('\n');
}

/// Per evaluation step: each arm's mean held-out EM over seeds, the paired differences per
/// source, and each arm's flatness by the rule of [`flatness`].
fn format_by_step(s: &mut String, cfg: &ExperimentConfig, r: &RegimeResults, srcs: &[String]) {
    let comps = comparisons(cfg, r);
    if comps.iter().all(|c| c.by_step.len() < 2) {
        return;
    }
    s.push_str("Held-out EM (all) by evaluation step, mean ± sd over seeds:\n\n");
    let mut steps: Vec<u64> = comps.iter().flat_map(|c| c.by_step.iter().map(|(k, _)| *k)).collect();
    steps.sort_unstable();
    steps.dedup();
    table_header(s, &["method", "0 (start)"], &steps);
    for arm in &cfg.arms {
        let label = arm.label();
        let _ = write!(s, "| {label} | {:.3} |", score(&r.start.greedy, "all"));
        for k in &steps {
            let v: Vec<f64> =
                r.runs.iter().filter(|x| x.arm == label).filter_map(|x| em_at(x, Some(*k), "all")).collect();
            let (m, sd) = mean_std(&v);
            let _ = write!(s, " {m:.3} ± {sd:.3} |");
        }
        s.push('\n');
    }
    for c in &comps {
        let _ = write!(
            s,
            "\nPaired difference {} − {} of held-out EM by evaluation step, mean [95% CI] (wins/losses):\n\n",
            c.tree, c.chain
        );
        table_header(s, &["step", "pairs"], srcs);
        for (step, per) in diffs_by_step(r, c) {
            let n = per.get("all").map_or(0, |d| d.n);
            let _ = write!(s, "| {step} | {n} |");
            diff_cells(s, &per, srcs);
        }
    }
    let flat = flatness(cfg, r);
    if flat.is_empty() {
        return;
    }
    let _ = write!(
        s,
        "\nFlat by the last evaluation? Flat when mean held-out EM moves by less than {FLAT_EM} between \
         the last two evaluations and the 95% CI over seeds of the change in mean training reward \
         between the last two blocks of steps contains 0:\n\n| method | evaluations | EM change | \
         training reward change [95% CI] | flat |\n|---|---|---|---|---|\n"
    );
    for f in &flat {
        let _ = writeln!(
            s,
            "| {} | {} → {} | {:+.3} | {} | {} |",
            f.label,
            f.steps.0,
            f.steps.1,
            f.em_change,
            fmt_diff(&f.reward_change),
            if f.flat { "yes" } else { "no, still moving" }
        );
    }
    s.push('\n');
}

/// Per evaluation step, the mean over seeds of each arm's held-out EM (the start at step 0).
fn em_series(cfg: &ExperimentConfig, r: &RegimeResults) -> Vec<(String, Vec<(f64, f64)>)> {
    cfg.arms
        .iter()
        .map(|arm| {
            let label = arm.label();
            let mut by: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
            by.entry(0).or_default().push(score(&r.start.greedy, "all"));
            for x in r.runs.iter().filter(|x| x.arm == label) {
                for p in &x.summary.evals {
                    by.entry(p.step).or_default().push(score(&p.greedy, "all"));
                }
            }
            (label, by.into_iter().map(|(k, v)| (k as f64, mean_std(&v).0)).collect())
        })
        .collect()
}

/// Per step, the mean over seeds of a step metric of each arm.
fn step_series(
    cfg: &ExperimentConfig,
    r: &RegimeResults,
    f: fn(&StepMetrics) -> f64,
) -> Vec<(String, Vec<(f64, f64)>)> {
    cfg.arms
        .iter()
        .map(|arm| {
            let label = arm.label();
            let mut by: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
            for x in r.runs.iter().filter(|x| x.arm == label) {
                for m in &x.summary.metrics {
                    by.entry(m.step + 1).or_default().push(f(m));
                }
            }
            (label, by.into_iter().map(|(k, v)| (k as f64, mean_std(&v).0)).collect())
        })
        .collect()
}

/// The plots of each regime, by file name.
const PLOTS: [&str; 3] = ["em_vs_step.svg", "reward_vs_step.svg", "zero_advantage_vs_step.svg"];

/// `table.md`, `results.json`, and per regime `<regime>-em_vs_step.svg`,
/// `<regime>-reward_vs_step.svg` and `<regime>-zero_advantage_vs_step.svg` (means over seeds).
pub fn write_outputs(results: &ExperimentResults, out: &Path) -> Result<()> {
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(results)?)?;
    std::fs::write(out.join("table.md"), format_table(results))?;
    let cfg = &results.config;
    for r in &results.regimes {
        let name = &r.regime.name;
        let charts = [
            (format!("{name}: held-out EM (greedy, mean over seeds)"), em_series(cfg, r)),
            (format!("{name}: training reward (mean over seeds)"), step_series(cfg, r, |m| m.reward_mean)),
            (
                format!("{name}: fraction of groups with equal rewards (mean over seeds)"),
                step_series(cfg, r, |m| m.zero_advantage_groups),
            ),
        ];
        for (file, (title, series)) in PLOTS.iter().zip(charts) {
            let series: Vec<(&str, Vec<(f64, f64)>)> = series.iter().map(|(l, p)| (l.as_str(), p.clone())).collect();
            std::fs::write(
                out.join(format!("{name}-{file}")),
                crate::support::plots::multi_line_chart(&title, "training step", &series),
            )?;
        }
    }
    Ok(())
}

/// Where the experiment writes, for printing.
pub fn outputs(cfg: &ExperimentConfig) -> Vec<PathBuf> {
    let out = &cfg.train.out_dir;
    let mut v = vec![out.join("table.md"), out.join("results.json")];
    for r in cfg.regimes() {
        v.extend(PLOTS.iter().map(|f| out.join(format!("{}-{f}", r.name))));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_differences_have_t_intervals() {
        // Five pairs: mean 0.02, sd 0.01581, half-width t(4) 2.776 x sd / sqrt(5) = 0.01963.
        let d = PairedDiff::of(&[0.01, 0.02, 0.03, 0.0, 0.04]);
        assert!((d.mean - 0.02).abs() < 1e-12);
        assert!((d.hi - d.mean - 2.776 * 0.0158113883 / 5f64.sqrt()).abs() < 1e-6, "{d:?}");
        assert_eq!((d.wins, d.losses, d.n), (4, 0, 5));
        let one = PairedDiff::of(&[0.1]);
        assert!(one.hi.is_infinite() && one.lo.is_infinite(), "one pair has no interval");
        assert_eq!(t_975(1), 12.706);
        assert!((t_975(40) - 2.021).abs() < 0.002 && (t_975(120) - 1.980).abs() < 0.002);
    }

    /// A run of 40 steps evaluated every 10, with EM `em[i]` at step 10(i+1) and training reward
    /// `reward(step)` (1-based step).
    fn run(arm: &str, seed: u64, em: [f64; 4], reward: impl Fn(u64) -> f64) -> ArmRun {
        let point = |step: u64, score: f64| {
            let mut greedy = EvalReport::new();
            greedy.insert("all".into(), grove_rundir::SourceScore { questions: 200, score, ..Default::default() });
            greedy.insert("hop2".into(), grove_rundir::SourceScore { questions: 100, score, ..Default::default() });
            EvalPoint { step, greedy, sampled: None, selection: None }
        };
        let metrics =
            (0..40).map(|m| StepMetrics { step: m, reward_mean: reward(m + 1), ..Default::default() }).collect();
        let evals = em.iter().enumerate().map(|(i, e)| point(10 * (i as u64 + 1), *e)).collect();
        ArmRun { arm: arm.into(), seed, summary: RunSummary { metrics, evals, out_dir: PathBuf::new() } }
    }

    #[test]
    fn flatness_follows_the_rule_fixed_before_the_follow_up() {
        let cfg = ExperimentConfig {
            arms: vec![Arm::new(Method::chain(4)), Arm::new(Method::tree(2, 2, 1, 3))],
            ..Default::default()
        };
        let (chain, tree) = (cfg.arms[0].label(), cfg.arms[1].label());
        let mut runs = Vec::new();
        for seed in 0..5u64 {
            let noise = [0.01, -0.02, 0.0, 0.02, -0.01][seed as usize];
            // Chain: EM moves 0.005 and the reward is flat after step 20 up to seed noise, whose
            // sign flips between the blocks, so its interval straddles 0.
            runs.push(run(&chain, seed, [0.40, 0.45, 0.470, 0.475], |s| {
                if s <= 20 {
                    0.3
                } else if s <= 30 {
                    0.5 + noise
                } else {
                    0.5 - noise
                }
            }));
            // Tree: still climbing, by 0.03 EM and 0.05 reward in every seed.
            runs.push(run(&tree, seed, [0.40, 0.45, 0.48, 0.51 + noise / 10.0], |s| {
                if s <= 30 { 0.5 } else { 0.55 + noise / 10.0 }
            }));
        }
        let start = run(&chain, 0, [0.3; 4], |_| 0.0).summary.evals[0].clone();
        let r = RegimeResults {
            regime: Regime { name: "strong".into(), model: PathBuf::new(), note: String::new() },
            start: EvalPoint { step: 0, ..start },
            sweep: None,
            lr: 3e-4,
            runs,
        };
        let f = flatness(&cfg, &r);
        assert_eq!(f.len(), 2);
        assert_eq!((f[0].label.as_str(), f[0].steps), (chain.as_str(), (30, 40)));
        assert!((f[0].em_change - 0.005).abs() < 1e-9, "{:?}", f[0]);
        // Per seed the change is -2 x noise: mean 0, an interval around 0.
        assert!(f[0].reward_change.mean.abs() < 1e-9 && f[0].reward_change.lo < 0.0 && f[0].reward_change.hi > 0.0);
        assert!(f[0].flat);
        assert!((f[1].em_change - 0.03).abs() < 1e-9 && f[1].reward_change.lo > 0.04, "{:?}", f[1]);
        assert!(!f[1].flat);

        let table = format_table(&ExperimentResults { config: cfg, regimes: vec![r] });
        assert!(table.contains("| 40 | 5 | +0.035 ["), "{table}");
        assert!(table.contains(&format!("| {chain} | 30 → 40 | +0.005 |")), "{table}");
        assert!(table.contains("no, still moving"), "{table}");
    }
}
