//! A scripted, deliberately imperfect agent for the synthetic multi-hop world: it plays episodes
//! through a real env-server (so its observations are real search results) and writes the
//! trajectories for SFT warm starts.
//!
//! It knows each question's chain of entities (a demonstrator may), searches them hop by hop and
//! answers. With probability `early_answer` it answers before the last hop with the last entity
//! it found (a wrong answer), and with probability `vague_query` it searches the question text
//! instead of the entity name, so the warm-started policy starts well below perfect.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use grove_datasets::synthetic::{SyntheticQuestion, World};
use grove_protocol::{EpisodeOptions, TaskSpec};

use crate::rl::env::{EnvClient, EnvError};
use crate::workflows::sft::{SftStep, Trajectory};

#[derive(Debug, Clone, PartialEq)]
pub struct ScriptConfig {
    pub early_answer: f64,
    pub vague_query: f64,
    pub max_turns: u32,
    pub seed: u64,
    /// Agent prompt (`{question}` placeholder); `None` takes the env-server's.
    pub prompt_template: Option<String>,
    pub topk: Option<u32>,
}

impl Default for ScriptConfig {
    fn default() -> Self {
        Self { early_answer: 0.25, vague_query: 0.15, max_turns: 4, seed: 0, prompt_template: None, topk: None }
    }
}

/// A played trajectory and the reward the env-server gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct Played {
    pub trajectory: Trajectory,
    pub reward: f64,
    pub correct: bool,
}

pub fn task_of(q: &SyntheticQuestion) -> TaskSpec {
    TaskSpec {
        question: q.example.question.clone(),
        golden_answers: q.example.golden_answers.clone(),
        data_source: q.example.data_source.clone(),
        task_id: Some(q.example.id.clone()),
        metric: Some(grove_protocol::Metric::Em),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error("env-server: {0}")]
    Client(#[from] grove_protocol::client::ClientError),
    #[error("env-server refused the episode: {0}")]
    Refused(grove_protocol::ErrorInfo),
}

/// Play every question `passes` times (pass p with seed `cfg.seed + p`, so each pass makes
/// different imperfections).
pub fn play_passes(
    world: &World,
    questions: &[SyntheticQuestion],
    env: &EnvClient,
    cfg: &ScriptConfig,
    passes: usize,
) -> Result<Vec<Played>, ScriptError> {
    let mut played = Vec::new();
    for pass in 0..passes {
        let pass_cfg = ScriptConfig { seed: cfg.seed + pass as u64, ..cfg.clone() };
        played.extend(play(world, questions, env, &pass_cfg)?);
    }
    Ok(played)
}

/// Play every question once through `env`.
pub fn play(
    world: &World,
    questions: &[SyntheticQuestion],
    env: &EnvClient,
    cfg: &ScriptConfig,
) -> Result<Vec<Played>, ScriptError> {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut out = Vec::with_capacity(questions.len());
    for q in questions {
        let opts = EpisodeOptions {
            max_turns: Some(cfg.max_turns),
            prompt_template: cfg.prompt_template.clone(),
            topk: cfg.topk,
            ..Default::default()
        };
        let created = env.create(&[task_of(q)], &opts)?;
        let start = match created.into_iter().next() {
            Some(Ok(s)) => s,
            Some(Err(e)) => return Err(ScriptError::Refused(e)),
            None => continue,
        };
        let hops = q.chain.len();
        // How many hops this playthrough completes before answering.
        let done_hops = if hops > 1 && rng.random_bool(cfg.early_answer) { rng.random_range(1..hops) } else { hops };
        let mut steps = Vec::new();
        let mut reward = 0.0;
        let mut correct = false;
        for hop in 0..done_hops.min(cfg.max_turns as usize) {
            let entity = &world.entities[q.chain[hop]].name;
            let query = if rng.random_bool(cfg.vague_query) { q.example.question.clone() } else { entity.clone() };
            let action = format!("<think>I need to find out about {entity}.</think>\n<search> {query} </search>");
            let obs = env.block_on(env.client().step_text(start.episode, &action))?;
            steps.push(SftStep { action, observation: obs.text });
        }
        let answer = if done_hops == hops {
            world.entities[q.answer].name.clone()
        } else {
            // Answering early: the last entity found so far, which is not the answer.
            world.entities[q.chain[done_hops]].name.clone()
        };
        let action = format!("<think>The answer is {answer}.</think>\n<answer> {answer} </answer>");
        let obs = env.block_on(env.client().step_text(start.episode, &action))?;
        if let Some(r) = &obs.reward {
            reward = r.score;
            correct = r.metric_value > 0.0;
        }
        steps.push(SftStep { action, observation: String::new() });
        env.close(&[start.episode])?;
        out.push(Played { trajectory: Trajectory { prompt: start.prompt, steps }, reward, correct });
    }
    Ok(out)
}
