//! `cargo xtask experiment`: chain GRPO against Tree-GRPO at budgets about 2 and 4, from a strong
//! and a weak warm start of the small synthetic-world policy, with a learning-rate sweep judged
//! on the training reward, paired seeds and confidence intervals (`trainer experiment` does the
//! runs and the statistics). Every finished run is reused, so the same command resumes an
//! interrupted experiment; `--quick` is a small check of the whole path.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::demo::{Ctx, SMALL_POLICY_BATCHING, WORLD_RL_SETTINGS, world_keys};
use crate::util;

/// Knobs of `cargo xtask experiment`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExperimentArgs {
    /// Where everything is written (default `runs/experiment`, or `runs/experiment-quick`). Its
    /// finished runs, world and warm starts are reused.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// A check of the whole path that fits in a few minutes: a small world, 2 steps of 4 prompts,
    /// 2 seeds, 2 candidate learning rates.
    #[arg(long)]
    pub quick: bool,
    /// Training steps of every arm (and of every sweep run).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Prompts per step.
    #[arg(long)]
    pub prompts: Option<usize>,
    /// Comma-separated seeds, paired across arms.
    #[arg(long)]
    pub seeds: Option<String>,
    /// Comma-separated candidate learning rates of the sweep.
    #[arg(long)]
    pub lrs: Option<String>,
    /// SFT epochs of the strong and of the weak warm start.
    #[arg(long, default_value_t = 4)]
    pub strong_epochs: usize,
    #[arg(long, default_value_t = 2)]
    pub weak_epochs: usize,
    /// Train the weak start on a seeded sample of this many of the scripted trajectories
    /// (default: all): a finer knob than whole epochs for where the weak start lands.
    #[arg(long)]
    pub weak_trajectories: Option<usize>,
    /// Held-out questions per hop count.
    #[arg(long)]
    pub test_questions: Option<usize>,
    #[arg(long)]
    pub release: bool,
    /// Use the `trainer` and `env-server` in this folder instead of building them: a protocol's
    /// later runs then use the very binaries its first runs did, whatever the tree has become.
    #[arg(long, conflicts_with = "release")]
    pub bins: Option<PathBuf>,
    /// Run only these regimes (repeatable; default both). A follow-up on one regime writes to
    /// its own `--out`.
    #[arg(long = "regime", value_enum)]
    pub regimes: Vec<RegimeKind>,
    /// Build the world and the warm starts, print each start's greedy EM on a seeded sample of
    /// 100 *training* questions, and stop before any training run: the check a protocol may
    /// use to choose a start, since it never reads held-out data.
    #[arg(long)]
    pub check_starts: bool,
    /// Run only the arms of these budgets (repeatable; default both).
    #[arg(long = "budget", value_enum)]
    pub budgets: Vec<BudgetKind>,
    /// Train every arm at this learning rate and run no sweep: for a follow-up that reuses the
    /// rate an earlier sweep chose (say which in its protocol).
    #[arg(long, conflicts_with = "lrs")]
    pub lr: Option<f64>,
    /// Evaluate on the held-out set every this many steps (default: half the steps).
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Warm up every arm's learning rate over this fraction of the steps (default: each method's
    /// own, from the spec: 0.285 for trees, 0.5 for chains). One value for both arms removes the
    /// difference in integrated learning rate between them.
    #[arg(long)]
    pub warmup_ratio: Option<f64>,
    /// Evaluate sampled (the rollout's temperature and top-p) as well as greedily, at the start
    /// and at every evaluation step.
    #[arg(long)]
    pub eval_sampled: bool,
    /// The pre-registered analysis: each run's primary metric is its mean greedy held-out EM over
    /// this many last evaluations, reported per regime in `table.md` with the decision rules.
    #[arg(long)]
    pub analysis_last_evals: Option<usize>,
    /// The analysis's "no effect" margin (with `--analysis-last-evals`).
    #[arg(long, default_value_t = 0.03, requires = "analysis_last_evals")]
    pub no_effect_margin: f64,
    /// Train nothing: analyse the finished runs (the record's, for `--record`) once, on complete
    /// pairs, as a protocol's stop rule says.
    #[arg(long)]
    pub report_only: bool,
    /// A folder to commit that makes the experiment resumable on another machine: it keeps the
    /// world and the warm starts (so every run of every session starts from the same weights)
    /// and, as each run finishes, its configuration, metrics and evaluations. What it holds is
    /// copied into `--out` first; a file there that differs from the record is an error.
    #[arg(long)]
    pub record: Option<PathBuf>,
}

/// The two budgets of the experiment: chains of 2 against trees of (1, 2, 1), chains of 4
/// against trees of (2, 2, 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BudgetKind {
    #[value(name = "2")]
    Two,
    #[value(name = "4")]
    Four,
}

impl BudgetKind {
    fn arms(self) -> &'static str {
        match self {
            BudgetKind::Two => {
                "[[arms]]\nmethod = { kind = \"chain\", n = 2 }\n\n[[arms]]\nmethod = { kind = \"tree\", m = 1, n = 2, l = 1, k = 3 }\n"
            }
            BudgetKind::Four => {
                "[[arms]]\nmethod = { kind = \"chain\", n = 4 }\n\n[[arms]]\nmethod = { kind = \"tree\", m = 2, n = 2, l = 1, k = 3 }\n"
            }
        }
    }
}

/// The two warm starts of the experiment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RegimeKind {
    Strong,
    Weak,
}

impl RegimeKind {
    fn name(self) -> &'static str {
        match self {
            RegimeKind::Strong => "strong",
            RegimeKind::Weak => "weak",
        }
    }

    fn epochs(self, args: &ExperimentArgs) -> usize {
        match self {
            RegimeKind::Strong => args.strong_epochs,
            RegimeKind::Weak => args.weak_epochs,
        }
    }

    fn trajectories(self, args: &ExperimentArgs) -> Option<usize> {
        match self {
            RegimeKind::Strong => None,
            RegimeKind::Weak => args.weak_trajectories,
        }
    }

    fn note(self, args: &ExperimentArgs) -> String {
        match self.trajectories(args) {
            Some(t) => format!("SFT {} epochs on {t} of the scripted trajectories", self.epochs(args)),
            None => format!("SFT {} epochs on the scripted trajectories", self.epochs(args)),
        }
    }

    fn model(self) -> String {
        format!("sft-{}", self.name())
    }
}

/// The settings of a full or a quick experiment.
struct Plan {
    out: PathBuf,
    steps: u64,
    prompts: usize,
    seeds: String,
    lrs: String,
    test_questions: usize,
    train_questions: usize,
    passes: usize,
}

impl Plan {
    fn of(args: &ExperimentArgs) -> Plan {
        let (out, steps, prompts, seeds, lrs, test, train, passes) = if args.quick {
            ("runs/experiment-quick", 2, 4, "0,1", "3e-4,1e-3", 10, 40, 1)
        } else {
            ("runs/experiment", 20, 16, "0,1,2,3,4", "1e-4,3e-4,1e-3", 100, 200, 3)
        };
        Plan {
            out: args.out.clone().unwrap_or_else(|| PathBuf::from(out)),
            steps: args.steps.unwrap_or(steps),
            prompts: args.prompts.unwrap_or(prompts),
            seeds: args.seeds.clone().unwrap_or_else(|| seeds.into()),
            lrs: args.lrs.clone().unwrap_or_else(|| lrs.into()),
            test_questions: args.test_questions.unwrap_or(test),
            train_questions: train,
            passes,
        }
    }
}

/// The experiment's TOML: the spec's settings where they translate to this small policy
/// (T = 1, top-p 0.95, k3 KL 0.001, entropy 0.001, each method's warm-up ratio).
fn config(env: &str, plan: &Plan, args: &ExperimentArgs) -> String {
    format!(
        r#"# Written by `cargo xtask experiment`.
seeds = [{seeds}]
{record}
[train]
model = "{first}"
{world}
out_dir = "experiment"
steps = {steps}
prompts_per_step = {prompts}
{world_rl}
{batching}
eval_every = {eval_every}
eval_sampled = {eval_sampled}
save_every = 0
{warmup}{lr}{analysis}
{regimes}{arms}"#,
        seeds = plan.seeds,
        world = world_keys(env),
        world_rl = WORLD_RL_SETTINGS,
        batching = SMALL_POLICY_BATCHING,
        steps = plan.steps,
        prompts = plan.prompts,
        eval_every = args.eval_every.unwrap_or(plan.steps / 2).max(1),
        eval_sampled = args.eval_sampled,
        warmup = match args.warmup_ratio {
            Some(w) => format!("warmup_ratio = {w}\n"),
            None => String::new(),
        },
        lr = match args.lr {
            Some(lr) => format!("lr = {lr:e}\n"),
            None => format!("\n[lr_sweep]\nlrs = [{}]\nseeds = [1000]\njudge_last = 0.5\n", plan.lrs),
        },
        analysis = match args.analysis_last_evals {
            Some(k) => format!("\n[analysis]\nlast_evals = {k}\nno_effect_margin = {}\n", args.no_effect_margin),
            None => String::new(),
        },
        record = match &args.record {
            // The trainer's run folders are under `experiment/`; the record mirrors them there.
            Some(r) => format!("record = {}\n", toml_string(&r.join("experiment").display().to_string())),
            None => String::new(),
        },
        regimes = regimes_toml(args),
        arms = budgets(args).iter().map(|b| b.arms()).collect::<Vec<_>>().join("\n"),
        first = selected(args)[0].model(),
    )
}

/// The regimes `args` selects (both when none is named), in a fixed order.
fn selected(args: &ExperimentArgs) -> Vec<RegimeKind> {
    [RegimeKind::Strong, RegimeKind::Weak]
        .into_iter()
        .filter(|r| args.regimes.is_empty() || args.regimes.contains(r))
        .collect()
}

/// The budgets `args` selects (both when none is named), in a fixed order.
fn budgets(args: &ExperimentArgs) -> Vec<BudgetKind> {
    [BudgetKind::Two, BudgetKind::Four]
        .into_iter()
        .filter(|b| args.budgets.is_empty() || args.budgets.contains(b))
        .collect()
}

fn regimes_toml(args: &ExperimentArgs) -> String {
    let mut out = String::new();
    for r in selected(args) {
        out += &format!(
            "[[regimes]]\nname = \"{}\"\nmodel = \"{}\"\nnote = \"{}\"\n\n",
            r.name(),
            r.model(),
            r.note(args)
        );
    }
    out
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let escaped: String = s
        .chars()
        .flat_map(|c| match c {
            '"' => vec!['\\', '"'],
            '\\' => vec!['\\', '\\'],
            c => vec![c],
        })
        .collect();
    format!("\"{escaped}\"")
}

/// The folders of `--out` a record keeps whole: the world and the selected warm starts.
fn recorded_dirs(args: &ExperimentArgs) -> Vec<String> {
    std::iter::once("world".to_string()).chain(selected(args).iter().map(|r| r.model())).collect()
}

/// Copy the regular files directly in `from` into `to`; a file already in `to` must be equal.
fn mirror_files(from: &Path, to: &Path) -> Result<()> {
    if !from.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(to).with_context(|| format!("create {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("read {}", from.display()))? {
        let src = entry?.path();
        if !src.is_file() {
            continue;
        }
        let dst = to.join(src.file_name().context("a file without a name")?);
        if dst.exists() {
            if util::sha256_file(&dst)? != util::sha256_file(&src)? {
                bail!(
                    "{} and {} differ: the output folder and the record do not hold the same experiment; move one \
                     away",
                    src.display(),
                    dst.display()
                );
            }
            continue;
        }
        std::fs::copy(&src, &dst).with_context(|| format!("copy {} to {}", src.display(), dst.display()))?;
    }
    Ok(())
}

/// Chain GRPO against Tree-GRPO at budgets 2 and 4, from a strong and a weak warm start.
pub fn run(root: &Path, args: &ExperimentArgs) -> Result<()> {
    let plan = Plan::of(args);
    let mut args = args.clone();
    if let Some(r) = &args.record {
        std::fs::create_dir_all(r).with_context(|| format!("create {}", r.display()))?;
        args.record = Some(r.canonicalize()?);
    }
    let args = &args;
    let ctx = Ctx::prepare(root, &plan.out, args.release, args.bins.as_deref())?;
    if let Some(record) = &args.record {
        for dir in recorded_dirs(args) {
            mirror_files(&record.join(&dir), &ctx.out.join(&dir))?;
        }
    }
    if !ctx.out.join("world/world.toml").exists() {
        util::banner("synthetic world: corpus, training and held-out 2/3-hop questions");
        let (train, test) = (plan.train_questions.to_string(), plan.test_questions.to_string());
        ctx.trainer(&["world", "--out", "world", "--train", &train, "--test", &test])?;
    }
    let server = ctx.world_server(plan.test_questions)?;
    let missing: Vec<RegimeKind> =
        selected(args).into_iter().filter(|r| !ctx.out.join(r.model()).join("model.safetensors").exists()).collect();
    if !missing.is_empty() {
        if !ctx.out.join("warm.jsonl").exists() {
            util::banner("warm start: scripted agent through the env-server");
            ctx.play(&server.url, plan.passes)?;
        }
        if !ctx.out.join("init/model.safetensors").exists() {
            ctx.init_small()?;
        }
    }
    for r in missing {
        let (name, epochs) = (r.model(), r.epochs(args));
        util::banner(&format!("warm start `{name}`: {}", r.note(args)));
        ctx.sft_small_sample(&name, epochs, r.trajectories(args))?;
    }
    if let Some(record) = &args.record {
        for dir in recorded_dirs(args) {
            mirror_files(&ctx.out.join(&dir), &record.join(&dir))?;
        }
    }
    if args.check_starts {
        for r in selected(args) {
            let name = r.model();
            util::banner(&format!("`{name}`: greedy EM on 100 training questions (sample seed 0)"));
            ctx.eval_world("1", &name, &server.url, "world/train.jsonl", 100, &format!("{name}-train-check.json"))?;
        }
        return Ok(());
    }
    std::fs::write(ctx.out.join("experiment.toml"), config(&server.url, &plan, args))?;
    let names: Vec<&str> = selected(args).iter().map(|r| r.name()).collect();
    let budgets: Vec<&str> = budgets(args).iter().map(|b| if *b == BudgetKind::Two { "2" } else { "4" }).collect();
    util::banner(&format!(
        "experiment: chain GRPO against Tree-GRPO at budget {}, {} start",
        budgets.join(" and "),
        names.join(" and ")
    ));
    if args.report_only {
        return ctx.trainer(&["experiment", "--config", "experiment.toml", "--report-only"]);
    }
    ctx.trainer(&["experiment", "--config", "experiment.toml"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_folders_fill_the_output_and_refuse_a_different_file() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        std::fs::create_dir_all(a.join("sub")).unwrap();
        std::fs::write(a.join("model.safetensors"), "weights").unwrap();
        std::fs::write(a.join("sub/ignored"), "x").unwrap();
        mirror_files(&a, &b).unwrap();
        assert_eq!(std::fs::read_to_string(b.join("model.safetensors")).unwrap(), "weights");
        assert!(!b.join("sub").exists(), "only the folder's own files");
        mirror_files(&a, &b).unwrap();
        std::fs::write(b.join("model.safetensors"), "other weights").unwrap();
        let err = mirror_files(&a, &b).unwrap_err().to_string();
        assert!(err.contains("differ"), "{err}");
        mirror_files(&tmp.path().join("missing"), &b).unwrap();
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: ExperimentArgs,
    }

    #[test]
    fn the_record_is_a_top_level_key_of_the_experiment_toml() {
        use clap::Parser;
        let cli = Cli::parse_from(["experiment", "--record", "/kept", "--regime", "strong", "--lr", "3e-4"]);
        let toml = config("ws://127.0.0.1:1/", &Plan::of(&cli.args), &cli.args);
        let (record, first_table) = (toml.find("record = \"/kept/experiment\"\n").unwrap(), toml.find("\n[").unwrap());
        assert!(record < first_table, "a key after a table header belongs to that table:\n{toml}");
        let cli = Cli::parse_from(["experiment"]);
        assert!(!config("ws://127.0.0.1:1/", &Plan::of(&cli.args), &cli.args).contains("record"));
    }

    #[test]
    fn one_warmup_ratio_and_sampled_evaluation_reach_the_trainer_config() {
        use clap::Parser;
        let cli = Cli::parse_from(["experiment", "--lr", "3e-4", "--warmup-ratio", "0.285", "--eval-sampled"]);
        let toml = config("ws://127.0.0.1:1/", &Plan::of(&cli.args), &cli.args);
        // Both keys belong to `[train]`: after its header and before the next table's.
        let train = toml.find("[train]\n").unwrap();
        let next = train + toml[train..].find("\n[[").unwrap();
        for key in ["warmup_ratio = 0.285\n", "eval_sampled = true\n"] {
            let at = toml.find(key).unwrap_or_else(|| panic!("{key:?} missing:\n{toml}"));
            assert!(train < at && at < next, "{key:?} outside [train]:\n{toml}");
        }
        let cli = Cli::parse_from(["experiment", "--lr", "3e-4"]);
        let toml = config("ws://127.0.0.1:1/", &Plan::of(&cli.args), &cli.args);
        assert!(!toml.contains("warmup_ratio"), "each method's own warm-up by default:\n{toml}");
    }

    #[test]
    fn toml_strings_escape_quotes_and_backslashes() {
        assert_eq!(toml_string(r#"C:\runs "x""#), r#""C:\\runs \"x\"""#);
    }
}
