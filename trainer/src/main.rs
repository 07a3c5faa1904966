//! `trainer`: generate with, import and benchmark models (training loops come with the RL issue).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use grove_trainer::device::{DeviceRequest, place};
use grove_trainer::eval::{evaluate, format_report};
use grove_trainer::generate::{Engine, SamplingParams};
use grove_trainer::model::load_model;
use grove_trainer::openai::{Mode, OpenAiEvalConfig, OpenAiPolicy, evaluate_openai};
use grove_trainer::optim::{AdamW, AdamWConfig};
use grove_trainer::rollout::agent::{AgentConfig, EnvClient, TreeShape};
use grove_trainer::tokenizer::{ChatMessage, Tokenizer};
use grove_trainer::train::{TrainConfig, load_tasks};

/// Which policy `trainer eval` evaluates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum EvalPolicy {
    Native,
    Openai,
    DirectOpenai,
}

#[derive(Parser)]
#[command(name = "trainer", version, about = "Grove trainer")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt.
    Generate {
        /// A Hugging Face model folder (config.json, safetensors, tokenizer.json).
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        prompt: String,
        /// Wrap the prompt as a user message with the model's chat template.
        #[arg(long)]
        chat: bool,
        #[arg(long, default_value_t = 128)]
        max_new: usize,
        /// 0 = greedy.
        #[arg(long, default_value_t = 0.0)]
        temperature: f64,
        #[arg(long, default_value_t = 1.0)]
        top_p: f64,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// auto, cpu, cuda or cuda:N.
        #[arg(long, default_value = "auto")]
        device: DeviceRequest,
    },
    /// Convert a llama-architecture GGUF file into a Hugging Face folder.
    ImportGguf { gguf: PathBuf, out_dir: PathBuf },
    /// Train with Tree-GRPO or chain GRPO against an env-server (`--config` TOML; see TrainConfig).
    Train {
        #[arg(long)]
        config: PathBuf,
        /// Continue from the latest checkpoint in the output folder.
        #[arg(long)]
        resume: bool,
        #[arg(long)]
        steps: Option<u64>,
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Chain GRPO against Tree-GRPO at equal budget from one checkpoint, several seeds each;
    /// writes table.md, results.json and plots (`--config` TOML: `[train]`, `seeds`, `[[arms]]`;
    /// without one, the default grid: chain n=2 / tree (1,2,1), chain n=4 / tree (2,2,1), 3 seeds).
    Experiment {
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
    },
    /// Evaluate a model as an agent through an env-server: EM / F1 per data source.
    Eval {
        /// `native` (an HF folder, --model), `openai` (a ReAct agent served by an
        /// OpenAI-compatible server, --base-url / --model-name) or `direct-openai` (the same server
        /// answering without search: direct inference).
        #[arg(long, value_enum, default_value = "native")]
        policy: EvalPolicy,
        /// The HF model folder (native policy), or the served model's name (openai policies).
        #[arg(long)]
        model: Option<PathBuf>,
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
        #[arg(long, default_value = "ws://127.0.0.1:8000/")]
        env: String,
        /// Search-R1 parquet or QA JSONL.
        #[arg(long)]
        data: PathBuf,
        #[arg(long, default_value = "nq")]
        data_source: String,
        /// Sample at T = 1, top-p 0.95 instead of greedy decoding.
        #[arg(long)]
        sampled: bool,
        #[arg(long, default_value_t = 3)]
        max_turns: u32,
        #[arg(long, default_value_t = 500)]
        max_new_tokens: usize,
        #[arg(long)]
        max_questions: Option<usize>,
        /// Keep only questions whose metadata flag is true (e.g. `answer_in_passage`).
        #[arg(long)]
        only: Option<String>,
        /// A file with the agent prompt (`{question}` placeholder); default: the env-server's.
        #[arg(long)]
        prompt: Option<PathBuf>,
        /// Search results per query; default: the env-server's.
        #[arg(long)]
        topk: Option<u32>,
        /// Write the report as JSON here too.
        #[arg(long)]
        json: Option<PathBuf>,
        #[arg(long, default_value = "auto")]
        device: DeviceRequest,
    },
    /// Supervised fine-tuning on trajectory JSONL (`{prompt, steps: [{action, observation}]}`):
    /// loss on the actions only; writes an HF folder.
    Sft {
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        data: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 1)]
        epochs: usize,
        #[arg(long, default_value_t = 1e-5)]
        lr: f64,
        #[arg(long, default_value_t = 8)]
        batch: usize,
        #[arg(long, default_value = "auto")]
        device: DeviceRequest,
    },
    /// Play the synthetic world with the scripted, imperfect agent through an env-server and write
    /// the trajectories (SFT JSONL).
    Warmstart {
        #[arg(long, default_value = "ws://127.0.0.1:8000/")]
        env: String,
        /// A folder written by `trainer world` (the env-server must serve its corpus); its
        /// training questions are played, with its prompt.
        #[arg(long)]
        world: PathBuf,
        /// Play each training question this many times (different random imperfections).
        #[arg(long, default_value_t = 1)]
        passes: usize,
        /// Search results per query; default: the env-server's.
        #[arg(long)]
        topk: Option<u32>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 0.25)]
        early_answer: f64,
        #[arg(long, default_value_t = 0.15)]
        vague_query: f64,
    },
    /// Write a synthetic multi-hop world: corpus.jsonl (wiki-18), train.jsonl and test.jsonl
    /// (disjoint 2- and 3-hop questions), prompt.txt and world.toml.
    World {
        #[arg(long)]
        out: PathBuf,
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
    },
    /// A small policy from scratch: train a BPE tokenizer on a wiki-18 corpus (and QA questions),
    /// then write a randomly initialised Qwen2 model with it as an HF folder.
    InitSmall {
        /// wiki-18 JSONL corpus.
        #[arg(long)]
        corpus: PathBuf,
        /// QA JSONL whose questions join the tokenizer's training text.
        #[arg(long)]
        questions: Option<PathBuf>,
        /// Agent prompt template (`{question}` placeholder): the questions join the training text
        /// as the prompts the model will read.
        #[arg(long)]
        prompt: Option<PathBuf>,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 4096)]
        vocab: usize,
        #[arg(long, default_value_t = 128)]
        hidden: i64,
        #[arg(long, default_value_t = 4)]
        layers: i64,
        #[arg(long, default_value_t = 0)]
        seed: i64,
    },
    /// Budget accounting: a tree shape and chain GRPO on the same prompts, with their costs.
    Budget {
        #[arg(long)]
        model: PathBuf,
        #[arg(long, default_value = "ws://127.0.0.1:8000/")]
        env: String,
        #[arg(long)]
        data: PathBuf,
        #[arg(long, default_value = "nq")]
        data_source: String,
        #[arg(long, default_value_t = 8)]
        prompts: usize,
        /// Tree shape M,N,L,k.
        #[arg(long, default_value = "2,2,1,3")]
        tree: String,
        #[arg(long, default_value_t = 4)]
        chain_n: usize,
        #[arg(long, default_value_t = 3)]
        max_turns: u32,
        #[arg(long, default_value_t = 500)]
        max_new_tokens: usize,
        #[arg(long, default_value = "auto")]
        device: DeviceRequest,
    },
    /// Measure generation, prefill and training throughput of a model on this machine, and
    /// multi-turn generation with KV-prefix reuse against re-encoding every turn; with --env and
    /// --data, also a real tree and chain rollout at equal budget.
    Bench {
        #[arg(long)]
        model: PathBuf,
        #[arg(long, default_value = "auto")]
        device: DeviceRequest,
        /// Tokens sampled per sequence in the batch 1 / batch 8 generation figures.
        #[arg(long, default_value_t = 64)]
        new_tokens: usize,
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
        /// An env-server for the tree-vs-chain rollout (without it: the budget arithmetic).
        #[arg(long)]
        env: Option<String>,
        /// QA JSONL or Search-R1 parquet of the rollout's prompts.
        #[arg(long)]
        data: Option<PathBuf>,
        #[arg(long, default_value = "nq")]
        data_source: String,
        /// Keep only rows whose metadata has this flag set (e.g. answer_in_passage).
        #[arg(long)]
        only: Option<String>,
        /// Prompts of the rollout, spread evenly over the data file.
        #[arg(long, default_value_t = 2)]
        budget_prompts: usize,
        /// The policy of the rollout (default: --model); a policy that calls tools makes the
        /// tree and chain figures compare something.
        #[arg(long)]
        policy: Option<PathBuf>,
        /// Agent prompt of the rollout, with a `{question}` placeholder (default: the env-server's).
        #[arg(long)]
        prompt_template: Option<PathBuf>,
        /// Search results per query in the rollout (default: the env-server's).
        #[arg(long)]
        topk: Option<u32>,
        #[arg(long, default_value_t = 1.0)]
        temperature: f64,
        /// Tree shape M,N,L,k and the chain at equal budget.
        #[arg(long, default_value = "2,2,1,3")]
        tree: String,
        #[arg(long, default_value_t = 4)]
        chain_n: usize,
        #[arg(long, default_value_t = 3)]
        max_turns: u32,
        #[arg(long, default_value_t = 48)]
        max_new_tokens: usize,
        /// Print rows as JSON lines (`{"figure", "value", "unit", "note"}`) instead of the table.
        #[arg(long)]
        json: bool,
    },
}

/// `--tree M,N,L,k`.
fn parse_tree_shape(tree: &str) -> Result<TreeShape> {
    let shape: Vec<usize> =
        tree.split(',').map(|x| x.trim().parse()).collect::<Result<_, _>>().context("--tree M,N,L,k")?;
    let [m, n, l, k] = shape[..] else { anyhow::bail!("--tree needs four numbers M,N,L,k") };
    Ok(TreeShape { m, n, l, k })
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Generate { model, prompt, chat, max_new, temperature, top_p, seed, device } => {
            let Loaded { lm, tok, .. } = load(&model, device)?;
            let text = if chat { tok.apply_chat_template(&[ChatMessage::new("user", prompt)], true)? } else { prompt };
            let mut engine = Engine::new(&lm);
            let seq = engine.add(tok.encode(&text)?, seed)?;
            let params = SamplingParams { temperature, top_p, top_k: 0, max_new_tokens: max_new, stop: Vec::new() };
            let t = Instant::now();
            let out = engine.generate(&[seq], &params, &tok)?.remove(0);
            let secs = t.elapsed().as_secs_f64();
            println!("{}", out.text);
            eprintln!(
                "{} tokens in {secs:.2} s ({:.1} tokens/s, prompt {} tokens, finish {:?})",
                out.tokens.len(),
                out.tokens.len() as f64 / secs,
                engine.stats.prefill_tokens,
                out.finish
            );
        }
        Command::ImportGguf { gguf, out_dir } => {
            let s = grove_trainer::import::import_gguf(&gguf, &out_dir)?;
            println!(
                "wrote {} ({} tensors, {} parameters, vocab {}, tied embeddings: {})",
                out_dir.display(),
                s.tensors,
                s.parameters,
                s.vocab,
                s.tied_embeddings
            );
        }
        Command::Train { config, resume, steps, out_dir } => train(&config, resume, steps, out_dir)?,
        Command::Experiment { config, model, world, env, out, steps, seeds } => {
            use grove_trainer::experiment::{ExperimentConfig, format_table, outputs, run_experiment};
            let mut cfg: ExperimentConfig = match &config {
                Some(p) => {
                    toml::from_str(&std::fs::read_to_string(p).with_context(|| format!("read {}", p.display()))?)
                        .with_context(|| format!("parse {}", p.display()))?
                }
                None => ExperimentConfig::default(),
            };
            if let Some(m) = model {
                cfg.train.model = m;
            }
            if let Some(w) = world {
                let files = grove_trainer::world::WorldFiles { dir: w };
                cfg.train.train_data = files.train();
                cfg.train.eval_data = Some(files.test());
                cfg.train.prompt_template = Some(files.prompt());
                cfg.train.data_source = "synthetic".into();
            }
            if let Some(e) = env {
                cfg.train.env = grove_trainer::train::EnvUrls(vec![e]);
            }
            if let Some(o) = out {
                cfg.train.out_dir = o;
            }
            if let Some(s) = steps {
                cfg.train.steps = s;
            }
            if let Some(s) = seeds {
                cfg.seeds = s;
            }
            let results = run_experiment(&cfg, true)?;
            print!("{}", format_table(&results));
            for p in outputs(&cfg.train.out_dir) {
                println!("wrote {}", p.display());
            }
        }
        Command::Eval {
            policy,
            model,
            base_url,
            model_name,
            concurrency,
            retries,
            timeout_s,
            env,
            data,
            data_source,
            sampled,
            max_turns,
            max_new_tokens,
            max_questions,
            only,
            prompt,
            topk,
            json,
            device,
        } => {
            let mut tasks = grove_trainer::train::load_tasks_where(&data, &data_source, only.as_deref())?;
            tasks.truncate(max_questions.unwrap_or(usize::MAX));
            let prompt_template = prompt.map(std::fs::read_to_string).transpose()?;
            if policy != EvalPolicy::Native {
                let name = model_name
                    .or_else(|| model.as_ref().map(|m| m.to_string_lossy().into_owned()))
                    .context("--policy openai / direct-openai needs --model NAME (or --model-name)")?;
                let mut http = OpenAiPolicy::new(base_url, name);
                http.temperature = if sampled { 1.0 } else { 0.0 };
                http.max_tokens = max_new_tokens;
                http.timeout = std::time::Duration::from_secs(timeout_s.max(1));
                http.retries = retries;
                let config = OpenAiEvalConfig {
                    mode: if policy == EvalPolicy::Openai { Mode::Agent } else { Mode::Direct },
                    max_turns,
                    prompt_template,
                    topk,
                    concurrency,
                };
                let report = evaluate_openai(&http, &env, Default::default(), &tasks, &config)?;
                print!("{}", format_report(&report));
                if let Some(path) = json {
                    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
                }
                return Ok(());
            }
            let model = model.context("--policy native needs --model (a Hugging Face model folder)")?;
            let Loaded { lm, tok, .. } = load(&model, device)?;
            let client = EnvClient::connect(&env, Default::default())?;
            let agent = AgentConfig {
                max_turns,
                sampling: SamplingParams {
                    temperature: if sampled { 1.0 } else { 0.0 },
                    top_p: if sampled { 0.95 } else { 1.0 },
                    max_new_tokens,
                    ..SamplingParams::default()
                },
                prompt_template,
                topk,
                ..AgentConfig::default()
            };
            let report = evaluate(&lm, &tok, std::slice::from_ref(&client), &tasks, &agent, 16, 0)?;
            print!("{}", format_report(&report));
            if let Some(path) = json {
                std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
            }
        }
        Command::Budget {
            model,
            env,
            data,
            data_source,
            prompts,
            tree,
            chain_n,
            max_turns,
            max_new_tokens,
            device,
        } => {
            let shape = parse_tree_shape(&tree)?;
            let Loaded { lm, tok, .. } = load(&model, device)?;
            let client = EnvClient::connect(&env, Default::default())?;
            let mut tasks = load_tasks(&data, &data_source)?;
            tasks.truncate(prompts);
            let agent = AgentConfig {
                max_turns,
                sampling: SamplingParams { max_new_tokens, ..SamplingParams::default() },
                ..AgentConfig::default()
            };
            let rows = [
                grove_trainer::budget::measure(&lm, &tok, &client, &tasks, &agent, shape, 0, 1)?,
                grove_trainer::budget::measure(&lm, &tok, &client, &tasks, &agent, TreeShape::chain(chain_n), 0, 1)?,
            ];
            print!("{}", grove_trainer::budget::format_rows(&rows));
        }
        Command::Sft { model, data, out, epochs, lr, batch, device } => {
            let Loaded { vs, lm, tok, .. } = load(&model, device)?;
            let rows = grove_trainer::sft::load_trajectories(&data)?
                .iter()
                .map(|t| grove_trainer::sft::tokenize(&tok, t))
                .collect::<Result<Vec<_>, _>>()?;
            let mut opt = AdamW::new(&vs, AdamWConfig::default());
            eprintln!(
                "{} trajectories, action NLL {:.4}",
                rows.len(),
                grove_trainer::sft::evaluate_nll(&lm, &rows, batch)
            );
            let per_epoch = rows.len().div_ceil(batch.max(1));
            let bar = indicatif::ProgressBar::new((epochs * per_epoch) as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template("sft {bar:30} {pos}/{len} {msg} ({eta})")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            for epoch in 0..epochs {
                let mut show = |loss: f64| {
                    bar.set_message(format!("epoch {} loss {loss:.4}", epoch + 1));
                    bar.inc(1);
                };
                let losses = grove_trainer::sft::sft_epoch(&lm, &mut opt, &rows, (batch, lr, epoch as u64), &mut show);
                let mean = losses.iter().sum::<f64>() / losses.len().max(1) as f64;
                bar.suspend(|| eprintln!("epoch {}: mean step loss {mean:.4}", epoch + 1));
            }
            bar.finish_and_clear();
            eprintln!("action NLL after SFT {:.4}", grove_trainer::sft::evaluate_nll(&lm, &rows, batch));
            let config = std::fs::read_to_string(model.join("config.json"))?;
            let files: Vec<PathBuf> = ["tokenizer.json", "tokenizer_config.json"]
                .iter()
                .map(|f| model.join(f))
                .filter(|p| p.exists())
                .collect();
            grove_trainer::model::save_model(&vs, &config, &out, tch::Kind::Float, &files)?;
            println!("wrote {}", out.display());
        }
        Command::Warmstart { env, world: dir, passes, topk, seed, out, early_answer, vague_query } => {
            let spec = grove_trainer::world::WorldSpec::read(&dir)?;
            let files = grove_trainer::world::WorldFiles { dir };
            let world = spec.world();
            let (train, _) = spec.questions(&world);
            let client = EnvClient::connect(&env, Default::default())?;
            let prompt = std::fs::read_to_string(files.prompt())?;
            let mut played = Vec::new();
            for pass in 0..passes {
                let cfg = grove_trainer::scripted::ScriptConfig {
                    early_answer,
                    vague_query,
                    seed: seed + pass as u64,
                    prompt_template: Some(prompt.clone()),
                    topk,
                    ..Default::default()
                };
                played.extend(grove_trainer::scripted::play(&world, &train, &client, &cfg)?);
            }
            let lines: Vec<String> =
                played.iter().map(|p| serde_json::to_string(&p.trajectory)).collect::<Result<_, _>>()?;
            std::fs::write(&out, lines.join("\n") + "\n")?;
            let correct = played.iter().filter(|p| p.correct).count();
            println!("wrote {} trajectories to {} ({correct} correct)", played.len(), out.display());
        }
        Command::World { out, seed, scale, train, test } => {
            let spec = grove_trainer::world::WorldSpec { seed, scale, train_per_hops: train, test_per_hops: test };
            let files = spec.write(&out)?;
            println!(
                "wrote {} (corpus {}, train {}, test {})",
                files.dir.display(),
                files.corpus().display(),
                files.train().display(),
                files.test().display()
            );
        }
        Command::InitSmall { corpus, questions, prompt, out, vocab, hidden, layers, seed } => {
            let template = prompt.map(std::fs::read_to_string).transpose()?;
            let mut texts: Vec<String> = grove_datasets::loaders::load_wiki18(&corpus, grove_datasets::OnBadRow::Fail)?
                .items
                .iter()
                .map(|p| p.contents())
                .collect();
            if let Some(q) = questions {
                texts.extend(
                    grove_datasets::loaders::load_qa_jsonl(&q, "qa", None, grove_datasets::OnBadRow::Fail)?
                        .items
                        .into_iter()
                        .map(|e| match &template {
                            Some(t) => t.replace("{question}", &e.question),
                            None => e.question,
                        }),
                );
            }
            let vocab = grove_trainer::scratch::train_bpe(&texts, vocab, &out)?;
            let shape = grove_trainer::scratch::SmallModel {
                hidden,
                layers,
                intermediate: hidden * 3,
                ..grove_trainer::scratch::SmallModel::default()
            };
            let params = grove_trainer::scratch::init_model(&out, vocab, shape, seed)?;
            println!("wrote {} (vocab {vocab}, {params} parameters)", out.display());
        }
        Command::Bench {
            model,
            device,
            new_tokens,
            train_batch,
            train_len,
            turns,
            turn_tokens,
            obs_tokens,
            env,
            data,
            data_source,
            only,
            budget_prompts,
            policy,
            prompt_template,
            topk,
            temperature,
            tree,
            chain_n,
            max_turns,
            max_new_tokens,
            json,
        } => {
            use grove_trainer::bench::{BenchOptions, BenchRow};
            let shape = parse_tree_shape(&tree)?;
            let Loaded { lm, tok, placement, .. } = load(&model, device)?;
            let threads = tch::get_num_threads();
            let opts = BenchOptions {
                new_tokens,
                train_batch,
                train_len,
                turns,
                turn_tokens,
                obs_tokens,
                ..Default::default()
            };
            let mut rows = vec![BenchRow::new(
                "libtorch threads",
                threads.to_string(),
                "threads",
                format!("{:?}, {}", placement.device, model.display()),
            )];
            rows.extend(grove_trainer::bench::run(&lm, &tok, &opts).rows);
            match (env, data) {
                (Some(env), Some(data)) if budget_prompts > 0 => {
                    let client = EnvClient::connect(&env, Default::default())?;
                    let all = grove_trainer::train::load_tasks_where(&data, &data_source, only.as_deref())?;
                    let stride = (all.len() / budget_prompts).max(1);
                    let tasks: Vec<_> = all.into_iter().step_by(stride).take(budget_prompts).collect();
                    let agent = AgentConfig {
                        max_turns,
                        sampling: SamplingParams { max_new_tokens, temperature, ..SamplingParams::default() },
                        prompt_template: prompt_template
                            .map(|p| std::fs::read_to_string(&p).with_context(|| format!("read {}", p.display())))
                            .transpose()?,
                        topk,
                        ..AgentConfig::default()
                    };
                    let rollout_policy = policy.as_deref().map(|p| load(p, device)).transpose()?;
                    let (plm, ptok) = rollout_policy.as_ref().map_or((&lm, &tok), |l| (&l.lm, &l.tok));
                    let budget = grove_trainer::bench::budget_rows(plm, ptok, &client, &tasks, &agent, shape, chain_n)?;
                    let name = policy.as_deref().unwrap_or(&model);
                    rows.push(BenchRow::new(
                        "rollout policy",
                        name.file_name().map_or_else(|| name.display().to_string(), |n| n.to_string_lossy().into()),
                        "",
                        format!("{}, {} prompts of {}", name.display(), tasks.len(), data.display()),
                    ));
                    rows.extend(budget);
                }
                _ => rows.extend(grove_trainer::bench::budget_arithmetic(shape, max_turns, max_new_tokens)),
            }
            if json {
                for r in rows {
                    let line =
                        serde_json::json!({ "figure": r.figure, "value": r.value, "unit": r.unit, "note": r.note });
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
    Ok(())
}

fn train(config_path: &std::path::Path, resume: bool, steps: Option<u64>, out_dir: Option<PathBuf>) -> Result<()> {
    let text = std::fs::read_to_string(config_path).with_context(|| format!("read {}", config_path.display()))?;
    let mut cfg: TrainConfig = toml::from_str(&text).with_context(|| format!("parse {}", config_path.display()))?;
    if let Some(s) = steps {
        cfg.steps = s;
    }
    if let Some(o) = out_dir {
        cfg.out_dir = o;
    }
    let opts = grove_trainer::run::RunOptions { resume, progress: true, label: "train".into() };
    let summary = grove_trainer::run::run(&cfg, &opts)?;
    eprintln!("{} steps; checkpoints, metrics and plots in {}", summary.metrics.len(), summary.out_dir.display());
    Ok(())
}

/// A model folder loaded for a command: weights on the requested device, and its tokenizer.
struct Loaded {
    vs: tch::nn::VarStore,
    lm: grove_trainer::model::CausalLm,
    tok: Tokenizer,
    placement: grove_trainer::device::Placement,
}

fn load(model: &std::path::Path, device: DeviceRequest) -> Result<Loaded> {
    let placement = place(device)?;
    let (vs, lm) =
        load_model(model, placement.device, placement.kind).with_context(|| format!("load {}", model.display()))?;
    let tok = Tokenizer::from_dir(model).with_context(|| format!("tokenizer of {}", model.display()))?;
    Ok(Loaded { vs, lm, tok, placement })
}
