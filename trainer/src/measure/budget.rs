//! Rollout budget accounting (spec §2.6): rollouts of several methods on the same prompts, with
//! what each cost. `trainer budget` prints these rows and `trainer bench --env` reports them;
//! both come from [`compare`].
//!
//! Measured: trajectories, tool calls, generated tokens, the tokens our engine encoded with
//! KV-prefix reuse, and the tokens (and seconds) of actually re-encoding every generation's full
//! context from scratch, as the reference implementation does (it has no prefix cache).
//! Modelled: only the method's nominal budget, `Method::budget` (spec §2.6's formula).

use std::time::Instant;

use rand::SeedableRng;

use crate::engine::generate::Engine;
use crate::engine::model::CausalLm;
use crate::engine::tokenizer::Tokenizer;
use crate::rl::env::EnvClient;
use crate::rl::method::Method;
use crate::rl::rollout::agent::{AgentConfig, PromptRollout, RolloutCost, RolloutError};
use crate::rl::rollout::drive::{Driver, Visit, drive};

#[derive(Debug, Clone, PartialEq)]
pub struct BudgetRow {
    pub method: Method,
    pub prompts: usize,
    /// Modelled: the method's nominal budget in complete trajectories per prompt.
    pub nominal_budget: f64,
    /// Measured from here on.
    pub trajectories_per_prompt: f64,
    pub tool_calls: u64,
    pub generated_tokens: u64,
    /// Tokens encoded into caches by our engine (forks reuse their parent's cache).
    pub prefill_tokens: u64,
    /// Tokens encoded by re-encoding each generation's whole context from scratch.
    pub reencode_tokens: u64,
    /// Wall time of the rollout, and of the re-encoding replay (device-synchronised).
    pub rollout_seconds: f64,
    pub reencode_seconds: f64,
    /// Rows the engine decoded per decode step, on average (tokens drawn / steps).
    pub mean_batch: f64,
    /// The most rows one decode step drew for.
    pub peak_rows: u64,
    /// Decode steps, and the passes that encoded new rows' contexts before decoding them (one
    /// per generate call; one per admission to the running batch).
    pub decode_steps: u64,
    pub first_passes: u64,
    /// Measured: bytes of keys and values the engine held for the trees' roots and snapshots
    /// once a batch was rolled out (the largest batch's), shared prefixes counted once.
    pub kv_bytes_held: u64,
    /// Computed from the same trees: what one contiguous copy of its whole prefix per held
    /// sequence takes (how the engine before kept snapshots).
    pub kv_bytes_copies: u64,
}

impl BudgetRow {
    pub fn label(&self) -> String {
        self.method.label()
    }

    /// Fraction of the re-encoding prefill that KV-prefix reuse saved.
    pub fn prefill_saved(&self) -> f64 {
        1.0 - self.prefill_tokens as f64 / self.reencode_tokens.max(1) as f64
    }
}

/// Re-encode, from scratch, the context every node of `r` was generated from (the prompt plus the
/// steps on the path to its parent); the tokens encoded.
fn reencode(engine: &mut Engine<'_>, r: &PromptRollout) -> Result<u64, RolloutError> {
    let mut total = 0;
    for tree in &r.trees {
        for id in 1..tree.len() {
            let Some(node) = tree.node(id) else { continue };
            if node.step.as_ref().is_none_or(|s| s.response.is_empty()) {
                continue; // a refused trajectory that generated nothing
            }
            let mut context = r.prompt_tokens.clone();
            for s in tree.path(node.parent.unwrap_or(0)) {
                context.extend(&s.response);
                context.extend(&s.observation);
            }
            total += engine.encode_fresh(&context)?;
        }
    }
    Ok(total)
}

/// How [`measure`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measure {
    pub seed: u64,
    /// Prompts rolled out together ([`Rollout::run_many`]; 1: one at a time, 0: all).
    pub batch_prompts: usize,
    /// Replay the re-encoding baseline too.
    pub replay: bool,
}

/// Bytes one position's keys and values take in `model`.
fn kv_bytes_per_token(model: &CausalLm) -> u64 {
    let c = &model.config;
    let elt = if model.device().is_cuda() { 2 } else { 4 };
    (c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * elt) as u64
}

/// Positions a held sequence (a root, or a node's snapshot) caches: its whole context but the
/// last token, observation excluded (it is encoded at the next generation).
fn held_positions(r: &PromptRollout) -> u64 {
    let prompt = r.prompt_tokens.len() as u64;
    let mut total = 0;
    for tree in &r.trees {
        total += prompt.saturating_sub(1);
        for id in 1..tree.len() {
            let Some(step) = tree.node(id).and_then(|n| n.step.as_ref()) else { continue };
            if step.snapshot.is_some() {
                let path: u64 = tree.path(id).iter().map(|s| (s.response.len() + s.observation.len()) as u64).sum();
                total += (prompt + path).saturating_sub(step.observation.len() as u64 + 1);
            }
        }
    }
    total
}

/// Roll out `method` on every task, `how.batch_prompts` at a time, then (with `how.replay`)
/// replay the re-encoding baseline.
pub fn measure(
    (model, tok): (&CausalLm, &Tokenizer),
    env: &EnvClient,
    tasks: &[grove_protocol::TaskSpec],
    agent: &AgentConfig,
    method: Method,
    how: Measure,
) -> Result<BudgetRow, RolloutError> {
    let (seed, batch_prompts) = (how.seed, how.batch_prompts);
    let shape = method.shape();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut engine = Engine::new(model);
    let mut row = BudgetRow {
        method,
        prompts: tasks.len(),
        nominal_budget: method.budget(),
        trajectories_per_prompt: 0.0,
        tool_calls: 0,
        generated_tokens: 0,
        prefill_tokens: 0,
        reencode_tokens: 0,
        rollout_seconds: 0.0,
        reencode_seconds: 0.0,
        mean_batch: 0.0,
        peak_rows: 0,
        decode_steps: 0,
        first_passes: 0,
        kv_bytes_held: 0,
        kv_bytes_copies: 0,
    };
    // Per batch: its time, the cache it holds and what copies would hold; per prompt: the
    // re-encoding replay (timed) and the leaves.
    struct Tally<'r, 'm> {
        row: &'r mut BudgetRow,
        replay: Option<Engine<'m>>,
        bytes_per_token: u64,
        leaves: usize,
    }
    impl Visit for Tally<'_, '_> {
        fn batch(&mut self, engine: &Engine<'_>, rollouts: &[PromptRollout], cost: &RolloutCost, seconds: f64) {
            let row = &mut *self.row;
            row.rollout_seconds += seconds;
            row.kv_bytes_held = row.kv_bytes_held.max(engine.kv_bytes());
            let copies: u64 = rollouts.iter().map(held_positions).sum::<u64>() * self.bytes_per_token;
            row.kv_bytes_copies = row.kv_bytes_copies.max(copies);
            row.tool_calls += cost.tool_calls;
            row.generated_tokens += cost.generated_tokens;
            row.prefill_tokens += cost.prefill_tokens;
        }

        fn prompt(
            &mut self,
            _: usize,
            rollout: &PromptRollout,
            _: &mut rand_chacha::ChaCha8Rng,
        ) -> Result<(), RolloutError> {
            if let Some(replay) = self.replay.as_mut() {
                let device = replay.device();
                crate::support::timing::sync(device);
                let t = Instant::now();
                self.row.reencode_tokens += reencode(replay, rollout)?;
                crate::support::timing::sync(device);
                self.row.reencode_seconds += t.elapsed().as_secs_f64();
            }
            self.leaves += rollout.trees.iter().map(|t| t.leaves().len()).sum::<usize>();
            Ok(())
        }
    }
    let replay = how.replay.then(|| Engine::new(model));
    let mut tally = Tally { row: &mut row, replay, bytes_per_token: kv_bytes_per_token(model), leaves: 0 };
    let mut driver = Driver { engine: &mut engine, tok, env, config: agent };
    drive(&mut driver, tasks, batch_prompts, shape, &mut rng, &mut tally)?;
    let leaves = tally.leaves;
    row.trajectories_per_prompt = leaves as f64 / tasks.len().max(1) as f64;
    row.mean_batch = engine.stats.generated_tokens as f64 / engine.stats.decode_steps.max(1) as f64;
    row.peak_rows = engine.stats.peak_rows;
    row.decode_steps = engine.stats.decode_steps;
    row.first_passes = engine.stats.generate_calls;
    Ok(row)
}

/// Every method on the same tasks, one prompt at a time, each from the same seed.
pub fn compare(
    (model, tok): (&CausalLm, &Tokenizer),
    env: &EnvClient,
    tasks: &[grove_protocol::TaskSpec],
    agent: &AgentConfig,
    methods: &[Method],
    seed: u64,
) -> Result<Vec<BudgetRow>, RolloutError> {
    let how = Measure { seed, batch_prompts: 1, replay: true };
    methods.iter().map(|m| measure((model, tok), env, tasks, agent, *m, how)).collect()
}

pub fn format_rows(rows: &[BudgetRow]) -> String {
    let mut out = format!(
        "{:<18} {:>7} {:>8} {:>11} {:>10} {:>10} {:>12} {:>14} {:>7}\n",
        "rollout",
        "prompts",
        "budget*",
        "traj/prompt",
        "tool calls",
        "generated",
        "prefill (KV)",
        "prefill (re-enc)",
        "saved"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<18} {:>7} {:>8.1} {:>11.2} {:>10} {:>10} {:>12} {:>14} {:>6.1}%\n",
            r.label(),
            r.prompts,
            r.nominal_budget,
            r.trajectories_per_prompt,
            r.tool_calls,
            r.generated_tokens,
            r.prefill_tokens,
            r.reencode_tokens,
            100.0 * r.prefill_saved()
        ));
    }
    out.push_str("* modelled (spec §2.6); every other column is measured on these rollouts\n");
    out
}
