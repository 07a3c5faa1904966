//! `trainer generate`, `train` and `experiment`: the commands that sample from a policy and train
//! it.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use grove_trainer::engine::generate::{Engine, SamplingParams};
use grove_trainer::engine::tokenizer::ChatMessage;
use grove_trainer::rl::algo::advantage::Estimator;
use grove_trainer::rl::method::Method;
use grove_trainer::rl::train::{RunOptions, TrainConfig};

use super::args::ModelArgs;

#[derive(Debug, Args)]
pub(super) struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt as a user message with the model's chat template.
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

impl GenerateArgs {
    pub(super) fn run(self) -> Result<()> {
        let l = self.model.load()?;
        let text = if self.chat {
            l.tok.apply_chat_template(&[ChatMessage::new("user", self.prompt)], true)?
        } else {
            self.prompt
        };
        let mut engine = Engine::new(&l.lm);
        let seq = engine.add(l.tok.encode(&text)?, self.seed)?;
        let params = SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: 0,
            max_new_tokens: self.max_new_tokens,
            stop: Vec::new(),
        };
        let t = Instant::now();
        let out = engine.generate(&[seq], &params, &l.tok)?.remove(0);
        let secs = t.elapsed().as_secs_f64();
        println!("{}", out.text);
        eprintln!(
            "{} tokens in {secs:.2} s ({:.1} tokens/s, prompt {} tokens, finish {:?})",
            out.tokens.len(),
            out.tokens.len() as f64 / secs,
            engine.stats.prefill_tokens,
            out.finish
        );
        Ok(())
    }
}

#[derive(Debug, Args)]
pub(super) struct TrainArgs {
    /// The run's TOML configuration.
    #[arg(long)]
    config: PathBuf,
    /// Continue from the latest checkpoint in the output folder.
    #[arg(long)]
    resume: bool,
    /// Override `steps`.
    #[arg(long)]
    steps: Option<u64>,
    /// Override `out_dir`.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Override `method`: `tree:M,N,L,K` or `chain:N`.
    #[arg(long)]
    method: Option<Method>,
    /// Override `estimator`: grpo, tree, tree_intra, tree_inter.
    #[arg(long)]
    estimator: Option<Estimator>,
}

impl TrainArgs {
    pub(super) fn run(self) -> Result<()> {
        let mut cfg = TrainConfig::from_file(&self.config)?;
        if let Some(s) = self.steps {
            cfg.steps = s;
        }
        if let Some(o) = self.out {
            cfg.out_dir = o;
        }
        if let Some(m) = self.method {
            cfg.method = m;
        }
        if let Some(e) = self.estimator {
            cfg.estimator = Some(e);
        }
        let step = cfg.step_config().with_context(|| format!("invalid configuration {}", self.config.display()))?;
        eprintln!(
            "{} with estimator {}, {} prompts x {} rows per step, {} steps, {} rollouts{}",
            cfg.method.label(),
            step.estimator,
            cfg.prompts_per_step,
            cfg.method.rows_per_prompt(),
            cfg.steps,
            cfg.rollout_schedule.name(),
            match cfg.rollout_max_rows {
                0 => String::new(),
                n => format!(" (at most {n} chains decoding at once)"),
            }
        );
        let opts = RunOptions { resume: self.resume, progress: true, label: "train".into() };
        let summary = grove_trainer::rl::train::run(&cfg, &opts)?;
        eprintln!("{} steps; checkpoints, metrics and plots in {}", summary.metrics.len(), summary.out_dir.display());
        Ok(())
    }
}

#[derive(Debug, Args)]
pub(super) struct ExperimentArgs {
    /// The experiment's TOML (`[train]`, `seeds`, `[[arms]]`, `[[regimes]]`, `[lr_sweep]`);
    /// default: the grid. Finished runs in the output folder are reused, so running the
    /// same command again resumes an interrupted experiment.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Starting checkpoint (overrides `train.model`).
    #[arg(long)]
    model: Option<PathBuf>,
    /// A `trainer world` folder: its train/test questions and prompt.
    #[arg(long)]
    world: Option<PathBuf>,
    #[arg(long)]
    env: Option<String>,
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long)]
    steps: Option<u64>,
    /// Comma-separated seeds.
    #[arg(long, value_delimiter = ',')]
    seeds: Option<Vec<u64>>,
    /// Train nothing: report the finished runs only (complete pairs), e.g. once an experiment's
    /// protocol says to stop.
    #[arg(long)]
    report_only: bool,
}

impl ExperimentArgs {
    pub(super) fn run(self) -> Result<()> {
        use grove_trainer::measure::experiment::{ExperimentConfig, format_table, outputs, run_experiment};
        let mut cfg: ExperimentConfig = match &self.config {
            Some(p) => toml::from_str(&std::fs::read_to_string(p).with_context(|| format!("read {}", p.display()))?)
                .with_context(|| format!("parse {}", p.display()))?,
            None => ExperimentConfig::default(),
        };
        if let Some(m) = self.model {
            cfg.train.model = m;
        }
        if let Some(w) = self.world {
            let files = grove_trainer::support::world::WorldFiles { dir: w };
            cfg.train.train_data = files.train();
            cfg.train.eval_data = Some(files.test());
            cfg.train.prompt_template = Some(files.prompt());
            cfg.train.data_source = "synthetic".into();
        }
        if let Some(e) = self.env {
            cfg.train.env = grove_trainer::rl::train::EnvUrls(vec![e]);
        }
        if let Some(o) = self.out {
            cfg.train.out_dir = o;
        }
        if let Some(s) = self.steps {
            cfg.train.steps = s;
        }
        if let Some(s) = self.seeds {
            cfg.seeds = s;
        }
        cfg.report_only = self.report_only;
        let results = run_experiment(&cfg, true)?;
        print!("{}", format_table(&results));
        for p in outputs(&cfg) {
            println!("wrote {}", p.display());
        }
        Ok(())
    }
}
