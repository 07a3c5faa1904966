//! A step's rollout trees as the run folder keeps them for `trainer view`
//! (`grove_rundir::PromptTrees`): captured from a prompt's rollout before its engine state is
//! released, decoded with the tokenizer, then given each kept leaf's advantage and its inter- and
//! intra-tree parts once the step's advantages are known.

use std::collections::HashMap;

use grove_protocol::ActionKind;
use grove_rundir::{LeafRecord, NodeRecord, PromptTrees, TREES_VERSION, TreeRecord};

use crate::engine::tokenizer::Tokenizer;
use crate::rl::algo::advantage::{Estimator, normalise};
use crate::rl::method::Method;
use crate::rl::rollout::agent::PromptRollout;
use crate::rl::rollout::tree::Tree;
use crate::rl::rows::TrainingRow;

/// Which steps record trees, and how many of their prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TreeRecording {
    /// Every this many steps (0: never).
    pub every: u64,
    /// The first this many prompts of a recorded step.
    pub prompts: usize,
}

impl TreeRecording {
    /// How many of step `step`'s prompts are recorded.
    pub fn prompts_at(&self, step: u64) -> usize {
        if self.every > 0 && step.is_multiple_of(self.every) { self.prompts } else { 0 }
    }
}

fn kind_name(kind: ActionKind) -> &'static str {
    match kind {
        ActionKind::Search => "search",
        ActionKind::Open => "open",
        ActionKind::Answer => "answer",
        ActionKind::Invalid => "invalid",
    }
}

/// One prompt's trees, without advantages yet. `rows` are this prompt's training rows (the kept
/// leaves), in `training_rows` order.
#[allow(clippy::too_many_arguments)]
pub fn capture(
    tok: &Tokenizer,
    task: &grove_protocol::TaskSpec,
    rollout: &PromptRollout,
    rows: &[TrainingRow],
    step: u64,
    prompt: usize,
    method: &Method,
    estimator: Estimator,
) -> PromptTrees {
    let decode = |ids: &[u32]| tok.decode(ids, false).unwrap_or_default();
    let n_trees = rollout.trees.len().max(1);
    let trees = rollout
        .trees
        .iter()
        .enumerate()
        .map(|(t, tree)| {
            let group = prompt * n_trees + t;
            let kept: Vec<usize> = rows.iter().filter(|r| r.tree_group == group).map(|r| r.leaf).collect();
            TreeRecord { group, nodes: nodes(tree, &kept, &decode) }
        })
        .collect();
    PromptTrees {
        version: TREES_VERSION,
        step,
        prompt,
        task_id: task.task_id.clone(),
        question: task.question.clone(),
        golden_answers: task.golden_answers.clone(),
        data_source: task.data_source.clone(),
        method: method.label(),
        estimator: estimator.name().to_string(),
        prompt_text: decode(&rollout.prompt_tokens),
        prompt_tokens: rollout.prompt_tokens.len(),
        trees,
    }
}

fn nodes(
    tree: &Tree<crate::rl::rollout::agent::StepRecord>,
    kept: &[usize],
    decode: &impl Fn(&[u32]) -> String,
) -> Vec<NodeRecord> {
    (0..tree.len())
        .filter_map(|id| tree.node(id).map(|n| (id, n)))
        .map(|(id, n)| {
            let mut rec =
                NodeRecord { id, parent: n.parent, depth: n.depth, children: n.children.clone(), ..Default::default() };
            if let Some(s) = &n.step {
                let action = decode(&s.response);
                let parsed = grove_datasets::actions::parse_text_with(&action, s.kind == ActionKind::Open);
                rec.kind = kind_name(s.kind).to_string();
                rec.content = (!parsed.content.is_empty()).then_some(parsed.content);
                rec.action = action;
                rec.observation = decode(&s.observation);
                rec.observation_truncated = s.observation_truncated;
                rec.tokens = s.response.len();
                rec.observation_tokens = s.observation.len();
                rec.episode = s.episode;
                rec.env_step = s.env_step;
                rec.snapshot = s.snapshot;
                rec.tool_error = s.tool_error.map(|c| c.name().to_string());
                rec.failure = s.failure.as_ref().map(|f| f.key());
                if n.is_leaf {
                    rec.leaf = Some(LeafRecord {
                        reward: s.reward.unwrap_or(0.0),
                        metric: s.metric.unwrap_or(0.0),
                        format_valid: s.outcome.as_ref().map(|o| o.format_valid),
                        answer: s.outcome.as_ref().and_then(|o| o.answer.clone()),
                        kept: kept.contains(&id),
                        ..Default::default()
                    });
                }
            }
            rec
        })
        .collect()
}

/// Give each recorded kept leaf its advantage (`advantages`, one per row, as the update used
/// them) and the inter- and intra-tree parts of it, normalised over the rows that train.
pub fn fill_advantages(trees: &mut [PromptTrees], rows: &[TrainingRow], advantages: &[f64], estimator: Estimator) {
    let g = crate::rl::algo::advantage::TrainedGroups::of(rows);
    let (inter, intra) = (normalise(&g.rewards, &g.prompt), normalise(&g.rewards, &g.tree));
    let (uses_inter, uses_intra) = estimator.parts();
    let mut by_leaf: HashMap<(usize, usize), (f64, f64, f64)> = HashMap::new();
    for (j, &i) in g.rows.iter().enumerate() {
        let a = advantages.get(i).copied().unwrap_or(0.0);
        by_leaf.insert((rows[i].tree_group, rows[i].leaf), (a, inter[j], intra[j]));
    }
    for p in trees {
        for t in &mut p.trees {
            for n in &mut t.nodes {
                let Some(leaf) = n.leaf.as_mut() else { continue };
                if let Some(&(a, inter, intra)) = by_leaf.get(&(t.group, n.id)) {
                    leaf.advantage = Some(a);
                    leaf.advantage_inter = uses_inter.then_some(inter);
                    leaf.advantage_intra = uses_intra.then_some(intra);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(prompt_group: usize, tree_group: usize, leaf: usize, reward: f64) -> TrainingRow {
        TrainingRow {
            prompt: vec![1],
            response: vec![2],
            loss_mask: vec![1],
            sampled_logprobs: vec![0.0],
            reward,
            metric: reward,
            prompt_group,
            tree_group,
            leaf,
            failure: None,
        }
    }

    fn leaf(id: usize) -> NodeRecord {
        NodeRecord {
            id,
            parent: Some(0),
            leaf: Some(LeafRecord { kept: true, ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn kept_leaves_get_the_update_advantage_and_its_parts() {
        // One prompt, two trees of two kept leaves each.
        let rows = [row(0, 0, 1, 1.0), row(0, 0, 2, 0.0), row(0, 1, 1, 1.0), row(0, 1, 2, 1.0)];
        let adv = crate::rl::algo::advantage::advantages(
            &rows.iter().map(|r| r.reward).collect::<Vec<_>>(),
            &[0usize; 4],
            &[0usize, 0, 1, 1],
            Estimator::Tree,
        );
        let tree = |group| TreeRecord { group, nodes: vec![NodeRecord::default(), leaf(1), leaf(2)] };
        let mut trees = vec![PromptTrees {
            version: TREES_VERSION,
            step: 0,
            prompt: 0,
            task_id: None,
            question: String::new(),
            golden_answers: vec![],
            data_source: String::new(),
            method: String::new(),
            estimator: "tree".into(),
            prompt_text: String::new(),
            prompt_tokens: 0,
            trees: vec![tree(0), tree(1)],
        }];
        fill_advantages(&mut trees, &rows, &adv, Estimator::Tree);
        let got: Vec<LeafRecord> =
            trees[0].trees.iter().flat_map(|t| t.nodes.iter().filter_map(|n| n.leaf.clone())).collect();
        for (l, a) in got.iter().zip(&adv) {
            assert_eq!(l.advantage, Some(*a));
            let sum = l.advantage_inter.unwrap() + l.advantage_intra.unwrap();
            assert!((sum - a).abs() < 1e-12, "{l:?}");
        }
        // The second tree's rewards are equal: its intra part is exactly 0.
        assert_eq!(got[2].advantage_intra, Some(0.0));
        // GRPO records no intra part.
        fill_advantages(&mut trees, &rows, &adv, Estimator::Grpo);
        assert!(trees[0].trees[0].nodes[1].leaf.as_ref().unwrap().advantage_intra.is_none());
    }

    #[test]
    fn recording_every_n_steps() {
        let r = TreeRecording { every: 5, prompts: 3 };
        assert_eq!((r.prompts_at(0), r.prompts_at(4), r.prompts_at(10)), (3, 0, 3));
        assert_eq!(TreeRecording::default().prompts_at(0), 0);
    }
}
