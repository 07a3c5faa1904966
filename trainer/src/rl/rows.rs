//! The hand-off from rollouts to the update: training rows (the types; `rollout/leaves.rs`
//! fills them, so the update never depends on the rollout). A row is one kept leaf (spec §2.3
//! phase 3): the prompt tokens, then the response side (every step's generated tokens with loss
//! mask 1, its observation tokens with mask 0), the leaf's reward, and the groups the advantage
//! estimators normalise over.
//!
//! A trajectory the env-server refused somewhere (its episode could not be created or forked, or
//! a step was refused: an over-long query or action, a full episode table) has no reward from
//! the server. Its row is kept, with its [`Failure`], and **masked out of the loss**: it gets no
//! advantage, joins no group and trains no token, and the step's metrics count it per kind.
//! Tool errors the server turns into observations (a failed search, a timeout) are not
//! failures: the model saw the server's error text and the episode went on.

use grove_protocol::{ErrorCode, ErrorInfo};

/// Which request the env-server refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refused {
    Create,
    Fork,
    Step,
}

impl Refused {
    pub fn name(&self) -> &'static str {
        match self {
            Refused::Create => "create",
            Refused::Fork => "fork",
            Refused::Step => "step",
        }
    }
}

/// Why a trajectory has no outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub refused: Refused,
    pub code: ErrorCode,
    pub message: String,
}

impl Failure {
    pub fn new(refused: Refused, info: &ErrorInfo) -> Self {
        Self { refused, code: info.code, message: info.message.clone() }
    }

    /// `<request>:<error code>`, the key of the metrics' failure counts.
    pub fn key(&self) -> String {
        format!("{}:{}", self.refused.name(), self.code.name())
    }
}

/// One training row.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingRow {
    pub prompt: Vec<u32>,
    pub response: Vec<u32>,
    /// 1 on generated tokens, 0 on observation tokens.
    pub loss_mask: Vec<u8>,
    /// Log-probability of each response token under the distribution it was sampled from
    /// (temperature applied, before top-k / top-p truncation); 0 on observation tokens.
    pub sampled_logprobs: Vec<f32>,
    pub reward: f64,
    /// Pure EM / F1 of the leaf's answer.
    pub metric: f64,
    /// Group ids for the advantage estimators: the prompt, and the tree within the prompt.
    pub prompt_group: usize,
    pub tree_group: usize,
    /// The leaf this row was flattened from: its node id within its tree.
    pub leaf: usize,
    /// Set when the trajectory was refused somewhere: the row is masked out of the loss.
    pub failure: Option<Failure>,
}

impl TrainingRow {
    /// A row that trains (not refused, with tokens on both sides).
    pub fn trains(&self) -> bool {
        self.failure.is_none() && !self.prompt.is_empty() && !self.response.is_empty()
    }

    /// Generated (loss-masked) tokens.
    pub fn generated_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|m| **m == 1).count()
    }
}
