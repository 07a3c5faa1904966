//! The `trainer` command line: one args struct per subcommand, built from the shared flag groups
//! of `args`, each turned into the library's typed settings in one place and handed to the
//! library, which owns every workflow (training, SFT, warm starts, evaluation, budgets).

mod args;
mod heartbeat;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use grove_trainer::algo::advantage::Estimator;
use grove_trainer::bench::{BenchOptions, BenchRow};
use grove_trainer::env::EnvClient;
use grove_trainer::eval::{EVAL_BATCH, evaluate, format_report};
use grove_trainer::generate::{Engine, SamplingParams};
use grove_trainer::method::Method;
use grove_trainer::openai::{Mode, OpenAiEvalConfig, OpenAiPolicy, evaluate_openai};
use grove_trainer::optim::{AdamW, AdamWConfig, OptimState};
use grove_trainer::tokenizer::ChatMessage;
use grove_trainer::train::{RunOptions, TrainConfig};

use args::{AgentArgs, DataArgs, EnvArgs, ModelArgs, OutArgs, SamplingArgs, load};

#[derive(Debug, Parser)]
#[command(name = "trainer", version, about = "Grove trainer: Tree-GRPO and chain GRPO for LLM search agents")]
pub struct Cli {
    /// libtorch's CPU threads, intra-op and inter-op alike. Pinned (not the core count) so that
    /// a command gives the same per-step numbers on every machine; raise it for speed on a large
    /// model on the CPU, at the cost of numbers that match only runs with the same count.
    #[arg(long, global = true, default_value = "1")]
    threads: std::num::NonZeroUsize,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate text from a prompt.
    Generate(GenerateArgs),
    /// Convert a llama-architecture GGUF file into a Hugging Face folder.
    ImportGguf(ImportArgs),
    /// Train with Tree-GRPO or chain GRPO against env-servers (`--config` TOML; see TrainConfig).
    Train(TrainArgs),
    /// Compare rollout methods (chain GRPO against Tree-GRPO at equal budget, ...) from one
    /// checkpoint with several seeds each; writes table.md, results.json and plots (`--config`
    /// TOML: `[train]`, `seeds`, `[[arms]]`).
    Experiment(ExperimentArgs),
    /// Evaluate a model as an agent through an env-server: EM / F1 per data source.
    Eval(EvalArgs),
    /// Supervised fine-tuning on trajectory JSONL (`{prompt, steps: [{action, observation}]}`):
    /// loss on the actions only; writes an HF folder.
    Sft(SftArgs),
    /// Play the synthetic world with the scripted, imperfect agent through an env-server and
    /// write the trajectories (SFT JSONL).
    Warmstart(WarmstartArgs),
    /// Write a synthetic multi-hop world: corpus.jsonl (wiki-18), train.jsonl and test.jsonl
    /// (disjoint 2- and 3-hop questions), prompt.txt and world.toml.
    World(WorldArgs),
    /// A small policy from scratch: a BPE tokenizer trained on a wiki-18 corpus (and QA
    /// questions as prompts), and a randomly initialised Qwen2 model, as an HF folder.
    InitSmall(InitSmallArgs),
    /// Rollout budget accounting: rollout methods on the same prompts, with what each cost
    /// (measured), next to their nominal budget (modelled).
    Budget(BudgetArgs),
    /// Compare a golden folder (an HF checkpoint with `cases.safetensors`, transformers' outputs)
    /// run here on a device and precision against transformers' logits and greedy ids.
    Parity(ParityArgs),
    /// Throughput of a model on this machine: generation, prefill, training, multi-turn
    /// generation with KV-prefix reuse against re-encoding; with --env and --data, also the
    /// budget rows of `trainer budget`.
    Bench(BenchArgs),
    /// The device memory of one training step, per component, from a model's shape and the
    /// run's shapes (the paper's by default), and whether it fits a card; nothing is allocated.
    Plan(PlanArgs),
    /// Serve a page of a run's rollout trees, transcripts and training curves (or of an experiment
    /// folder's arms side by side), offline, on loopback, until Ctrl-C; follows a run still training.
    View(ViewArgs),
}

impl Cli {
    pub fn run(self) -> Result<()> {
        grove_trainer::device::pin_threads(self.threads);
        // Off a terminal every long command says it is alive at least every 30 s.
        let _alive = match &self.command {
            Command::Generate(_) | Command::ImportGguf(_) | Command::World(_) | Command::View(_) | Command::Plan(_) => {
                None
            }
            other => Some(heartbeat::Heartbeat::start(&format!("trainer {}", command_name(other)))),
        };
        match self.command {
            Command::Generate(a) => a.run(),
            Command::ImportGguf(a) => a.run(),
            Command::Train(a) => a.run(),
            Command::Experiment(a) => a.run(),
            Command::Eval(a) => a.run(),
            Command::Sft(a) => a.run(),
            Command::Warmstart(a) => a.run(),
            Command::World(a) => a.run(),
            Command::InitSmall(a) => a.run(),
            Command::Budget(a) => a.run(),
            Command::Bench(a) => a.run(),
            Command::Parity(a) => a.run(),
            Command::View(a) => a.run(),
            Command::Plan(a) => a.run(),
        }
    }
}

/// The subcommand's name as typed.
fn command_name(c: &Command) -> &'static str {
    match c {
        Command::Generate(_) => "generate",
        Command::ImportGguf(_) => "import-gguf",
        Command::Train(_) => "train",
        Command::Experiment(_) => "experiment",
        Command::Eval(_) => "eval",
        Command::Sft(_) => "sft",
        Command::Warmstart(_) => "warmstart",
        Command::World(_) => "world",
        Command::InitSmall(_) => "init-small",
        Command::Budget(_) => "budget",
        Command::Bench(_) => "bench",
        Command::Parity(_) => "parity",
        Command::View(_) => "view",
        Command::Plan(_) => "plan",
    }
}

#[derive(Debug, Args)]
struct GenerateArgs {
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
    fn run(self) -> Result<()> {
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
struct ImportArgs {
    /// The GGUF file.
    gguf: PathBuf,
    #[command(flatten)]
    out: OutArgs,
}

impl ImportArgs {
    fn run(self) -> Result<()> {
        let out = &self.out.out;
        let s = grove_trainer::import::import_gguf(&self.gguf, out)?;
        println!(
            "wrote {} ({} tensors, {} parameters, vocab {}, tied embeddings: {})",
            out.display(),
            s.tensors,
            s.parameters,
            s.vocab,
            s.tied_embeddings
        );
        Ok(())
    }
}

#[derive(Debug, Args)]
struct TrainArgs {
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
    fn run(self) -> Result<()> {
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
            "{} with estimator {}, {} prompts x {} rows per step, {} steps",
            cfg.method.label(),
            step.estimator,
            cfg.prompts_per_step,
            cfg.method.rows_per_prompt(),
            cfg.steps
        );
        let opts = RunOptions { resume: self.resume, progress: true, label: "train".into() };
        let summary = grove_trainer::train::run(&cfg, &opts)?;
        eprintln!("{} steps; checkpoints, metrics and plots in {}", summary.metrics.len(), summary.out_dir.display());
        Ok(())
    }
}

#[derive(Debug, Args)]
struct ExperimentArgs {
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
    fn run(self) -> Result<()> {
        use grove_trainer::experiment::{ExperimentConfig, format_table, outputs, run_experiment};
        let mut cfg: ExperimentConfig = match &self.config {
            Some(p) => toml::from_str(&std::fs::read_to_string(p).with_context(|| format!("read {}", p.display()))?)
                .with_context(|| format!("parse {}", p.display()))?,
            None => ExperimentConfig::default(),
        };
        if let Some(m) = self.model {
            cfg.train.model = m;
        }
        if let Some(w) = self.world {
            let files = grove_trainer::world::WorldFiles { dir: w };
            cfg.train.train_data = files.train();
            cfg.train.eval_data = Some(files.test());
            cfg.train.prompt_template = Some(files.prompt());
            cfg.train.data_source = "synthetic".into();
        }
        if let Some(e) = self.env {
            cfg.train.env = grove_trainer::train::EnvUrls(vec![e]);
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

/// Which policy `trainer eval` evaluates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum EvalPolicy {
    Native,
    Openai,
    DirectOpenai,
}

#[derive(Debug, Args)]
struct EvalArgs {
    /// `native` (an HF folder, --model), `openai` (a ReAct agent served by an OpenAI-compatible
    /// server, --base-url / --model-name) or `direct-openai` (the same server answering without
    /// search: direct inference).
    #[arg(long, value_enum, default_value = "native")]
    policy: EvalPolicy,
    /// The HF model folder (native policy), or the served model's name (openai policies).
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long, default_value = "auto")]
    device: grove_trainer::device::DeviceRequest,
    /// Parameter precision of a native model: auto, f32 or bf16.
    #[arg(long, value_enum, default_value = "auto")]
    precision: grove_trainer::device::Precision,
    /// The OpenAI-compatible server, with or without `/v1` (API key: `OPENAI_API_KEY`).
    #[arg(long, default_value = "http://127.0.0.1:8001")]
    base_url: String,
    /// The served model's name (openai policies; default: `--model`).
    #[arg(long)]
    model_name: Option<String>,
    /// Questions in flight at once (openai policies).
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Retries of a model call on 429 / 5xx / timeouts (openai policies).
    #[arg(long, default_value_t = 3)]
    retries: u32,
    /// Per-request timeout in seconds (openai policies).
    #[arg(long, default_value_t = 120)]
    timeout_s: u64,
    #[command(flatten)]
    env: EnvArgs,
    #[command(flatten)]
    data: DataArgs,
    /// Evaluate a seeded random sample of this many questions (default: every question).
    #[arg(long)]
    max_questions: Option<usize>,
    /// Seed of that sample.
    #[arg(long, default_value_t = 0)]
    sample_seed: u64,
    /// Sample at T = 1, top-p 0.95 instead of decoding greedily.
    #[arg(long)]
    sampled: bool,
    #[arg(long, default_value_t = 500)]
    max_new_tokens: usize,
    #[command(flatten)]
    agent: AgentArgs,
    /// Write the report as JSON here too.
    #[arg(long)]
    json: Option<PathBuf>,
}

impl EvalArgs {
    fn run(self) -> Result<()> {
        let (tasks, selection) = self.data.sample(self.max_questions, self.sample_seed)?;
        eprintln!("evaluating on {selection} of {}", self.data.data.display());
        let sampling = SamplingParams {
            temperature: if self.sampled { 1.0 } else { 0.0 },
            top_p: if self.sampled { 0.95 } else { 1.0 },
            max_new_tokens: self.max_new_tokens,
            ..SamplingParams::default()
        };
        let agent = self.agent.agent(sampling)?;
        let report = if self.policy == EvalPolicy::Native {
            let model = self.model.as_ref().context("--policy native needs --model (a Hugging Face model folder)")?;
            let l = load(model, self.device, self.precision)?;
            let client = EnvClient::connect(&self.env.env, Default::default())?;
            evaluate(&l.lm, &l.tok, std::slice::from_ref(&client), &tasks, &agent, EVAL_BATCH, 0)?
        } else {
            let name = self
                .model_name
                .or_else(|| self.model.as_ref().map(|m| m.to_string_lossy().into_owned()))
                .context("--policy openai / direct-openai needs --model NAME (or --model-name)")?;
            let mut http = OpenAiPolicy::new(self.base_url, name);
            http.temperature = agent.sampling.temperature;
            http.max_tokens = agent.sampling.max_new_tokens;
            http.timeout = std::time::Duration::from_secs(self.timeout_s.max(1));
            http.retries = self.retries;
            let config = OpenAiEvalConfig {
                mode: if self.policy == EvalPolicy::Openai { Mode::Agent } else { Mode::Direct },
                max_turns: agent.max_turns,
                prompt_template: agent.prompt_template.clone(),
                topk: agent.topk,
                concurrency: self.concurrency,
            };
            evaluate_openai(&http, &self.env.env, Default::default(), &tasks, &config)?
        };
        print!("{}", format_report(&report));
        if let Some(path) = self.json {
            std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
        }
        Ok(())
    }
}

#[derive(Debug, Args)]
struct SftArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Trajectory JSONL.
    #[arg(long)]
    data: PathBuf,
    #[command(flatten)]
    out: OutArgs,
    #[arg(long, default_value_t = 1)]
    epochs: usize,
    #[arg(long, default_value_t = 1e-5)]
    lr: f64,
    /// Trajectories per optimiser step.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Train on a seeded random sample of this many trajectories (default: all of them).
    #[arg(long)]
    max_trajectories: Option<usize>,
    /// Seed of that sample.
    #[arg(long, default_value_t = 0)]
    sample_seed: u64,
    /// Skip measuring the action NLL before and after (two passes over the data without grad).
    #[arg(long)]
    no_nll: bool,
    /// What AdamW keeps per parameter: stochastic-rounding (16 bytes), f32-master (20) or
    /// compact (12); see `optim.rs`.
    #[arg(long, value_enum, default_value_t = OptimState::default())]
    optim_state: OptimState,
    /// Write each optimiser step's loss to this file, one JSON object per line (`epoch`,
    /// `step`, `loss`): the loss curve.
    #[arg(long)]
    losses: Option<PathBuf>,
}

impl SftArgs {
    fn run(self) -> Result<()> {
        use grove_trainer::sft::{SftConfig, SftProgress, load_trajectories, steps_per_epoch, tokenize, train};
        let l = self.model.load()?;
        let mut trajectories = load_trajectories(&self.data)?;
        let total = trajectories.len();
        if let Some(n) = self.max_trajectories
            && n < total
        {
            use rand::SeedableRng;
            use rand::seq::SliceRandom;
            trajectories.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(self.sample_seed));
            trajectories.truncate(n);
            eprintln!("a random sample of {n} of {total} trajectories (seed {})", self.sample_seed);
        }
        let rows = trajectories.iter().map(|t| tokenize(&l.tok, t)).collect::<Result<Vec<_>, _>>()?;
        let mut opt = AdamW::new(&l.vs, AdamWConfig::with_state(self.optim_state));
        eprintln!("optimiser: {:?}, {:.1} bytes per parameter", self.optim_state, opt.bytes_per_param());
        let cfg = SftConfig { epochs: self.epochs, lr: self.lr, batch: self.batch, measure_nll: !self.no_nll };
        let bar = indicatif::ProgressBar::new((cfg.epochs * steps_per_epoch(&rows, cfg.batch)) as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("sft {bar:30} {pos}/{len} {msg} ({eta})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        eprintln!("{} trajectories", rows.len());
        let mut losses = match &self.losses {
            Some(path) => Some(std::io::BufWriter::new(
                std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?,
            )),
            None => None,
        };
        let mut step = 0usize;
        let mut write_error = None;
        let report = train(&l.lm, &mut opt, &rows, cfg, &mut |p| match p {
            SftProgress::Step { epoch, loss } => {
                bar.set_message(format!("epoch {} loss {loss:.4}", epoch + 1));
                bar.inc(1);
                if let Some(out) = &mut losses {
                    use std::io::Write;
                    let line = serde_json::json!({ "epoch": epoch, "step": step, "loss": loss });
                    if let Err(e) = writeln!(out, "{line}") {
                        write_error.get_or_insert(e);
                    }
                }
                step += 1;
            }
            SftProgress::EpochDone { epoch, mean_loss } => {
                bar.suspend(|| eprintln!("epoch {}: mean step loss {mean_loss:.4}", epoch + 1));
            }
        });
        bar.finish_and_clear();
        if let Some(e) = write_error {
            return Err(e).context("write the loss curve");
        }
        if let Some(mut out) = losses {
            use std::io::Write;
            out.flush().context("write the loss curve")?;
        }
        if let (Some(before), Some(after)) = (report.nll_before, report.nll_after) {
            eprintln!("action NLL {before:.4} before SFT, {after:.4} after");
        }
        let model = &self.model.model;
        let config = std::fs::read_to_string(model.join("config.json"))?;
        let files: Vec<PathBuf> =
            ["tokenizer.json", "tokenizer_config.json"].iter().map(|f| model.join(f)).filter(|p| p.exists()).collect();
        grove_trainer::model::save_model(&l.vs, &config, &self.out.out, tch::Kind::Float, &files)?;
        println!("wrote {}", self.out.out.display());
        Ok(())
    }
}

#[derive(Debug, Args)]
struct WarmstartArgs {
    #[command(flatten)]
    env: EnvArgs,
    /// A folder written by `trainer world` (the env-server must serve its corpus); its training
    /// questions are played, with its prompt.
    #[arg(long)]
    world: PathBuf,
    /// Play each training question this many times (different random imperfections).
    #[arg(long, default_value_t = 1)]
    passes: usize,
    /// Search results per query (default: the env-server's).
    #[arg(long)]
    topk: Option<u32>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    out: OutArgs,
    /// Probability of answering before the last hop (a wrong answer).
    #[arg(long, default_value_t = 0.25)]
    early_answer: f64,
    /// Probability of searching the question text instead of the entity name.
    #[arg(long, default_value_t = 0.15)]
    vague_query: f64,
}

impl WarmstartArgs {
    fn run(self) -> Result<()> {
        use grove_trainer::scripted::{ScriptConfig, play_passes};
        for (flag, p) in [("--early-answer", self.early_answer), ("--vague-query", self.vague_query)] {
            if !(0.0..=1.0).contains(&p) {
                bail!("{flag} {p}: a probability in [0, 1]");
            }
        }
        let spec = grove_trainer::world::WorldSpec::read(&self.world)?;
        let files = grove_trainer::world::WorldFiles { dir: self.world.clone() };
        let world = spec.world();
        let (train, _) = spec.questions(&world);
        let client = EnvClient::connect(&self.env.env, Default::default())?;
        let prompt = std::fs::read_to_string(files.prompt())?;
        let cfg = ScriptConfig {
            early_answer: self.early_answer,
            vague_query: self.vague_query,
            seed: self.seed,
            prompt_template: Some(prompt),
            topk: self.topk,
            ..Default::default()
        };
        let played = play_passes(&world, &train, &client, &cfg, self.passes)?;
        let lines: Vec<String> =
            played.iter().map(|p| serde_json::to_string(&p.trajectory)).collect::<Result<_, _>>()?;
        std::fs::write(&self.out.out, lines.join("\n") + "\n")?;
        let correct = played.iter().filter(|p| p.correct).count();
        println!("wrote {} trajectories to {} ({correct} correct)", played.len(), self.out.out.display());
        Ok(())
    }
}

#[derive(Debug, Args)]
struct WorldArgs {
    #[command(flatten)]
    out: OutArgs,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value_t = 1)]
    scale: usize,
    /// Training questions per hop count.
    #[arg(long, default_value_t = 200)]
    train: usize,
    /// Held-out questions per hop count.
    #[arg(long, default_value_t = 50)]
    test: usize,
}

impl WorldArgs {
    fn run(self) -> Result<()> {
        let spec = grove_trainer::world::WorldSpec {
            seed: self.seed,
            scale: self.scale,
            train_per_hops: self.train,
            test_per_hops: self.test,
        };
        let files = spec.write(&self.out.out)?;
        println!(
            "wrote {} (corpus {}, train {}, test {})",
            files.dir.display(),
            files.corpus().display(),
            files.train().display(),
            files.test().display()
        );
        Ok(())
    }
}

#[derive(Debug, Args)]
struct InitSmallArgs {
    /// wiki-18 JSONL corpus a new BPE tokenizer is trained on.
    #[arg(long, required_unless_present = "tokenizer", conflicts_with = "tokenizer")]
    corpus: Option<PathBuf>,
    /// Use this folder's tokenizer (tokenizer.json, tokenizer_config.json) instead of training
    /// one: a small random model for an existing vocabulary.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// QA JSONL whose questions join the tokenizer's training text.
    #[arg(long)]
    questions: Option<PathBuf>,
    /// Agent prompt template (`{question}` placeholder): the questions join the training text
    /// as the prompts the model will read.
    #[arg(long)]
    prompt_template: Option<PathBuf>,
    #[command(flatten)]
    out: OutArgs,
    #[arg(long, default_value_t = 4096)]
    vocab: usize,
    #[arg(long, default_value_t = 128)]
    hidden: i64,
    #[arg(long, default_value_t = 4)]
    layers: i64,
    #[arg(long, default_value_t = 0)]
    seed: i64,
}

impl InitSmallArgs {
    fn run(self) -> Result<()> {
        use grove_trainer::scratch::{SmallModel, init_model, tokenizer_corpus, train_bpe};
        let template = self
            .prompt_template
            .as_ref()
            .map(|p| std::fs::read_to_string(p).with_context(|| format!("read {}", p.display())))
            .transpose()?;
        let out = &self.out.out;
        let vocab = match (&self.tokenizer, &self.corpus) {
            (Some(dir), _) => {
                std::fs::create_dir_all(out)?;
                for file in ["tokenizer.json", "tokenizer_config.json"] {
                    let from = dir.join(file);
                    if from.exists() {
                        std::fs::copy(&from, out.join(file)).with_context(|| format!("copy {}", from.display()))?;
                    }
                }
                grove_trainer::tokenizer::Tokenizer::from_dir(out)?.vocab_size()
            }
            (None, Some(corpus)) => {
                let texts = tokenizer_corpus(corpus, self.questions.as_deref(), template.as_deref())?;
                train_bpe(&texts, self.vocab, out)?
            }
            (None, None) => bail!("init-small needs --corpus or --tokenizer"),
        };
        let shape = SmallModel {
            hidden: self.hidden,
            layers: self.layers,
            intermediate: self.hidden * 3,
            ..SmallModel::default()
        };
        let params = init_model(out, vocab, shape, self.seed)?;
        println!("wrote {} (vocab {vocab}, {params} parameters)", out.display());
        Ok(())
    }
}

/// The rollouts of `trainer budget` and of `trainer bench --env`: the same prompts, agent and
/// methods.
#[derive(Debug, Args)]
struct RolloutArgs {
    /// An env-server serving the questions' corpus.
    #[arg(long)]
    env: Option<String>,
    /// Search-R1 parquet or QA JSONL of the rollout's prompts.
    #[arg(long)]
    data: Option<PathBuf>,
    #[arg(long, default_value = "nq")]
    data_source: String,
    /// Keep only rows whose metadata has this flag set (e.g. answer_in_passage).
    #[arg(long)]
    only: Option<String>,
    /// Prompts of the rollout, spread evenly over the data file.
    #[arg(long, default_value_t = 8)]
    prompts: usize,
    /// Rollout methods to compare (repeat the flag): `tree:M,N,L,K`, `chain:N`.
    #[arg(long = "method", default_values = ["tree:2,2,1,3", "chain:4"])]
    methods: Vec<Method>,
    #[command(flatten)]
    agent: AgentArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
}

impl RolloutArgs {
    /// The server, prompts and agent, or `None` when no server or data was named.
    fn resolve(
        &self,
    ) -> Result<Option<(EnvClient, Vec<grove_protocol::TaskSpec>, grove_trainer::rollout::agent::AgentConfig)>> {
        let (Some(env), Some(data)) = (&self.env, &self.data) else { return Ok(None) };
        if self.prompts == 0 {
            return Ok(None);
        }
        let data = DataArgs { data: data.clone(), data_source: self.data_source.clone(), only: self.only.clone() };
        let tasks = data.spread(self.prompts)?;
        let agent = self.agent.agent(self.sampling.params(1.0)?)?;
        Ok(Some((EnvClient::connect(env, Default::default())?, tasks, agent)))
    }
}

#[derive(Debug, Args)]
struct BudgetArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    rollout: RolloutArgs,
}

impl BudgetArgs {
    fn run(self) -> Result<()> {
        let l = self.model.load()?;
        let (client, tasks, agent) = self.rollout.resolve()?.context("trainer budget needs --env and --data")?;
        let rows = grove_trainer::budget::compare((&l.lm, &l.tok), &client, &tasks, &agent, &self.rollout.methods, 0)?;
        print!("{}", grove_trainer::budget::format_rows(&rows));
        Ok(())
    }
}

#[derive(Debug, Args)]
struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
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
enum LogitsArg {
    Chunked,
    Full,
}

/// `BxT`, e.g. `4x4096`.
fn batch_by_len(flag: &str, shape: &str) -> Result<(usize, usize)> {
    let parsed = shape.split_once('x').and_then(|(b, t)| Some((b.parse::<usize>().ok()?, t.parse::<usize>().ok()?)));
    parsed.filter(|(b, t)| *b > 0 && *t > 1).with_context(|| format!("{flag} {shape}: expected BxT, e.g. 1x4096"))
}

impl BenchArgs {
    fn run(self) -> Result<()> {
        let l = self.model.load()?;
        if let Some(shape) = &self.train_step {
            use grove_trainer::algo::update::LogitsPath;
            let shape = batch_by_len("--train-step", shape)?;
            let path = match self.logits {
                LogitsArg::Chunked => LogitsPath::Chunked(512),
                LogitsArg::Full => LogitsPath::Full,
            };
            let row = grove_trainer::bench::train_step(&l.lm, &l.vs, shape, (path, self.checkpoint), self.repeats);
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
        rows.extend(grove_trainer::bench::run(&l.lm, &l.tok, &opts).rows);
        if let Some(shape) = &self.train_memory {
            let (b, t) = batch_by_len("--train-memory", shape)?;
            match grove_trainer::bench::train_memory(b, t) {
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
                let budget = grove_trainer::bench::budget_rows(
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
            None => rows.extend(grove_trainer::bench::budget_arithmetic(
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
                let line = serde_json::json!({ "figure": r.figure, "value": r.value, "unit": r.unit, "note": r.note });
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
struct ParityArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Print the report as one JSON line.
    #[arg(long)]
    json: bool,
}

impl ParityArgs {
    fn run(self) -> Result<()> {
        let placement = grove_trainer::device::place_with(self.model.device, self.model.precision)?;
        let r = grove_trainer::parity::check(&self.model.model, placement)?;
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
struct ViewArgs {
    /// The run folder (`out_dir` of `trainer train`), or an experiment folder.
    run_dir: PathBuf,
    /// Where to listen (default 127.0.0.1:8450, or a free loopback port when it is taken); an
    /// address other than loopback lets other machines read the run.
    #[arg(long)]
    bind: Option<std::net::SocketAddr>,
}

impl ViewArgs {
    fn run(self) -> Result<()> {
        grove_view::run(&self.run_dir, self.bind)?;
        Ok(())
    }
}

#[derive(Debug, Args)]
struct PlanArgs {
    /// An HF folder whose `config.json` gives the shape (no weights are read).
    #[arg(long, conflicts_with = "shape", required_unless_present = "shape")]
    model: Option<PathBuf>,
    /// A built-in shape instead of a folder.
    #[arg(long, value_enum)]
    shape: Option<grove_trainer::plan::Shape>,
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
enum PlanPrecision {
    Bf16,
    F32,
}

impl PlanArgs {
    fn run(self) -> Result<()> {
        use grove_trainer::plan::{Shapes, plan};
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
                grove_trainer::model::ModelConfig::from_json(&text).with_context(|| path.display().to_string())?
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
