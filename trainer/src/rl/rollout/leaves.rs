//! Kept leaves flattened into training rows (spec §2.3 phase 3): the one place a rollout becomes
//! the [`TrainingRow`]s the update reads.

use rand::Rng;

use super::agent::{PromptRollout, RolloutError};
use crate::rl::rows::TrainingRow;

/// Keep `k` leaves per tree and flatten them into training rows (spec §2.3 phase 3): prompt-major,
/// then tree, then leaf; the response side right-truncated to `max_response_tokens`.
pub fn training_rows(
    rollout: &PromptRollout,
    k: usize,
    prompt_group: usize,
    max_response_tokens: usize,
    rng: &mut impl Rng,
) -> Result<Vec<TrainingRow>, RolloutError> {
    let trees = rollout.trees.len().max(1);
    let mut out = Vec::new();
    for (t, tree) in rollout.trees.iter().enumerate() {
        for leaf in tree.keep_leaves(k, rng)? {
            let path = tree.path(leaf);
            let mut response = Vec::new();
            let mut mask = Vec::new();
            let mut logprobs = Vec::new();
            for step in &path {
                response.extend(&step.response);
                mask.extend(std::iter::repeat_n(1u8, step.response.len()));
                logprobs.extend(&step.logprobs);
                logprobs.resize(response.len(), 0.0);
                response.extend(&step.observation);
                mask.extend(std::iter::repeat_n(0u8, step.observation.len()));
                logprobs.resize(response.len(), 0.0);
            }
            response.truncate(max_response_tokens);
            mask.truncate(max_response_tokens);
            logprobs.truncate(max_response_tokens);
            let last = path.last();
            out.push(TrainingRow {
                prompt: rollout.prompt_tokens.clone(),
                response,
                loss_mask: mask,
                sampled_logprobs: logprobs,
                reward: last.and_then(|s| s.reward).unwrap_or(0.0),
                metric: last.and_then(|s| s.metric).unwrap_or(0.0),
                prompt_group,
                tree_group: prompt_group * trees + t,
                leaf,
                failure: last.and_then(|s| s.failure.clone()),
            });
        }
    }
    Ok(out)
}
