//! Chain and tree rollouts (spec §1.2-1.3 and §2.3) against an env-server: the model acts, the
//! server resolves the actions; a tree expansion forks the env episode at the picked node's step
//! and the engine sequence at that node's token prefix, so a branch reuses its parent's KV cache.
//!
//! Each turn of every active chain is one engine batch and one `Step` request; each expansion
//! round is one `Fork` request. A refused item (create, fork or step) ends that trajectory with a
//! [`Failure`] leaf and nothing else; only a lost env-server stops the rollout.

use std::collections::BTreeMap;

use rand::Rng;

use grove_protocol::{ActionKind, EpisodeId, EpisodeOptions, ErrorInfo, TaskSpec};

use super::tree::{NodeId, Tree};
use crate::engine::generate::{Engine, EngineError, SamplingParams, SeqId};
use crate::engine::tokenizer::{ChatMessage, Tokenizer, TokenizerError};
use crate::rl::env::{EnvClient, EnvError};
use crate::rl::method::TreeShape;
use crate::rl::rows::{Failure, Refused};

#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Tree(#[from] super::tree::TreeError),
    #[error("rollout bookkeeping: {0}")]
    Internal(&'static str),
}

impl RolloutError {
    /// The env-server that was lost, and how many live episodes went with it, if that is what
    /// happened.
    pub fn lost_server(&self) -> Option<(&str, u64)> {
        match self {
            RolloutError::Env(EnvError::Lost { url, live, .. }) => Some((url, *live)),
            _ => None,
        }
    }
}

/// How a rollout's generations are scheduled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Schedule {
    /// Turn by turn: each turn of every active chain is one engine call and one step request,
    /// the tree's expansion rounds one after the other for all prompts, the tree picks drawn from
    /// the caller's stream in prompt order (the schedule every published figure was made with).
    #[default]
    Phased,
    /// One running batch that chains join and leave at any token, env steps answered while
    /// decoding goes on, each prompt's next round started when its last round ended, the picks
    /// drawn from a stream of each prompt's own (see `continuous.rs`). The same algorithm;
    /// other random draws than `phased`.
    Continuous,
}

impl Schedule {
    pub fn name(self) -> &'static str {
        match self {
            Schedule::Phased => "phased",
            Schedule::Continuous => "continuous",
        }
    }
}

impl std::str::FromStr for Schedule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "phased" => Ok(Schedule::Phased),
            "continuous" => Ok(Schedule::Continuous),
            other => Err(format!("unknown schedule `{other}`: expected `phased` or `continuous`")),
        }
    }
}

/// Agent-loop limits (spec §1.5; QA defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    pub max_turns: u32,
    /// Observation tokens kept per step (the rest is dropped).
    pub max_obs_tokens: usize,
    /// Cap on a trajectory's response side (generated + observation tokens).
    pub max_response_tokens: usize,
    /// Per-turn sampling; `max_new_tokens` is the per-turn generation cap.
    pub sampling: SamplingParams,
    /// The agent prompt with a `{question}` placeholder; `None` takes the env-server's default
    /// (our wording of the Search-R1 instruction).
    pub prompt_template: Option<String>,
    /// Rolling context cap (`max_prompt_length`, 4096 for QA): a longer context is cut from the
    /// left before generating, and re-encoded (positions restart at 0, as in the reference).
    pub max_context: usize,
    /// Search results per query; `None` takes the env-server's default.
    pub topk: Option<u32>,
    /// How generations are scheduled.
    pub schedule: Schedule,
    /// Continuous schedule only: at most this many chains decode at once (the running batch's
    /// rows; the others wait their turn in order), and the next prompt starts while its first
    /// chains (M) fit under this many chains decoding, waiting or awaiting the env-server
    /// (0: no cap but the prompts in flight). A prompt always starts when none is in flight.
    pub max_rows: usize,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            max_turns: 3,
            max_obs_tokens: 500,
            max_response_tokens: 4096,
            sampling: SamplingParams::default(),
            prompt_template: None,
            max_context: 4096,
            topk: None,
            schedule: Schedule::Phased,
            max_rows: 0,
        }
    }
}

impl AgentConfig {
    /// The cap on chains decoding at once ([`AgentConfig::max_rows`]; `usize::MAX` for none).
    pub fn row_cap(&self) -> usize {
        if self.max_rows == 0 { usize::MAX } else { self.max_rows }
    }

    /// What the env-server is told about each episode.
    pub fn episode_options(&self) -> EpisodeOptions {
        EpisodeOptions {
            max_turns: Some(self.max_turns),
            prompt_template: self.prompt_template.clone(),
            topk: self.topk,
            ..Default::default()
        }
    }

    /// The same agent decoding greedily.
    pub fn greedy(&self) -> AgentConfig {
        AgentConfig {
            sampling: SamplingParams { temperature: 0.0, top_p: 1.0, top_k: 0, ..self.sampling.clone() },
            ..self.clone()
        }
    }
}

/// One agent step: what the model generated and what the environment answered.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    pub response: Vec<u32>,
    /// Log-probability of each response token under its sampling distribution.
    pub logprobs: Vec<f32>,
    pub observation: Vec<u32>,
    pub kind: ActionKind,
    pub done: bool,
    /// The server's reward, on the step that ended the episode.
    pub reward: Option<f64>,
    /// Pure EM / F1 of the answer, on the step that ended the episode.
    pub metric: Option<f64>,
    /// The server's whole reward (answer, format validity), on the step that ended the episode.
    pub outcome: Option<grove_protocol::Reward>,
    /// The observation was longer than `max_obs_tokens` and was cut.
    pub observation_truncated: bool,
    /// The env episode this step happened in, and the step count after it.
    pub episode: Option<EpisodeId>,
    pub env_step: u32,
    /// An engine sequence holding the state right after this step (for expansions).
    pub snapshot: Option<SeqId>,
    /// The tool call failed on the server (the observation is the server's error text).
    pub tool_error: Option<grove_protocol::ErrorCode>,
    /// The env-server refused this step (or the episode it would have run in): the trajectory
    /// ends here without an outcome.
    pub failure: Option<Failure>,
}

impl StepRecord {
    /// The leaf of a trajectory that never ran (its episode could not be created or forked).
    pub(super) fn refused(failure: Failure) -> Self {
        StepRecord {
            response: Vec::new(),
            logprobs: Vec::new(),
            observation: Vec::new(),
            kind: ActionKind::Invalid,
            done: true,
            reward: None,
            metric: None,
            outcome: None,
            observation_truncated: false,
            episode: None,
            env_step: 0,
            snapshot: None,
            tool_error: None,
            failure: Some(failure),
        }
    }

    /// A search the server ran (not the forced final turn).
    pub fn is_tool_call(&self) -> bool {
        self.kind == ActionKind::Search && !self.observation.is_empty()
    }
}

/// Cost of a rollout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RolloutCost {
    pub generated_tokens: u64,
    pub prefill_tokens: u64,
    pub tool_calls: u64,
    pub forks: u64,
    /// Failed tool calls by error code (trained on: the model saw the server's error text).
    pub tool_errors: BTreeMap<String, u64>,
}

impl RolloutCost {
    pub fn add(&mut self, other: &RolloutCost) {
        self.generated_tokens += other.generated_tokens;
        self.prefill_tokens += other.prefill_tokens;
        self.tool_calls += other.tool_calls;
        self.forks += other.forks;
        for (k, v) in &other.tool_errors {
            *self.tool_errors.entry(k.clone()).or_default() += v;
        }
    }
}

/// Everything a rollout produced for one prompt.
#[derive(Debug)]
pub struct PromptRollout {
    pub prompt_tokens: Vec<u32>,
    pub trees: Vec<Tree<StepRecord>>,
    /// Engine sequences kept for expansions (roots and node snapshots); see [`PromptRollout::release`].
    pub held: Vec<SeqId>,
    /// Env episodes created or forked for this prompt.
    pub episodes: Vec<EpisodeId>,
}

impl PromptRollout {
    /// Drop the engine sequences held for expansions (their KV caches).
    pub fn release(&self, engine: &mut Engine<'_>) {
        for s in &self.held {
            engine.remove(*s);
        }
    }
}

/// A chain being continued: its prompt (in a batch of prompts) and tree, engine sequence, env
/// episode and turns so far.
pub(super) struct Row {
    pub(super) prompt: usize,
    pub(super) tree: usize,
    pub(super) parent: NodeId,
    pub(super) seq: SeqId,
    pub(super) episode: EpisodeId,
    pub(super) steps: Vec<(StepRecord, bool)>,
}

/// Where a tree's root stands: its engine sequence, and its env episode or why there is none.
struct Root {
    seq: SeqId,
    episode: Result<EpisodeId, ErrorInfo>,
}

/// One prompt's trees while they grow.
pub(super) struct PromptState {
    pub(super) prompt_tokens: Vec<u32>,
    pub(super) trees: Vec<Tree<StepRecord>>,
    roots: Vec<Root>,
    pub(super) held: Vec<SeqId>,
    pub(super) episodes: Vec<EpisodeId>,
}

/// A node picked for expansion (prompt `prompt`'s tree `tree`), and where its branch starts: the
/// node's snapshot, env episode and step, or why it cannot start.
pub(super) struct Pick {
    pub(super) prompt: usize,
    tree: usize,
    node: NodeId,
    at: Result<(SeqId, EpisodeId, u32), Failure>,
}

/// A pick's branch: a row to continue, or the pick and why it could not start.
pub(super) type Started = Result<Row, (Pick, Failure)>;

impl PromptState {
    /// `n` picks per tree (spec §2.3), prompt `p`'s.
    pub(super) fn picks(&self, p: usize, n: usize, rng: &mut impl Rng) -> Result<Vec<Pick>, RolloutError> {
        let mut picks = Vec::new();
        for (t, tree) in self.trees.iter().enumerate() {
            for node in tree.pick(n, rng) {
                let at = match tree.node(node).and_then(|n| n.step.as_ref()) {
                    Some(step) => match (step.snapshot, step.episode) {
                        (Some(seq), Some(episode)) => Ok((seq, episode, step.env_step)),
                        _ => return Err(RolloutError::Internal("an expandable node has no snapshot")),
                    },
                    None => match &self.roots[t].episode {
                        Ok(episode) => Ok((self.roots[t].seq, *episode, 0)),
                        Err(info) => Err(Failure::new(Refused::Create, info)),
                    },
                };
                picks.push(Pick { prompt: p, tree: t, node, at });
            }
        }
        Ok(picks)
    }

    /// A pick that could not start: a failed leaf below its node.
    pub(super) fn refuse(&mut self, pick: &Pick, failure: Failure) -> Result<(), RolloutError> {
        self.trees[pick.tree].add_chain(pick.node, vec![(StepRecord::refused(failure), true)])?;
        Ok(())
    }

    /// The rollout, holding the roots and every node's snapshot.
    pub(super) fn finish(mut self) -> PromptRollout {
        for tree in &self.trees {
            for id in 0..tree.len() {
                if let Some(seq) = tree.node(id).and_then(|n| n.step.as_ref()).and_then(|s| s.snapshot) {
                    self.held.push(seq);
                }
            }
        }
        PromptRollout { prompt_tokens: self.prompt_tokens, trees: self.trees, held: self.held, episodes: self.episodes }
    }
}

pub struct Rollout<'a, 'm> {
    pub engine: &'a mut Engine<'m>,
    pub tok: &'a Tokenizer,
    pub env: &'a EnvClient,
    pub config: &'a AgentConfig,
    pub cost: RolloutCost,
}

impl std::fmt::Debug for Rollout<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rollout").field("cost", &self.cost).finish()
    }
}

impl Rollout<'_, '_> {
    /// Continue every row until its episode ends (the server runs the forced final turn) or the
    /// server refuses a step.
    fn continue_rows(&mut self, rows: &mut [Row]) -> Result<(), RolloutError> {
        let mut active: Vec<usize> = (0..rows.len()).collect();
        while !active.is_empty() {
            for &i in &active {
                self.truncate_context(&mut rows[i])?;
            }
            let seqs: Vec<SeqId> = active.iter().map(|&i| rows[i].seq).collect();
            let gens = self.engine.generate(&seqs, &self.config.sampling, self.tok)?;
            let actions: Vec<_> = active.iter().zip(&gens).map(|(&i, g)| (rows[i].episode, g.text.clone())).collect();
            let results = self.env.step(&actions)?;
            let mut still = Vec::new();
            for ((&i, g), result) in active.iter().zip(gens).zip(results) {
                if self.record(&mut rows[i], g, result)? {
                    still.push(i);
                }
            }
            active = still;
        }
        Ok(())
    }

    /// Cut a context longer than `max_context` from the left (a new sequence, re-encoded).
    pub(super) fn truncate_context(&mut self, row: &mut Row) -> Result<(), RolloutError> {
        let Some(tokens) = self.engine.tokens(row.seq) else { return Ok(()) };
        let max = self.config.max_context.max(1);
        if tokens.len() <= max {
            return Ok(());
        }
        let kept = tokens[tokens.len() - max..].to_vec();
        let seed = row.seq.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let fresh = self.engine.add(kept, seed)?;
        self.engine.remove(row.seq);
        row.seq = fresh;
        Ok(())
    }

    /// Tree rollouts for one task: M initial chains, L rounds of N expansions per tree.
    pub fn run(
        &mut self,
        task: &TaskSpec,
        shape: TreeShape,
        rng: &mut impl Rng,
    ) -> Result<PromptRollout, RolloutError> {
        let mut out = self.run_many(std::slice::from_ref(task), shape, rng)?;
        Ok(out.remove(0))
    }

    pub(super) fn prompt_tokens(&self, prompt: &str) -> Result<Vec<u32>, RolloutError> {
        let text = self.tok.apply_chat_template(&[ChatMessage::new("user", prompt.to_string())], true)?;
        Ok(self.tok.encode(&text)?)
    }

    /// Tree rollouts for several tasks at once, one [`PromptRollout`] per task in order: every
    /// generation is batched across all the tasks' chains (M per task at first, then the N picks
    /// of every tree in each of the L rounds), so the engine sees batches of
    /// `tasks.len() x M` and `tasks.len() x M x N` sequences instead of M and M x N.
    pub fn run_many(
        &mut self,
        tasks: &[TaskSpec],
        shape: TreeShape,
        rng: &mut impl Rng,
    ) -> Result<Vec<PromptRollout>, RolloutError> {
        if self.config.schedule == Schedule::Continuous {
            return self.run_continuous(tasks, 0, shape, rng);
        }
        let before = self.engine.stats;
        let (mut prompts, mut rows) = self.start_prompts(tasks, 0, shape, |_| rng.random::<u64>())?;
        self.continue_rows(&mut rows)?;
        self.attach(&mut prompts, rows)?;
        for _round in 0..shape.l {
            // All picks of the round first (spec §2.3), then one Fork request for all of them.
            let mut picks = Vec::new();
            for (p, prompt) in prompts.iter().enumerate() {
                picks.extend(prompt.picks(p, shape.n, rng)?);
            }
            let mut rows = Vec::new();
            for started in self.start_picks(picks)? {
                match started {
                    Ok(row) => {
                        prompts[row.prompt].episodes.push(row.episode);
                        rows.push(row);
                    }
                    Err((pick, failure)) => prompts[pick.prompt].refuse(&pick, failure)?,
                }
            }
            self.continue_rows(&mut rows)?;
            self.attach(&mut prompts, rows)?;
        }
        self.cost.generated_tokens += self.engine.stats.generated_tokens - before.generated_tokens;
        self.cost.prefill_tokens += self.engine.stats.prefill_tokens - before.prefill_tokens;
        Ok(prompts.into_iter().map(PromptState::finish).collect())
    }

    /// Create every task's M episodes (one request) and each tree's root sequence, seeded by
    /// `seed(prompt)` called once per tree in order; the trees' first chains, to continue, and
    /// each prompt's state. A refused create is a failed leaf at the root. Prompts are numbered
    /// from `first`.
    pub(super) fn start_prompts(
        &mut self,
        tasks: &[TaskSpec],
        first: usize,
        shape: TreeShape,
        mut seed: impl FnMut(usize) -> u64,
    ) -> Result<(Vec<PromptState>, Vec<Row>), RolloutError> {
        let creates: Vec<TaskSpec> = tasks.iter().flat_map(|t| std::iter::repeat_n(t.clone(), shape.m)).collect();
        let starts = self.env.create(&creates, &self.config.episode_options())?;
        let mut prompts = Vec::with_capacity(tasks.len());
        let mut rows = Vec::with_capacity(starts.len());
        for (i, mine) in starts.chunks(shape.m.max(1)).enumerate().take(tasks.len()) {
            let p = first + i;
            // Every tree of a prompt gets the same prompt text; a refused tree has none.
            let prompt = mine.iter().find_map(|s| s.as_ref().ok()).map(|s| s.prompt.clone());
            let prompt_tokens = match &prompt {
                Some(text) => self.prompt_tokens(text)?,
                None => Vec::new(),
            };
            let mut state = PromptState {
                trees: (0..shape.m).map(|_| Tree::new()).collect(),
                roots: Vec::with_capacity(shape.m),
                held: Vec::new(),
                episodes: mine.iter().filter_map(|s| s.as_ref().ok().map(|s| s.episode)).collect(),
                prompt_tokens,
            };
            for (t, start) in mine.iter().enumerate() {
                let seed = seed(p);
                match start {
                    Ok(s) => {
                        let root = self.engine.add(state.prompt_tokens.clone(), seed)?;
                        state.held.push(root);
                        let seq = self.engine.fork(root, 1)?[0];
                        let parent = Tree::<StepRecord>::ROOT;
                        rows.push(Row { prompt: p, tree: t, parent, seq, episode: s.episode, steps: Vec::new() });
                        state.roots.push(Root { seq: root, episode: Ok(s.episode) });
                    }
                    Err(info) => {
                        let leaf = StepRecord::refused(Failure::new(Refused::Create, info));
                        state.trees[t].add_chain(Tree::<StepRecord>::ROOT, vec![(leaf, true)])?;
                        state.roots.push(Root { seq: 0, episode: Err(info.clone()) });
                    }
                }
            }
            prompts.push(state);
        }
        Ok((prompts, rows))
    }

    /// Fork the env episode of every pick that has one (one request) and an engine sequence at
    /// its node's snapshot: each pick becomes a row to continue, or the failure that ends it.
    pub(super) fn start_picks(&mut self, picks: Vec<Pick>) -> Result<Vec<Started>, RolloutError> {
        let fork_at: Vec<(EpisodeId, u32)> =
            picks.iter().filter_map(|pick| pick.at.as_ref().ok().map(|&(_, e, s)| (e, s))).collect();
        let mut forked = if fork_at.is_empty() { Vec::new() } else { self.env.fork(&fork_at)? }.into_iter();
        let mut out = Vec::with_capacity(picks.len());
        for pick in picks {
            let result = match &pick.at {
                Ok((seq, _, _)) => match forked.next() {
                    Some(Ok(episode)) => Ok((*seq, episode)),
                    Some(Err(info)) => Err(Failure::new(Refused::Fork, &info)),
                    None => return Err(RolloutError::Internal("a fork request item got no reply")),
                },
                Err(f) => Err(f.clone()),
            };
            out.push(match result {
                Ok((snapshot, episode)) => {
                    let seq = self.engine.fork(snapshot, 1)?[0];
                    self.cost.forks += 1;
                    let (prompt, tree, parent) = (pick.prompt, pick.tree, pick.node);
                    Ok(Row { prompt, tree, parent, seq, episode, steps: Vec::new() })
                }
                Err(failure) => Err((pick, failure)),
            });
        }
        Ok(out)
    }

    /// One chain per task, all tasks batched together (evaluation). Returns each task's steps
    /// (a refused episode: one failed step); the episodes are closed (one request) and the
    /// sequences released.
    pub fn run_chains(&mut self, tasks: &[TaskSpec], seed: u64) -> Result<Vec<Vec<StepRecord>>, RolloutError> {
        let before = self.engine.stats;
        let starts = self.env.create(tasks, &self.config.episode_options())?;
        let mut rows = Vec::with_capacity(tasks.len());
        let mut out: Vec<Vec<StepRecord>> = vec![Vec::new(); tasks.len()];
        for (i, start) in starts.iter().enumerate() {
            match start {
                Ok(s) => {
                    let seq = self.engine.add(self.prompt_tokens(&s.prompt)?, seed.wrapping_add(i as u64))?;
                    let parent = Tree::<StepRecord>::ROOT;
                    rows.push(Row { prompt: i, tree: 0, parent, seq, episode: s.episode, steps: Vec::new() });
                }
                Err(info) => out[i].push(StepRecord::refused(Failure::new(Refused::Create, info))),
            }
        }
        let rows = match self.config.schedule {
            Schedule::Phased => {
                self.continue_rows(&mut rows)?;
                rows
            }
            Schedule::Continuous => {
                let mut ended = Vec::with_capacity(rows.len());
                let mut ready: std::collections::VecDeque<usize> = (0..rows.len()).collect();
                let mut live: Vec<Option<Row>> = rows.into_iter().map(Some).collect();
                self.run_rows(&mut live, &mut ready, |_, row, _, _| {
                    ended.push(row);
                    Ok(())
                })?;
                ended
            }
        };
        self.cost.generated_tokens += self.engine.stats.generated_tokens - before.generated_tokens;
        self.cost.prefill_tokens += self.engine.stats.prefill_tokens - before.prefill_tokens;
        for row in rows {
            self.engine.remove(row.seq);
            let steps: Vec<StepRecord> = row.steps.into_iter().map(|(s, _)| s).collect();
            for s in steps.iter().filter_map(|s| s.snapshot) {
                self.engine.remove(s);
            }
            out[row.prompt] = steps;
        }
        let opened: Vec<EpisodeId> = starts.iter().filter_map(|s| s.as_ref().ok().map(|s| s.episode)).collect();
        self.env.close(&opened)?;
        Ok(out)
    }

    fn attach(&mut self, prompts: &mut [PromptState], rows: Vec<Row>) -> Result<(), RolloutError> {
        for row in rows {
            self.engine.remove(row.seq);
            prompts[row.prompt].trees[row.tree].add_chain(row.parent, row.steps)?;
        }
        Ok(())
    }
}
