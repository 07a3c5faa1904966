//! The generation engine: batched sampling with a KV cache, per-sequence seeded randomness, stop
//! strings and EOS, and **forkable sequences**: a sequence can be forked into children that
//! continue from the same prefix without re-encoding it, and a child can be extended with new
//! tokens (an observation) before it samples again.
//!
//! Built for the device:
//! - a sequence's keys and values are a chain of immutable segments shared with its ancestors
//!   (a fork or a snapshot copies a pointer), so the memory a tree of sequences holds grows with
//!   the tokens encoded, not with nodes x context;
//! - one `generate` call lays its rows into one preallocated, left-padded batch cache, encodes
//!   every row's new tokens in one batched pass (the prompts, the observations), then decodes
//!   writing each step's keys and values in place;
//! - sampling (temperature, top-k, top-p, greedy) runs on the device for the whole batch, and a
//!   decode step makes **one** host<->device transfer: the sampled tokens are fed back on the
//!   device, positions are a device counter, a call's random uniforms are uploaded once, and the
//!   tokens, their log-probabilities and a flag per row come back in one copy (counted by
//!   [`crate::engine::device::transfers`]; the only other per-step transfer is a compaction's index);
//! - top-p draws from a candidate set (the top [`Engine::nucleus_candidates`] tokens), not a sort
//!   of the whole vocabulary;
//! - on an accelerator the next step is launched before the host reads this one (stop strings
//!   are checked one step behind), so host work overlaps the device's;
//! - stop strings are checked on the last few tokens only;
//! - finished rows stay in the batch until half of it has finished, then the batch is compacted
//!   once (amortised: each row is copied at most a few times, not once per finished row).
//!
//! Invariant of a sequence between calls: its cache holds every token but the last, which is fed
//! at the start of the next generation (so that its logits exist without recomputation).
//!
//! `legacy` keeps the engine before this one, as the benchmark's baseline (behind the
//! `bench-baseline` feature).

#[cfg(feature = "bench-baseline")]
pub mod legacy;
mod running;
mod sample;

use std::collections::HashMap;
use std::rc::Rc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Device, Kind, Tensor};

use self::sample::{Drawn, sample_batch};
use crate::engine::device::transfers;
use crate::engine::model::{CausalLm, KvCache, Masking};
use crate::engine::tokenizer::{Tokenizer, TokenizerError};

pub type SeqId = u64;

/// How to sample.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f64,
    /// Nucleus sampling; 1.0 disables it.
    pub top_p: f64,
    /// 0 disables it.
    pub top_k: usize,
    pub max_new_tokens: usize,
    /// Generation stops at the token whose decoded text completes one of these. That token is
    /// kept whole, so the text may run a few characters past the stop string: the text sent to
    /// the environment is always the decoding of the tokens that are trained.
    pub stop: Vec<String>,
}

impl Default for SamplingParams {
    /// The reference rollout settings: T = 1, top-p 0.95, no top-k, stop at `</search>` /
    /// `</answer>`, 500 new tokens.
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 0.95,
            top_k: 0,
            max_new_tokens: 500,
            stop: vec!["</search>".into(), "</answer>".into()],
        }
    }
}

impl SamplingParams {
    pub fn greedy(max_new_tokens: usize) -> Self {
        Self { temperature: 0.0, top_p: 1.0, top_k: 0, max_new_tokens, stop: Vec::new() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Eos,
    Stop,
    Length,
}

/// What one call produced for one sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub seq: SeqId,
    /// The kept new tokens (EOS excluded; through the token that completed a stop string).
    pub tokens: Vec<u32>,
    /// The log-probability of each kept token under the distribution it was drawn from: the
    /// logits divided by the temperature, before top-k / top-p truncation (the distribution the
    /// trainer's log-probs recompute); unscaled logits when greedy.
    pub logprobs: Vec<f32>,
    /// Exactly the decoding of `tokens` (special tokens skipped).
    pub text: String,
    pub finish: Finish,
}

/// Token counts, for budget accounting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Tokens run through the model to build caches (prompts, observations, forks' extensions).
    pub prefill_tokens: u64,
    /// Tokens sampled.
    pub generated_tokens: u64,
    /// Calls of [`Engine::generate`], and the sequences they decoded together (their ratio is
    /// the mean batch size).
    pub generate_calls: u64,
    pub generated_sequences: u64,
    /// Cached positions encoded again to line a batch's rows up (the first pass of a call runs
    /// every row's last `max uncached` tokens).
    pub recomputed_tokens: u64,
    /// Sampling steps of all calls (one token drawn per batch row each).
    pub decode_steps: u64,
    /// Host<->device transfers those steps made: one per step, plus one index upload per
    /// compaction.
    pub step_transfers: u64,
    /// Times a batch dropped its finished rows.
    pub compactions: u64,
    /// Tokens drawn from the candidate set when a row's top-p nucleus reached past it (the
    /// candidates renormalised: a truncated nucleus; see [`Engine::nucleus_candidates`]).
    pub truncated_nuclei: u64,
    /// The most rows one decode step drew a token for.
    pub peak_rows: u64,
}

impl EngineStats {
    /// A decode step drew tokens up to `generated_tokens`, from `before`.
    fn drew(&mut self, before: u64) {
        self.peak_rows = self.peak_rows.max(self.generated_tokens - before);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("no sequence {0}")]
    UnknownSequence(SeqId),
    #[error("sequence {0} is empty")]
    Empty(SeqId),
    #[error("token id {0} is outside the vocabulary")]
    BadToken(u32),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("a decode step returned {got} values for {rows} rows")]
    Transfer { got: usize, rows: usize },
    #[error("sequence {0} is in the running batch (wait for its generation)")]
    Running(SeqId),
    #[error("the running batch samples with other settings; step it until it is empty first")]
    MixedSampling,
}

/// Keys and values of consecutive positions of a sequence, one `[kv_heads, n, head_dim]` pair per
/// layer, after the positions its parent segment holds. Immutable once made: forks share it.
#[derive(Debug)]
struct Segment {
    parent: Option<Rc<Segment>>,
    /// Position of this segment's first token.
    start: usize,
    len: usize,
    layers: Vec<(Tensor, Tensor)>,
}

impl Segment {
    fn end(&self) -> usize {
        self.start + self.len
    }

    fn bytes(&self) -> u64 {
        self.layers
            .iter()
            .map(|(k, v)| (k.numel() * k.kind().elt_size_in_bytes() + v.numel() * v.kind().elt_size_in_bytes()) as u64)
            .sum()
    }
}

#[derive(Debug)]
struct SeqState {
    tokens: Vec<u32>,
    /// Holds `tokens[..cached]`, where `cached` is the chain's end.
    kv: Option<Rc<Segment>>,
    rng: ChaCha8Rng,
    seed: u64,
    forks: u64,
}

impl SeqState {
    fn cached(&self) -> usize {
        self.kv.as_ref().map_or(0, |s| s.end())
    }
}

/// Sequences and their caches, on the model's device. Not `Sync`: it lives on the tensor thread.
#[derive(Debug)]
pub struct Engine<'m> {
    model: &'m CausalLm,
    seqs: HashMap<SeqId, SeqState>,
    next: SeqId,
    pub stats: EngineStats,
    /// Size of the candidate set top-p draws from (the most probable tokens of each row). When a
    /// row's candidates hold less than `top_p` of its mass, its token is drawn from the
    /// candidates renormalised and counted in [`EngineStats::truncated_nuclei`]; 0 sorts the
    /// whole vocabulary (exact in every case, and slow).
    pub nucleus_candidates: usize,
    /// Launch each decode step before reading the previous one's tokens (default: on an
    /// accelerator, where it overlaps host and device work; on the CPU it only adds a step per
    /// call). Outputs are the same either way.
    pub lookahead: bool,
    /// Sequences admitted to the running batch and not placed yet (see [`Engine::admit`]).
    queued: Vec<SeqId>,
    running: Option<running::Running>,
}

/// The default [`Engine::nucleus_candidates`].
pub const NUCLEUS_CANDIDATES: usize = 1024;

pub(crate) fn mix(a: u64, b: u64) -> u64 {
    // splitmix64 of a combination: distinct, well-spread child seeds.
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One row of a generate call.
#[derive(Debug)]
struct Row {
    seq: SeqId,
    /// Known tokens before this call.
    len: usize,
    /// Positions its chain held before this call.
    cached: usize,
    generated: Vec<u32>,
    logprobs: Vec<f32>,
    finish: Option<Finish>,
    /// Uniforms this row used (one per step it was active when sampling).
    draws: usize,
}

impl Row {
    /// A row for `seq` as it stands now.
    fn of(seq: SeqId, state: &SeqState) -> Row {
        Row {
            seq,
            len: state.tokens.len(),
            cached: state.cached(),
            generated: Vec::new(),
            logprobs: Vec::new(),
            finish: None,
            draws: 0,
        }
    }
}

impl SeqState {
    /// Keep positions `cached..hold` of batch row `slot` of `cache`, where this sequence's
    /// position 0 sits at column `first`, as a new segment of its chain (nothing when `hold`
    /// does not pass `cached`).
    fn keep(&mut self, cache: &KvCache, slot: usize, first: usize, cached: usize, hold: usize) {
        if hold <= cached {
            return;
        }
        let n = hold - cached;
        let layers = cache.read_row(slot as i64, (first + cached) as i64, n as i64);
        // A chain that ran past `cached` can only be this row's own (it was read at build).
        let parent = self.kv.take();
        self.kv = Some(Rc::new(Segment { parent, start: cached, len: n, layers }));
    }
}

impl<'m> Engine<'m> {
    pub fn new(model: &'m CausalLm) -> Self {
        Self {
            model,
            seqs: HashMap::new(),
            next: 0,
            stats: EngineStats::default(),
            nucleus_candidates: NUCLEUS_CANDIDATES,
            lookahead: !matches!(model.device(), Device::Cpu),
            queued: Vec::new(),
            running: None,
        }
    }

    pub fn device(&self) -> Device {
        self.model.device()
    }

    /// A new sequence holding `tokens` (a prompt), with its own random stream.
    pub fn add(&mut self, tokens: Vec<u32>, seed: u64) -> Result<SeqId, EngineError> {
        self.check(&tokens)?;
        self.next += 1;
        let id = self.next;
        if tokens.is_empty() {
            return Err(EngineError::Empty(id));
        }
        self.seqs.insert(id, SeqState { tokens, kv: None, rng: ChaCha8Rng::seed_from_u64(seed), seed, forks: 0 });
        Ok(id)
    }

    fn check(&self, tokens: &[u32]) -> Result<(), EngineError> {
        let vocab = self.model.config.vocab_size;
        match tokens.iter().find(|t| i64::from(**t) >= vocab) {
            Some(t) => Err(EngineError::BadToken(*t)),
            None => Ok(()),
        }
    }

    /// Append tokens (an observation) to a sequence; they are encoded at its next generation.
    pub fn extend(&mut self, seq: SeqId, tokens: &[u32]) -> Result<(), EngineError> {
        self.check(tokens)?;
        if self.is_running(seq) {
            return Err(EngineError::Running(seq));
        }
        self.seqs.get_mut(&seq).ok_or(EngineError::UnknownSequence(seq))?.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// `n` children continuing from `seq` as it is now. They share its keys and values (a
    /// pointer each: no copy, no re-encoding) and get independent random streams derived from
    /// the parent's seed.
    pub fn fork(&mut self, seq: SeqId, n: usize) -> Result<Vec<SeqId>, EngineError> {
        if self.is_running(seq) {
            return Err(EngineError::Running(seq));
        }
        let parent = self.seqs.get_mut(&seq).ok_or(EngineError::UnknownSequence(seq))?;
        let mut made = Vec::with_capacity(n);
        for _ in 0..n {
            parent.forks += 1;
            let seed = mix(parent.seed, parent.forks);
            made.push(SeqState {
                tokens: parent.tokens.clone(),
                kv: parent.kv.clone(),
                rng: ChaCha8Rng::seed_from_u64(seed),
                seed,
                forks: 0,
            });
        }
        let mut children = Vec::with_capacity(n);
        for state in made {
            self.next += 1;
            self.seqs.insert(self.next, state);
            children.push(self.next);
        }
        Ok(children)
    }

    pub fn tokens(&self, seq: SeqId) -> Option<&[u32]> {
        self.seqs.get(&seq).map(|s| s.tokens.as_slice())
    }

    /// Drop a sequence (and its place in the running batch's queue; a row already decoding
    /// finishes and its generation is returned, with nothing kept).
    pub fn remove(&mut self, seq: SeqId) {
        self.queued.retain(|&s| s != seq);
        self.seqs.remove(&seq);
    }

    /// Bytes of keys and values the live sequences hold, each shared segment counted once.
    pub fn kv_bytes(&self) -> u64 {
        let mut seen = std::collections::HashSet::new();
        let mut total = 0;
        for s in self.seqs.values() {
            let mut at = s.kv.as_ref();
            while let Some(seg) = at {
                if !seen.insert(Rc::as_ptr(seg)) {
                    break;
                }
                total += seg.bytes();
                at = seg.parent.as_ref();
            }
        }
        total
    }

    /// Encode `tokens` into a fresh cache (all but the last, as for a sequence about to
    /// generate), then drop it: what re-encoding a context from scratch costs. Returns the tokens
    /// encoded.
    pub fn encode_fresh(&mut self, tokens: &[u32]) -> Result<u64, EngineError> {
        self.check(tokens)?;
        let n = tokens.len().saturating_sub(1);
        if n > 0 {
            let device = self.device();
            let ids: Vec<i64> = tokens[..n].iter().map(|t| i64::from(*t)).collect();
            let ids = Tensor::from_slice(&ids).view([1, n as i64]).to_device(device);
            let pos = Tensor::arange(n as i64, (Kind::Int64, device)).unsqueeze(0);
            tch::no_grad(|| {
                let _ = self.model.hidden_with(&ids, &pos, Masking::Causal, None);
            });
        }
        self.stats.prefill_tokens += n as u64;
        Ok(n as u64)
    }

    /// Generate for several sequences at once; each stops at EOS, a stop string or
    /// `max_new_tokens`. Results are in the order of `seqs`.
    pub fn generate(
        &mut self,
        seqs: &[SeqId],
        params: &SamplingParams,
        tok: &Tokenizer,
    ) -> Result<Vec<Generation>, EngineError> {
        for &s in seqs {
            if !self.seqs.contains_key(&s) {
                return Err(EngineError::UnknownSequence(s));
            }
            if self.is_running(s) {
                return Err(EngineError::Running(s));
            }
        }
        self.stats.generate_calls += 1;
        self.stats.generated_sequences += seqs.len() as u64;
        if params.max_new_tokens == 0 || seqs.is_empty() {
            return Ok(seqs
                .iter()
                .map(|&seq| Generation {
                    seq,
                    tokens: Vec::new(),
                    logprobs: Vec::new(),
                    text: String::new(),
                    finish: Finish::Length,
                })
                .collect());
        }
        let mut rows: Vec<Row> = seqs.iter().map(|&seq| Row::of(seq, &self.seqs[&seq])).collect();
        let max_new = params.max_new_tokens;
        // A call's uniforms: each row's next `max_new` draws from its own stream, uploaded once.
        // Its stream is advanced below by the draws the row used, so what a sequence samples
        // next does not depend on when its row finished or on the other rows.
        let uniforms = (params.temperature > 0.0).then(|| {
            let mut u = vec![0f32; rows.len() * max_new];
            for (r, row) in rows.iter().enumerate() {
                let mut rng = self.seqs[&row.seq].rng.clone();
                for x in &mut u[r * max_new..(r + 1) * max_new] {
                    *x = rng.random::<f32>();
                }
            }
            Tensor::from_slice(&u).view([rows.len() as i64, max_new as i64])
        });
        let mut batch = Batch::build(self, &rows, max_new, uniforms)?;
        self.stats.prefill_tokens += batch.encoded;
        self.stats.recomputed_tokens += batch.recomputed;
        let window = params.stop.iter().map(|s| s.len()).max().unwrap_or(0) + 2;
        let k = self.nucleus_candidates;
        let before = transfers::count();
        let mut current = batch.sample(params, 0, k);
        let mut step = 0usize;
        loop {
            // `current` holds step `step + 1`'s draw for every batch row.
            step += 1;
            let ahead = (self.lookahead && step < max_new).then(|| {
                batch.decode(self.model, &current.tokens);
                batch.sample(params, step, k)
            });
            let host: Vec<f64> = Vec::try_from(transfers::to_host(&current.packed).view([-1])).unwrap_or_default();
            if host.len() != 3 * batch.order.len() {
                return Err(EngineError::Transfer { got: host.len(), rows: batch.order.len() });
            }
            self.stats.decode_steps += 1;
            let drawn_before = self.stats.generated_tokens;
            for (slot, &r) in batch.order.iter().enumerate() {
                let row = &mut rows[r];
                if row.finish.is_some() {
                    continue;
                }
                let (token, lp) = (host[3 * slot] as u32, host[3 * slot + 1] as f32);
                if host[3 * slot + 2] > 0.5 {
                    self.stats.truncated_nuclei += 1;
                }
                row.draws += 1;
                self.stats.generated_tokens += 1;
                row.finish = take_token(tok, params, window, (&mut row.generated, &mut row.logprobs), token, lp)?;
                if row.finish.is_some() {
                    batch.keep(self, row, slot)?;
                }
            }
            self.stats.drew(drawn_before);
            let active = batch.order.iter().filter(|&&r| rows[r].finish.is_none()).count();
            if active == 0 {
                break;
            }
            let compact = active * 2 <= batch.order.len() && batch.order.len() > 1;
            current = match ahead {
                Some(mut next) => {
                    if compact {
                        batch.compact(&rows, &mut next);
                        self.stats.compactions += 1;
                    }
                    next
                }
                None => {
                    if compact {
                        batch.compact(&rows, &mut current);
                        self.stats.compactions += 1;
                    }
                    batch.decode(self.model, &current.tokens);
                    batch.sample(params, step, k)
                }
            };
        }
        self.stats.step_transfers += transfers::count() - before;
        let mut out = HashMap::with_capacity(rows.len());
        for row in rows {
            let text = tok.decode(&row.generated, true)?;
            let state = self.seqs.get_mut(&row.seq).ok_or(EngineError::UnknownSequence(row.seq))?;
            if params.temperature > 0.0 {
                for _ in 0..row.draws {
                    let _: f32 = state.rng.random();
                }
            }
            state.tokens.extend_from_slice(&row.generated);
            let finish = row.finish.unwrap_or(Finish::Length);
            out.insert(
                row.seq,
                Generation { seq: row.seq, tokens: row.generated, logprobs: row.logprobs, text, finish },
            );
        }
        Ok(seqs.iter().filter_map(|s| out.remove(s)).collect())
    }
}

/// A row's drawn token: EOS ends the row (not kept); any other is kept with its log-probability,
/// and ends the row when it completes a stop string (checked on the last `window` tokens) or
/// makes `max_new_tokens`.
fn take_token(
    tok: &Tokenizer,
    params: &SamplingParams,
    window: usize,
    (generated, logprobs): (&mut Vec<u32>, &mut Vec<f32>),
    token: u32,
    lp: f32,
) -> Result<Option<Finish>, EngineError> {
    if tok.eos_ids.contains(&token) {
        return Ok(Some(Finish::Eos));
    }
    generated.push(token);
    logprobs.push(lp);
    let tail = generated.len().saturating_sub(window);
    let text = tok.decode(&generated[tail..], true)?;
    Ok(if params.stop.iter().any(|s| text.contains(s.as_str())) {
        Some(Finish::Stop)
    } else if generated.len() >= params.max_new_tokens {
        Some(Finish::Length)
    } else {
        None
    })
}

/// The batch cache of one generate call. Row r's known tokens end at column `end` (left
/// padding); generated tokens are written at `end`, `end + 1`, ... for every row.
struct Batch {
    cache: KvCache,
    /// `[rows, capacity]`, 1 on real columns (every column from `end` on is real for every row).
    mask: Tensor,
    /// Which `rows` entry each batch row is (after compactions, a subset).
    order: Vec<usize>,
    /// `[rows, 1]` on the device: each batch row's known length before the call (positions).
    lens: Tensor,
    /// `[rows, max_new]` on the device: each row's uniform for each step (sampled calls).
    uniforms: Option<Tensor>,
    end: usize,
    /// Decode steps done (tokens fed after the first pass).
    fed: usize,
    padded: bool,
    logits: Tensor,
    /// New positions the first pass encoded, and positions it recomputed to align the rows.
    encoded: u64,
    recomputed: u64,
}

impl Batch {
    /// Lay the rows out, copy their cached prefixes in, and run the first pass over every row's
    /// last `width` tokens (at least its uncached ones): its logits are the first step's.
    fn build(
        engine: &Engine<'_>,
        rows: &[Row],
        max_new: usize,
        uniforms: Option<Tensor>,
    ) -> Result<Batch, EngineError> {
        let model = engine.model;
        let device = engine.device();
        let b = rows.len();
        let end = rows.iter().map(|r| r.len).max().unwrap_or(1);
        let width = rows.iter().map(|r| r.len - r.cached.min(r.len - 1)).max().unwrap_or(1);
        let capacity = end + max_new;
        let mut cache = model.cache_with_capacity(b as i64, capacity as i64);
        let mut mask = vec![0i64; b * capacity];
        let mut ids = vec![0i64; b * width];
        let mut pos = vec![0i64; b * width];
        for (r, row) in rows.iter().enumerate() {
            let state = &engine.seqs[&row.seq];
            let first = end - row.len;
            for c in first..capacity {
                mask[r * capacity + c] = 1;
            }
            // Positions before the pass come from the chain.
            let from_chain = row.len.saturating_sub(width);
            let mut segments = Vec::new();
            let mut at = state.kv.as_ref();
            while let Some(seg) = at {
                segments.push(seg.clone());
                at = seg.parent.as_ref();
            }
            for seg in segments.iter().rev() {
                if seg.start >= from_chain {
                    break;
                }
                let n = seg.len.min(from_chain - seg.start);
                cache.write_row(r as i64, (first + seg.start) as i64, &seg.layers, n as i64);
            }
            for i in 0..width {
                let col = end - width + i;
                if col >= first {
                    let p = col - first;
                    ids[r * width + i] = i64::from(state.tokens[p]);
                    pos[r * width + i] = p as i64;
                }
            }
        }
        cache.set_len((end - width) as i64);
        let mask = transfers::to_device(&Tensor::from_slice(&mask).view([b as i64, capacity as i64]), device);
        let ids = transfers::to_device(&Tensor::from_slice(&ids).view([b as i64, width as i64]), device);
        let pos = transfers::to_device(&Tensor::from_slice(&pos).view([b as i64, width as i64]), device);
        let lens: Vec<i64> = rows.iter().map(|r| r.len as i64).collect();
        let lens = transfers::to_device(&Tensor::from_slice(&lens).view([b as i64, 1]), device);
        let uniforms = uniforms.map(|u| transfers::to_device(&u, device));
        let padded = rows.iter().any(|r| r.len != end);
        let visible = mask.narrow(1, 0, end as i64);
        let masking = if padded {
            Masking::Padding(&visible)
        } else if end > width {
            Masking::CausalAfterPast
        } else {
            Masking::Causal
        };
        let logits = tch::no_grad(|| model.forward_last_with(&ids, &pos, masking, Some(&mut cache)));
        // New positions encoded into caches (every uncached token but each row's last, which
        // is the first decode step's input), and positions recomputed only to align the rows.
        let encoded = rows.iter().map(|r| (r.len - r.cached - 1) as u64).sum::<u64>();
        let recomputed = rows.iter().map(|r| (r.len.min(width) - (r.len - r.cached)) as u64).sum::<u64>();
        Ok(Batch {
            cache,
            mask,
            order: (0..b).collect(),
            lens,
            uniforms,
            end,
            fed: 0,
            padded,
            logits,
            encoded,
            recomputed,
        })
    }

    /// One decode step: feed each batch row the token it drew (`[rows]`, on the device; a
    /// finished row's is fed too and its output ignored). Nothing crosses to or from the host.
    fn decode(&mut self, model: &CausalLm, tokens: &Tensor) {
        let col = self.end + self.fed;
        let ids = tokens.view([-1, 1]);
        let pos = &self.lens + self.fed as i64;
        self.fed += 1;
        let mask = self.mask.narrow(1, 0, col as i64 + 1);
        let masking = if self.padded { Masking::Padding(&mask) } else { Masking::CausalAfterPast };
        self.logits = tch::no_grad(|| model.forward_last_with(&ids, &pos, masking, Some(&mut self.cache)));
    }

    /// Draw step `step`'s token (0-based) for every batch row from the last logits, on the device.
    fn sample(&self, params: &SamplingParams, step: usize, candidates: usize) -> Drawn {
        let u = self.uniforms.as_ref().map(|u| u.narrow(1, step as i64, 1));
        sample_batch(&self.logits, params, u.as_ref(), candidates)
    }

    /// A finished row's new keys and values become a segment of its sequence's chain: the
    /// positions from what it had cached up to all but its last token.
    fn keep(&self, engine: &mut Engine<'_>, row: &Row, slot: usize) -> Result<(), EngineError> {
        let hold = (row.len + row.generated.len()).saturating_sub(1);
        if hold <= row.cached {
            return Ok(());
        }
        let state = engine.seqs.get_mut(&row.seq).ok_or(EngineError::UnknownSequence(row.seq))?;
        state.keep(&self.cache, slot, self.end - row.len, row.cached, hold);
        Ok(())
    }

    /// Drop finished rows from the batch and from `drawn` (one copy of the cache for all of
    /// them; one upload, of the rows kept).
    fn compact(&mut self, rows: &[Row], drawn: &mut Drawn) {
        let keep: Vec<i64> =
            (0..self.order.len()).filter(|&i| rows[self.order[i]].finish.is_none()).map(|i| i as i64).collect();
        let idx = transfers::to_device(&Tensor::from_slice(&keep), self.mask.device());
        self.cache = self.cache.select_rows(&idx);
        self.mask = self.mask.index_select(0, &idx);
        self.lens = self.lens.index_select(0, &idx);
        self.uniforms = self.uniforms.as_ref().map(|u| u.index_select(0, &idx));
        self.logits = self.logits.index_select(0, &idx);
        drawn.tokens = drawn.tokens.index_select(0, &idx);
        drawn.packed = drawn.packed.index_select(0, &idx);
        self.order = keep.iter().map(|&i| self.order[i as usize]).collect();
    }
}
