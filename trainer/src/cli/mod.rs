//! The `trainer` command line: one args struct per subcommand, built from the shared flag groups
//! of `args`, each turned into the library's typed settings in one place and handed to the
//! library, which owns every workflow (training, SFT, warm starts, evaluation, budgets).

mod args;
mod heartbeat;
mod measure;
mod rl;
mod workflows;

use anyhow::Result;
use clap::{Parser, Subcommand};

use measure::{BenchArgs, BudgetArgs, ParityArgs, PlanArgs, ViewArgs};
use rl::{ExperimentArgs, GenerateArgs, TrainArgs};
use workflows::{EvalArgs, ImportArgs, InitSmallArgs, SftArgs, WarmstartArgs, WorldArgs};

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
        grove_trainer::engine::device::pin_threads(self.threads);
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
