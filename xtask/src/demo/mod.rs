//! `cargo xtask demo`: the whole system on a laptop. Sets up what is missing, builds the two
//! binaries, writes a synthetic multi-hop world, serves it with an env-server, warm-starts a small
//! policy trained from scratch (BPE tokenizer, Qwen2 model, scripted trajectories, SFT), runs a
//! short Tree-GRPO training with evaluation before and after, then shows the real
//! SmolLM2-135M-Instruct learning to search the same world: held-out EM before and after a short
//! SFT on scripted trajectories played through the env-server. `--full` also trains SmolLM2 for a
//! few Tree-GRPO steps from that warm start and evaluates it again on the same held-out questions,
//! and evaluates SmolLM2 as a ReAct agent on the FanOutQA questions the mini-Wikipedia corpus
//! answers.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::util;

mod ctx;
mod smollm2;

use ctx::read_eval_json;
pub(crate) use ctx::{Ctx, Server, smollm2_hf, start_server};
pub(crate) use smollm2::SMOLLM2_THREADS;
use smollm2::{SMOLLM2_RL_LR, smollm2_learns, smollm2_tree_grpo};

/// Knobs of the demo (`cargo xtask demo --help`).
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Where everything is written.
    #[arg(long, default_value = "runs/demo")]
    pub out: PathBuf,
    /// Tree-GRPO steps of the small policy.
    #[arg(long, default_value_t = 30)]
    pub steps: u64,
    /// Prompts per training step.
    #[arg(long, default_value_t = 16)]
    pub prompts: usize,
    /// SFT epochs of the warm start.
    #[arg(long, default_value_t = 3)]
    pub sft_epochs: usize,
    /// Times each training question is played by the scripted agent.
    #[arg(long, default_value_t = 3)]
    pub warm_passes: usize,
    /// Held-out questions per hop count (2 and 3 hops).
    #[arg(long, default_value_t = 50)]
    pub test_questions: usize,
    /// Held-out questions SmolLM2 is evaluated on before and after its warm start (a seeded
    /// sample of the world's held-out questions, the same before and after).
    #[arg(long, default_value_t = 60)]
    pub smollm2_questions: usize,
    /// Scripted trajectories (a seeded sample of one pass over the training questions) that
    /// SmolLM2 is fine-tuned on.
    #[arg(long, default_value_t = 96)]
    pub smollm2_trajectories: usize,
    /// Skip SmolLM2.
    #[arg(long)]
    pub skip_smollm2: bool,
    /// Tree-GRPO steps SmolLM2 takes after its warm start (`--full` only; 0: none).
    #[arg(long, default_value_t = 4)]
    pub smollm2_rl_steps: u64,
    /// Training prompts per SmolLM2 Tree-GRPO step (`--full` only).
    #[arg(long, default_value_t = 8)]
    pub smollm2_rl_prompts: usize,
    /// Also train SmolLM2 for a few Tree-GRPO steps after its warm start and evaluate it again,
    /// and evaluate SmolLM2 as a ReAct agent on FanOutQA over mini-Wikipedia (longer).
    #[arg(long)]
    pub full: bool,
    /// Build with `--release` (slower to build, faster to run).
    #[arg(long)]
    pub release: bool,
    /// Use the `trainer` and `env-server` in this folder instead of building them (a copy of
    /// `target/release/` kept with a run, so that later runs use the very binaries earlier ones did).
    #[arg(long, conflicts_with = "release")]
    pub bins: Option<PathBuf>,
    /// Learning rate of the small policy's RL.
    #[arg(long, default_value_t = DEMO_RL.lr)]
    pub rl_lr: f64,
    /// k3 KL coefficient of the small policy's RL.
    #[arg(long, default_value_t = DEMO_RL.kl)]
    pub rl_kl: f64,
    /// Sampling temperature of the small policy's rollouts.
    #[arg(long, default_value_t = DEMO_RL.temperature)]
    pub rl_temperature: f64,
    /// Seeds of the small policy's RL, one run each from the same warm start (`rl/` for the
    /// first, `rl-seed-N/` for the others); with several, the summary gives the paired
    /// difference after − before with its 95% interval.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub rl_seeds: Vec<u64>,
    /// The questions the small policy is evaluated on before and after RL: the held-out ones
    /// (the demo's figure), or a validation split of the *training* questions, on which settings
    /// are chosen without looking at held-out data. With `validation` the world keeps the last
    /// `VALIDATION_PER_HOPS` of its training questions per hop count out of the warm start and
    /// the RL (so they are as unseen as held-out questions) and evaluates on them; use a `--out`
    /// of its own.
    #[arg(long, value_enum, default_value = "held-out")]
    pub rl_eval_on: EvalOn,
    /// Keep the warm start already in `--out` (its world, trajectories and SFT policy) instead of
    /// making it again: for trying RL settings from one start.
    #[arg(long)]
    pub reuse_warm_start: bool,
}

impl DemoArgs {
    /// The small policy's RL at the settings the README's five seeds were run with.
    fn is_default_small_rl(&self) -> bool {
        self.steps == 30
            && self.prompts == 16
            && self.sft_epochs == 3
            && self.warm_passes == 3
            && self.test_questions == 50
            && self.rl_lr == DEMO_RL.lr
            && self.rl_kl == DEMO_RL.kl
            && self.rl_temperature == DEMO_RL.temperature
    }
}

/// Which questions judge the small policy's RL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EvalOn {
    HeldOut,
    Validation,
}

/// Training questions per hop count that `--rl-eval-on validation` keeps out of the warm start
/// and the RL, out of the world's 200.
const VALIDATION_PER_HOPS: usize = 50;

/// Training questions per hop count of the demo's world.
const TRAIN_PER_HOPS: usize = 200;

/// The small policy's RL settings in the demo.
pub(crate) struct DemoRl {
    pub lr: f64,
    pub kl: f64,
    pub temperature: f64,
}

/// The demo's defaults (see the README for how they were chosen).
pub(crate) const DEMO_RL: DemoRl = DemoRl { lr: 3e-4, kl: 0.001, temperature: 0.5 };

/// `--rl-eval-on validation`: the demo's world with its last [`VALIDATION_PER_HOPS`] training
/// questions per hop count left out of `world/` (so out of the warm start and the RL) and written
/// to `world/valid.jsonl`, the questions the RL settings are chosen on.
fn validation_world_server(ctx: &Ctx, test_questions: usize) -> Result<Server> {
    let keep = TRAIN_PER_HOPS - VALIDATION_PER_HOPS;
    let valid = ctx.out.join("world/valid.jsonl");
    if !valid.exists() {
        let _ = std::fs::remove_dir_all(ctx.out.join("world"));
        let _ = std::fs::remove_dir_all(ctx.out.join("world-full"));
        let (test, train) = (test_questions.to_string(), TRAIN_PER_HOPS.to_string());
        ctx.trainer(&["world", "--out", "world-full", "--train", &train, "--test", &test])?;
        let full = std::fs::read_to_string(ctx.out.join("world-full/train.jsonl"))?;
        let mut lines = String::new();
        for line in full.lines() {
            let row: serde_json::Value = serde_json::from_str(line).context("world-full/train.jsonl")?;
            let id = row["id"].as_str().context("a training question without an id")?;
            let index: usize = id.rsplit('-').next().and_then(|i| i.parse().ok()).context("a training id")?;
            if index >= keep {
                lines.push_str(line);
                lines.push('\n');
            }
        }
        let server = ctx.world_server_training(test_questions, keep)?;
        std::fs::write(&valid, lines)?;
        return Ok(server);
    }
    ctx.world_server_training(test_questions, keep)
}

pub fn run(root: &Path, args: &DemoArgs) -> Result<()> {
    let started = Instant::now();
    let ctx = Ctx::prepare(root, &args.out, args.release, args.bins.as_deref())?;
    let out = &ctx.out;
    let server = match args.rl_eval_on {
        EvalOn::HeldOut => ctx.world_server(args.test_questions)?,
        EvalOn::Validation => validation_world_server(&ctx, args.test_questions)?,
    };
    if args.reuse_warm_start && out.join("sft/model.safetensors").exists() {
        eprintln!("reusing the warm start in {}", out.join("sft").display());
    } else {
        ctx.warm_start(&server.url, args.warm_passes, args.sft_epochs)?;
    }

    util::banner("Tree-GRPO (2,2,1) from the SFT policy, evaluated before and after");
    let mut small = Vec::new();
    for &seed in &args.rl_seeds {
        let dir = rl_dir(args, seed);
        let file = format!("{dir}.toml");
        std::fs::write(out.join(&file), demo_train_config(&server.url, args, seed, &dir))?;
        let _ = std::fs::remove_dir_all(out.join(&dir));
        ctx.trainer(&["train", "--config", &file])?;
        let run = grove_rundir::RunDir::new(out.join(&dir));
        let per_step: Vec<f64> = run.metrics()?.iter().map(|m| m.reward_mean).collect();
        let rewards = per_step.chunks(10).map(|b| b.iter().sum::<f64>() / b.len() as f64).collect::<Vec<_>>();
        let (before, after) = (run.eval(0)?.greedy, run.eval(args.steps)?.greedy);
        small.push(SmallRun { seed, before, after, rewards, per_step });
    }
    let run = grove_rundir::RunDir::new(out.join(rl_dir(args, args.rl_seeds[0])));

    let smol = if args.skip_smollm2 { None } else { Some(smollm2_learns(&ctx, &server.url, args)?) };
    let smol_rl = if args.full && !args.skip_smollm2 && args.smollm2_rl_steps > 0 {
        let rl = smollm2_tree_grpo(&ctx, &server.url, args, SMOLLM2_RL_LR, "smollm2-rl")?;
        // The same steps on the same prompts with the same seed at learning rate 0: what the
        // evaluation gives when nothing is learned, so the reader can tell learning from noise.
        let control = smollm2_tree_grpo(&ctx, &server.url, args, "0", "smollm2-rl-control")?;
        Some((rl, control))
    } else {
        None
    };
    drop(server);

    let mut fanout = None;
    if args.full && !args.skip_smollm2 {
        util::banner("SmolLM2-135M-Instruct as a ReAct agent on FanOutQA (mini-Wikipedia env-server)");
        let hf = smollm2_hf(&ctx.trainer)?;
        let corpus = grove_datasets::assets::wiki_summaries_corpus();
        let server = start_server(&ctx.env_server, &corpus, &out.join("env-server-wiki.log"))?;
        let mut cmd = Command::new(&ctx.trainer);
        cmd.args(["--threads", SMOLLM2_THREADS, "eval"])
            .arg("--model")
            .arg(&hf)
            .args(["--env", &server.url, "--data"])
            .arg(grove_datasets::assets::fanoutqa_dev())
            .args(["--data-source", "fanoutqa", "--only", "answer_in_passage", "--max-turns", "3"])
            .args(["--max-new-tokens", "64", "--json"])
            .arg(out.join("smollm2-fanoutqa.json"));
        util::run_cmd(cmd.current_dir(out))?;
        fanout = read_eval_json(&out.join("smollm2-fanoutqa.json"))?.remove("all");
    }

    util::banner("demo summary");
    print_small(args, &small);
    if let Some((before, after)) = &smol {
        println!(
            "SmolLM2-135M-Instruct on held-out synthetic questions it was not trained on, greedy EM, before and after \
             SFT on {} scripted trajectories:",
            args.smollm2_trajectories
        );
        println!(
            "  {:<18} {:>9} {:>8} {:>8} {:>15} {:>14}",
            "data source", "questions", "before", "after", "tools/q before", "tools/q after"
        );
        for (src, b) in before {
            let a = after.get(src).cloned().unwrap_or_default();
            println!(
                "  {src:<18} {:>9} {:>8.3} {:>8.3} {:>15.2} {:>14.2}",
                b.questions, b.score, a.score, b.tool_calls_per_question, a.tool_calls_per_question
            );
        }
        if let Some((rl, control)) = &smol_rl {
            println!(
                "SmolLM2-135M-Instruct after {} Tree-GRPO (2,2,1) steps from that warm start ({} training prompts per \
                 step, lr {SMOLLM2_RL_LR}, fixed before any run), and the same steps at lr 0 (same seed and \
                 prompts: the control), same held-out questions:",
                args.smollm2_rl_steps, args.smollm2_rl_prompts
            );
            println!(
                "  {:<18} {:>9} {:>10} {:>8} {:>11} {:>14}",
                "data source", "questions", "after SFT", "after RL", "control", "tools/q after"
            );
            for (src, r) in &rl.eval {
                let a = after.get(src).cloned().unwrap_or_default();
                let c = control.eval.get(src).map_or(0.0, |c| c.score);
                println!(
                    "  {src:<18} {:>9} {:>10.3} {:>8.3} {c:>11.3} {:>14.2}",
                    r.questions, a.score, r.score, r.tool_calls_per_question
                );
            }
            println!("  training reward per step: {} (one seed; a step's mean over its prompts)", rl.rewards);
            println!("  control's training reward per step: {}", control.rewards);
        }
    }
    if let Some(s) = fanout {
        println!(
            "SmolLM2-135M-Instruct ReAct (no fine-tuning) on {} answerable FanOutQA questions: EM {:.3}, {:.2} tool \
             calls per question",
            s.questions, s.score, s.tool_calls_per_question
        );
    }
    println!("plots (reward, EM, KL, entropy, tool calls): {}/{}/*.svg", out.display(), rl_dir(args, args.rl_seeds[0]));
    let checkpoint = run.latest_checkpoint().context("the training run wrote no checkpoint")?;
    println!("checkpoint: {}", checkpoint.display());
    println!("demo took {:.1} min", started.elapsed().as_secs_f64() / 60.0);
    Ok(())
}

/// One seed of the small policy's RL: its evaluations before and after, and its training reward
/// per block of 10 steps.
struct SmallRun {
    seed: u64,
    before: grove_rundir::EvalReport,
    after: grove_rundir::EvalReport,
    rewards: Vec<f64>,
    per_step: Vec<f64>,
}

/// The run folder of the small policy's RL with `seed`.
fn rl_dir(args: &DemoArgs, seed: u64) -> String {
    let on = match args.rl_eval_on {
        EvalOn::HeldOut => "",
        EvalOn::Validation => "-validation",
    };
    if seed == args.rl_seeds[0] { format!("rl{on}") } else { format!("rl{on}-seed-{seed}") }
}

/// The small policy's part of the summary: per seed, and over seeds when there are several.
fn print_small(args: &DemoArgs, small: &[SmallRun]) {
    let on = match args.rl_eval_on {
        EvalOn::HeldOut => "held-out synthetic questions",
        EvalOn::Validation => "the validation split of the training questions (unseen by warm start and RL)",
    };
    println!(
        "small policy (from scratch, SFT warm start) on {on}, greedy EM, before and after {} Tree-GRPO steps (lr {:e}, \
         KL {}, T {}):",
        args.steps, args.rl_lr, args.rl_kl, args.rl_temperature
    );
    for run in small {
        println!("  seed {}:", run.seed);
        println!("    {:<18} {:>8} {:>8} {:>16}", "data source", "before", "after", "tools/q after");
        for (src, b) in &run.before {
            let (a, tools) = run.after.get(src).map_or((0.0, 0.0), |s| (s.score, s.tool_calls_per_question));
            println!("    {src:<18} {:>8.3} {a:>8.3} {tools:>16.2}", b.score);
        }
        let rewards = run.rewards.iter().map(|r| format!("{r:.3}")).collect::<Vec<_>>().join(" / ");
        println!("    training reward (training questions), mean per block of 10 steps: {rewards}");
        let steps = run.per_step.iter().map(|r| format!("{r:.3}")).collect::<Vec<_>>().join(" ");
        println!("    training reward per step: {steps}");
    }
    if args.rl_eval_on == EvalOn::HeldOut && small.len() == 1 && args.is_default_small_rl() {
        print_spread(&small[0]);
    }
    if small.len() > 1 {
        let score = |r: &grove_rundir::EvalReport| r.get("all").map_or(0.0, |s| s.score);
        let diffs: Vec<f64> = small.iter().map(|r| score(&r.after) - score(&r.before)).collect();
        let d = grove_rundir::stats::PairedDiff::of(&diffs);
        println!(
            "  over {} seeds, EM after − before: {:+.3} [{:+.3}, {:+.3}] (95% t interval; {} up, {} down)",
            d.n, d.mean, d.lo, d.hi, d.wins, d.losses
        );
    }
}

/// The held-out greedy EM (all 100 questions) after RL of each of the seeds 0-4 at the demo's
/// defaults, from the runs the README reports (`--rl-seeds 0,1,2,3,4`); the EM before RL is the
/// same warm start for every seed.
pub(crate) const DEMO_SPREAD: Option<DemoSpread> =
    Some(DemoSpread { before: 0.280, after: [0.440, 0.360, 0.430, 0.320, 0.340] });

/// What [`DEMO_SPREAD`] records.
pub(crate) struct DemoSpread {
    pub before: f64,
    pub after: [f64; 5],
}

/// Where this run's held-out EM after RL sits among the README's five seeds.
fn print_spread(run: &SmallRun) {
    let score = |r: &grove_rundir::EvalReport| r.get("all").map_or(0.0, |s| s.score);
    let (before, after) = (score(&run.before), score(&run.after));
    let Some(spread) = &DEMO_SPREAD else { return };
    let diffs: Vec<f64> = spread.after.iter().map(|a| a - spread.before).collect();
    let d = grove_rundir::stats::PairedDiff::of(&diffs);
    let (lo, hi) = spread.after.iter().fold((f64::MAX, f64::MIN), |(lo, hi), a| (lo.min(*a), hi.max(*a)));
    let below = spread.after.iter().filter(|a| **a < after - 1e-9).count();
    println!(
        "  this run: {before:.3} -> {after:.3} ({:+.3}); the README's 5 seeds at these settings: {:.3} -> {lo:.3} to \
         {hi:.3}, after − before {:+.3} [{:+.3}, {:+.3}] (95% t); this run is above {below} of them{}",
        after - before,
        spread.before,
        d.mean,
        d.lo,
        d.hi,
        if (before - spread.before).abs() > 1e-9 {
            " (its warm start differs from theirs: another machine or libtorch build gives other numbers)"
        } else {
            ""
        }
    );
}

/// The `trainer train` configuration of one seed of the demo's RL run.
fn demo_train_config(env: &str, args: &DemoArgs, seed: u64, dir: &str) -> String {
    let world = match args.rl_eval_on {
        EvalOn::HeldOut => world_keys(env),
        EvalOn::Validation => world_keys(env).replace("world/test.jsonl", "world/valid.jsonl"),
    };
    format!(
        r#"# Written by `cargo xtask demo`.
model = "sft"
{world}
out_dir = "{dir}"
seed = {seed}
steps = {steps}
prompts_per_step = {prompts}
method = {{ kind = "tree", m = 2, n = 2, l = 1, k = 3 }}
lr = {lr:e}
{rollout}
temperature = {temperature}
top_p = 0.95
kl_coef = {kl}
entropy_coef = 0.001
{batching}
eval_every = {steps}
eval_before = true
eval_sampled = false
save_every = 0
"#,
        steps = args.steps,
        prompts = args.prompts,
        lr = args.rl_lr,
        rollout = WORLD_ROLLOUT,
        temperature = args.rl_temperature,
        kl = args.rl_kl,
        batching = SMALL_POLICY_BATCHING,
    )
}

/// The `trainer train` keys naming the env-server and the world's files (paths relative to the
/// demo or experiment folder).
pub(crate) fn world_keys(env: &str) -> String {
    format!(
        r#"env = "{env}"
train_data = "world/train.jsonl"
eval_data = "world/test.jsonl"
prompt_template = "world/prompt.txt"
data_source = "synthetic""#
    )
}

/// The agent and loss settings of every RL run on the synthetic world (the demo's small policy,
/// SmolLM2 in `--full`, and `cargo xtask experiment`): the spec's where they translate (T = 1,
/// top-p 0.95, k3 KL 0.001, entropy 0.001; the warm-up is the method's unless a run sets it), at
/// most 4 turns of 48 new tokens, top-1 search.
pub(crate) const WORLD_RL_SETTINGS: &str = concat!(
    world_rollout!(),
    "
temperature = 1.0
top_p = 0.95
kl_coef = 0.001
entropy_coef = 0.001"
);

/// The rollout-shape keys of [`WORLD_RL_SETTINGS`] (a macro, so that both constants are one
/// literal), for a config that sets its own sampling and loss coefficients.
macro_rules! world_rollout {
    () => {
        "max_turns = 4
max_obs_tokens = 200
max_new_tokens = 48
max_response_tokens = 1024
max_context = 2048
topk = 1"
    };
}
use world_rollout;

const WORLD_ROLLOUT: &str = world_rollout!();

/// Update batching of the small policy (the demo's RL run and the experiment): 4 mini-batches per
/// step, micro-batches of 8 rows. The demo's learning rate, 3e-4, is the one the experiment's sweep
/// chose on training reward for the strong start.
pub(crate) const SMALL_POLICY_BATCHING: &str = "micro_batch = 8
mini_batches = 4";
