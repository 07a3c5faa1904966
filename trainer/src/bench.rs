//! `trainer bench`: throughput of one model on this machine, every figure next to a baseline
//! measured in the same run:
//! - generation at several batch sizes, this engine against the engine before it
//!   (`generate::legacy`), greedy, with a check that both decode the same tokens;
//! - prefill and a training forward + backward;
//! - multi-turn generation with KV-prefix reuse against re-encoding the whole context at every
//!   turn (the reference's way: no prefix cache);
//! - with `--train-memory`, the peak memory of one training micro-batch, chunked logits against
//!   the full-logits path;
//! - with an env-server, a real tree and chain rollout on the same prompts ([`budget_rows`]).
//!
//! Timings are trustworthy on an accelerator too: every timed region ends with a device
//! synchronisation, runs once at the measured shape before it is timed, and is the median of
//! `repeats` runs; paired arms alternate which goes first.

use std::time::Instant;

use tch::{Device, Kind, Tensor};

use crate::env::EnvClient;
#[cfg(feature = "bench-baseline")]
use crate::generate::legacy::LegacyEngine;
use crate::generate::{Engine, SamplingParams};
use crate::logprobs::ScoreOptions;
use crate::logprobs::score_sequences;
use crate::method::Method;
use crate::model::CausalLm;
use crate::rollout::agent::{AgentConfig, RolloutError};
use crate::timing::{median, seconds};
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchOptions {
    /// Prompt tokens of the generation measurements.
    pub prompt_len: usize,
    /// Tokens sampled per sequence in the generation measurements.
    pub new_tokens: usize,
    /// Batch sizes of the generation measurements.
    pub gen_batches: Vec<usize>,
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
    /// Timed runs per figure (the median is reported).
    pub repeats: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            prompt_len: 32,
            new_tokens: 64,
            gen_batches: vec![1, 8, 64],
            prefill_batch: 8,
            prefill_len: 256,
            train_batch: 4,
            train_len: 256,
            turn_prompt: 256,
            turns: 4,
            turn_tokens: 32,
            obs_tokens: 200,
            repeats: 3,
        }
    }
}

/// Median seconds of `a` and of `b` over `repeats` runs each, after one untimed run of each at
/// the same shape; the two alternate which runs first.
fn paired(device: Device, repeats: usize, a: &mut dyn FnMut(), b: &mut dyn FnMut()) -> (f64, f64) {
    a();
    b();
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for rep in 0..repeats.max(1) {
        if rep % 2 == 0 {
            ta.push(seconds(device, a));
            tb.push(seconds(device, b));
        } else {
            tb.push(seconds(device, b));
            ta.push(seconds(device, a));
        }
    }
    (median(ta), median(tb))
}

/// Median seconds of `f` over `repeats` runs after one untimed run.
fn single(device: Device, repeats: usize, f: &mut dyn FnMut()) -> f64 {
    f();
    median((0..repeats.max(1)).map(|_| seconds(device, f)).collect())
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
    tch::no_grad(|| {
        let _ = model.hidden_with(&ids, &pos, crate::model::Masking::Causal, None);
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

/// The two engines, for the same-run comparison.
trait Generates {
    fn add_prompt(&mut self, tokens: Vec<u32>) -> u64;
    fn generate_tokens(&mut self, seqs: &[u64], params: &SamplingParams, tok: &Tokenizer) -> Vec<Vec<u32>>;
    fn generated(&self) -> u64;
}

impl Generates for Engine<'_> {
    fn add_prompt(&mut self, tokens: Vec<u32>) -> u64 {
        self.add(tokens, 1).unwrap_or(0)
    }
    fn generate_tokens(&mut self, seqs: &[u64], params: &SamplingParams, tok: &Tokenizer) -> Vec<Vec<u32>> {
        self.generate(seqs, params, tok).map(|g| g.into_iter().map(|g| g.tokens).collect()).unwrap_or_default()
    }
    fn generated(&self) -> u64 {
        self.stats.generated_tokens
    }
}

#[cfg(feature = "bench-baseline")]
impl Generates for LegacyEngine<'_> {
    fn add_prompt(&mut self, tokens: Vec<u32>) -> u64 {
        self.add(tokens, 1).unwrap_or(0)
    }
    fn generate_tokens(&mut self, seqs: &[u64], params: &SamplingParams, tok: &Tokenizer) -> Vec<Vec<u32>> {
        self.generate(seqs, params, tok).map(|g| g.into_iter().map(|g| g.tokens).collect()).unwrap_or_default()
    }
    fn generated(&self) -> u64 {
        self.stats.generated_tokens
    }
}

/// On fresh sequences: tokens/s of a first call (encoding the prompts, then decoding) and of a
/// second (decoding only), and the second call's tokens.
fn timed_generation(
    mut engine: impl Generates,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    tok: &Tokenizer,
    device: Device,
) -> Timed {
    let seqs: Vec<u64> = prompts.iter().map(|p| engine.add_prompt(p.clone())).collect();
    let t = seconds(device, &mut || {
        engine.generate_tokens(&seqs, params, tok);
    });
    let whole = engine.generated() as f64 / t.max(1e-12);
    let before = engine.generated();
    let mut out = Vec::new();
    let t = seconds(device, &mut || out = engine.generate_tokens(&seqs, params, tok));
    ((whole, (engine.generated() - before) as f64 / t.max(1e-12)), out)
}

/// Generation at batch `b`, this engine against the legacy one, each run on fresh sequences:
/// tokens/s of the whole call (encoding the prompts, then decoding) and of decoding alone (a
/// second call, the prompts already encoded), medians, and whether their greedy tokens agree.
struct GenFigures {
    whole: (f64, f64),
    decode: (f64, f64),
    same: bool,
}

/// What [`timed_generation`] measures: (tokens/s of the whole call, of decoding alone), and the
/// second call's tokens.
type Timed = ((f64, f64), Vec<Vec<u32>>);

/// The engine before this one, on fresh sequences, when this build has it (`bench-baseline`).
#[cfg(feature = "bench-baseline")]
fn legacy_generation(
    model: &CausalLm,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    tok: &Tokenizer,
) -> Option<Timed> {
    Some(timed_generation(LegacyEngine::new(model), prompts, params, tok, model.device()))
}

#[cfg(not(feature = "bench-baseline"))]
fn legacy_generation(
    _model: &CausalLm,
    _prompts: &[Vec<u32>],
    _params: &SamplingParams,
    _tok: &Tokenizer,
) -> Option<Timed> {
    None
}

/// Whether this build can measure the engine before (the `bench-baseline` feature).
pub const HAS_BASELINE: bool = cfg!(feature = "bench-baseline");

fn generation(model: &CausalLm, tok: &Tokenizer, vocab: i64, b: usize, opts: &BenchOptions) -> GenFigures {
    let device = model.device();
    let prompts: Vec<Vec<u32>> = (0..b).map(|i| tokens(vocab, opts.prompt_len, i as u64)).collect();
    let params = greedy(opts.new_tokens);
    let mut outputs: [Vec<Vec<u32>>; 2] = [Vec::new(), Vec::new()];
    let mut timings: [[Vec<f64>; 2]; 2] = Default::default();
    let mut run = |legacy: bool, keep: bool| {
        let measured = if legacy {
            legacy_generation(model, &prompts, &params, tok)
        } else {
            Some(timed_generation(Engine::new(model), &prompts, &params, tok, device))
        };
        let Some(((whole, decode), out)) = measured else { return };
        let i = usize::from(legacy);
        if keep {
            timings[i][0].push(whole);
            timings[i][1].push(decode);
        }
        outputs[i] = out;
    };
    run(false, false);
    run(true, false);
    for rep in 0..opts.repeats.max(1) {
        let order = if rep % 2 == 0 { [false, true] } else { [true, false] };
        for legacy in order {
            run(legacy, true);
        }
    }
    let [new, old] = timings;
    let [out_new, out_old] = outputs;
    GenFigures {
        whole: (median(new[0].clone()), median(old[0].clone())),
        decode: (median(new[1].clone()), median(old[1].clone())),
        same: !out_new.is_empty() && out_new == out_old,
    }
}

pub fn run(model: &CausalLm, tok: &Tokenizer, opts: &BenchOptions) -> BenchReport {
    let vocab = model.config.vocab_size.min(tok.vocab_size() as i64);
    let device = model.device();
    let mut rows = Vec::new();
    let note = format!("median of {} synchronised runs after a warm-up at the same shape", opts.repeats.max(1));
    for &b in &opts.gen_batches {
        let g = generation(model, tok, vocab, b, opts);
        let setting = format!("{} prompt + {} new tokens per sequence, greedy", opts.prompt_len, opts.new_tokens);
        for (what, (new, old)) in [("encode + decode", g.whole), ("decoding only", g.decode)] {
            rows.push(BenchRow::new(
                format!("generation, batch {b}, {what}"),
                format!("{new:.1}"),
                "tokens/s",
                format!("{setting}; {note}"),
            ));
            if !HAS_BASELINE {
                continue;
            }
            rows.push(BenchRow::new(
                format!("generation, batch {b}, {what}, engine before (baseline)"),
                format!("{old:.1}"),
                "tokens/s",
                "generate::legacy, same prompts, same run, alternating",
            ));
            rows.push(BenchRow::new(
                format!("  generation, batch {b}, {what}: engine vs engine before"),
                format!("{:.2}x", new / old.max(1e-12)),
                "ratio",
                format!("greedy outputs identical: {}", if g.same { "yes" } else { "NO" }),
            ));
        }
    }
    if !HAS_BASELINE {
        rows.push(BenchRow::new(
            "generation, engine before (baseline)",
            "-",
            "",
            "not in this build: the baseline engine comes with the `bench-baseline` feature (`cargo xtask bench` turns it on)",
        ));
    }
    let (b, len) = (opts.prefill_batch as i64, opts.prefill_len as i64);
    let secs = single(device, opts.repeats, &mut || prefill(model, vocab, b, len, 99));
    rows.push(BenchRow::new(
        "prefill",
        format!("{:.1}", (b * len) as f64 / secs),
        "tokens/s",
        format!("batch {b} x {len}, no grad; {note}"),
    ));
    let secs =
        single(device, opts.repeats, &mut || forward_backward(model, vocab, opts.train_batch, opts.train_len, 1000));
    rows.push(BenchRow::new(
        "training forward+backward",
        format!("{:.1}", (opts.train_batch * opts.train_len) as f64 / secs),
        "tokens/s",
        format!("batch {} x {}; {note}", opts.train_batch, opts.train_len),
    ));
    rows.extend(multi_turn(model, tok, vocab, opts));
    rows.extend(sdpa_kernels(model, opts));
    BenchReport { rows }
}

/// The attention kernel libtorch chose at each shape the engine and the trainer run: training
/// and prefill (causal, no past), decoding one position (unpadded, and padded as a batch of
/// prompts of unequal length is), and a padded first pass over a cached prefix.
fn sdpa_kernels(model: &CausalLm, opts: &BenchOptions) -> Vec<BenchRow> {
    let b = opts.gen_batches.iter().copied().max().unwrap_or(1) as i64;
    let past = (opts.prompt_len + opts.new_tokens) as i64;
    let shapes = [
        ("training", opts.train_batch as i64, opts.train_len as i64, 0, false),
        ("prefill", opts.prefill_batch as i64, opts.prefill_len as i64, 0, false),
        ("decode, rows of equal length", b, 1, past, false),
        ("decode, padded rows", b, 1, past, true),
        ("first pass over a cached prefix, padded", b, 16, past, true),
    ];
    let device = format!("{:?}, {:?}", model.device(), model.kind());
    shapes
        .into_iter()
        .map(|(what, batch, new, past, padded)| {
            BenchRow::new(
                format!("SDPA kernel: {what}"),
                model.sdpa_kernel(batch, new, past, padded).name(),
                "kernel",
                format!("batch {batch} x {new} new after {past} cached; {device}; libtorch's _fused_sdp_choice"),
            )
        })
        .collect()
}

/// What one multi-turn run cost.
#[derive(Debug, Default, Clone, Copy)]
struct TurnRun {
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
    if reuse {
        let mut engine = Engine::new(model);
        let Ok(seq) = engine.add(prompt, 1) else { return TurnRun::default() };
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
    TurnRun { generated, prefill }
}

fn multi_turn(model: &CausalLm, tok: &Tokenizer, vocab: i64, opts: &BenchOptions) -> Vec<BenchRow> {
    let setting = format!(
        "{} turns x {} tokens, {}-token prompt, {}-token observations, batch 1",
        opts.turns, opts.turn_tokens, opts.turn_prompt, opts.obs_tokens
    );
    let (mut kv, mut re) = (TurnRun::default(), TurnRun::default());
    let (t_kv, t_re) =
        paired(model.device(), opts.repeats, &mut || kv = turns_once(model, tok, vocab, opts, true), &mut || {
            re = turns_once(model, tok, vocab, opts, false)
        });
    let per_s = |r: &TurnRun, t: f64| r.generated as f64 / t.max(1e-12);
    vec![
        BenchRow::new(
            "multi-turn generation, KV-prefix reuse",
            format!("{:.1}", per_s(&kv, t_kv)),
            "tokens/s",
            format!("{setting}; {t_kv:.3} s, {} tokens encoded", kv.prefill),
        ),
        BenchRow::new(
            "multi-turn generation, re-encoding each turn (baseline)",
            format!("{:.1}", per_s(&re, t_re)),
            "tokens/s",
            format!("same turns; {t_re:.3} s, {} tokens encoded", re.prefill),
        ),
        BenchRow::new(
            "  KV-prefix reuse vs re-encoding",
            format!("{:.2}x", per_s(&kv, t_kv) / per_s(&re, t_re).max(1e-12)),
            "ratio",
            format!(
                "tokens/s, medians of {} alternating runs; re-encoding encodes {:.2}x the tokens",
                opts.repeats.max(1),
                re.prefill as f64 / kv.prefill.max(1) as f64
            ),
        ),
    ]
}

/// A real rollout of a tree method and of chain GRPO at the same nominal budget on the same
/// prompts, through an env-server ([`crate::budget::compare`], the rows `trainer budget` prints);
/// their generation speed timed as medians of `repeats` alternating runs (the rollouts are
/// seeded, so every run does the same work); the tree rolled out with all prompts batched; and
/// the keys and values its snapshots hold, shallow (1 turn) and deep.
pub fn budget_rows(
    (model, tok): (&CausalLm, &Tokenizer),
    env: &EnvClient,
    tasks: &[grove_protocol::TaskSpec],
    agent: &AgentConfig,
    (tree, chain): (Method, Method),
    repeats: usize,
) -> Result<Vec<BenchRow>, RolloutError> {
    use crate::budget::{BudgetRow, Measure, compare, measure};
    let compared = compare((model, tok), env, tasks, agent, &[tree, chain], 0)?;
    let (tree_row, chain_row) = (&compared[0], &compared[1]);
    // Timed as training rolls out: every prompt of the batch together.
    let all = Measure { seed: 0, batch_prompts: 0, replay: false };
    let (mut tree_secs, mut chain_secs) = (Vec::new(), Vec::new());
    let (mut tree_all, mut chain_all) = (None, None);
    for rep in 0..repeats.max(1) {
        let order = if rep % 2 == 0 { [tree, chain] } else { [chain, tree] };
        for m in order {
            let r = measure((model, tok), env, tasks, agent, m, all)?;
            if m == tree {
                tree_secs.push(r.rollout_seconds);
                tree_all = Some(r);
            } else {
                chain_secs.push(r.rollout_seconds);
                chain_all = Some(r);
            }
        }
    }
    let (tree_t, chain_t) = (median(tree_secs), median(chain_secs));
    let (Some(batched), Some(chain_batched)) = (tree_all, chain_all) else { return Ok(Vec::new()) };
    let shallow_agent = AgentConfig { max_turns: 1, ..agent.clone() };
    let shallow = measure((model, tok), env, tasks, &shallow_agent, tree, Measure { batch_prompts: 1, ..all })?;
    let p = tasks.len().max(1) as f64;
    let setting = format!(
        "real rollout, {} prompts, <= {} turns x {} tokens",
        tasks.len(),
        agent.max_turns,
        agent.sampling.max_new_tokens
    );
    let mut rows = Vec::new();
    for (r, secs) in [(tree_row, tree_row.rollout_seconds), (chain_row, chain_row.rollout_seconds)] {
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
            format!("measured; {secs:.2} s for all prompts, one at a time"),
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
    let rate = |r: &BudgetRow, secs: f64| r.generated_tokens as f64 / secs.max(1e-9);
    for (r, t) in [(&batched, tree_t), (&chain_batched, chain_t)] {
        rows.push(BenchRow::new(
            format!("{}: rollout, all prompts batched", r.label()),
            format!("{:.1}", rate(r, t)),
            "tokens/s",
            format!(
                "generated; {t:.2} s (median of {} alternating runs), mean batch {:.1} sequences",
                repeats.max(1),
                r.mean_batch
            ),
        ));
    }
    rows.push(BenchRow::new(
        format!("  {} vs {}: generated tokens/s, batched", tree_row.label(), chain_row.label()),
        format!("{:.2}x", rate(&batched, tree_t) / rate(&chain_batched, chain_t).max(1e-9)),
        "ratio",
        "same prompts, all rolled out together as training does",
    ));
    rows.push(BenchRow::new(
        format!("  {}: batched vs one prompt at a time", tree_row.label()),
        format!("{:.2}x", rate(&batched, tree_t) / rate(tree_row, tree_row.rollout_seconds).max(1e-9)),
        "ratio",
        format!("generated tokens/s; one at a time: {:.1} tokens/s", rate(tree_row, tree_row.rollout_seconds)),
    ));
    let per_traj = |r: &BudgetRow| r.generated_tokens as f64 / (r.trajectories_per_prompt * p).max(1e-9);
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
    for (name, r) in [("1 turn", &shallow), (&*format!("{} turns", agent.max_turns), tree_row)] {
        let kib = |b: u64| b as f64 / 1024.0;
        rows.push(BenchRow::new(
            format!("{}: KV held by roots and snapshots, {name}", r.label()),
            format!("{:.0} / {:.0}", kib(r.kv_bytes_held), kib(r.kv_bytes_copies)),
            "KiB",
            format!(
                "measured, shared prefixes / computed, one copy of the prefix per snapshot: {:.1}x; {} tokens encoded + generated",
                r.kv_bytes_copies as f64 / r.kv_bytes_held.max(1) as f64,
                r.prefill_tokens + r.generated_tokens
            ),
        ));
    }
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
/// path, in two rounds of opposite order. `None` where /proc cannot say.
pub fn train_memory(batch: usize, len: usize) -> Option<Vec<BenchRow>> {
    use crate::algo::update::{UpdateConfig, ppo_update};
    use crate::model::ModelConfig;
    let config = r#"{"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true}"#;
    let config = ModelConfig::from_json(config).ok()?;
    let vs = tch::nn::VarStore::new(Device::Cpu);
    let model = CausalLm::new(&vs.root(), config);
    crate::model::init_normal(&vs, 0, 0.02);
    let vocab = model.config.vocab_size;
    let (rows, advantages) = random_rows(vocab, batch, len);
    let mut opt = crate::optim::AdamW::new(&vs, Default::default());
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
fn random_rows(vocab: i64, batch: usize, len: usize) -> (Vec<crate::rows::TrainingRow>, Vec<f64>) {
    let rows = (0..batch)
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
    (logits, checkpoint): (crate::algo::update::LogitsPath, bool),
    repeats: usize,
) -> BenchRow {
    use crate::algo::update::{UpdateConfig, ppo_update};
    let (rows, advantages) = random_rows(model.config.vocab_size, batch, len);
    let mut opt = crate::optim::AdamW::new(vs, Default::default());
    let cfg = UpdateConfig { micro_batch: batch, logits, checkpoint, ..Default::default() };
    let secs = single(model.device(), repeats, &mut || {
        ppo_update(model, model, &mut opt, 0.0, &rows, &advantages, &cfg);
    });
    BenchRow::new(
        format!(
            "training micro-batch, {logits:?}{}",
            if checkpoint && logits != crate::algo::update::LogitsPath::Full { " + layer checkpointing" } else { "" }
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
