//! Flag groups shared by several subcommands, each with the one function that turns it into the
//! library's typed settings. One spelling per concept: `--model`, `--device`, `--env`, `--data`,
//! `--max-new-tokens`, `--prompt-template`, `--out`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use grove_trainer::engine::device::{DeviceRequest, Placement, Precision, place_with};
use grove_trainer::engine::generate::SamplingParams;
use grove_trainer::engine::model::{CausalLm, load_model};
use grove_trainer::engine::tokenizer::Tokenizer;
use grove_trainer::rl::env::EnvClient;
use grove_trainer::rl::method::Method;
use grove_trainer::rl::rollout::agent::{AgentConfig, Schedule};
use grove_trainer::support::data::{EvalSelection, load_tasks_where, select};

/// A model folder and where to run it.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// A Hugging Face model folder (config.json, safetensors, tokenizer.json).
    #[arg(long)]
    pub model: PathBuf,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: DeviceRequest,
    /// Parameter precision: auto (f32 on the CPU, bf16 on CUDA), f32 or bf16.
    #[arg(long, value_enum, default_value = "auto")]
    pub precision: Precision,
}

/// A model folder loaded for a command: weights on the requested device, and its tokenizer.
pub struct Loaded {
    pub vs: tch::nn::VarStore,
    pub lm: CausalLm,
    pub tok: Tokenizer,
    pub placement: Placement,
}

/// Load a model folder and its tokenizer.
pub fn load(model: &Path, device: DeviceRequest, precision: Precision) -> Result<Loaded> {
    let placement = place_with(device, precision)?;
    let (vs, lm) =
        load_model(model, placement.device, placement.kind).with_context(|| format!("load {}", model.display()))?;
    let tok = Tokenizer::from_dir(model).with_context(|| format!("tokenizer of {}", model.display()))?;
    Ok(Loaded { vs, lm, tok, placement })
}

impl ModelArgs {
    pub fn load(&self) -> Result<Loaded> {
        load(&self.model, self.device, self.precision)
    }
}

/// The env-server to talk to.
#[derive(Debug, Args)]
pub struct EnvArgs {
    /// The env-server's WebSocket URL.
    #[arg(long, default_value = "ws://127.0.0.1:8000/")]
    pub env: String,
}

/// Questions from a file.
#[derive(Debug, Args)]
pub struct DataArgs {
    /// Search-R1 parquet or QA JSONL.
    #[arg(long)]
    pub data: PathBuf,
    /// Data source of JSONL rows that do not name one.
    #[arg(long, default_value = "nq")]
    pub data_source: String,
    /// Keep only questions whose metadata flag is true (e.g. `answer_in_passage`).
    #[arg(long)]
    pub only: Option<String>,
}

impl DataArgs {
    pub fn tasks(&self) -> Result<Vec<grove_protocol::TaskSpec>> {
        load_tasks_where(&self.data, &self.data_source, self.only.as_deref())
            .with_context(|| format!("read {}", self.data.display()))
    }

    /// Every question, or a seeded random sample of `max`.
    pub fn sample(&self, max: Option<usize>, seed: u64) -> Result<(Vec<grove_protocol::TaskSpec>, EvalSelection)> {
        Ok(select(&self.tasks()?, max, seed))
    }

    /// `n` questions spread evenly over the file (the same ones every time).
    pub fn spread(&self, n: usize) -> Result<Vec<grove_protocol::TaskSpec>> {
        let all = self.tasks()?;
        let stride = (all.len() / n.max(1)).max(1);
        Ok(all.into_iter().step_by(stride).take(n).collect())
    }
}

/// How the agent samples each turn.
#[derive(Debug, Args)]
pub struct SamplingArgs {
    /// 0 = greedy (default: the command's).
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Nucleus sampling (default: 0.95 when sampling, 1 when greedy).
    #[arg(long)]
    pub top_p: Option<f64>,
    /// 0 disables top-k.
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Tokens generated per turn at most.
    #[arg(long, default_value_t = 500)]
    pub max_new_tokens: usize,
}

impl SamplingArgs {
    /// The sampling settings, with `temperature` when the flag is absent; stop strings are the
    /// agent's (`</search>`, `</answer>`).
    pub fn params(&self, temperature: f64) -> Result<SamplingParams> {
        let temperature = self.temperature.unwrap_or(temperature);
        if !(temperature >= 0.0 && temperature.is_finite()) {
            bail!("--temperature {temperature}: must be a finite number >= 0");
        }
        let top_p = self.top_p.unwrap_or(if temperature > 0.0 { 0.95 } else { 1.0 });
        if !(top_p > 0.0 && top_p <= 1.0) {
            bail!("--top-p {top_p}: must be in (0, 1]");
        }
        if self.max_new_tokens == 0 {
            bail!("--max-new-tokens must be at least 1");
        }
        Ok(SamplingParams {
            temperature,
            top_p,
            top_k: self.top_k,
            max_new_tokens: self.max_new_tokens,
            ..Default::default()
        })
    }
}

/// The agent loop's settings.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Tool turns before the forced final answer turn.
    #[arg(long, default_value_t = 3)]
    pub max_turns: u32,
    /// Search results per query (default: the env-server's).
    #[arg(long)]
    pub topk: Option<u32>,
    /// A file with the agent prompt (`{question}` placeholder; default: the env-server's).
    #[arg(long)]
    pub prompt_template: Option<PathBuf>,
    /// How generations are scheduled: `phased` (turn by turn) or `continuous` (one running
    /// batch that chains join and leave at any token).
    #[arg(long, default_value = "phased")]
    pub schedule: Schedule,
    /// With `--schedule continuous`: at most this many chains decode at once, and the next
    /// prompt starts when its first chains fit (default: no cap but the prompts in flight).
    #[arg(long)]
    pub max_rows: Option<usize>,
}

impl AgentArgs {
    /// The one way the command line builds an agent.
    pub fn agent(&self, sampling: SamplingParams) -> Result<AgentConfig> {
        let prompt_template = self
            .prompt_template
            .as_ref()
            .map(|p| std::fs::read_to_string(p).with_context(|| format!("read {}", p.display())))
            .transpose()?;
        if self.max_rows.is_some() && self.schedule != Schedule::Continuous {
            bail!("--max-rows caps the continuous schedule's running chains: add --schedule continuous");
        }
        Ok(AgentConfig {
            max_turns: self.max_turns,
            sampling,
            prompt_template,
            topk: self.topk,
            schedule: self.schedule,
            max_rows: self.max_rows.unwrap_or(0),
            ..AgentConfig::default()
        })
    }
}

/// Where a command writes.
#[derive(Debug, Args)]
pub struct OutArgs {
    /// Output path.
    #[arg(long)]
    pub out: PathBuf,
}

/// The rollouts of `trainer budget` and of `trainer bench --env`: the same prompts, agent and
/// methods.
#[derive(Debug, Args)]
pub(super) struct RolloutArgs {
    /// An env-server serving the questions' corpus.
    #[arg(long)]
    pub(super) env: Option<String>,
    /// Search-R1 parquet or QA JSONL of the rollout's prompts.
    #[arg(long)]
    pub(super) data: Option<PathBuf>,
    #[arg(long, default_value = "nq")]
    pub(super) data_source: String,
    /// Keep only rows whose metadata has this flag set (e.g. answer_in_passage).
    #[arg(long)]
    pub(super) only: Option<String>,
    /// Prompts of the rollout, spread evenly over the data file.
    #[arg(long, default_value_t = 8)]
    pub(super) prompts: usize,
    /// Rollout methods to compare (repeat the flag): `tree:M,N,L,K`, `chain:N`.
    #[arg(long = "method", default_values = ["tree:2,2,1,3", "chain:4"])]
    pub(super) methods: Vec<Method>,
    #[command(flatten)]
    pub(super) agent: AgentArgs,
    #[command(flatten)]
    pub(super) sampling: SamplingArgs,
}

impl RolloutArgs {
    /// The server, prompts and agent, or `None` when no server or data was named.
    pub(super) fn resolve(&self) -> Result<Option<(EnvClient, Vec<grove_protocol::TaskSpec>, AgentConfig)>> {
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
