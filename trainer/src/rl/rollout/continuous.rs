//! Continuous rollouts ([`Schedule::Continuous`](super::agent::Schedule)): every turn of every
//! chain of every prompt decodes in the engine's one running batch ([`Engine::step`]), joining
//! it when its context is ready and leaving at the token that ends it; its action goes to the
//! env-server at once and decoding goes on while the server answers; a prompt whose chains of
//! one round have all ended picks and forks its next round's branches right away, so one
//! prompt's expansions decode beside other prompts' first chains.
//!
//! The trees are those of the phased schedule's algorithm (spec §2.3: all picks of a round made
//! after the round before it ended, uniform with replacement), drawn from a stream of each
//! prompt's own (seeded from the caller's stream, one draw per prompt in order), so a rollout
//! does not depend on the order in which prompts progress. They differ from the phased
//! schedule's draws, which come from one stream in prompt order.

use std::collections::{HashMap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use grove_protocol::{ActionKind, TaskSpec};

use super::agent::{PromptRollout, PromptState, Rollout, RolloutError, Row, StepRecord};
use crate::engine::generate::{Generation, SeqId};
use crate::rl::env::PendingStep;
use crate::rl::method::TreeShape;
use crate::rl::rows::{Failure, Refused};

/// One prompt's progress: its trees, its own stream, the rounds done and the chains running.
struct Prompt {
    state: PromptState,
    rng: ChaCha8Rng,
    round: usize,
    running: usize,
}

impl Rollout<'_, '_> {
    /// Tree rollouts for several tasks on the running batch, at most `window` prompts (0: all)
    /// in flight and, with [`AgentConfig::max_rows`](super::agent::AgentConfig::max_rows), at
    /// most that many chains decoding: the next prompt starts (its episodes created) when there
    /// is room, so the batch stays full across what would be the phased schedule's batches of
    /// prompts. Rollouts are returned in task order; see the module's documentation.
    pub fn run_continuous(
        &mut self,
        tasks: &[TaskSpec],
        window: usize,
        shape: TreeShape,
        rng: &mut impl Rng,
    ) -> Result<Vec<PromptRollout>, RolloutError> {
        let before = self.engine.stats;
        let window = if window == 0 { tasks.len() } else { window };
        let mut streams: Vec<Option<ChaCha8Rng>> =
            (0..tasks.len()).map(|_| Some(ChaCha8Rng::seed_from_u64(rng.random::<u64>()))).collect();
        let mut prompts: Vec<Prompt> = Vec::with_capacity(tasks.len());
        let mut rows: Vec<Option<Row>> = Vec::new();
        let mut ready: VecDeque<usize> = VecDeque::new();
        let mut active = 0;
        self.enter(tasks, window, shape, (streams.as_mut_slice(), &mut prompts, &mut active), &mut rows, &mut ready)?;
        self.run_rows(&mut rows, &mut ready, |this, row, rows, ready| {
            let prompt = &mut prompts[row.prompt];
            let p = row.prompt;
            this.engine.remove(row.seq);
            prompt.state.trees[row.tree].add_chain(row.parent, row.steps)?;
            prompt.running -= 1;
            if prompt.running == 0 {
                this.next_round(prompt, p, shape, rows, ready)?;
                if prompt.running == 0 {
                    active -= 1;
                }
            }
            // A prompt or (with a row cap) a row ended: room for the next prompts, maybe.
            this.enter(tasks, window, shape, (streams.as_mut_slice(), &mut prompts, &mut active), rows, ready)
        })?;
        if rows.iter().any(Option::is_some) || prompts.len() < tasks.len() {
            return Err(RolloutError::Internal("a row or a prompt never ended"));
        }
        self.cost.generated_tokens += self.engine.stats.generated_tokens - before.generated_tokens;
        self.cost.prefill_tokens += self.engine.stats.prefill_tokens - before.prefill_tokens;
        Ok(prompts.into_iter().map(|p| p.state.finish()).collect())
    }

    /// Start the next prompts while fewer than `window` are in flight and their first chains fit
    /// under the row cap (one create request for them), queueing those chains; a prompt that
    /// cannot start a chain goes on to its rounds, and one that has nothing to run ends at once.
    fn enter(
        &mut self,
        tasks: &[TaskSpec],
        window: usize,
        shape: TreeShape,
        (streams, prompts, active): (&mut [Option<ChaCha8Rng>], &mut Vec<Prompt>, &mut usize),
        rows: &mut Vec<Option<Row>>,
        ready: &mut VecDeque<usize>,
    ) -> Result<(), RolloutError> {
        let cap = self.config.row_cap();
        while *active < window && prompts.len() < tasks.len() {
            // With a row cap, as many prompts as their first chains (M each) fit under it, and
            // one when none is in flight.
            let live = rows.iter().filter(|r| r.is_some()).count();
            let fit = cap.saturating_sub(live) / shape.m.max(1);
            let fit = if *active == 0 { fit.max(1) } else { fit };
            if fit == 0 {
                break;
            }
            let from = prompts.len();
            let to = (from + (window - *active).min(fit)).min(tasks.len());
            let mut mine: Vec<ChaCha8Rng> = streams[from..to]
                .iter_mut()
                .map(|s| s.take().ok_or(RolloutError::Internal("a prompt entered twice")))
                .collect::<Result<_, _>>()?;
            let (states, first) =
                self.start_prompts(&tasks[from..to], from, shape, |p| mine[p - from].random::<u64>())?;
            for (state, rng) in states.into_iter().zip(mine) {
                prompts.push(Prompt { state, rng, round: 0, running: 0 });
            }
            *active += to - from;
            for row in first {
                prompts[row.prompt].running += 1;
                ready.push_back(rows.len());
                rows.push(Some(row));
            }
            for (p, prompt) in prompts.iter_mut().enumerate().skip(from) {
                if prompt.running == 0 {
                    self.next_round(prompt, p, shape, rows, ready)?;
                    if prompt.running == 0 {
                        *active -= 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// Prompt `p`'s round ended: pick and fork its next round's branches (one fork request),
    /// queue them, and go on to the round after if none could start.
    fn next_round(
        &mut self,
        prompt: &mut Prompt,
        p: usize,
        shape: TreeShape,
        rows: &mut Vec<Option<Row>>,
        ready: &mut VecDeque<usize>,
    ) -> Result<(), RolloutError> {
        while prompt.running == 0 && prompt.round < shape.l {
            prompt.round += 1;
            let picks = prompt.state.picks(p, shape.n, &mut prompt.rng)?;
            for started in self.start_picks(picks)? {
                match started {
                    Ok(row) => {
                        prompt.state.episodes.push(row.episode);
                        prompt.running += 1;
                        ready.push_back(rows.len());
                        rows.push(Some(row));
                    }
                    Err((pick, failure)) => prompt.state.refuse(&pick, failure)?,
                }
            }
        }
        Ok(())
    }

    /// Decode `rows` (those in `ready` first) on the running batch until every row has ended;
    /// `ended` takes each row that ended and may queue new ones.
    pub(super) fn run_rows(
        &mut self,
        rows: &mut Vec<Option<Row>>,
        ready: &mut VecDeque<usize>,
        mut ended: impl FnMut(&mut Self, Row, &mut Vec<Option<Row>>, &mut VecDeque<usize>) -> Result<(), RolloutError>,
    ) -> Result<(), RolloutError> {
        let mut decoding: HashMap<SeqId, usize> = HashMap::new();
        // The actions sent after the last decode step, and their rows.
        let mut in_flight: Option<(PendingStep, Vec<(usize, Generation)>)> = None;
        let cap = self.config.row_cap();
        loop {
            // Ready rows join in order while the batch has fewer than the cap.
            while self.engine.running_rows() < cap
                && let Some(i) = ready.pop_front()
            {
                let row = rows[i].as_mut().ok_or(RolloutError::Internal("a ready row was attached"))?;
                self.truncate_context(row)?;
                self.engine.admit(row.seq)?;
                decoding.insert(row.seq, i);
            }
            let finished = if self.engine.running_rows() > 0 {
                self.engine.step(&self.config.sampling, self.tok)?
            } else {
                Vec::new()
            };
            // The replies to the actions sent before this step: they had the step's time to come
            // back, and are taken now whether or not they had (so that which rows decode
            // together never depends on the server's timing).
            if let Some((pending, which)) = in_flight.take() {
                let results = self.env.step_wait(pending)?;
                if results.len() != which.len() {
                    return Err(RolloutError::Internal("a step reply of another length"));
                }
                for ((i, g), result) in which.into_iter().zip(results) {
                    let row = rows[i].as_mut().ok_or(RolloutError::Internal("a stepped row was attached"))?;
                    if self.record(row, g, result)? {
                        ready.push_back(i);
                    } else {
                        let row = rows[i].take().ok_or(RolloutError::Internal("a row ended twice"))?;
                        ended(self, row, rows, ready)?;
                    }
                }
            }
            if !finished.is_empty() {
                let mut actions = Vec::with_capacity(finished.len());
                let mut which = Vec::with_capacity(finished.len());
                for g in finished {
                    let i = decoding.remove(&g.seq).ok_or(RolloutError::Internal("a generation of no row"))?;
                    let row = rows[i].as_ref().ok_or(RolloutError::Internal("a decoding row was attached"))?;
                    actions.push((row.episode, g.text.clone()));
                    which.push((i, g));
                }
                in_flight = Some((self.env.step_start(&actions), which));
            }
            if in_flight.is_none() && ready.is_empty() && self.engine.running_rows() == 0 {
                return Ok(());
            }
        }
    }

    /// Record one turn of `row` (its generation and the server's answer); whether the chain
    /// goes on.
    pub(super) fn record(
        &mut self,
        row: &mut Row,
        g: Generation,
        result: Result<grove_protocol::Observation, grove_protocol::ErrorInfo>,
    ) -> Result<bool, RolloutError> {
        let Generation { tokens, logprobs, .. } = g;
        let obs = match result {
            Ok(obs) => obs,
            Err(info) => {
                let failure = Failure::new(Refused::Step, &info);
                let step = StepRecord {
                    response: tokens,
                    logprobs,
                    episode: Some(row.episode),
                    env_step: row.steps.last().map_or(0, |s| s.0.env_step),
                    ..StepRecord::refused(failure)
                };
                row.steps.push((step, true));
                return Ok(false);
            }
        };
        if obs.kind == ActionKind::Search && !obs.forced_final {
            self.cost.tool_calls += 1;
        }
        if let Some(e) = &obs.error {
            *self.cost.tool_errors.entry(e.code.name().to_string()).or_default() += 1;
        }
        let mut obs_tokens = if obs.text.is_empty() { Vec::new() } else { self.tok.encode(&obs.text)? };
        let observation_truncated = obs_tokens.len() > self.config.max_obs_tokens;
        obs_tokens.truncate(self.config.max_obs_tokens);
        self.engine.extend(row.seq, &obs_tokens)?;
        let snapshot = if obs.done { None } else { Some(self.engine.fork(row.seq, 1)?[0]) };
        row.steps.push((
            StepRecord {
                response: tokens,
                logprobs,
                observation: obs_tokens,
                kind: obs.kind,
                done: obs.done,
                reward: obs.reward.as_ref().map(|r| r.score),
                metric: obs.reward.as_ref().map(|r| r.metric_value),
                outcome: obs.reward,
                observation_truncated,
                episode: Some(row.episode),
                env_step: obs.step,
                snapshot,
                tool_error: obs.error.map(|e| e.code),
                failure: None,
            },
            obs.done,
        ));
        Ok(!obs.done)
    }
}
