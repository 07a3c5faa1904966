//! Rollout budget accounting (spec §2.6): tree and chain rollouts on the same prompts, with what
//! each cost: trajectories, tool calls, generated tokens, and prefill tokens actually computed
//! with KV-prefix reuse against the prefill of re-encoding the whole context at every turn (what
//! the reference implementation does, with no prefix cache).

use crate::generate::Engine;
use crate::model::CausalLm;
use crate::rollout::agent::{AgentConfig, EnvClient, PromptRollout, Rollout, RolloutError, TreeShape};
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone, PartialEq)]
pub struct BudgetRow {
    pub label: String,
    pub prompts: usize,
    pub trajectories_per_prompt: f64,
    pub tool_calls: u64,
    pub generated_tokens: u64,
    /// Tokens encoded into caches by our engine (forks reuse their parent's cache).
    pub prefill_tokens: u64,
    /// Tokens a rollout that re-encodes the full context at every generation would prefill.
    pub reencode_prefill_tokens: u64,
    /// Sequences the engine decoded per generate call, on average.
    pub mean_batch: f64,
}

/// Prefill of the re-encoding baseline: every node was generated from the prompt plus the steps
/// on its path.
fn reencode_cost(r: &PromptRollout) -> u64 {
    let prompt = r.prompt_tokens.len() as u64;
    r.trees
        .iter()
        .map(|tree| {
            (1..tree.len())
                .map(|id| {
                    let parent = tree.node(id).and_then(|n| n.parent).unwrap_or(0);
                    let context: u64 =
                        tree.path(parent).iter().map(|s| (s.response.len() + s.observation.len()) as u64).sum();
                    prompt + context
                })
                .sum::<u64>()
        })
        .sum()
}

/// Run `shape` on every task and report its cost (labelled `tree (M,N,L,k)` or `chain n=…`).
/// The tasks are rolled out `batch_prompts` at a time ([`Rollout::run_many`]: each turn of a
/// batch's chains is one engine batch); 1 is one prompt at a time, 0 all of them together.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    model: &CausalLm,
    tok: &Tokenizer,
    env: &EnvClient,
    tasks: &[grove_protocol::TaskSpec],
    agent: &AgentConfig,
    shape: TreeShape,
    seed: u64,
    batch_prompts: usize,
) -> Result<BudgetRow, RolloutError> {
    let label = if shape.n == 0 {
        format!("chain n={}", shape.m)
    } else {
        format!("tree ({},{},{},{})", shape.m, shape.n, shape.l, shape.k)
    };
    use rand::SeedableRng;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut engine = Engine::new(model);
    let mut row = BudgetRow {
        label,
        prompts: tasks.len(),
        trajectories_per_prompt: 0.0,
        tool_calls: 0,
        generated_tokens: 0,
        prefill_tokens: 0,
        reencode_prefill_tokens: 0,
        mean_batch: 0.0,
    };
    let mut leaves = 0usize;
    let batch = if batch_prompts == 0 { tasks.len() } else { batch_prompts };
    for batch in tasks.chunks(batch.max(1)) {
        let mut r = Rollout { engine: &mut engine, tok, env, config: agent, cost: Default::default() };
        let rollouts = r.run_many(batch, shape, &mut rng)?;
        let cost = r.cost;
        row.tool_calls += cost.tool_calls;
        row.generated_tokens += cost.generated_tokens;
        row.prefill_tokens += cost.prefill_tokens;
        for rollout in rollouts {
            row.reencode_prefill_tokens += reencode_cost(&rollout);
            leaves += rollout.trees.iter().map(|t| t.leaves().len()).sum::<usize>();
            rollout.release(&mut engine);
            env.close(rollout.episodes.clone())?;
        }
    }
    row.trajectories_per_prompt = leaves as f64 / tasks.len().max(1) as f64;
    row.mean_batch = engine.stats.generated_sequences as f64 / engine.stats.generate_calls.max(1) as f64;
    Ok(row)
}

pub fn format_rows(rows: &[BudgetRow]) -> String {
    let mut out = format!(
        "{:<18} {:>8} {:>11} {:>10} {:>10} {:>12} {:>14} {:>7}\n",
        "rollout", "prompts", "traj/prompt", "tool calls", "generated", "prefill (KV)", "prefill (re-enc)", "saved"
    );
    for r in rows {
        let saved = 1.0 - r.prefill_tokens as f64 / r.reencode_prefill_tokens.max(1) as f64;
        out.push_str(&format!(
            "{:<18} {:>8} {:>11.2} {:>10} {:>10} {:>12} {:>14} {:>6.1}%\n",
            r.label,
            r.prompts,
            r.trajectories_per_prompt,
            r.tool_calls,
            r.generated_tokens,
            r.prefill_tokens,
            r.reencode_prefill_tokens,
            100.0 * saved
        ));
    }
    out
}
