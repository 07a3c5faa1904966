//! A small policy that already plays the synthetic world, from nothing: the scripted, imperfect
//! agent plays the world's training questions through an env-server, a BPE tokenizer is trained
//! on the corpus and the prompts, a small Qwen2 model is initialised, and SFT teaches it the
//! trajectories. What `cargo xtask demo` does step by step with the `trainer` subcommands, as one
//! library call (tests use it for a policy that answers).

use std::path::{Path, PathBuf};

use crate::engine::optim::{AdamW, AdamWConfig};
use crate::engine::scratch::{SmallModel, init_model, tokenizer_corpus, train_bpe};
use crate::rl::env::EnvClient;
use crate::support::world::{WorldFiles, WorldSpec};
use crate::workflows::scripted::{ScriptConfig, play_passes};
use crate::workflows::sft::{SftConfig, SftReport, tokenize, train};

/// How big and how imperfect the warm start is.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmStart {
    /// Times each training question is played (different imperfections each pass).
    pub passes: usize,
    pub script: ScriptConfig,
    pub vocab: usize,
    pub model: SmallModel,
    pub sft: SftConfig,
    pub seed: i64,
}

impl Default for WarmStart {
    /// The demo's settings.
    fn default() -> Self {
        Self {
            passes: 3,
            script: ScriptConfig { early_answer: 0.3, vague_query: 0.1, topk: Some(1), ..ScriptConfig::default() },
            vocab: 2048,
            model: SmallModel::default(),
            sft: SftConfig { epochs: 3, lr: 2e-3, batch: 4, measure_nll: true },
            seed: 0,
        }
    }
}

impl WarmStart {
    /// A policy in about a minute of CPU (a debug build): enough to search and answer, sometimes
    /// right, on a world of a few dozen training questions. For tests and smoke runs.
    pub fn tiny() -> Self {
        Self {
            passes: 3,
            vocab: 700,
            model: SmallModel { hidden: 64, layers: 2, heads: 4, kv_heads: 2, intermediate: 128 },
            sft: SftConfig { epochs: 12, lr: 5e-3, batch: 8, measure_nll: true },
            ..Self::default()
        }
    }
}

/// What a warm start made.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmStarted {
    /// The SFT policy (an HF folder with its tokenizer).
    pub policy: PathBuf,
    pub trajectories: usize,
    /// Trajectories the scripted agent got right.
    pub correct: usize,
    pub sft: SftReport,
}

/// Warm-start a small policy on the world in `files` (served by `env`), writing into `out`:
/// `warm.jsonl` (the trajectories), `init/` (tokenizer + random model), `sft/` (the policy).
pub fn warm_start(env: &EnvClient, files: &WorldFiles, out: &Path, cfg: &WarmStart) -> anyhow::Result<WarmStarted> {
    std::fs::create_dir_all(out)?;
    let spec = WorldSpec::read(&files.dir)?;
    let world = spec.world();
    let (train_questions, _) = spec.questions(&world);
    let prompt = std::fs::read_to_string(files.prompt())?;
    let script = ScriptConfig { prompt_template: Some(prompt.clone()), ..cfg.script.clone() };
    let played = play_passes(&world, &train_questions, env, &script, cfg.passes)?;
    let lines: Vec<String> = played.iter().map(|p| serde_json::to_string(&p.trajectory)).collect::<Result<_, _>>()?;
    std::fs::write(out.join("warm.jsonl"), lines.join("\n") + "\n")?;
    let init = out.join("init");
    let texts = tokenizer_corpus(&files.corpus(), Some(&files.train()), Some(&prompt))?;
    let vocab = train_bpe(&texts, cfg.vocab, &init)?;
    init_model(&init, vocab, cfg.model, cfg.seed)?;
    let (vs, lm) = crate::engine::model::load_model(&init, tch::Device::Cpu, tch::Kind::Float)?;
    let tok = crate::engine::tokenizer::Tokenizer::from_dir(&init)?;
    let rows = played.iter().map(|p| tokenize(&tok, &p.trajectory)).collect::<Result<Vec<_>, _>>()?;
    let mut opt = AdamW::new(&vs, AdamWConfig::default());
    let sft = train(&lm, &mut opt, &rows, cfg.sft, &mut |_| {});
    let policy = out.join("sft");
    let config = std::fs::read_to_string(init.join("config.json"))?;
    let tokenizer_files = [init.join("tokenizer.json"), init.join("tokenizer_config.json")];
    crate::engine::model::save_model(&vs, &config, &policy, tch::Kind::Float, &tokenizer_files)?;
    Ok(WarmStarted { policy, trajectories: played.len(), correct: played.iter().filter(|p| p.correct).count(), sft })
}
