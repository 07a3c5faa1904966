//! The rollout driver training and the budget bench share: a list of prompts rolled out in
//! batches on one env-server, each batch one [`Rollout::run_many`], every prompt's rollout shown
//! to the caller before its engine state is released, each batch's episodes closed in one
//! request.

use std::time::Instant;

use rand_chacha::ChaCha8Rng;

use super::agent::{AgentConfig, PromptRollout, Rollout, RolloutCost, RolloutError, Schedule};
use crate::engine::generate::Engine;
use crate::engine::tokenizer::Tokenizer;
use crate::rl::env::EnvClient;
use crate::rl::method::TreeShape;

/// What a caller does with the rollouts [`drive`] makes.
pub trait Visit {
    /// A batch's rollouts, all still held by the engine, with what the batch cost and how long
    /// its `run_many` took (device-synchronised).
    fn batch(&mut self, _engine: &Engine<'_>, _rollouts: &[PromptRollout], _cost: &RolloutCost, _seconds: f64) {}

    /// One prompt's rollout (`index` into the driven tasks), before its engine state is
    /// released; `rng` is the stream the rollouts were drawn from, continued.
    fn prompt(&mut self, index: usize, rollout: &PromptRollout, rng: &mut ChaCha8Rng) -> Result<(), RolloutError>;
}

/// Where a drive rolls out: the engine, tokenizer, env-server and agent settings.
#[derive(Debug)]
pub struct Driver<'a, 'm> {
    pub engine: &'a mut Engine<'m>,
    pub tok: &'a Tokenizer,
    pub env: &'a EnvClient,
    pub config: &'a AgentConfig,
}

/// Roll out `tasks` with `shape`, `batch` prompts at a time (0: all in one batch), in order;
/// returns the summed cost. On the continuous schedule, `batch` prompts are in flight at a time
/// and the next starts as soon as one ends; every prompt's rollout is held until all have ended
/// (one `Visit::batch` for all of them).
pub fn drive(
    d: &mut Driver<'_, '_>,
    tasks: &[grove_protocol::TaskSpec],
    batch: usize,
    shape: TreeShape,
    rng: &mut ChaCha8Rng,
    visit: &mut dyn Visit,
) -> Result<RolloutCost, RolloutError> {
    let device = d.engine.device();
    let mut total = RolloutCost::default();
    if d.config.schedule == Schedule::Continuous {
        // One pass over every task, `batch` prompts in flight: the next starts when one ends.
        crate::support::timing::sync(device);
        let t = Instant::now();
        let mut r =
            Rollout { engine: &mut *d.engine, tok: d.tok, env: d.env, config: d.config, cost: RolloutCost::default() };
        let rollouts = r.run_continuous(tasks, batch, shape, rng)?;
        let cost = r.cost;
        crate::support::timing::sync(device);
        visit.batch(d.engine, &rollouts, &cost, t.elapsed().as_secs_f64());
        total.add(&cost);
        let mut opened = Vec::new();
        for (i, rollout) in rollouts.into_iter().enumerate() {
            visit.prompt(i, &rollout, rng)?;
            rollout.release(d.engine);
            opened.extend_from_slice(&rollout.episodes);
        }
        d.env.close(&opened).map_err(RolloutError::from)?;
        return Ok(total);
    }
    let batch = if batch == 0 { tasks.len() } else { batch };
    let mut first = 0;
    for chunk in tasks.chunks(batch.max(1)) {
        crate::support::timing::sync(device);
        let t = Instant::now();
        let mut r =
            Rollout { engine: &mut *d.engine, tok: d.tok, env: d.env, config: d.config, cost: RolloutCost::default() };
        let rollouts = r.run_many(chunk, shape, rng)?;
        let cost = r.cost;
        crate::support::timing::sync(device);
        visit.batch(d.engine, &rollouts, &cost, t.elapsed().as_secs_f64());
        total.add(&cost);
        let mut opened = Vec::new();
        for (i, rollout) in rollouts.into_iter().enumerate() {
            visit.prompt(first + i, &rollout, rng)?;
            rollout.release(d.engine);
            opened.extend_from_slice(&rollout.episodes);
        }
        d.env.close(&opened).map_err(RolloutError::from)?;
        first += chunk.len();
    }
    Ok(total)
}
