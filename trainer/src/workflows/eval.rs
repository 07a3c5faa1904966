//! Evaluation (spec §4.4 validation, §5.5): one trajectory per question, greedy or sampled; the
//! pure EM / F1 of the answer (the env-server's `metric_value`) averaged per data source, with
//! the number of tool calls per question. A question whose episode the server refused scores 0
//! and is counted as not answered.

use std::collections::BTreeMap;

use crate::engine::generate::Engine;
use crate::engine::model::CausalLm;
use crate::engine::tokenizer::Tokenizer;
use crate::rl::env::EnvClient;
use crate::rl::rollout::agent::{AgentConfig, Rollout, RolloutError};

pub use grove_rundir::{EvalPoint, EvalReport, EvalSelection, SourceScore};

/// Questions evaluated per engine batch.
pub const EVAL_BATCH: usize = 16;

/// Evaluate `tasks` in batches of `batch` questions.
pub fn evaluate(
    model: &CausalLm,
    tok: &Tokenizer,
    envs: &[EnvClient],
    tasks: &[grove_protocol::TaskSpec],
    agent: &AgentConfig,
    batch: usize,
    seed: u64,
) -> Result<EvalReport, RolloutError> {
    let mut engine = Engine::new(model);
    if envs.is_empty() {
        return Ok(EvalReport::new());
    }
    let mut scores = Vec::with_capacity(tasks.len());
    for (b, chunk) in tasks.chunks(batch.max(1)).enumerate() {
        let env = &envs[b % envs.len()];
        let mut r = Rollout { engine: &mut engine, tok, env, config: agent, cost: Default::default() };
        let chains = r.run_chains(chunk, seed.wrapping_add(b as u64 * 1_000_003))?;
        for (task, steps) in chunk.iter().zip(chains) {
            let last = steps.last();
            let score = QuestionScore {
                metric: last.and_then(|s| s.metric).unwrap_or(0.0),
                tool_calls: steps.iter().filter(|s| s.is_tool_call()).count() as u64,
                answered: last.is_some_and(|s| s.kind == grove_protocol::ActionKind::Answer && s.failure.is_none()),
            };
            scores.push((task.data_source.as_str(), score));
        }
    }
    Ok(report(scores))
}

/// One question's result, as an evaluation report counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QuestionScore {
    /// The env's pure EM / F1 of the final answer (0 without one).
    pub metric: f64,
    pub tool_calls: u64,
    /// Ended on an answer the env-server accepted.
    pub answered: bool,
}

/// The report of every evaluation, native or through an OpenAI-compatible server: per data
/// source and `"all"`, the questions, the mean metric, tool calls per question and answers.
pub fn report<'a>(scores: impl IntoIterator<Item = (&'a str, QuestionScore)>) -> EvalReport {
    let mut sums: BTreeMap<String, (usize, f64, u64, usize)> = BTreeMap::new();
    for (source, s) in scores {
        for key in [source, "all"] {
            let e = sums.entry(key.to_string()).or_default();
            e.0 += 1;
            e.1 += s.metric;
            e.2 += s.tool_calls;
            e.3 += usize::from(s.answered);
        }
    }
    sums.into_iter()
        .map(|(k, (n, m, t, a))| {
            let q = n.max(1) as f64;
            (k, SourceScore { questions: n, score: m / q, tool_calls_per_question: t as f64 / q, answered: a })
        })
        .collect()
}

/// Evaluate `model` on the selected held-out questions greedily (and sampled with the agent's
/// own settings when asked), as the point after `step` training steps.
#[allow(clippy::too_many_arguments)]
pub fn eval_point(
    model: &CausalLm,
    tok: &Tokenizer,
    envs: &[EnvClient],
    (tasks, selection): (&[grove_protocol::TaskSpec], EvalSelection),
    agent: &AgentConfig,
    sampled: bool,
    step: u64,
    seed: u64,
) -> Result<EvalPoint, RolloutError> {
    let greedy = evaluate(model, tok, envs, tasks, &agent.greedy(), EVAL_BATCH, seed)?;
    let sampled = if sampled { Some(evaluate(model, tok, envs, tasks, agent, EVAL_BATCH, seed)?) } else { None };
    Ok(EvalPoint { step, greedy, sampled, selection: Some(selection) })
}

/// A printable table of a report.
pub fn format_report(report: &EvalReport) -> String {
    let mut out =
        format!("{:<24} {:>9} {:>8} {:>12} {:>9}\n", "data source", "questions", "score", "tools/quest.", "answered");
    for (k, s) in report {
        out.push_str(&format!(
            "{k:<24} {:>9} {:>8.3} {:>12.2} {:>9}\n",
            s.questions, s.score, s.tool_calls_per_question, s.answered
        ));
    }
    out
}

/// Human-readable form of an evaluation point.
pub fn format_eval_point(p: &EvalPoint, agent: &AgentConfig) -> String {
    let on = p.selection.map(|s| format!(" on {s}")).unwrap_or_default();
    let mut s = format!("eval after step {}{on} (greedy):\n{}", p.step, format_report(&p.greedy));
    if let Some(r) = &p.sampled {
        s.push_str(&format!(
            "(sampled, T={} top-p={}):\n{}",
            agent.sampling.temperature,
            agent.sampling.top_p,
            format_report(r)
        ));
    }
    s
}
