//! Continuous batching: one **running** decode batch that rows join and leave at any step.
//!
//! [`Engine::generate`] decodes a fixed set of sequences until the last of them finishes. A
//! caller that has work arriving at different times (the next turn of a chain whose observation
//! came back, the branches of a tree whose first chains ended) would wait for the slowest row of
//! every call. Here a sequence is [`Engine::admit`]ted at any time and decoded by
//! [`Engine::step`] together with every other admitted sequence; a finished row leaves at the
//! step it finished (its slot is reused by the next admission, no copy of the batch), and its
//! [`Generation`] is returned by that step.
//!
//! Layout: the batch cache's columns are shared by the rows, as in a generate call's batch; a
//! row admitted at column `c` holds its known tokens at `c - len .. c` and writes its draws at
//! `c`, `c + 1`, ... Admission encodes the new rows' uncached tokens in one batched pass of their
//! own, then places their keys and values into free slots (one copy per layer for all of them).
//! The live window moves left and the capacity grows when an admission needs room (amortised:
//! each move leaves at least as many free columns as it copied).
//!
//! What a sequence generates does not depend on when it was admitted or with whom: its uniforms
//! are drawn from its own stream (the same ones a generate call would use) and laid at the
//! columns where it draws; greedy decoding picks the same tokens as a generate call. A decode
//! step makes one host<->device transfer; an admission makes its own uploads, a compaction one.
//!
//! A sequence in the running batch cannot be extended, forked or generated for until its
//! generation is returned (refused with [`EngineError::Running`]); removed, it keeps nothing.

use rand::Rng;
use tch::{Kind, Tensor};

use super::sample::sample_batch;
use super::{Batch, Engine, EngineError, Finish, Generation, Row, SamplingParams, SeqId, take_token};
use crate::engine::device::transfers;
use crate::engine::model::{KvCache, Masking};
use crate::engine::tokenizer::Tokenizer;

/// One occupied slot of the running batch.
#[derive(Debug)]
struct Slot {
    seq: SeqId,
    /// Known tokens at admission.
    len: usize,
    /// Positions its chain held at admission.
    cached: usize,
    /// Column of its position 0.
    first: usize,
    generated: Vec<u32>,
    logprobs: Vec<f32>,
}

/// The running batch.
#[derive(Debug)]
pub(super) struct Running {
    cache: KvCache,
    /// `[slots, capacity]`, 1 on real columns: a row's own from its first column on.
    mask: Tensor,
    /// `[slots, 1]`: each slot's first column (a row's position at column c is `c - first`).
    first: Tensor,
    /// `[slots, capacity]`: the uniform each row draws with at each column (sampled batches).
    uniforms: Option<Tensor>,
    /// `[slots, vocab]`: the logits the next draw is made from.
    logits: Tensor,
    /// The next column decoding writes (the cache's length).
    col: usize,
    slots: Vec<Option<Slot>>,
    /// The sampling settings of the rows in the batch (one batch samples one way).
    params: SamplingParams,
}

impl Running {
    fn capacity(&self) -> usize {
        self.mask.size()[1] as usize
    }

    fn active(&self) -> usize {
        self.slots.iter().flatten().count()
    }
}

impl Engine<'_> {
    /// Queue `seq` to join the running batch at the next [`Engine::step`].
    pub fn admit(&mut self, seq: SeqId) -> Result<(), EngineError> {
        if !self.seqs.contains_key(&seq) {
            return Err(EngineError::UnknownSequence(seq));
        }
        if self.is_running(seq) {
            return Err(EngineError::Running(seq));
        }
        self.queued.push(seq);
        Ok(())
    }

    /// Whether `seq` is queued or decoding in the running batch.
    pub fn is_running(&self, seq: SeqId) -> bool {
        self.queued.contains(&seq)
            || self.running.as_ref().is_some_and(|r| r.slots.iter().flatten().any(|s| s.seq == seq))
    }

    /// Sequences queued or decoding.
    pub fn running_rows(&self) -> usize {
        self.queued.len() + self.running.as_ref().map_or(0, Running::active)
    }

    /// Admit the queued sequences, then draw one token for every row of the running batch (one
    /// transfer) and feed it; returns the generations that finished at this step, in slot order.
    /// Every row of the batch samples with `params`; a batch whose rows sampled with other
    /// settings must be drained (stepped until empty) first.
    pub fn step(&mut self, params: &SamplingParams, tok: &Tokenizer) -> Result<Vec<Generation>, EngineError> {
        if let Some(r) = &self.running
            && r.params != *params
            && r.active() > 0
        {
            return Err(EngineError::MixedSampling);
        }
        let mut done = Vec::new();
        if !self.queued.is_empty() {
            let queued = std::mem::take(&mut self.queued);
            self.stats.generate_calls += 1;
            self.stats.generated_sequences += queued.len() as u64;
            if params.max_new_tokens == 0 {
                done.extend(queued.into_iter().map(|seq| Generation {
                    seq,
                    tokens: Vec::new(),
                    logprobs: Vec::new(),
                    text: String::new(),
                    finish: Finish::Length,
                }));
            } else {
                self.place(&queued, params)?;
            }
        }
        let Some(mut run) = self.running.take() else { return Ok(done) };
        if run.active() == 0 {
            self.running = Some(run);
            return Ok(done);
        }
        let result = self.step_running(&mut run, tok, &mut done);
        self.running = Some(run);
        result?;
        Ok(done)
    }

    fn step_running(
        &mut self,
        run: &mut Running,
        tok: &Tokenizer,
        done: &mut Vec<Generation>,
    ) -> Result<(), EngineError> {
        let params = run.params.clone();
        let u = run.uniforms.as_ref().map(|u| u.narrow(1, run.col as i64, 1));
        let mut drawn = sample_batch(&run.logits, &params, u.as_ref(), self.nucleus_candidates);
        let before = transfers::count();
        let host: Vec<f64> = Vec::try_from(transfers::to_host(&drawn.packed).view([-1])).unwrap_or_default();
        if host.len() != 3 * run.slots.len() {
            return Err(EngineError::Transfer { got: host.len(), rows: run.slots.len() });
        }
        self.stats.decode_steps += 1;
        let drawn_before = self.stats.generated_tokens;
        let window = params.stop.iter().map(|s| s.len()).max().unwrap_or(0) + 2;
        for i in 0..run.slots.len() {
            let Some(slot) = run.slots[i].as_mut() else { continue };
            let (token, lp) = (host[3 * i] as u32, host[3 * i + 1] as f32);
            if host[3 * i + 2] > 0.5 {
                self.stats.truncated_nuclei += 1;
            }
            self.stats.generated_tokens += 1;
            let finish = take_token(tok, &params, window, (&mut slot.generated, &mut slot.logprobs), token, lp)?;
            if let Some(finish) = finish
                && let Some(slot) = run.slots[i].take()
            {
                let draws = slot.generated.len() + usize::from(finish == Finish::Eos);
                done.push(self.leave(&run.cache, i, slot, finish, draws, &params, tok)?);
            }
        }
        self.stats.drew(drawn_before);
        if run.active() == 0 {
            self.stats.step_transfers += transfers::count() - before;
            return Ok(());
        }
        if self.queued.is_empty() && run.active() * 2 <= run.slots.len() && run.slots.len() > 1 {
            compact(run, &mut drawn.tokens);
            self.stats.compactions += 1;
        }
        self.stats.step_transfers += transfers::count() - before;
        // Feed every row the token it drew, at column `col`.
        let col = run.col as i64;
        let ids = drawn.tokens.view([-1, 1]);
        let pos = (&run.first * -1) + col;
        let mask = run.mask.narrow(1, 0, col + 1);
        run.logits =
            tch::no_grad(|| self.model.forward_last_with(&ids, &pos, Masking::Padding(&mask), Some(&mut run.cache)));
        run.col += 1;
        Ok(())
    }

    /// A finished row leaves: its new keys and values become a segment of its sequence's chain,
    /// its stream advances by the draws it used, its tokens are appended.
    #[allow(clippy::too_many_arguments)]
    fn leave(
        &mut self,
        cache: &KvCache,
        index: usize,
        slot: Slot,
        finish: Finish,
        draws: usize,
        params: &SamplingParams,
        tok: &Tokenizer,
    ) -> Result<Generation, EngineError> {
        let hold = (slot.len + slot.generated.len()).saturating_sub(1);
        let text = tok.decode(&slot.generated, true)?;
        // A sequence removed while it decoded keeps nothing.
        let Some(state) = self.seqs.get_mut(&slot.seq) else {
            return Ok(Generation { seq: slot.seq, tokens: slot.generated, logprobs: slot.logprobs, text, finish });
        };
        state.keep(cache, index, slot.first, slot.cached, hold);
        if params.temperature > 0.0 {
            for _ in 0..draws {
                let _: f32 = state.rng.random();
            }
        }
        state.tokens.extend_from_slice(&slot.generated);
        Ok(Generation { seq: slot.seq, tokens: slot.generated, logprobs: slot.logprobs, text, finish })
    }

    /// Encode the queued rows in one pass of their own and place them into free slots.
    fn place(&mut self, seqs: &[SeqId], params: &SamplingParams) -> Result<(), EngineError> {
        let rows: Vec<Row> = seqs
            .iter()
            .map(|&seq| self.seqs.get(&seq).map(|s| Row::of(seq, s)).ok_or(EngineError::UnknownSequence(seq)))
            .collect::<Result<_, EngineError>>()?;
        let max_new = params.max_new_tokens;
        let fresh = Batch::build(self, &rows, 0, None)?;
        self.stats.prefill_tokens += fresh.encoded;
        self.stats.recomputed_tokens += fresh.recomputed;
        let end = fresh.end;
        let device = self.device();
        let mut run = match self.running.take() {
            Some(r) if r.active() > 0 => r,
            // An empty batch starts over at the new rows' width.
            _ => Running {
                cache: self.model.cache_with_capacity(0, 0),
                mask: Tensor::zeros([0, 0], (Kind::Int64, device)),
                first: Tensor::zeros([0, 1], (Kind::Int64, device)),
                uniforms: None,
                logits: Tensor::zeros([0, fresh.logits.size()[1]], (fresh.logits.kind(), device)),
                col: end,
                slots: Vec::new(),
                params: params.clone(),
            },
        };
        run.params = params.clone();
        let free = run.slots.iter().filter(|s| s.is_none()).count();
        let missing = rows.len().saturating_sub(free);
        // A batch that grows gets a quarter more slots than it needs, so that rows arriving one
        // or two at a time do not move it at every admission.
        let slots = if missing > 0 { (run.slots.len() + missing) * 5 / 4 } else { run.slots.len() };
        let need_left = end;
        let need_right = max_new;
        if run.col < need_left || run.col + need_right > run.capacity() || slots > run.slots.len() {
            rebase(&mut run, slots, need_left, need_right, params.temperature > 0.0);
        }
        let capacity = run.capacity();
        let col = run.col;
        // Free slots in order.
        let chosen: Vec<usize> = (0..run.slots.len()).filter(|&i| run.slots[i].is_none()).take(rows.len()).collect();
        let mut mask = vec![0i64; rows.len() * capacity];
        let mut first = vec![0i64; rows.len()];
        let mut uniforms = vec![0f32; rows.len() * capacity];
        for (r, row) in rows.iter().enumerate() {
            let start = col - row.len;
            first[r] = start as i64;
            for c in start..capacity {
                mask[r * capacity + c] = 1;
            }
            if params.temperature > 0.0 {
                let mut rng = self.seqs[&row.seq].rng.clone();
                for x in &mut uniforms[r * capacity + col..r * capacity + col + max_new] {
                    *x = rng.random::<f32>();
                }
            }
        }
        let idx: Vec<i64> = chosen.iter().map(|&i| i as i64).collect();
        let idx = transfers::to_device(&Tensor::from_slice(&idx), device);
        let n = rows.len() as i64;
        run.cache.place_rows(&idx, (col - end) as i64, &fresh.cache);
        let mask = transfers::to_device(&Tensor::from_slice(&mask).view([n, capacity as i64]), device);
        let _ = run.mask.index_copy_(0, &idx, &mask);
        let first_t = transfers::to_device(&Tensor::from_slice(&first).view([n, 1]), device);
        let _ = run.first.index_copy_(0, &idx, &first_t);
        if let Some(u) = run.uniforms.as_mut() {
            let src = transfers::to_device(&Tensor::from_slice(&uniforms).view([n, capacity as i64]), device);
            let _ = u.index_copy_(0, &idx, &src);
        }
        let _ = run.logits.index_copy_(0, &idx, &fresh.logits.to_kind(run.logits.kind()));
        for (r, &i) in rows.iter().zip(&chosen) {
            run.slots[i] = Some(Slot {
                seq: r.seq,
                len: r.len,
                cached: r.cached,
                first: col - r.len,
                generated: Vec::new(),
                logprobs: Vec::new(),
            });
        }
        self.running = Some(run);
        Ok(())
    }
}

/// Move the batch's live window (from its oldest row's first column to `col`) to the left edge
/// of new tensors with `slots` rows, at least `need_left` columns before the next write and
/// `need_right` after it, plus as many spare columns as the window holds (so that the next move
/// is at least that many steps away).
fn rebase(run: &mut Running, slots: usize, need_left: usize, need_right: usize, sampled: bool) {
    let lo = run.slots.iter().flatten().map(|s| s.first).min().unwrap_or(run.col);
    let live = run.col - lo;
    let to = need_left.saturating_sub(live);
    let col = to + live;
    let old_capacity = run.capacity();
    // Columns from `lo` on that hold data or future uniforms.
    let tail = old_capacity.saturating_sub(lo);
    let capacity = (col + need_right + live.max(64)).max(to + tail);
    let (rows, slots_i) = (run.slots.len() as i64, slots as i64);
    run.cache = run.cache.rebased(slots_i, capacity as i64, lo as i64, live as i64, to as i64);
    let device = run.mask.device();
    let grow = |old: &Tensor, kind: Kind, fill_future: bool| {
        let t = Tensor::zeros([slots_i, capacity as i64], (kind, device));
        if tail > 0 && rows > 0 {
            t.narrow(0, 0, rows).narrow(1, to as i64, tail as i64).copy_(&old.narrow(1, lo as i64, tail as i64));
        }
        if fill_future {
            let future = capacity - (to + tail).max(col);
            if future > 0 {
                let _ = t.narrow(1, (capacity - future) as i64, future as i64).fill_(1);
            }
        }
        t
    };
    run.mask = grow(&run.mask, Kind::Int64, true);
    run.uniforms = sampled.then(|| match &run.uniforms {
        Some(u) => grow(u, Kind::Float, false),
        None => Tensor::zeros([slots_i, capacity as i64], (Kind::Float, device)),
    });
    let shift = to as i64 - lo as i64;
    let first = Tensor::zeros([slots_i, 1], (Kind::Int64, device));
    if rows > 0 {
        first.narrow(0, 0, rows).copy_(&(&run.first + shift));
    }
    run.first = first;
    let vocab = run.logits.size()[1];
    let logits = Tensor::zeros([slots_i, vocab], (run.logits.kind(), device));
    if rows > 0 {
        logits.narrow(0, 0, rows).copy_(&run.logits);
    }
    run.logits = logits;
    for s in run.slots.iter_mut().flatten() {
        s.first = s.first + to - lo;
    }
    run.slots.resize_with(slots, || None);
    run.col = col;
}

/// Drop the free slots (one copy of the batch; one upload, of the slots kept).
fn compact(run: &mut Running, tokens: &mut Tensor) {
    let keep: Vec<i64> = (0..run.slots.len()).filter(|&i| run.slots[i].is_some()).map(|i| i as i64).collect();
    let idx = transfers::to_device(&Tensor::from_slice(&keep), run.mask.device());
    run.cache = run.cache.select_rows(&idx);
    run.mask = run.mask.index_select(0, &idx);
    run.first = run.first.index_select(0, &idx);
    run.uniforms = run.uniforms.as_ref().map(|u| u.index_select(0, &idx));
    run.logits = run.logits.index_select(0, &idx);
    *tokens = tokens.index_select(0, &idx);
    let slots = std::mem::take(&mut run.slots);
    run.slots = slots.into_iter().flatten().map(Some).collect();
}
