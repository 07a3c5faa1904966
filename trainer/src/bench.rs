//! `trainer bench`: throughput of one model on this machine: generation at batch 1 and 8 with the
//! KV cache, prefill, a training forward + backward, and multi-turn generation with KV-prefix
//! reuse against re-encoding the whole context at every turn (the reference's way, no prefix
//! cache). With an env-server, also a real tree and chain rollout at equal budget
//! ([`budget_rows`], spec §2.6).

use std::time::Instant;

use tch::{Kind, Tensor};

use crate::env::EnvClient;
use crate::generate::{Engine, SamplingParams};
use crate::logprobs::ScoreOptions;
use crate::logprobs::score_sequences;
use crate::method::Method;
use crate::model::CausalLm;
use crate::rollout::agent::{AgentConfig, RolloutError};
use crate::tokenizer::Tokenizer;

/// One figure: what, its value (formatted), its unit, and a baseline or note.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    pub figure: String,
    pub value: String,
    pub unit: String,
    pub note: String,
}

impl BenchRow {
    pub fn new(figure: impl Into<String>, value: impl Into<String>, unit: &str, note: impl Into<String>) -> Self {
        Self { figure: figure.into(), value: value.into(), unit: unit.into(), note: note.into() }
    }
}

#[derive(Debug, Clone)]
pub struct BenchReport {
    pub rows: Vec<BenchRow>,
}

/// Sizes of the measurements (`trainer bench --help`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchOptions {
    /// Prompt tokens of the generation measurements.
    pub prompt_len: usize,
    /// Tokens sampled per sequence in the generation measurements.
    pub new_tokens: usize,
    /// Prompts x tokens of the prefill measurement.
    pub prefill_batch: usize,
    pub prefill_len: usize,
    /// Sequences x tokens of the training forward + backward.
    pub train_batch: usize,
    pub train_len: usize,
    /// Multi-turn baseline: prompt tokens, turns, tokens generated per turn, observation tokens
    /// appended after each turn but the last.
    pub turn_prompt: usize,
    pub turns: usize,
    pub turn_tokens: usize,
    pub obs_tokens: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            prompt_len: 32,
            new_tokens: 64,
            prefill_batch: 8,
            prefill_len: 256,
            train_batch: 4,
            train_len: 256,
            turn_prompt: 256,
            turns: 4,
            turn_tokens: 32,
            obs_tokens: 200,
        }
    }
}

/// Random token ids in `[1, vocab)`, deterministic.
fn tokens(vocab: i64, n: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (1 + (x >> 33) % (vocab as u64 - 1)) as u32
        })
        .collect()
}

/// Greedy, no stop strings (EOS still ends a sequence; token counts come from the engine).
fn greedy(n: usize) -> SamplingParams {
    let mut p = SamplingParams::greedy(n);
    p.stop.clear();
    p
}

/// Hidden states of a `[b, len]` batch of random tokens, without grad.
fn prefill(model: &CausalLm, vocab: i64, b: i64, len: i64, seed: u64) {
    let device = model.device();
    let ids = tokens(vocab, (b * len) as usize, seed).iter().map(|t| i64::from(*t)).collect::<Vec<_>>();
    let ids = Tensor::from_slice(&ids).view([b, len]).to_device(device);
    let pos = Tensor::arange(len, (Kind::Int64, device)).unsqueeze(0).repeat([b, 1]);
    let mask = Tensor::ones([b, len], (Kind::Int64, device));
    tch::no_grad(|| {
        let _ = model.hidden(&ids, &pos, &mask, None);
    });
}

/// Mean log-probability of random sequences, backpropagated (grads are left on the weights).
fn forward_backward(model: &CausalLm, vocab: i64, b: usize, len: usize, seed: u64) {
    let seqs: Vec<Vec<u32>> = (0..b).map(|i| tokens(vocab, len, seed + i as u64)).collect();
    let scored = score_sequences(model, &seqs, ScoreOptions { micro_batch: b, temperature: 1.0, with_grad: true });
    let loss =
        Tensor::stack(&scored.iter().map(|s| s.logprobs.mean(Kind::Float)).collect::<Vec<_>>(), 0).mean(Kind::Float);
    (-loss).backward();
}

pub fn run(model: &CausalLm, tok: &Tokenizer, opts: &BenchOptions) -> BenchReport {
    let vocab = model.config.vocab_size.min(tok.vocab_size() as i64);
    let mut rows = Vec::new();
    // Generation: a `prompt_len` prompt, `new_tokens` greedy tokens, no stop string.
    let no_stop = greedy(opts.new_tokens);
    for batch in [1usize, 8] {
        let mut engine = Engine::new(model);
        let seqs: Vec<_> =
            (0..batch).map(|i| engine.add(tokens(vocab, opts.prompt_len, i as u64), i as u64).unwrap_or(0)).collect();
        // Prefill outside the timed part: generation speed alone.
        let _ = engine.generate(&seqs, &greedy(1), tok);
        let before = engine.stats.generated_tokens;
        let t = Instant::now();
        let _ = engine.generate(&seqs, &no_stop, tok);
        let n = engine.stats.generated_tokens - before;
        rows.push(BenchRow::new(
            format!("generation, batch {batch}"),
            format!("{:.1}", n as f64 / t.elapsed().as_secs_f64()),
            "tokens/s",
            format!("{} prompt + {} new tokens per sequence, KV cache", opts.prompt_len, opts.new_tokens),
        ));
    }
    // Prefill: one forward over a batch of prompts, no grad (after a small warm-up forward).
    prefill(model, vocab, 1, 16, 98);
    let (b, len) = (opts.prefill_batch as i64, opts.prefill_len as i64);
    let t = Instant::now();
    prefill(model, vocab, b, len, 99);
    rows.push(BenchRow::new(
        "prefill",
        format!("{:.1}", (b * len) as f64 / t.elapsed().as_secs_f64()),
        "tokens/s",
        format!("batch {b} x {len}, no grad"),
    ));
    // Training: forward + backward (after a small warm-up step: the first backward allocates).
    forward_backward(model, vocab, 1, 32, 500);
    let t = Instant::now();
    forward_backward(model, vocab, opts.train_batch, opts.train_len, 1000);
    rows.push(BenchRow::new(
        "training forward+backward",
        format!("{:.1}", (opts.train_batch * opts.train_len) as f64 / t.elapsed().as_secs_f64()),
        "tokens/s",
        format!("batch {} x {}", opts.train_batch, opts.train_len),
    ));
    rows.extend(multi_turn(model, tok, vocab, opts));
    BenchReport { rows }
}

/// What one multi-turn run cost.
struct TurnRun {
    secs: f64,
    generated: u64,
    prefill: u64,
}

/// Multi-turn generation, as an agent does it: a prompt, then `turns` generations with an
/// observation appended after each but the last. `reuse`: one engine sequence whose KV cache
/// carries over (only the new tokens are encoded); else a fresh engine per turn over the whole
/// context so far (the reference implementation has no prefix cache and re-encodes it).
fn turns_once(model: &CausalLm, tok: &Tokenizer, vocab: i64, opts: &BenchOptions, reuse: bool) -> TurnRun {
    let prompt = tokens(vocab, opts.turn_prompt, 7);
    let obs: Vec<Vec<u32>> = (0..opts.turns).map(|t| tokens(vocab, opts.obs_tokens, 100 + t as u64)).collect();
    let params = greedy(opts.turn_tokens);
    let (mut generated, mut prefill) = (0, 0);
    let t = Instant::now();
    if reuse {
        let mut engine = Engine::new(model);
        let Ok(seq) = engine.add(prompt, 1) else { return TurnRun { secs: 0.0, generated, prefill } };
        for (turn, ob) in obs.iter().enumerate() {
            let _ = engine.generate(&[seq], &params, tok);
            if turn + 1 < opts.turns {
                let _ = engine.extend(seq, ob);
            }
        }
        generated = engine.stats.generated_tokens;
        prefill = engine.stats.prefill_tokens;
    } else {
        let mut context = prompt;
        for (turn, ob) in obs.iter().enumerate() {
            let mut engine = Engine::new(model);
            let Ok(seq) = engine.add(context.clone(), 1) else { break };
            let out = engine.generate(&[seq], &params, tok).ok().and_then(|mut g| g.pop());
            generated += engine.stats.generated_tokens;
            prefill += engine.stats.prefill_tokens;
            context.extend(out.map(|g| g.tokens).unwrap_or_default());
            if turn + 1 < opts.turns {
                context.extend_from_slice(ob);
            }
        }
    }
    TurnRun { secs: t.elapsed().as_secs_f64(), generated, prefill }
}

fn multi_turn(model: &CausalLm, tok: &Tokenizer, vocab: i64, opts: &BenchOptions) -> Vec<BenchRow> {
    let setting = format!(
        "{} turns x {} tokens, {}-token prompt, {}-token observations, batch 1",
        opts.turns, opts.turn_tokens, opts.turn_prompt, opts.obs_tokens
    );
    let kv = turns_once(model, tok, vocab, opts, true);
    let re = turns_once(model, tok, vocab, opts, false);
    let per_s = |r: &TurnRun| r.generated as f64 / r.secs.max(1e-9);
    vec![
        BenchRow::new(
            "multi-turn generation, KV-prefix reuse",
            format!("{:.1}", per_s(&kv)),
            "tokens/s",
            format!("{setting}; {:.2} s, {} tokens encoded", kv.secs, kv.prefill),
        ),
        BenchRow::new(
            "multi-turn generation, re-encoding each turn (baseline)",
            format!("{:.1}", per_s(&re)),
            "tokens/s",
            format!("same turns; {:.2} s, {} tokens encoded", re.secs, re.prefill),
        ),
        BenchRow::new(
            "  KV-prefix reuse vs re-encoding",
            format!("{:.2}x", per_s(&kv) / per_s(&re).max(1e-9)),
            "ratio",
            format!("tokens/s; re-encoding encodes {:.2}x the tokens", re.prefill as f64 / kv.prefill.max(1) as f64),
        ),
    ]
}

/// A real rollout of a tree method and of chain GRPO at the same nominal budget on the same
/// prompts, through an env-server ([`crate::budget::compare`], the rows `trainer budget` prints),
/// plus the tree rolled out with all prompts batched against one prompt at a time.
pub fn budget_rows(
    (model, tok): (&CausalLm, &Tokenizer),
    env: &EnvClient,
    tasks: &[grove_protocol::TaskSpec],
    agent: &AgentConfig,
    (tree, chain): (Method, Method),
) -> Result<Vec<BenchRow>, RolloutError> {
    let compared = crate::budget::compare((model, tok), env, tasks, agent, &[tree, chain], 0)?;
    let (tree_row, chain_row) = (&compared[0], &compared[1]);
    let batched = crate::budget::measure((model, tok), env, tasks, agent, tree, (0, 0))?;
    let p = tasks.len().max(1) as f64;
    let setting = format!(
        "real rollout, {} prompts, <= {} turns x {} tokens",
        tasks.len(),
        agent.max_turns,
        agent.sampling.max_new_tokens
    );
    let mut rows = Vec::new();
    for r in [tree_row, chain_row] {
        let label = r.label();
        rows.push(BenchRow::new(
            format!("{label}: nominal budget (modelled, spec 2.6)"),
            format!("{:.1}", r.nominal_budget),
            "traj",
            setting.clone(),
        ));
        rows.push(BenchRow::new(
            format!("{label}: trajectories per prompt"),
            format!("{:.2}", r.trajectories_per_prompt),
            "traj",
            "measured",
        ));
        rows.push(BenchRow::new(
            format!("{label}: tool calls per prompt"),
            format!("{:.2}", r.tool_calls as f64 / p),
            "calls",
            "measured",
        ));
        rows.push(BenchRow::new(
            format!("{label}: generated tokens per prompt"),
            format!("{:.0}", r.generated_tokens as f64 / p),
            "tokens",
            format!("measured; {:.1} s for all prompts", r.rollout_seconds),
        ));
        rows.push(BenchRow::new(
            format!("{label}: prefill tokens per prompt, KV reuse / re-encode"),
            format!("{:.0} / {:.0}", r.prefill_tokens as f64 / p, r.reencode_tokens as f64 / p),
            "tokens",
            format!(
                "measured: {:.1}% saved by the prefix cache; re-encoding every context took {:.1} s",
                100.0 * r.prefill_saved(),
                r.reencode_seconds
            ),
        ));
    }
    let rate = |r: &crate::budget::BudgetRow| r.generated_tokens as f64 / r.rollout_seconds.max(1e-9);
    rows.push(BenchRow::new(
        format!("{}: rollout, all prompts batched", tree_row.label()),
        format!("{:.1}", rate(&batched)),
        "tokens/s",
        format!("generated; {:.1} s, mean batch {:.1} sequences", batched.rollout_seconds, batched.mean_batch),
    ));
    rows.push(BenchRow::new(
        format!("  {}: batched vs one prompt at a time", tree_row.label()),
        format!("{:.2}x", rate(&batched) / rate(tree_row).max(1e-9)),
        "ratio",
        format!("generated tokens/s; one at a time: {:.1} tokens/s", rate(tree_row)),
    ));
    let per_traj = |r: &crate::budget::BudgetRow| r.generated_tokens as f64 / (r.trajectories_per_prompt * p).max(1e-9);
    rows.push(BenchRow::new(
        format!("  {} vs {}: generated tokens per trajectory", tree_row.label(), chain_row.label()),
        format!("{:.2}x", per_traj(tree_row) / per_traj(chain_row).max(1e-9)),
        "ratio",
        format!(
            "{:.2}x trajectories for {:.2}x generated tokens, {:.2}x tool calls",
            tree_row.trajectories_per_prompt / chain_row.trajectories_per_prompt.max(1e-9),
            tree_row.generated_tokens as f64 / chain_row.generated_tokens.max(1) as f64,
            tree_row.tool_calls as f64 / chain_row.tool_calls.max(1) as f64
        ),
    ));
    Ok(rows)
}

/// The arithmetic of spec §2.6 when no rollout is measured: a tree (M,N,L) yields M(1 + NL)
/// trajectories for about M + MNL/2 chains of generation (a branch starts, on average, halfway
/// down its parent), so chain GRPO at equal budget has M(1 + NL/2) trajectories.
pub fn budget_arithmetic(tree: Method, turns: u32, turn_tokens: usize) -> Vec<BenchRow> {
    let shape = tree.shape();
    let chains = tree.budget();
    let per_chain_tokens = f64::from(turns) * turn_tokens as f64;
    let label = tree.label();
    let note = format!("modelled, spec §2.6 ({turns} turns x {turn_tokens} tokens per chain)");
    vec![
        BenchRow::new(
            format!("{label}: trajectories per prompt"),
            format!("{}", shape.m * shape.leaves_per_tree()),
            "traj",
            &note,
        ),
        BenchRow::new(
            format!("chain n={chains:.0}: trajectories per prompt"),
            format!("{chains:.0}"),
            "traj",
            "equal budget",
        ),
        BenchRow::new(
            "tree and chain: tool calls per prompt (at most)",
            format!("{:.0}", chains * f64::from(turns)),
            "calls",
            &note,
        ),
        BenchRow::new(
            "tree and chain: generated tokens per prompt (at most)",
            format!("{:.0}", chains * per_chain_tokens),
            "tokens",
            &note,
        ),
    ]
}

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
const MEMORY_PATHS: [(&str, crate::algo::update::LogitsPath, bool); 3] = [
    ("full logits (the path before chunking)", crate::algo::update::LogitsPath::Full, false),
    ("chunked logits (512 positions)", crate::algo::update::LogitsPath::Chunked(512), false),
    ("chunked logits + layer checkpointing", crate::algo::update::LogitsPath::Chunked(512), true),
];

/// Peak memory of one training micro-batch of `batch` x `len` tokens, all of them generated
/// (every position scored), on a Qwen2-shaped model with the real Qwen2.5 vocabulary (151,936)
/// and a small body (hidden 64, 2 layers), so that the vocabulary projection dominates as it does
/// at the paper's shapes. CPU only: the figure is the growth of the process's peak resident set
/// over one PPO update (old and reference scoring, forward, backward, optimiser step), for each
/// path in turn. `None` where /proc cannot say.
pub fn train_memory(batch: usize, len: usize) -> Option<Vec<BenchRow>> {
    use crate::algo::update::{UpdateConfig, ppo_update};
    use crate::model::ModelConfig;
    let config = r#"{"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true}"#;
    let config = ModelConfig::from_json(config).ok()?;
    tch::manual_seed(0);
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let model = CausalLm::new(&vs.root(), config);
    let vocab = model.config.vocab_size;
    let rows: Vec<crate::rows::TrainingRow> = (0..batch)
        .map(|i| {
            let seq = tokens(vocab, len, 77 + i as u64);
            crate::rows::TrainingRow {
                prompt: seq[..1].to_vec(),
                response: seq[1..].to_vec(),
                loss_mask: vec![1; len - 1],
                sampled_logprobs: Vec::new(),
                reward: 0.0,
                metric: 0.0,
                prompt_group: 0,
                tree_group: 0,
                failure: None,
            }
        })
        .collect();
    let advantages: Vec<f64> = (0..batch).map(|i| if i % 2 == 0 { 1.0 } else { -1.0 }).collect();
    let mut opt = crate::optim::AdamW::new(&vs, Default::default());
    let mut peaks = Vec::new();
    for (name, logits, checkpoint) in MEMORY_PATHS {
        let cfg = UpdateConfig { micro_batch: batch, logits, checkpoint, ..Default::default() };
        let (before, _) = rss()?;
        if !reset_peak() {
            return None;
        }
        let t = Instant::now();
        let stats = ppo_update(&model, &model, &mut opt, 0.0, &rows, &advantages, &cfg);
        let secs = t.elapsed().as_secs_f64();
        let (_, peak) = rss()?;
        peaks.push((name, peak.saturating_sub(before), secs, stats.loss));
    }
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let shape = format!("{batch} x {len} tokens, V = {vocab}, hidden 64, CPU f32");
    let mut out: Vec<BenchRow> = peaks
        .iter()
        .map(|(name, bytes, secs, loss)| {
            BenchRow::new(
                format!("training micro-batch peak memory, {name}"),
                format!("{:.0}", mib(*bytes)),
                "MiB",
                format!("{shape}; {secs:.1} s; loss {loss:.6}"),
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
