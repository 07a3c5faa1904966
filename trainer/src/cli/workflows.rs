//! `trainer eval`, `sft`, `warmstart`, `world`, `init-small` and `import-gguf`: the commands that
//! make, convert and evaluate policies and their data.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use grove_trainer::engine::generate::SamplingParams;
use grove_trainer::engine::optim::{AdamW, AdamWConfig, OptimState};
use grove_trainer::rl::env::EnvClient;
use grove_trainer::workflows::eval::{EVAL_BATCH, evaluate, format_report};
use grove_trainer::workflows::openai::{Mode, OpenAiEvalConfig, OpenAiPolicy, evaluate_openai};

use super::args::{AgentArgs, DataArgs, EnvArgs, ModelArgs, OutArgs, load};

#[derive(Debug, Args)]
pub(super) struct ImportArgs {
    /// The GGUF file.
    gguf: PathBuf,
    #[command(flatten)]
    out: OutArgs,
}

impl ImportArgs {
    pub(super) fn run(self) -> Result<()> {
        let out = &self.out.out;
        let s = grove_trainer::engine::import::import_gguf(&self.gguf, out)?;
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

/// Which policy `trainer eval` evaluates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum EvalPolicy {
    Native,
    Openai,
    DirectOpenai,
}

#[derive(Debug, Args)]
pub(super) struct EvalArgs {
    /// `native` (an HF folder, --model), `openai` (a ReAct agent served by an OpenAI-compatible
    /// server, --base-url / --model-name) or `direct-openai` (the same server answering without
    /// search: direct inference).
    #[arg(long, value_enum, default_value = "native")]
    policy: EvalPolicy,
    /// The HF model folder (native policy), or the served model's name (openai policies).
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long, default_value = "auto")]
    device: grove_trainer::engine::device::DeviceRequest,
    /// Parameter precision of a native model: auto, f32 or bf16.
    #[arg(long, value_enum, default_value = "auto")]
    precision: grove_trainer::engine::device::Precision,
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
    pub(super) fn run(self) -> Result<()> {
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
pub(super) struct SftArgs {
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
    pub(super) fn run(self) -> Result<()> {
        use grove_trainer::workflows::sft::{
            SftConfig, SftProgress, load_trajectories, steps_per_epoch, tokenize, train,
        };
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
        grove_trainer::engine::model::save_model(&l.vs, &config, &self.out.out, tch::Kind::Float, &files)?;
        println!("wrote {}", self.out.out.display());
        Ok(())
    }
}

#[derive(Debug, Args)]
pub(super) struct WarmstartArgs {
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
    pub(super) fn run(self) -> Result<()> {
        use grove_trainer::workflows::scripted::{ScriptConfig, play_passes};
        for (flag, p) in [("--early-answer", self.early_answer), ("--vague-query", self.vague_query)] {
            if !(0.0..=1.0).contains(&p) {
                bail!("{flag} {p}: a probability in [0, 1]");
            }
        }
        let spec = grove_trainer::support::world::WorldSpec::read(&self.world)?;
        let files = grove_trainer::support::world::WorldFiles { dir: self.world.clone() };
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
pub(super) struct WorldArgs {
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
    pub(super) fn run(self) -> Result<()> {
        let spec = grove_trainer::support::world::WorldSpec {
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
pub(super) struct InitSmallArgs {
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
    pub(super) fn run(self) -> Result<()> {
        use grove_trainer::engine::scratch::{SmallModel, init_model, tokenizer_corpus, train_bpe};
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
                grove_trainer::engine::tokenizer::Tokenizer::from_dir(out)?.vocab_size()
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
