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

mod budget_rows;
mod memory;

pub use budget_rows::{budget_arithmetic, budget_rows};
pub use memory::{train_memory, train_step};

use tch::{Device, Kind, Tensor};

#[cfg(feature = "bench-baseline")]
use crate::engine::generate::legacy::LegacyEngine;
use crate::engine::generate::{Engine, SamplingParams};
use crate::engine::logprobs::ScoreOptions;
use crate::engine::logprobs::score_sequences;
use crate::engine::model::CausalLm;
use crate::engine::tokenizer::Tokenizer;
use crate::support::timing::{median, seconds};

pub use grove_rundir::bench::BenchRow;

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
/// `b` rows of `len` random token ids (deterministic) on `device`, and their positions.
fn random_rows(vocab: i64, b: i64, len: i64, seed: u64, device: Device) -> (Tensor, Tensor) {
    let ids = tokens(vocab, (b * len) as usize, seed).iter().map(|t| i64::from(*t)).collect::<Vec<_>>();
    let ids = Tensor::from_slice(&ids).view([b, len]).to_device(device);
    let pos = Tensor::arange(len, (Kind::Int64, device)).unsqueeze(0).repeat([b, 1]);
    (ids, pos)
}

fn prefill(model: &CausalLm, vocab: i64, b: i64, len: i64, seed: u64) {
    let (ids, pos) = random_rows(vocab, b, len, seed, model.device());
    tch::no_grad(|| {
        let _ = model.hidden_with(&ids, &pos, crate::engine::model::Masking::Causal, None);
    });
}

/// Tokens/s of the model's forward alone at the shape of the "decoding only" call: `b` rows
/// after `cached` positions, `steps` one-token passes, each fed the previous pass's greedy token
/// on the device, no sampling, no transfer, no bookkeeping: the part of decoding at this shape
/// that no scheduling or sampling work removes (median of `repeats` after a warm-up).
fn forward_floor(model: &CausalLm, vocab: i64, b: i64, cached: i64, steps: i64, repeats: usize) -> f64 {
    use crate::engine::model::Masking;
    let device = model.device();
    let (ids, pos) = random_rows(vocab, b, cached, 7, device);
    let run = || {
        tch::no_grad(|| {
            let mut cache = model.new_cache();
            let mut logits = model.forward_last_with(&ids, &pos, Masking::Causal, Some(&mut cache));
            crate::support::timing::sync(device);
            let t = std::time::Instant::now();
            for s in 0..steps {
                let next = logits.argmax(-1, true);
                let at = Tensor::full([b, 1], cached + s, (Kind::Int64, device));
                logits = model.forward_last_with(&next, &at, Masking::CausalAfterPast, Some(&mut cache));
            }
            let _ = logits.argmax(-1, false);
            crate::support::timing::sync(device);
            t.elapsed().as_secs_f64()
        })
    };
    run();
    let secs = median((0..repeats.max(1)).map(|_| run()).collect());
    (b * steps) as f64 / secs.max(1e-12)
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
        // What the engines' decoding is bounded by here: the forward alone at the same shape.
        let floor = forward_floor(
            model,
            vocab,
            b as i64,
            (opts.prompt_len + opts.new_tokens) as i64,
            opts.new_tokens as i64,
            opts.repeats,
        );
        rows.push(BenchRow::new(
            format!("generation, batch {b}, the model's forward alone"),
            format!("{floor:.1}"),
            "tokens/s",
            format!(
                "the decoding-only shape ({} cached, {} one-token passes), greedy token fed back on the device, nothing else: what scheduling and sampling cannot remove; {note}",
                opts.prompt_len + opts.new_tokens,
                opts.new_tokens
            ),
        ));
        rows.push(BenchRow::new(
            format!("  generation, batch {b}: engine decoding vs the forward alone"),
            format!("{:.2}x", g.decode.0 / floor.max(1e-12)),
            "ratio",
            "1.00x = no cost beyond the model's forward",
        ));
        if HAS_BASELINE {
            rows.push(BenchRow::new(
                format!("  generation, batch {b}: the forward alone vs the engine before's decoding"),
                format!("{:.2}x", floor / g.decode.1.max(1e-12)),
                "ratio",
                "the most an engine could gain over the baseline's decoding at this shape by cutting what it does beyond this forward",
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
