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
    let mut total = RolloutCost::default();
    if d.config.schedule == Schedule::Continuous {
        // One pass over every task, `batch` prompts in flight: the next starts when one ends.
        total.add(&d.pass(0, rng, visit, |r, rng| r.run_continuous(tasks, batch, shape, rng))?);
        return Ok(total);
    }
    let batch = if batch == 0 { tasks.len() } else { batch };
    for (c, chunk) in tasks.chunks(batch.max(1)).enumerate() {
        total.add(&d.pass(c * batch, rng, visit, |r, rng| r.run_many(chunk, shape, rng))?);
    }
    Ok(total)
}

impl Driver<'_, '_> {
    /// One rollout call (its prompts numbered from `first`), timed device-synchronised, its
    /// rollouts shown to `visit` (the batch, then each prompt in order) and released, their
    /// episodes closed in one request; its cost.
    fn pass(
        &mut self,
        first: usize,
        rng: &mut ChaCha8Rng,
        visit: &mut dyn Visit,
        roll: impl FnOnce(&mut Rollout<'_, '_>, &mut ChaCha8Rng) -> Result<Vec<PromptRollout>, RolloutError>,
    ) -> Result<RolloutCost, RolloutError> {
        let device = self.engine.device();
        crate::support::timing::sync(device);
        let t = Instant::now();
        let mut r = Rollout {
            engine: &mut *self.engine,
            tok: self.tok,
            env: self.env,
            config: self.config,
            cost: RolloutCost::default(),
        };
        let rollouts = roll(&mut r, rng)?;
        let cost = r.cost;
        crate::support::timing::sync(device);
        visit.batch(self.engine, &rollouts, &cost, t.elapsed().as_secs_f64());
        let mut opened = Vec::new();
        for (i, rollout) in rollouts.into_iter().enumerate() {
            visit.prompt(first + i, &rollout, rng)?;
            rollout.release(self.engine);
            opened.extend_from_slice(&rollout.episodes);
        }
        self.env.close(&opened).map_err(RolloutError::from)?;
        Ok(cost)
    }
}
