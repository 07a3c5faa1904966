//! The generation engine before the rewrite of `generate` (kept as the benchmark's baseline:
//! `trainer bench` measures both in the same run, and a test checks their greedy outputs agree).
//! Each call left-pads and concatenates every row's cache, appends each step by `cat`, samples
//! row by row on the host and re-decodes each generation at every token; every sequence holds its
//! own contiguous copy of its whole prefix.
//!
//! Invariant of a sequence between calls: its cache holds every token but the last.

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Device, Kind, Tensor};

use super::{EngineError, EngineStats, Finish, Generation, SamplingParams, SeqId, mix};
use crate::engine::model::{CausalLm, KvCache};
use crate::engine::tokenizer::Tokenizer;

#[derive(Debug)]
struct SeqState {
    tokens: Vec<u32>,
    /// Holds `tokens[..cached]`.
    cache: Option<KvCache>,
    cached: usize,
    rng: ChaCha8Rng,
    seed: u64,
    forks: u64,
}

/// Sequences and their caches, the way the engine was before (see the module note).
#[derive(Debug)]
pub struct LegacyEngine<'m> {
    model: &'m CausalLm,
    seqs: HashMap<SeqId, SeqState>,
    next: SeqId,
    pub stats: EngineStats,
}

impl<'m> LegacyEngine<'m> {
    pub fn new(model: &'m CausalLm) -> Self {
        Self { model, seqs: HashMap::new(), next: 0, stats: EngineStats::default() }
    }

    fn device(&self) -> Device {
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
        self.seqs.insert(
            id,
            SeqState { tokens, cache: None, cached: 0, rng: ChaCha8Rng::seed_from_u64(seed), seed, forks: 0 },
        );
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
        self.seqs.get_mut(&seq).ok_or(EngineError::UnknownSequence(seq))?.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// `n` children continuing from `seq` as it is now. They share its cache (no copy, no
    /// re-encoding) and get independent random streams derived from the parent's seed.
    pub fn fork(&mut self, seq: SeqId, n: usize) -> Result<Vec<SeqId>, EngineError> {
        let parent = self.seqs.get_mut(&seq).ok_or(EngineError::UnknownSequence(seq))?;
        let mut children = Vec::with_capacity(n);
        let mut made = Vec::with_capacity(n);
        for _ in 0..n {
            parent.forks += 1;
            let seed = mix(parent.seed, parent.forks);
            made.push(SeqState {
                tokens: parent.tokens.clone(),
                cache: parent.cache.as_ref().map(KvCache::share),
                cached: parent.cached,
                rng: ChaCha8Rng::seed_from_u64(seed),
                seed,
                forks: 0,
            });
        }
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

    pub fn remove(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
    }

    /// Encode everything but the last token of `seq` into its cache.
    fn prefill(&mut self, seq: SeqId) -> Result<(), EngineError> {
        let device = self.device();
        let model = self.model;
        let s = self.seqs.get_mut(&seq).ok_or(EngineError::UnknownSequence(seq))?;
        let target = s.tokens.len() - 1;
        if s.cached >= target {
            return Ok(());
        }
        let new: Vec<i64> = s.tokens[s.cached..target].iter().map(|t| i64::from(*t)).collect();
        let n = new.len() as i64;
        let ids = Tensor::from_slice(&new).view([1, n]).to_device(device);
        let pos = Tensor::arange_start(s.cached as i64, target as i64, (Kind::Int64, device)).unsqueeze(0);
        let mask = Tensor::ones([1, target as i64], (Kind::Int64, device));
        let mut cache = s.cache.take().unwrap_or_else(|| model.new_cache());
        tch::no_grad(|| {
            let _ = model.hidden(&ids, &pos, &mask, Some(&mut cache));
        });
        s.cache = Some(cache);
        s.cached = target;
        self.stats.prefill_tokens += n as u64;
        Ok(())
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
            self.prefill(s)?;
        }
        self.stats.generate_calls += 1;
        self.stats.generated_sequences += seqs.len() as u64;
        let device = self.device();
        let mut results: HashMap<SeqId, Generation> = HashMap::new();
        if params.max_new_tokens == 0 {
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
        // The batch: rows left-padded to the longest cache.
        let mut rows: Vec<SeqId> = seqs.to_vec();
        let lens: Vec<i64> = rows.iter().map(|s| self.seqs[s].cached as i64).collect();
        let longest = lens.iter().copied().max().unwrap_or(0);
        let mut cache = self.batch_cache(&rows, longest)?;
        let mut mask = Tensor::zeros([rows.len() as i64, longest], (Kind::Int64, device));
        for (r, len) in lens.iter().enumerate() {
            if *len > 0 {
                let _ = mask.get(r as i64).narrow(0, longest - len, *len).fill_(1);
            }
        }
        let mut pos: Vec<i64> = lens;
        let mut next: Vec<i64> = rows.iter().map(|s| i64::from(*self.seqs[s].tokens.last().unwrap_or(&0))).collect();
        let mut generated: Vec<Vec<u32>> = vec![Vec::new(); rows.len()];
        let mut generated_lp: Vec<Vec<f32>> = vec![Vec::new(); rows.len()];
        let mut step = 0usize;
        while !rows.is_empty() {
            let b = rows.len() as i64;
            let ids = Tensor::from_slice(&next).view([b, 1]).to_device(device);
            let p = Tensor::from_slice(&pos).view([b, 1]).to_device(device);
            mask = Tensor::cat(&[&mask, &Tensor::ones([b, 1], (Kind::Int64, device))], 1);
            let logits = tch::no_grad(|| self.model.forward_last(&ids, &p, &mask, Some(&mut cache)));
            // The distribution sampled from (temperature applied), for the whole batch at once.
            let scale = if params.temperature > 0.0 { params.temperature } else { 1.0 };
            let logp = (logits.to_kind(Kind::Float) / scale).log_softmax(-1, Kind::Float);
            step += 1;
            let mut keep_rows = Vec::new();
            for (r, &seq) in rows.iter().enumerate() {
                let row_logp = logp.get(r as i64);
                let state = self.seqs.get_mut(&seq).ok_or(EngineError::UnknownSequence(seq))?;
                let token = sample(&row_logp, params, &mut state.rng);
                self.stats.generated_tokens += 1;
                let finish = if tok.eos_ids.contains(&token) {
                    Some(Finish::Eos)
                } else {
                    generated[r].push(token);
                    generated_lp[r].push(row_logp.double_value(&[i64::from(token)]) as f32);
                    let text = tok.decode(&generated[r], true)?;
                    if params.stop.iter().any(|s| text.contains(s.as_str())) {
                        Some(Finish::Stop)
                    } else if step >= params.max_new_tokens {
                        Some(Finish::Length)
                    } else {
                        None
                    }
                };
                match finish {
                    None => {
                        keep_rows.push(r);
                    }
                    Some(f) => {
                        // Fed so far for this row: its cache plus `step` tokens (the first was
                        // the sequence's last token, then every sampled one but this).
                        let fed = state.cached as i64 + step as i64;
                        let start = mask.size()[1] - fed;
                        let row_cache = cache.select_rows(&Tensor::from_slice(&[r as i64]).to_device(device));
                        let kept = generated[r].clone();
                        state.tokens.extend_from_slice(&kept);
                        // Keep the invariant: the cache holds all tokens but the last.
                        let hold = state.tokens.len() as i64 - 1;
                        state.cache = Some(row_cache.narrow_positions(start, hold));
                        state.cached = hold as usize;
                        let text = tok.decode(&kept, true)?;
                        let logprobs = std::mem::take(&mut generated_lp[r]);
                        results.insert(seq, Generation { seq, tokens: kept, logprobs, text, finish: f });
                    }
                }
            }
            if keep_rows.len() < rows.len() {
                let idx =
                    Tensor::from_slice(&keep_rows.iter().map(|r| *r as i64).collect::<Vec<_>>()).to_device(device);
                cache = cache.select_rows(&idx);
                mask = mask.index_select(0, &idx);
                rows = keep_rows.iter().map(|r| rows[*r]).collect();
                generated = keep_rows.iter().map(|r| std::mem::take(&mut generated[*r])).collect();
                generated_lp = keep_rows.iter().map(|r| std::mem::take(&mut generated_lp[*r])).collect();
                pos = keep_rows.iter().map(|r| pos[*r]).collect();
            }
            next = generated.iter().map(|g| i64::from(*g.last().unwrap_or(&0))).collect();
            for p in pos.iter_mut() {
                *p += 1;
            }
        }
        Ok(seqs.iter().filter_map(|s| results.remove(s)).collect())
    }

    /// Stack the caches of `rows`, left-padded with zeros to `longest` positions.
    fn batch_cache(&self, rows: &[SeqId], longest: i64) -> Result<KvCache, EngineError> {
        let mut padded = Vec::with_capacity(rows.len());
        for s in rows {
            let state = &self.seqs[s];
            let c = match &state.cache {
                Some(c) => c.left_pad(longest),
                None => self.model.zero_cache(longest),
            };
            padded.push(c);
        }
        let refs: Vec<&KvCache> = padded.iter().collect();
        Ok(KvCache::cat(&refs).unwrap_or_else(|| self.model.new_cache()))
    }
}

/// Draw one token from `logp` (`[vocab]`, log-probabilities with the temperature applied):
/// greedy at temperature 0, else top-k and top-p, with the sequence's own random stream.
fn sample(logp: &Tensor, params: &SamplingParams, rng: &mut ChaCha8Rng) -> u32 {
    if params.temperature <= 0.0 {
        return logp.argmax(-1, false).int64_value(&[]) as u32;
    }
    let probs = logp.exp();
    let vocab = probs.size()[0];
    // With top-k, only the k largest need ordering.
    let (sorted, idx) = if params.top_k > 0 && (params.top_k as i64) < vocab {
        probs.topk(params.top_k as i64, -1, true, true)
    } else {
        probs.sort(-1, true)
    };
    let mut keep = sorted.size()[0];
    if params.top_p < 1.0 {
        // Smallest prefix whose mass reaches top_p (at least one token).
        let cum = sorted.cumsum(-1, Kind::Float);
        let below = cum.lt(params.top_p).sum(Kind::Int64).int64_value(&[]);
        keep = keep.min(below + 1);
    }
    let head: Vec<f32> = Vec::<f32>::try_from(sorted.narrow(0, 0, keep).to_device(Device::Cpu)).unwrap_or_default();
    let total: f32 = head.iter().sum();
    let mut u = rng.random::<f32>() * total;
    let mut pick = head.len().saturating_sub(1);
    for (i, p) in head.iter().enumerate() {
        if u < *p {
            pick = i;
            break;
        }
        u -= p;
    }
    idx.int64_value(&[pick as i64]) as u32
}
