//! Chain and tree rollouts (spec §1.2-1.3 and §2.3) against an env-server: the model acts, the
//! server resolves the actions; a tree expansion forks the env episode at the picked node's step
//! and the engine sequence at that node's token prefix, so a branch reuses its parent's KV cache.

use rand::Rng;

use grove_protocol::client::{Client, ClientError, ClientOptions};
use grove_protocol::{
    Action, ActionKind, EpisodeId, EpisodeOptions, ErrorInfo, ForkSpec, Observation, StepAction, TaskSpec,
};

use super::tree::{NodeId, Tree};
use crate::generate::{Engine, EngineError, SamplingParams, SeqId};
use crate::tokenizer::{ChatMessage, Tokenizer, TokenizerError};

#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error("env-server: {0}")]
    Client(#[from] ClientError),
    #[error("env-server refused: {0}")]
    Env(ErrorInfo),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Tree(#[from] super::tree::TreeError),
    #[error("cannot start the env client runtime: {0}")]
    Runtime(std::io::Error),
    /// The connection to an env-server broke (the server died or the network went away): every
    /// episode this client held there is gone with it.
    #[error("env-server {url} went away ({why}); {live} live episodes there are lost")]
    EnvLost { url: String, live: u64, why: String },
}

/// A blocking handle on one env-server for the tensor thread.
#[derive(Debug)]
pub struct EnvClient {
    rt: tokio::runtime::Runtime,
    client: Client,
    url: String,
    /// Episodes created or forked through this handle and not closed yet.
    live: std::sync::atomic::AtomicU64,
}

impl EnvClient {
    pub fn connect(url: &str, options: ClientOptions) -> Result<Self, RolloutError> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(RolloutError::Runtime)?;
        let client = rt.block_on(Client::connect(url, options))?;
        Ok(Self { rt, client, url: url.to_string(), live: Default::default() })
    }

    /// The env-server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Episodes opened through this handle and not closed yet.
    pub fn live_episodes(&self) -> u64 {
        self.live.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn opened(&self, n: usize) {
        self.live.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// A transport failure (not an error reply) means the server or the connection is gone.
    fn lost(&self, e: ClientError) -> RolloutError {
        match e {
            ClientError::Closed | ClientError::WebSocket(_) => {
                RolloutError::EnvLost { url: self.url.clone(), live: self.live_episodes(), why: e.to_string() }
            }
            other => RolloutError::Client(other),
        }
    }

    fn create(&self, tasks: Vec<TaskSpec>, config: &AgentConfig) -> Result<Vec<(EpisodeId, String)>, RolloutError> {
        let opts = EpisodeOptions {
            max_turns: Some(config.max_turns),
            prompt_template: config.prompt_template.clone(),
            topk: config.topk,
            ..Default::default()
        };
        let created = self.rt.block_on(self.client.create_episodes(tasks, opts)).map_err(|e| self.lost(e))?;
        self.opened(created.iter().filter(|r| r.is_ok()).count());
        created.into_iter().map(|r| r.map(|s| (s.episode, s.prompt)).map_err(RolloutError::Env)).collect()
    }

    fn step(&self, actions: Vec<(EpisodeId, String)>) -> Result<Vec<Observation>, RolloutError> {
        let actions =
            actions.into_iter().map(|(episode, text)| StepAction { episode, action: Action::Text(text) }).collect();
        let results = self.rt.block_on(self.client.step(actions)).map_err(|e| self.lost(e))?;
        results.into_iter().map(|r| r.map_err(RolloutError::Env)).collect()
    }

    fn fork(&self, episode: EpisodeId, at_step: u32) -> Result<EpisodeId, RolloutError> {
        let r =
            self.rt.block_on(self.client.fork(vec![ForkSpec { episode, at_step, n: 1 }])).map_err(|e| self.lost(e))?;
        match r.into_iter().next() {
            Some(Ok(f)) => f.children.first().copied().inspect(|_| self.opened(1)).ok_or_else(|| {
                RolloutError::Env(ErrorInfo::new(grove_protocol::ErrorCode::Internal, "fork returned no child"))
            }),
            Some(Err(e)) => Err(RolloutError::Env(e)),
            None => Err(RolloutError::Env(ErrorInfo::new(grove_protocol::ErrorCode::Internal, "empty fork reply"))),
        }
    }

    pub fn close(&self, episodes: Vec<EpisodeId>) -> Result<(), RolloutError> {
        let closed = self.rt.block_on(self.client.close(episodes)).map_err(|e| self.lost(e))?;
        let n = closed.iter().filter(|r| r.is_ok()).count() as u64;
        let _ =
            self.live.fetch_update(std::sync::atomic::Ordering::Relaxed, std::sync::atomic::Ordering::Relaxed, |l| {
                Some(l.saturating_sub(n))
            });
        Ok(())
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Run an async call of the client on this handle's runtime.
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
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
        }
    }
}

/// One agent step: what the model generated and what the environment answered.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    pub response: Vec<u32>,
    pub observation: Vec<u32>,
    pub kind: ActionKind,
    pub done: bool,
    /// The server's reward, on the step that ended the episode.
    pub reward: Option<f64>,
    /// Pure EM / F1 of the answer, on the step that ended the episode.
    pub metric: Option<f64>,
    /// The env episode this step happened in, and the step count after it.
    pub episode: EpisodeId,
    pub env_step: u32,
    /// An engine sequence holding the state right after this step (for expansions).
    pub snapshot: SeqId,
}

/// Cost of a rollout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RolloutCost {
    pub generated_tokens: u64,
    pub prefill_tokens: u64,
    pub tool_calls: u64,
    pub forks: u64,
}

/// One training row: the prompt, then the response side with its loss mask (1 = generated).
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingRow {
    pub prompt: Vec<u32>,
    pub response: Vec<u32>,
    pub loss_mask: Vec<u8>,
    pub reward: f64,
    /// Group ids for the advantage estimators.
    pub prompt_group: usize,
    pub tree_group: usize,
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

/// Tree shape (spec §2.1): M trees per prompt, N picks per tree per round, L rounds, k leaves kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeShape {
    pub m: usize,
    pub n: usize,
    pub l: usize,
    pub k: usize,
}

impl TreeShape {
    /// Chain GRPO with `n` trajectories: n trees of one chain each.
    pub fn chain(n: usize) -> Self {
        Self { m: n, n: 0, l: 0, k: 1 }
    }
}

/// A chain being continued: its prompt (in a batch of prompts) and tree, engine sequence, env
/// episode and turns so far.
struct Row {
    prompt: usize,
    tree: usize,
    parent: NodeId,
    seq: SeqId,
    episode: EpisodeId,
    steps: Vec<(StepRecord, bool)>,
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
    /// Continue every row until its episode ends; the server runs the forced final turn.
    fn continue_rows(&mut self, rows: &mut [Row]) -> Result<(), RolloutError> {
        let mut active: Vec<usize> = (0..rows.len()).collect();
        while !active.is_empty() {
            for &i in &active {
                self.truncate_context(&mut rows[i])?;
            }
            let seqs: Vec<SeqId> = active.iter().map(|&i| rows[i].seq).collect();
            let gens = self.engine.generate(&seqs, &self.config.sampling, self.tok)?;
            let actions = active.iter().zip(&gens).map(|(&i, g)| (rows[i].episode, g.text.clone())).collect();
            let observations = self.env.step(actions)?;
            let mut still = Vec::new();
            for ((&i, g), obs) in active.iter().zip(gens).zip(observations) {
                if obs.kind == ActionKind::Search && !obs.forced_final {
                    self.cost.tool_calls += 1;
                }
                let mut obs_tokens = if obs.text.is_empty() { Vec::new() } else { self.tok.encode(&obs.text)? };
                obs_tokens.truncate(self.config.max_obs_tokens);
                let row = &mut rows[i];
                self.engine.extend(row.seq, &obs_tokens)?;
                let snapshot = self.engine.fork(row.seq, 1)?[0];
                let reward = obs.reward.as_ref().map(|r| r.score);
                let metric = obs.reward.as_ref().map(|r| r.metric_value);
                row.steps.push((
                    StepRecord {
                        response: g.tokens,
                        observation: obs_tokens,
                        kind: obs.kind,
                        done: obs.done,
                        reward,
                        metric,
                        episode: row.episode,
                        env_step: obs.step,
                        snapshot,
                    },
                    obs.done,
                ));
                if !obs.done {
                    still.push(i);
                }
            }
            active = still;
        }
        Ok(())
    }

    /// Cut a context longer than `max_context` from the left (a new sequence, re-encoded).
    fn truncate_context(&mut self, row: &mut Row) -> Result<(), RolloutError> {
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
        let before = self.engine.stats;
        let creates: Vec<TaskSpec> = tasks.iter().flat_map(|t| std::iter::repeat_n(t.clone(), shape.m)).collect();
        let starts = self.env.create(creates, self.config)?;
        let mut prompts = Vec::with_capacity(tasks.len());
        let mut trees: Vec<Vec<Tree<StepRecord>>> = Vec::with_capacity(tasks.len());
        let mut episodes: Vec<Vec<EpisodeId>> = Vec::with_capacity(tasks.len());
        let mut roots: Vec<Vec<(SeqId, EpisodeId)>> = Vec::with_capacity(tasks.len());
        let mut rows = Vec::with_capacity(starts.len());
        for p in 0..tasks.len() {
            let mine = starts.get(p * shape.m..(p + 1) * shape.m).unwrap_or_default();
            let prompt_text = self.tok.apply_chat_template(
                &[ChatMessage::new("user", mine.first().map(|s| s.1.clone()).unwrap_or_default())],
                true,
            )?;
            let prompt_tokens = self.tok.encode(&prompt_text)?;
            let mut prompt_roots = Vec::with_capacity(shape.m);
            for (t, (episode, _)) in mine.iter().enumerate() {
                let seed = rng.random::<u64>();
                let root = self.engine.add(prompt_tokens.clone(), seed)?;
                prompt_roots.push((root, *episode));
                let seq = self.engine.fork(root, 1)?[0];
                let parent = Tree::<StepRecord>::ROOT;
                rows.push(Row { prompt: p, tree: t, parent, seq, episode: *episode, steps: Vec::new() });
            }
            prompts.push(prompt_tokens);
            trees.push((0..shape.m).map(|_| Tree::new()).collect());
            episodes.push(mine.iter().map(|s| s.0).collect());
            roots.push(prompt_roots);
        }
        self.continue_rows(&mut rows)?;
        self.attach(&mut trees, rows)?;
        for _round in 0..shape.l {
            let mut rows = Vec::new();
            for (p, prompt_trees) in trees.iter().enumerate() {
                for (t, tree) in prompt_trees.iter().enumerate() {
                    for node in tree.pick(shape.n, rng) {
                        let (snapshot, episode, at_step) = match tree.node(node).and_then(|n| n.step.as_ref()) {
                            Some(step) => (step.snapshot, step.episode, step.env_step),
                            None => (roots[p][t].0, roots[p][t].1, 0),
                        };
                        let seq = self.engine.fork(snapshot, 1)?[0];
                        let episode = self.env.fork(episode, at_step)?;
                        episodes[p].push(episode);
                        self.cost.forks += 1;
                        rows.push(Row { prompt: p, tree: t, parent: node, seq, episode, steps: Vec::new() });
                    }
                }
            }
            self.continue_rows(&mut rows)?;
            self.attach(&mut trees, rows)?;
        }
        self.cost.generated_tokens += self.engine.stats.generated_tokens - before.generated_tokens;
        self.cost.prefill_tokens += self.engine.stats.prefill_tokens - before.prefill_tokens;
        let mut out = Vec::with_capacity(tasks.len());
        for (((prompt_tokens, trees), episodes), roots) in prompts.into_iter().zip(trees).zip(episodes).zip(roots) {
            let mut held: Vec<SeqId> = roots.iter().map(|r| r.0).collect();
            for tree in &trees {
                for id in 0..tree.len() {
                    if let Some(step) = tree.node(id).and_then(|n| n.step.as_ref()) {
                        held.push(step.snapshot);
                    }
                }
            }
            out.push(PromptRollout { prompt_tokens, trees, held, episodes });
        }
        Ok(out)
    }

    /// One chain per task, all tasks batched together (evaluation, or quick chain rollouts).
    /// Returns each task's steps; the episodes are closed and the sequences released.
    pub fn run_chains(&mut self, tasks: &[TaskSpec], seed: u64) -> Result<Vec<Vec<StepRecord>>, RolloutError> {
        let before = self.engine.stats;
        let starts = self.env.create(tasks.to_vec(), self.config)?;
        let mut rows = Vec::with_capacity(tasks.len());
        for (i, (episode, prompt)) in starts.iter().enumerate() {
            let text = self.tok.apply_chat_template(&[ChatMessage::new("user", prompt.clone())], true)?;
            let seq = self.engine.add(self.tok.encode(&text)?, seed.wrapping_add(i as u64))?;
            let parent = Tree::<StepRecord>::ROOT;
            rows.push(Row { prompt: i, tree: 0, parent, seq, episode: *episode, steps: Vec::new() });
        }
        self.continue_rows(&mut rows)?;
        self.cost.generated_tokens += self.engine.stats.generated_tokens - before.generated_tokens;
        self.cost.prefill_tokens += self.engine.stats.prefill_tokens - before.prefill_tokens;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            self.engine.remove(row.seq);
            let steps: Vec<StepRecord> = row.steps.into_iter().map(|(s, _)| s).collect();
            for s in &steps {
                self.engine.remove(s.snapshot);
            }
            out.push(steps);
        }
        self.env.close(starts.iter().map(|s| s.0).collect())?;
        Ok(out)
    }

    fn attach(&mut self, trees: &mut [Vec<Tree<StepRecord>>], rows: Vec<Row>) -> Result<(), RolloutError> {
        for row in rows {
            self.engine.remove(row.seq);
            trees[row.prompt][row.tree].add_chain(row.parent, row.steps)?;
        }
        Ok(())
    }
}

/// Keep `k` leaves per tree and flatten them into training rows (spec §2.3 phase 3): prompt-major,
/// then tree, then leaf; response side right-truncated to `max_response_tokens`.
pub fn training_rows(
    rollout: &PromptRollout,
    k: usize,
    prompt_group: usize,
    max_response_tokens: usize,
    rng: &mut impl Rng,
) -> Result<Vec<TrainingRow>, RolloutError> {
    let mut out = Vec::new();
    for (t, tree) in rollout.trees.iter().enumerate() {
        for leaf in tree.keep_leaves(k, rng)? {
            let path = tree.path(leaf);
            let mut response = Vec::new();
            let mut mask = Vec::new();
            for step in &path {
                response.extend(&step.response);
                mask.extend(std::iter::repeat_n(1u8, step.response.len()));
                response.extend(&step.observation);
                mask.extend(std::iter::repeat_n(0u8, step.observation.len()));
            }
            response.truncate(max_response_tokens);
            mask.truncate(max_response_tokens);
            let reward = path.last().and_then(|s| s.reward).unwrap_or(0.0);
            out.push(TrainingRow {
                prompt: rollout.prompt_tokens.clone(),
                response,
                loss_mask: mask,
                reward,
                prompt_group,
                tree_group: prompt_group * 1_000_000 + t,
            });
        }
    }
    Ok(out)
}
