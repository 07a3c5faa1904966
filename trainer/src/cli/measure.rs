//! `trainer budget`, `bench`, `parity`, `plan` and `view`: the commands that measure, compare and
//! show.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use grove_trainer::engine::optim::OptimState;
use grove_trainer::measure::bench::{BenchOptions, BenchRow};
use grove_trainer::rl::method::Method;

use super::args::{ModelArgs, RolloutArgs, load};

#[derive(Debug, Args)]
pub(super) struct BudgetArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    rollout: RolloutArgs,
}

impl BudgetArgs {
    pub(super) fn run(self) -> Result<()> {
        let l = self.model.load()?;
        let (client, tasks, agent) = self.rollout.resolve()?.context("trainer budget needs --env and --data")?;
        let rows = grove_trainer::measure::budget::compare(
            (&l.lm, &l.tok),
            &client,
            &tasks,
            &agent,
            &self.rollout.methods,
            0,
        )?;
        print!("{}", grove_trainer::measure::budget::format_rows(&rows));
        Ok(())
    }
}

#[derive(Debug, Args)]
pub(super) struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Only the tree vs chain rollout rows (needs `--env`): their timings on both schedules,
    /// without the generation and training figures.
    #[arg(long, requires = "env")]
    rollout_only: bool,
    /// Tokens sampled per sequence in the generation figures.
    #[arg(long, default_value_t = 64)]
    new_tokens: usize,
    /// Batch sizes of the generation figures (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    gen_batches: Vec<usize>,
    /// Timed runs per figure; the median is reported.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Sequences and tokens of the training forward + backward.
    #[arg(long, default_value_t = 4)]
    train_batch: usize,
    #[arg(long, default_value_t = 256)]
    train_len: usize,
    /// Multi-turn baseline: turns, tokens per turn, observation tokens between turns.
    #[arg(long, default_value_t = 4)]
    turns: usize,
    #[arg(long, default_value_t = 32)]
    turn_tokens: usize,
    #[arg(long, default_value_t = 200)]
    obs_tokens: usize,
    /// Also measure the peak memory of one training micro-batch of BxT tokens with the real
    /// Qwen2.5 vocabulary, full logits against chunked (e.g. `1x4096`; CPU).
    #[arg(long)]
    train_memory: Option<String>,
    /// Only time one training micro-batch of BxT tokens on --model with --logits and
    /// --checkpoint (e.g. `4x4096`), nothing else: run alone, the process's peak device memory
    /// is that path's.
    #[arg(long)]
    train_step: Option<String>,
    /// The logits path of --train-step: chunked (512 positions at a time) or full.
    #[arg(long, value_enum, default_value = "chunked")]
    logits: LogitsArg,
    /// Layer checkpointing in --train-step.
    #[arg(long)]
    checkpoint: bool,
    /// The policy of the rollout (default: --model); a policy that calls tools makes the tree
    /// and chain figures compare something.
    #[arg(long)]
    policy: Option<PathBuf>,
    #[command(flatten)]
    rollout: RolloutArgs,
    /// Print rows as JSON lines (`{"figure", "value", "unit", "note"}`) instead of the table.
    #[arg(long)]
    json: bool,
}

/// `--logits` of `trainer bench --train-step`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum LogitsArg {
    Chunked,
    Full,
}

/// `BxT`, e.g. `4x4096`.
fn batch_by_len(flag: &str, shape: &str) -> Result<(usize, usize)> {
    let parsed = shape.split_once('x').and_then(|(b, t)| Some((b.parse::<usize>().ok()?, t.parse::<usize>().ok()?)));
    parsed.filter(|(b, t)| *b > 0 && *t > 1).with_context(|| format!("{flag} {shape}: expected BxT, e.g. 1x4096"))
}

impl BenchArgs {
    pub(super) fn run(self) -> Result<()> {
        let l = self.model.load()?;
        if let Some(shape) = &self.train_step {
            use grove_trainer::rl::algo::update::LogitsPath;
            let shape = batch_by_len("--train-step", shape)?;
            let path = match self.logits {
                LogitsArg::Chunked => LogitsPath::Chunked(512),
                LogitsArg::Full => LogitsPath::Full,
            };
            let row =
                grove_trainer::measure::bench::train_step(&l.lm, &l.vs, shape, (path, self.checkpoint), self.repeats);
            self.print(vec![row]);
            return Ok(());
        }
        let opts = BenchOptions {
            new_tokens: self.new_tokens,
            gen_batches: self.gen_batches.clone(),
            repeats: self.repeats,
            train_batch: self.train_batch,
            train_len: self.train_len,
            turns: self.turns,
            turn_tokens: self.turn_tokens,
            obs_tokens: self.obs_tokens,
            ..Default::default()
        };
        let mut rows = vec![BenchRow::new(
            "libtorch threads",
            tch::get_num_threads().to_string(),
            "threads",
            format!("{:?}, {}", l.placement.device, self.model.model.display()),
        )];
        if !self.rollout_only {
            rows.extend(grove_trainer::measure::bench::run(&l.lm, &l.tok, &opts).rows);
        }
        if let Some(shape) = self.train_memory.as_ref().filter(|_| !self.rollout_only) {
            let (b, t) = batch_by_len("--train-memory", shape)?;
            match grove_trainer::measure::bench::train_memory(b, t) {
                Some(r) => rows.extend(r),
                None => eprintln!("training memory: /proc/self/status or clear_refs unavailable, not measured"),
            }
        }
        let methods = &self.rollout.methods;
        let tree = methods.iter().copied().find(|m| matches!(m, Method::Tree(_))).unwrap_or(Method::tree(2, 2, 1, 3));
        let chain = methods.iter().copied().find(|m| matches!(m, Method::Chain(_))).unwrap_or(Method::chain(4));
        match self.rollout.resolve()? {
            Some((client, tasks, agent)) => {
                let policy =
                    self.policy.as_deref().map(|p| load(p, self.model.device, self.model.precision)).transpose()?;
                let (plm, ptok) = policy.as_ref().map_or((&l.lm, &l.tok), |p| (&p.lm, &p.tok));
                let budget = grove_trainer::measure::bench::budget_rows(
                    (plm, ptok),
                    &client,
                    &tasks,
                    &agent,
                    (tree, chain),
                    self.repeats,
                )?;
                let name = self.policy.as_deref().unwrap_or(&self.model.model);
                rows.push(BenchRow::new(
                    "rollout policy",
                    name.file_name().map_or_else(|| name.display().to_string(), |n| n.to_string_lossy().into()),
                    "",
                    format!("{}, {} prompts", name.display(), tasks.len()),
                ));
                rows.extend(budget);
            }
            None => rows.extend(grove_trainer::measure::bench::budget_arithmetic(
                tree,
                self.rollout.agent.max_turns,
                self.rollout.sampling.max_new_tokens,
            )),
        }
        self.print(rows);
        Ok(())
    }

    fn print(&self, rows: Vec<BenchRow>) {
        if self.json {
            for r in rows {
                let line = r.to_json_line();
                println!("{line}");
            }
        } else {
            println!("{:<58} {:>14} {:<9} note", "trainer bench", "value", "unit");
            for r in rows {
                println!("{:<58} {:>14} {:<9} {}", r.figure, r.value, r.unit, r.note);
            }
        }
    }
}

#[derive(Debug, Args)]
pub(super) struct ParityArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Print the report as one JSON line.
    #[arg(long)]
    json: bool,
}

impl ParityArgs {
    pub(super) fn run(self) -> Result<()> {
        let placement = grove_trainer::engine::device::place_with(self.model.device, self.model.precision)?;
        let r = grove_trainer::engine::parity::check(&self.model.model, placement)?;
        if self.json {
            println!("{}", serde_json::to_string(&r)?);
        } else {
            println!(
                "{} {}: logits max |err| {:.3e} (scale {:.2}, tolerance {:.0e} x scale), greedy ids {}: {}",
                r.device,
                r.kind,
                r.logits_max_abs_err,
                r.logits_scale,
                r.relative_tolerance,
                if r.greedy_equal { "equal" } else { "differ" },
                if r.ok { "ok" } else { "FAILED" }
            );
        }
        if !r.ok {
            bail!("parity with transformers failed for {}", self.model.model.display());
        }
        Ok(())
    }
}

#[derive(Debug, Args)]
pub(super) struct ViewArgs {
    /// The run folder (`out_dir` of `trainer train`), or an experiment folder.
    run_dir: PathBuf,
    /// Where to listen (default 127.0.0.1:8450, or a free loopback port when it is taken); an
    /// address other than loopback lets other machines read the run.
    #[arg(long)]
    bind: Option<std::net::SocketAddr>,
}

impl ViewArgs {
    pub(super) fn run(self) -> Result<()> {
        grove_view::run(&self.run_dir, self.bind)?;
        Ok(())
    }
}

#[derive(Debug, Args)]
pub(super) struct PlanArgs {
    /// An HF folder whose `config.json` gives the shape (no weights are read).
    #[arg(long, conflicts_with = "shape", required_unless_present = "shape")]
    model: Option<PathBuf>,
    /// A built-in shape instead of a folder.
    #[arg(long, value_enum)]
    shape: Option<grove_trainer::engine::plan::Shape>,
    /// Weights in bf16 (CUDA) or f32.
    #[arg(long, value_enum, default_value = "bf16")]
    precision: PlanPrecision,
    /// Prompts per step and leaves per prompt (rows per step; the paper: 512 x 6).
    #[arg(long, default_value_t = 512)]
    prompts: usize,
    #[arg(long, default_value_t = 6)]
    leaves: usize,
    /// Tokens per row (the paper's 4,096).
    #[arg(long, default_value_t = 4096)]
    context: usize,
    /// Rows decoded at once during rollouts.
    #[arg(long, default_value_t = 64)]
    gen_rows: usize,
    /// Rows per training micro-batch.
    #[arg(long, default_value_t = 2)]
    micro_batch: usize,
    /// Positions projected to the vocabulary at once in training (0: all of a micro-batch).
    #[arg(long, default_value_t = 512)]
    logits_chunk: usize,
    /// Train without activation checkpointing.
    #[arg(long)]
    no_checkpoint: bool,
    /// No frozen reference model (kl_coef = 0).
    #[arg(long)]
    no_reference: bool,
    #[arg(long, value_enum, default_value_t = OptimState::default())]
    optim_state: OptimState,
    /// The card's memory, GiB (80 for an H100, 141 for an H200).
    #[arg(long, default_value_t = 80.0)]
    card_gib: f64,
    /// Fraction of the card kept free for the allocator, the CUDA context and fragmentation.
    #[arg(long, default_value_t = 0.1)]
    headroom: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum PlanPrecision {
    Bf16,
    F32,
}

impl PlanArgs {
    pub(super) fn run(self) -> Result<()> {
        use grove_trainer::engine::plan::{Shapes, plan};
        if !(0.0..1.0).contains(&self.headroom) || !self.card_gib.is_finite() || self.card_gib <= 0.0 {
            bail!("--headroom must be in [0, 1) and --card-gib above 0");
        }
        if self.context == 0 || self.micro_batch == 0 || self.gen_rows == 0 {
            bail!("--context, --micro-batch and --gen-rows must be at least 1");
        }
        let cfg = match (&self.model, self.shape) {
            (Some(dir), _) => {
                let path = dir.join("config.json");
                let text = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
                grove_trainer::engine::model::ModelConfig::from_json(&text)
                    .with_context(|| path.display().to_string())?
            }
            (None, Some(shape)) => shape.config(),
            (None, None) => bail!("give --model or --shape"),
        };
        let shapes = Shapes {
            weight_bytes: match self.precision {
                PlanPrecision::Bf16 => 2.0,
                PlanPrecision::F32 => 4.0,
            },
            gen_rows: self.gen_rows,
            context: self.context,
            micro_batch: self.micro_batch,
            logits_chunk: self.logits_chunk,
            checkpoint: !self.no_checkpoint,
            reference: !self.no_reference,
            optim_state: self.optim_state,
        };
        let rows = self.prompts * self.leaves;
        println!(
            "a step: {} prompts x {} leaves = {rows} rows of up to {} tokens, decoded {} at a time, trained {} at a time \
             ({} micro-batches)",
            self.prompts,
            self.leaves,
            self.context,
            self.gen_rows,
            self.micro_batch,
            rows.div_ceil(self.micro_batch)
        );
        print!("{}", plan(&cfg, &shapes).render(self.card_gib, self.headroom));
        Ok(())
    }
}
