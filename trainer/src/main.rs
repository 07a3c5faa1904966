//! `trainer`: generate with, import and benchmark models (training loops come with the RL issue).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use grove_trainer::device::{DeviceRequest, place};
use grove_trainer::generate::{Engine, SamplingParams};
use grove_trainer::model::load_model;
use grove_trainer::tokenizer::{ChatMessage, Tokenizer};

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
    /// Measure generation, prefill and training throughput of a model on this machine.
    Bench {
        #[arg(long)]
        model: PathBuf,
        #[arg(long, default_value = "auto")]
        device: DeviceRequest,
        #[arg(long, default_value_t = 64)]
        new_tokens: usize,
    },
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
            let placement = place(device)?;
            let (_vs, lm) = load_model(&model, placement.device, placement.kind)
                .with_context(|| format!("load {}", model.display()))?;
            let tok = Tokenizer::from_dir(&model)?;
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
        Command::Bench { model, device, new_tokens } => {
            let placement = place(device)?;
            let (_vs, lm) = load_model(&model, placement.device, placement.kind)?;
            let tok = Tokenizer::from_dir(&model)?;
            let report = grove_trainer::bench::run(&lm, &tok, 32, new_tokens);
            println!(
                "{:<40} {:>12}  setting ({:?}, {} threads)",
                "trainer bench",
                "value",
                placement.device,
                tch::get_num_threads()
            );
            for (name, value, note) in report.rows {
                println!("{name:<40} {value:>12.1}  {note}");
            }
        }
    }
    Ok(())
}
