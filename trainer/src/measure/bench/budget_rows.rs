//! The bench's rollout-cost rows: the measured tree vs chain comparison through an env-server
//! (`budget_rows`, the rows `trainer budget` prints) and, without a server, the budget arithmetic
//! of spec §2.6 (`budget_arithmetic`).

use super::BenchRow;
use crate::engine::model::CausalLm;
use crate::engine::tokenizer::Tokenizer;
use crate::rl::env::EnvClient;
use crate::rl::method::Method;
use crate::rl::rollout::agent::{AgentConfig, RolloutError, Schedule};
use crate::support::timing::median;

/// A real rollout of a tree method and of chain GRPO at the same nominal budget on the same
/// prompts, through an env-server ([`crate::measure::budget::compare`], the rows `trainer budget` prints);
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
    use crate::measure::budget::{BudgetRow, Measure, compare, measure};
    let compared = compare((model, tok), env, tasks, agent, &[tree, chain], 0)?;
    let (tree_row, chain_row) = (&compared[0], &compared[1]);
    // Timed as training rolls out, on both schedules: every prompt together; the phased
    // schedule's batches of half the prompts; and the continuous schedule with a cap on the
    // chains decoding at once of chain's rows for half the prompts (the next prompt starts when
    // its first chains fit), the same cap for both methods. The arms alternate (forward, then backward).
    let all = Measure { seed: 0, batch_prompts: 0, replay: false };
    let continuous = AgentConfig { schedule: Schedule::Continuous, max_rows: 0, ..agent.clone() };
    let phased = AgentConfig { schedule: Schedule::Phased, max_rows: 0, ..agent.clone() };
    let half = (tasks.len() / 2).max(1);
    let capped = AgentConfig { max_rows: half * chain.rows_per_prompt(), ..continuous.clone() };
    let mut arms: Vec<(Method, &AgentConfig, usize)> = Vec::new();
    for (config, batch) in [(&phased, 0), (&continuous, 0), (&phased, half), (&capped, 0)] {
        arms.extend([(tree, config, batch), (chain, config, batch)]);
    }
    let mut secs: Vec<Vec<f64>> = vec![Vec::new(); arms.len()];
    let mut last: Vec<Option<BudgetRow>> = vec![None; arms.len()];
    for rep in 0..repeats.max(1) {
        let mut order: Vec<usize> = (0..arms.len()).collect();
        if rep % 2 == 1 {
            order.reverse();
        }
        for a in order {
            let (m, config, batch_prompts) = arms[a];
            let r = measure((model, tok), env, tasks, config, m, Measure { batch_prompts, ..all })?;
            secs[a].push(r.rollout_seconds);
            last[a] = Some(r);
        }
    }
    let timed: Vec<(BudgetRow, f64)> =
        last.into_iter().zip(secs).filter_map(|(r, s)| r.map(|r| (r, median(s)))).collect();
    if timed.len() != arms.len() {
        return Ok(Vec::new());
    }
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
    let in_flight = |config: &AgentConfig, batch: usize| match (config.max_rows, batch) {
        (0, 0) => "all prompts together".to_string(),
        (0, b) => format!("{b} prompts at a time"),
        (cap, _) => format!("at most {cap} chains decoding"),
    };
    for ((r, t), &(_, config, batch)) in timed.iter().zip(&arms) {
        rows.push(BenchRow::new(
            format!("{}: rollout, {}, {}", r.label(), in_flight(config, batch), config.schedule.name()),
            format!("{:.1}", rate(r, *t)),
            "tokens/s",
            format!(
                "generated; {t:.2} s (median of {} alternating runs), {} decode steps of {:.1} rows (peak {}), {} first passes, {} tokens",
                repeats.max(1),
                r.decode_steps,
                r.mean_batch,
                r.peak_rows,
                r.first_passes,
                r.generated_tokens
            ),
        ));
    }
    // Arms come in (tree, chain) pairs.
    for (pair, arm) in timed.chunks(2).zip(arms.chunks(2)) {
        let ((tree_r, tree_t), (chain_r, chain_t)) = (&pair[0], &pair[1]);
        let (_, config, batch) = arm[0];
        rows.push(BenchRow::new(
            format!(
                "  {} vs {}: tokens/s, {}, {}",
                tree_row.label(),
                chain_row.label(),
                in_flight(config, batch),
                config.schedule.name()
            ),
            format!("{:.2}x", rate(tree_r, *tree_t) / rate(chain_r, *chain_t).max(1e-9)),
            "ratio",
            "same prompts and policy; the target is 0.9x",
        ));
    }
    rows.push(BenchRow::new(
        format!("  {}: batched vs one prompt at a time", tree_row.label()),
        format!("{:.2}x", rate(&timed[0].0, timed[0].1) / rate(tree_row, tree_row.rollout_seconds).max(1e-9)),
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
