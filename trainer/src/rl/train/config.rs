//! `trainer train --config FILE`: the TOML a user writes, checked once into the typed settings
//! of a step. Every key has a default (the spec's QA settings where the machine allows); an
//! unknown key or value is an error that lists what is accepted, and combinations that would
//! silently train something else are refused with the reason.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::step::StepConfig;
use crate::engine::device::DeviceRequest;
use crate::engine::generate::SamplingParams;
use crate::rl::algo::advantage::Estimator;
use crate::rl::algo::loss::{Aggregation, LossConfig};
use crate::rl::algo::schedule::WarmupConstant;
use crate::rl::algo::update::UpdateConfig;
use crate::rl::method::{Method, MethodError};
use crate::rl::rollout::agent::{AgentConfig, Schedule};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("method {method}: {source}")]
    Method {
        method: String,
        #[source]
        source: MethodError,
    },
    #[error("`{key}` = {value}: {why}")]
    Value { key: &'static str, value: String, why: String },
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
}

/// One URL or a list of URLs in the config file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "OneOrMany", into = "Vec<String>")]
pub struct EnvUrls(pub Vec<String>);

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl From<OneOrMany> for EnvUrls {
    fn from(v: OneOrMany) -> Self {
        match v {
            OneOrMany::One(s) => EnvUrls(vec![s]),
            OneOrMany::Many(v) => EnvUrls(v),
        }
    }
}

impl From<EnvUrls> for Vec<String> {
    fn from(v: EnvUrls) -> Self {
        v.0
    }
}

/// The configuration of a training run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// HF folder of the initial policy (also the frozen reference).
    pub model: PathBuf,
    /// Folder with tokenizer.json / tokenizer_config.json; default: `model`.
    pub tokenizer: Option<PathBuf>,
    /// env-server WebSocket URL, or a list of them (prompts are sharded over the servers).
    pub env: EnvUrls,
    /// Training questions: Search-R1 `.parquet`, or QA `.jsonl` (FlashRAG / Grove).
    pub train_data: PathBuf,
    /// Held-out questions evaluated every `eval_every` steps (optional).
    pub eval_data: Option<PathBuf>,
    /// Data source of JSONL rows that do not name one.
    pub data_source: String,
    pub out_dir: PathBuf,
    pub steps: u64,
    pub prompts_per_step: usize,
    /// Prompts rolled out together with their generations batched (0: all prompts of a step):
    /// bounds the engine's batch at this many x M x N sequences.
    pub rollout_batch_prompts: usize,
    /// `phased` (each turn of every chain one engine call, the expansion rounds one after the
    /// other) or `continuous` (one running batch that chains join and leave at any token; other
    /// random draws than `phased`).
    pub rollout_schedule: Schedule,
    /// Continuous schedule only: at most this many chains decode at once, and the next prompt
    /// starts when its first chains fit (0: no cap but `rollout_batch_prompts`); see
    /// `AgentConfig::max_rows`.
    pub rollout_max_rows: usize,
    /// `{ kind = "tree", m, n, l, k }` or `{ kind = "chain", n }`.
    pub method: Method,
    /// Advantage estimator; default: the method's (tree -> `tree`, chain -> `grpo`).
    pub estimator: Option<Estimator>,
    pub lr: f64,
    /// Linear warm-up over this fraction of `steps`; default: the method's (tree 0.285, chain 0.5).
    pub warmup_ratio: Option<f64>,
    pub max_turns: u32,
    pub max_obs_tokens: usize,
    pub max_new_tokens: usize,
    pub max_response_tokens: usize,
    /// Rolling context cap (the reference's `max_prompt_length`).
    pub max_context: usize,
    pub temperature: f64,
    pub top_p: f64,
    /// 0 disables top-k.
    pub top_k: usize,
    pub micro_batch: usize,
    pub mini_batches: usize,
    /// Positions whose vocabulary logits exist at once during the update (memory against speed).
    pub logits_chunk: usize,
    /// Activation checkpointing: keep each decoder layer's input only and recompute the layer
    /// during backward.
    pub checkpoint_layers: bool,
    /// `token-mean` (over the mini-batch), `seq-mean-token-mean` (the paper's Eq. 8) or
    /// `micro-batch-token-mean` (the reference code's).
    pub loss_agg: Aggregation,
    pub clip_ratio_low: f64,
    pub clip_ratio_high: f64,
    /// Dual-clip bound for negative advantages.
    pub clip_ratio_c: f64,
    pub kl_coef: f64,
    pub entropy_coef: f64,
    pub eval_every: u64,
    /// Evaluate a seeded random sample of this many held-out questions (default: all of them).
    pub eval_max_questions: Option<usize>,
    /// Seed of that sample (default: `seed`).
    pub eval_seed: Option<u64>,
    /// Evaluate the initial policy before the first step too.
    pub eval_before: bool,
    /// Evaluate sampled (the rollout settings) as well as greedy.
    pub eval_sampled: bool,
    pub save_every: u64,
    /// Keep every step's training rows (decoded, with rewards and advantages) in
    /// `rollouts-<step>.jsonl`.
    pub save_rollouts: bool,
    /// Keep the rollout trees of every this many steps in `trees-<step>.jsonl.gz`, for
    /// `trainer view` (0: never).
    pub trees_every: u64,
    /// How many prompts of such a step keep their trees.
    pub tree_prompts: usize,
    pub seed: u64,
    /// `auto`, `cpu`, `cuda` or `cuda:N`.
    pub device: DeviceRequest,
    /// `auto` (f32 on the CPU, bf16 on CUDA), `f32` or `bf16`.
    pub precision: crate::engine::device::Precision,
    /// What AdamW keeps per parameter: `stochastic-rounding` (16 bytes), `f32-master` (20) or
    /// `compact` (12); see `optim.rs`.
    pub optim_state: crate::engine::optim::OptimState,
    /// A file holding the agent prompt template (`{question}` placeholder); default: the
    /// env-server's.
    pub prompt_template: Option<PathBuf>,
    /// Search results per query; default: the env-server's.
    pub topk: Option<u32>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            model: PathBuf::new(),
            tokenizer: None,
            env: EnvUrls(vec!["ws://127.0.0.1:8000/".into()]),
            train_data: PathBuf::new(),
            eval_data: None,
            data_source: "nq".into(),
            out_dir: PathBuf::from("runs/default"),
            steps: 180,
            prompts_per_step: 512,
            rollout_batch_prompts: 32,
            rollout_schedule: Schedule::Phased,
            rollout_max_rows: 0,
            method: Method::tree(2, 2, 1, 3),
            estimator: None,
            lr: 1e-6,
            warmup_ratio: None,
            max_turns: 3,
            max_obs_tokens: 500,
            max_new_tokens: 500,
            max_response_tokens: 4096,
            max_context: 4096,
            temperature: 1.0,
            top_p: 0.95,
            top_k: 0,
            micro_batch: 8,
            mini_batches: 8,
            logits_chunk: 512,
            checkpoint_layers: false,
            loss_agg: Aggregation::TokenMean,
            clip_ratio_low: 0.2,
            clip_ratio_high: 0.2,
            clip_ratio_c: 3.0,
            kl_coef: 0.001,
            entropy_coef: 0.001,
            eval_every: 60,
            eval_max_questions: None,
            eval_seed: None,
            eval_before: false,
            eval_sampled: true,
            save_every: 60,
            save_rollouts: false,
            trees_every: 1,
            tree_prompts: 4,
            seed: 0,
            device: DeviceRequest::Auto,
            precision: crate::engine::device::Precision::Auto,
            optim_state: crate::engine::optim::OptimState::default(),
            prompt_template: None,
            topk: None,
        }
    }
}

fn value_error(key: &'static str, value: impl std::fmt::Display, why: &str) -> ConfigError {
    ConfigError::Value { key, value: value.to_string(), why: why.to_string() }
}

impl TrainConfig {
    /// Read and parse a TOML file (not yet validated: see [`TrainConfig::step_config`]).
    pub fn from_file(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        toml::from_str(&text)
            .map_err(|e| ConfigError::Parse { path: path.display().to_string(), message: e.to_string() })
    }

    /// The configuration as TOML (the copy a run folder keeps).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_default()
    }

    /// The estimator this run trains with.
    pub fn resolved_estimator(&self) -> Result<Estimator, ConfigError> {
        self.method
            .estimator(self.estimator)
            .map_err(|source| ConfigError::Method { method: self.method.to_string(), source })
    }

    /// The warm-up ratio this run uses.
    pub fn resolved_warmup_ratio(&self) -> f64 {
        self.warmup_ratio.unwrap_or_else(|| self.method.default_warmup_ratio())
    }

    /// Check everything that can be checked without touching files, and give the settings of a
    /// training step (the agent's prompt template is read later, by the run).
    pub fn step_config(&self) -> Result<StepConfig, ConfigError> {
        let estimator = self.resolved_estimator()?;
        let warmup = self.resolved_warmup_ratio();
        let positive = |key, v: usize| if v == 0 { Err(value_error(key, v, "must be at least 1")) } else { Ok(()) };
        positive("prompts_per_step", self.prompts_per_step)?;
        positive("micro_batch", self.micro_batch)?;
        positive("mini_batches", self.mini_batches)?;
        positive("max_new_tokens", self.max_new_tokens)?;
        positive("max_context", self.max_context)?;
        positive("logits_chunk", self.logits_chunk)?;
        if !(self.temperature > 0.0 && self.temperature.is_finite()) {
            return Err(value_error(
                "temperature",
                self.temperature,
                "training samples: it must be above 0 (greedy rollouts have no distribution to score)",
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(value_error("top_p", self.top_p, "must be in (0, 1]"));
        }
        if !(0.0..=1.0).contains(&warmup) {
            return Err(value_error("warmup_ratio", warmup, "must be in [0, 1]"));
        }
        if !(self.lr >= 0.0 && self.lr.is_finite()) {
            return Err(value_error("lr", self.lr, "must be a finite number >= 0"));
        }
        if self.env.0.is_empty() {
            return Err(value_error("env", "[]", "at least one env-server URL"));
        }
        if self.max_turns == 0 {
            return Err(value_error("max_turns", 0, "must be at least 1"));
        }
        for (key, v) in [("clip_ratio_low", self.clip_ratio_low), ("clip_ratio_high", self.clip_ratio_high)] {
            if !(v >= 0.0 && v.is_finite()) {
                return Err(value_error(key, v, "must be a finite number >= 0"));
            }
        }
        if self.rollout_max_rows > 0 && self.rollout_schedule != Schedule::Continuous {
            return Err(value_error(
                "rollout_max_rows",
                self.rollout_max_rows,
                "only the continuous schedule caps its running chains: set rollout_schedule = \"continuous\" or remove it",
            ));
        }
        if self.clip_ratio_c.is_nan() || self.clip_ratio_c <= 1.0 {
            return Err(value_error("clip_ratio_c", self.clip_ratio_c, "the dual-clip bound must be above 1"));
        }
        Ok(StepConfig {
            prompts_per_step: self.prompts_per_step,
            rollout_batch_prompts: self.rollout_batch_prompts,
            method: self.method,
            estimator,
            agent: self.agent(None),
            update: UpdateConfig {
                mini_batches: self.mini_batches,
                micro_batch: self.micro_batch,
                temperature: self.temperature,
                logits: crate::rl::algo::update::LogitsPath::Chunked(self.logits_chunk),
                checkpoint: self.checkpoint_layers,
                loss: LossConfig {
                    clip_low: self.clip_ratio_low,
                    clip_high: self.clip_ratio_high,
                    clip_c: self.clip_ratio_c,
                    kl_coef: self.kl_coef,
                    entropy_coef: self.entropy_coef,
                    aggregation: self.loss_agg,
                },
            },
            schedule: WarmupConstant::from_ratio(self.lr, warmup, self.steps),
            seed: self.seed,
            trees: crate::rl::train::trees::TreeRecording { every: self.trees_every, prompts: self.tree_prompts },
        })
    }

    /// The agent of this run (rollouts, and evaluation with the sampling changed), with the
    /// prompt template's text when it has been read.
    pub fn agent(&self, prompt_template: Option<String>) -> AgentConfig {
        AgentConfig {
            max_turns: self.max_turns,
            max_obs_tokens: self.max_obs_tokens,
            max_response_tokens: self.max_response_tokens,
            sampling: SamplingParams {
                temperature: self.temperature,
                top_p: self.top_p,
                top_k: self.top_k,
                max_new_tokens: self.max_new_tokens,
                stop: vec!["</search>".into(), "</answer>".into()],
            },
            prompt_template,
            max_context: self.max_context,
            topk: self.topk,
            schedule: self.rollout_schedule,
            max_rows: self.rollout_max_rows,
        }
    }

    /// The prompt template file's text, if one is configured.
    pub fn prompt_template_text(&self) -> Result<Option<String>, ConfigError> {
        self.prompt_template
            .as_ref()
            .map(|p| {
                std::fs::read_to_string(p).map_err(|source| ConfigError::Read { path: p.display().to_string(), source })
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<TrainConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn chain_gets_grpo_and_its_warmup() {
        let cfg = parse("method = { kind = \"chain\", n = 4 }\nsteps = 10\n").unwrap();
        let step = cfg.step_config().unwrap();
        assert_eq!(step.estimator, Estimator::Grpo);
        assert_eq!(step.schedule.warmup_steps, 5, "0.5 x 10");
        let tree = parse("steps = 100\n").unwrap().step_config().unwrap();
        assert_eq!((tree.method, tree.estimator), (Method::tree(2, 2, 1, 3), Estimator::Tree));
        assert_eq!(tree.schedule.warmup_steps, 28, "0.285 x 100");
        let ablation = parse("estimator = \"tree_inter\"\n").unwrap().step_config().unwrap();
        assert_eq!(ablation.estimator, Estimator::TreeInter);
        assert_eq!(parse("estimator = \"tree_inner\"\n").unwrap().estimator, Some(Estimator::TreeIntra));
    }

    #[test]
    fn what_would_silently_train_something_else_is_an_error() {
        let e = parse("method = \"chain\"\n").unwrap_err();
        assert!(!e.is_empty());
        let e = parse("method = { kind = \"Chain\", n = 4 }\n").unwrap_err();
        assert!(e.contains("unknown variant `Chain`, expected `tree` or `chain`"), "{e}");
        // The keys of the old flat layout are unknown now.
        let e = parse("chain_n = 4\n").unwrap_err();
        assert!(e.contains("unknown field `chain_n`"), "{e}");
        let e = parse("estimator = \"trees\"\n").unwrap_err();
        assert!(e.contains("unknown variant `trees`"), "{e}");
        let e = parse("loss_agg = \"mean\"\n").unwrap_err();
        assert!(e.contains("token-mean"), "{e}");
        let e = parse("precision = \"fp16\"\n").unwrap_err();
        assert!(e.contains("`auto`, `f32`, `bf16`"), "{e}");
        assert_eq!(parse("precision = \"bf16\"\n").unwrap().precision, crate::engine::device::Precision::Bf16);
        assert_eq!(
            parse("optim_state = \"compact\"\n").unwrap().optim_state,
            crate::engine::optim::OptimState::Compact
        );
        assert!(parse("optim_state = \"8bit\"\n").is_err());
        let e = parse("rollout_schedule = \"async\"\n").unwrap_err();
        assert!(e.contains("expected `phased` or `continuous`"), "{e}");
        let continuous = parse("rollout_schedule = \"continuous\"\n").unwrap().step_config().unwrap();
        assert_eq!(continuous.agent.schedule, Schedule::Continuous);
        assert_eq!(parse("").unwrap().step_config().unwrap().agent.schedule, Schedule::Phased);
        let capped =
            parse("rollout_schedule = \"continuous\"\nrollout_max_rows = 32\n").unwrap().step_config().unwrap();
        assert_eq!(capped.agent.max_rows, 32);
        let e = parse("rollout_max_rows = 32\n").unwrap().step_config().unwrap_err().to_string();
        assert!(e.contains("rollout_max_rows") && e.contains("continuous"), "{e}");
        let e = parse("device = \"gpu\"\n").unwrap_err();
        assert!(e.contains("expected auto, cpu, cuda or cuda:N"), "{e}");
        let chain_tree = parse("method = { kind = \"chain\", n = 4 }\nestimator = \"tree\"\n").unwrap();
        let e = chain_tree.step_config().unwrap_err().to_string();
        assert!(e.contains("method chain:4") && e.contains("needs tree rollouts"), "{e}");
        let greedy = parse("temperature = 0.0\n").unwrap();
        assert!(greedy.step_config().unwrap_err().to_string().contains("`temperature` = 0"));
        assert!(parse("top_p = 1.5\n").unwrap().step_config().is_err());
        assert!(parse("micro_batch = 0\n").unwrap().step_config().is_err());
        assert!(parse("warmup_ratio = 2.0\n").unwrap().step_config().is_err());
    }

    #[test]
    fn the_run_copy_reads_back() {
        let cfg = parse("method = { kind = \"chain\", n = 2 }\neval_max_questions = 7\ndevice = \"cpu\"\n").unwrap();
        assert_eq!(parse(&cfg.to_toml()).unwrap(), cfg);
    }
}
