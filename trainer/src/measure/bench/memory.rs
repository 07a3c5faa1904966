//! The bench's training figures: one micro-batch's peak resident memory per logits path
//! (`trainer bench --train-memory`, CPU, from /proc) and one micro-batch's tokens/s
//! (`train_step`, run alone in a process when its device memory is sampled outside).

use std::time::Instant;

use tch::Device;

use super::{BenchRow, single, tokens};
use crate::engine::model::CausalLm;

/// Resident memory figures of this process from `/proc/self/status`, in bytes: (current, peak).
fn rss() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Reset the peak resident set size to the current one (Linux 4.0+).
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The training paths the memory figure compares.
const MEMORY_PATHS: [(&str, crate::rl::algo::update::LogitsPath, bool); 3] = [
    ("full logits (the path before chunking)", crate::rl::algo::update::LogitsPath::Full, false),
    ("chunked logits (512 positions)", crate::rl::algo::update::LogitsPath::Chunked(512), false),
    ("chunked logits + layer checkpointing", crate::rl::algo::update::LogitsPath::Chunked(512), true),
];

/// Peak memory of one training micro-batch of `batch` x `len` tokens, all of them generated
/// (every position scored), on a Qwen2-shaped model with the real Qwen2.5 vocabulary (151,936)
/// and a small body (hidden 64, 2 layers), so that the vocabulary projection dominates as it does
/// at the paper's shapes. CPU only: the figure is the growth of the process's peak resident set
/// over one PPO update (old and reference scoring, forward, backward, optimiser step), for each
/// path, in two rounds of opposite order. `None` where /proc cannot say.
pub fn train_memory(batch: usize, len: usize) -> Option<Vec<BenchRow>> {
    use crate::engine::model::ModelConfig;
    use crate::rl::algo::update::{UpdateConfig, ppo_update};
    let config = r#"{"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true}"#;
    let config = ModelConfig::from_json(config).ok()?;
    let vs = tch::nn::VarStore::new(Device::Cpu);
    let model = CausalLm::new(&vs.root(), config);
    crate::engine::model::init_normal(&vs, 0, 0.02);
    let vocab = model.config.vocab_size;
    let (rows, advantages) = random_rows(vocab, batch, len);
    let mut opt = crate::engine::optim::AdamW::new(&vs, Default::default());
    // Two rounds, the second in reverse order: memory an earlier arm freed may stay with the
    // process and hide a later arm's growth, so each arm's figure is its larger growth of the two
    // (the first and the last arm are each measured first once).
    let mut growth = [[0u64; 2]; MEMORY_PATHS.len()];
    let mut runs = [(0.0f64, 0.0f64); MEMORY_PATHS.len()];
    for (round, reverse) in [(0usize, false), (1, true)] {
        let order: Vec<usize> =
            if reverse { (0..MEMORY_PATHS.len()).rev().collect() } else { (0..MEMORY_PATHS.len()).collect() };
        for i in order {
            let (_, logits, checkpoint) = MEMORY_PATHS[i];
            let cfg = UpdateConfig { micro_batch: batch, logits, checkpoint, ..Default::default() };
            let (before, _) = rss()?;
            if !reset_peak() {
                return None;
            }
            let t = Instant::now();
            let stats = ppo_update(&model, &model, &mut opt, 0.0, &rows, &advantages, &cfg);
            let secs = t.elapsed().as_secs_f64();
            let (_, peak) = rss()?;
            growth[i][round] = peak.saturating_sub(before);
            runs[i] = (secs, stats.loss);
        }
    }
    let peaks: Vec<(&str, u64, f64, f64)> = MEMORY_PATHS
        .iter()
        .enumerate()
        .map(|(i, (name, _, _))| (*name, growth[i][0].max(growth[i][1]), runs[i].0, runs[i].1))
        .collect();
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let shape = format!("{batch} x {len} tokens, V = {vocab}, hidden 64, CPU f32");
    let mut out: Vec<BenchRow> = peaks
        .iter()
        .enumerate()
        .map(|(i, (name, bytes, secs, loss))| {
            BenchRow::new(
                format!("training micro-batch peak memory, {name}"),
                format!("{:.0}", mib(*bytes)),
                "MiB",
                format!(
                    "{shape}; the larger of two rounds in opposite orders ({:.0} / {:.0} MiB); {secs:.1} s; loss {loss:.6}",
                    mib(growth[i][0]),
                    mib(growth[i][1])
                ),
            )
        })
        .collect();
    let ratio = |i: usize| peaks[0].1 as f64 / peaks[i].1.max(1) as f64;
    out.push(BenchRow::new(
        "  full logits vs chunked: peak memory",
        format!("{:.1}x / {:.1}x", ratio(1), ratio(2)),
        "ratio",
        "without / with layer checkpointing (the loss is the same: see the note of each row)",
    ));
    Some(out)
}

/// `batch` training rows of `len` random tokens, every one generated (scored), with advantages
/// of alternating sign.
fn random_rows(vocab: i64, batch: usize, len: usize) -> (Vec<crate::rl::rows::TrainingRow>, Vec<f64>) {
    let rows = (0..batch)
        .map(|i| {
            let seq = tokens(vocab, len, 77 + i as u64);
            crate::rl::rows::TrainingRow {
                prompt: seq[..1].to_vec(),
                response: seq[1..].to_vec(),
                loss_mask: vec![1; len - 1],
                sampled_logprobs: Vec::new(),
                reward: 0.0,
                metric: 0.0,
                prompt_group: 0,
                tree_group: 0,
                leaf: 0,
                failure: None,
            }
        })
        .collect();
    (rows, (0..batch).map(|i| if i % 2 == 0 { 1.0 } else { -1.0 }).collect())
}

/// Tokens/s of one training micro-batch (a PPO update of `batch` x `len` random generated
/// tokens: old and reference scoring, forward, backward, optimiser step) on `model`, with the
/// logits path given: the median of `repeats` synchronised runs after a warm-up. Run alone in a
/// process, its peak device memory (sampled outside, e.g. by nvidia-smi) is that of this path.
pub fn train_step(
    model: &CausalLm,
    vs: &tch::nn::VarStore,
    (batch, len): (usize, usize),
    (logits, checkpoint): (crate::rl::algo::update::LogitsPath, bool),
    repeats: usize,
) -> BenchRow {
    use crate::rl::algo::update::{UpdateConfig, ppo_update};
    let (rows, advantages) = random_rows(model.config.vocab_size, batch, len);
    let mut opt = crate::engine::optim::AdamW::new(vs, Default::default());
    let cfg = UpdateConfig { micro_batch: batch, logits, checkpoint, ..Default::default() };
    let secs = single(model.device(), repeats, &mut || {
        ppo_update(model, model, &mut opt, 0.0, &rows, &advantages, &cfg);
    });
    BenchRow::new(
        format!(
            "training micro-batch, {logits:?}{}",
            if checkpoint && logits != crate::rl::algo::update::LogitsPath::Full {
                " + layer checkpointing"
            } else {
                ""
            }
        ),
        format!("{:.1}", (batch * len) as f64 / secs),
        "tokens/s",
        format!(
            "{batch} x {len} tokens, PPO update at lr 0 (scoring, forward, backward, step); median of {}; \
             optimiser {:?} at {:.1} bytes per parameter (weights, gradients, accumulators, moments)",
            repeats.max(1),
            opt.config.state,
            opt.bytes_per_param()
        ),
    )
}
