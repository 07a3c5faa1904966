//! Tree and chain rollouts of a (randomly initialised) tiny Qwen2 policy against a real
//! env-server over the synthetic world: tree shape, forks made on the server at the picked steps,
//! observation tokens masked out of the loss, KV-prefix reuse.

use grove_datasets::assets;
use grove_datasets::synthetic::{World, WorldConfig};
use grove_tests::{WorldServer, tiny_agent_config, tiny_policy};
use grove_trainer::engine::generate::{Engine, SamplingParams};
use grove_trainer::engine::tokenizer::Tokenizer;
use grove_trainer::rl::env::EnvClient;
use grove_trainer::rl::method::{Method, TreeShape};
use grove_trainer::rl::rollout::agent::{AgentConfig, Rollout};
use grove_trainer::rl::rollout::leaves::training_rows;
use grove_trainer::workflows::scripted::task_of;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

#[test]
fn tree_and_chain_rollouts_against_a_real_env_server() {
    let tok_dir = assets::qwen25_tokenizer_dir();
    assert!(tok_dir.join("tokenizer.json").exists(), "run `cargo xtask assets`");
    let tok = Tokenizer::from_dir(&tok_dir).unwrap();
    let (_vs, lm) = tiny_policy(tok.vocab_size());
    let world = World::generate(&WorldConfig::default());
    let srv = WorldServer::start(&world);
    let env = EnvClient::connect(&srv.url, Default::default()).unwrap();
    let task = task_of(&world.questions(2, 1, 3)[0]);
    let config = tiny_agent_config();
    let mut engine = Engine::new(&lm);
    let mut rng = ChaCha8Rng::seed_from_u64(7);

    // Tree (M, N, L, k) = (2, 2, 1, 3).
    let shape = TreeShape { m: 2, n: 2, l: 1, k: 3 };
    let mut r = Rollout { engine: &mut engine, tok: &tok, env: &env, config: &config, cost: Default::default() };
    let rollout = r.run(&task, shape, &mut rng).unwrap();
    let cost = r.cost;
    assert_eq!(rollout.trees.len(), 2);
    for tree in &rollout.trees {
        assert_eq!(tree.leaves().len(), 1 + shape.n * shape.l, "one leaf per chain");
        for leaf in tree.leaves() {
            let path = tree.path(leaf);
            assert!(path.len() <= config.max_turns as usize + 1, "at most max_turns + 1 steps");
            assert!(path.last().unwrap().done && path.last().unwrap().reward.is_some());
        }
    }
    assert_eq!(cost.forks, (shape.m * shape.n * shape.l) as u64);
    // Every expansion forked the env episode at its node's step: the child's lineage says so.
    let mut checked = 0;
    for tree in &rollout.trees {
        for id in 0..tree.len() {
            let node = tree.node(id).unwrap();
            let (Some(step), Some(parent)) = (node.step.as_ref(), node.parent) else { continue };
            let parent_episode = tree.node(parent).and_then(|p| p.step.as_ref()).map(|p| (p.episode, p.env_step));
            let parent_episode = parent_episode.map(|(e, s)| (e.unwrap(), s));
            let first_chain = tree.node(0).unwrap().children.first() == Some(&id);
            if first_chain || parent_episode.map(|(e, _)| e) == step.episode {
                continue;
            }
            // First step of an expansion: its episode is a fork.
            let t = env.block_on(env.client().transcript(step.episode.unwrap())).unwrap();
            let expected_step = parent_episode.map_or(0, |(_, s)| s);
            assert_eq!(t.lineage.fork_step, Some(expected_step));
            assert_eq!(t.lineage.depth, 1);
            checked += 1;
        }
    }
    assert_eq!(checked, 4);
    let stats = env.block_on(env.client().stats()).unwrap();
    assert_eq!(stats.forks, 4);
    // The 4 expansions of the round went to the server as one Fork request.
    assert_eq!(env.requests().fork, 1);

    // Training rows: M * k rows; generated tokens weigh 1, observation tokens 0.
    let rows = training_rows(&rollout, shape.k, 0, config.max_response_tokens, &mut rng).unwrap();
    assert_eq!(rows.len(), shape.m * shape.k);
    for (row, (t, leaf)) in rows
        .iter()
        .zip(rollout.trees.iter().enumerate().flat_map(|(t, tr)| tr.leaves().into_iter().map(move |l| (t, l))))
    {
        let path = rollout.trees[t].path(leaf);
        let want_mask: Vec<u8> = path
            .iter()
            .flat_map(|s| {
                std::iter::repeat_n(1u8, s.response.len()).chain(std::iter::repeat_n(0u8, s.observation.len()))
            })
            .collect();
        assert_eq!(row.loss_mask, want_mask);
        assert_eq!(row.response.len(), row.loss_mask.len());
        assert_eq!(row.tree_group, t);
        assert!(path.iter().filter(|s| !s.observation.is_empty()).all(|s| !s.done || s.observation.is_empty()));
    }
    // KV-prefix reuse: far fewer tokens encoded than re-encoding every turn of every chain would.
    let reencode: u64 = rollout
        .trees
        .iter()
        .flat_map(|tr| tr.leaves().into_iter().map(move |l| tr.path(l)))
        .map(|path| {
            let mut ctx = rollout.prompt_tokens.len() as u64;
            let mut total = 0;
            for s in path {
                total += ctx;
                ctx += (s.response.len() + s.observation.len()) as u64;
            }
            total
        })
        .sum();
    assert!(cost.prefill_tokens < reencode, "prefill {} vs re-encoding {}", cost.prefill_tokens, reencode);
    // The roots and the snapshots the tree held for expansion share their prefixes' keys and
    // values: what they hold is bounded by the positions encoded, far below what one copy of
    // its whole prefix per snapshot would take.
    let c = &lm.config;
    let per_token = (c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * 4) as u64;
    let held = engine.kv_bytes();
    assert!(held <= (cost.prefill_tokens + cost.generated_tokens) * per_token, "{held} bytes");
    let prompt = rollout.prompt_tokens.len() as u64;
    let mut copies = shape.m as u64 * prompt;
    for tree in &rollout.trees {
        for id in 1..tree.len() {
            let node = tree.node(id).unwrap();
            if node.step.as_ref().is_some_and(|s| s.snapshot.is_some()) {
                let path: u64 = tree.path(id).iter().map(|s| (s.response.len() + s.observation.len()) as u64).sum();
                copies += prompt + path - node.step.as_ref().unwrap().observation.len() as u64 - 1;
            }
        }
    }
    assert!(held * 2 < copies * per_token, "{held} bytes held; per-snapshot copies would be {}", copies * per_token);
    rollout.release(&mut engine);
    assert_eq!(engine.kv_bytes(), 0, "released");

    // Chain GRPO with n = 3: three one-chain trees, no forks; with a custom prompt template.
    let config = AgentConfig { prompt_template: Some("Custom agent prompt. Q: {question}\n".into()), ..config };
    let mut r = Rollout { engine: &mut engine, tok: &tok, env: &env, config: &config, cost: Default::default() };
    let chains = r.run(&task, Method::chain(3).shape(), &mut rng).unwrap();
    assert_eq!(r.cost.forks, 0);
    let prompt = tok.decode(&chains.prompt_tokens, false).unwrap();
    assert!(prompt.contains("<|im_start|>user\nCustom agent prompt. Q: "), "{prompt}");
    chains.release(&mut engine);

    // A rolling context cap shorter than the prompt plus two turns: contexts are cut from the
    // left and re-encoded, and the rollout still completes every chain.
    let short = AgentConfig { max_context: chains.prompt_tokens.len() + 8, ..config.clone() };
    let mut r = Rollout { engine: &mut engine, tok: &tok, env: &env, config: &short, cost: Default::default() };
    let cut = r.run(&task, Method::chain(2).shape(), &mut rng).unwrap();
    assert_eq!(cut.trees.iter().map(|t| t.leaves().len()).sum::<usize>(), 2);
    assert_eq!(chains.trees.iter().map(|t| t.leaves().len()).sum::<usize>(), 3);
    assert_eq!(training_rows(&chains, 1, 1, 4096, &mut rng).unwrap().len(), 3);
}

#[test]
fn budget_of_tree_and_chain_rollouts() {
    use grove_trainer::measure::budget::{compare, format_rows};
    let tok_dir = assets::qwen25_tokenizer_dir();
    assert!(tok_dir.join("tokenizer.json").exists(), "run `cargo xtask assets`");
    let tok = Tokenizer::from_dir(&tok_dir).unwrap();
    let (_vs, lm) = tiny_policy(tok.vocab_size());
    let world = World::generate(&WorldConfig::default());
    let srv = WorldServer::start(&world);
    let env = EnvClient::connect(&srv.url, Default::default()).unwrap();
    let tasks: Vec<grove_protocol::TaskSpec> = world.questions(2, 2, 5).iter().map(task_of).collect();
    let agent = AgentConfig {
        max_turns: 2,
        max_obs_tokens: 48,
        max_response_tokens: 4096,
        sampling: SamplingParams { max_new_tokens: 8, top_k: 64, ..SamplingParams::default() },
        prompt_template: None,
        max_context: 4096,
        topk: None,
        schedule: Default::default(),
        max_rows: 0,
    };
    let rows = compare((&lm, &tok), &env, &tasks, &agent, &[Method::tree(2, 2, 1, 3), Method::chain(4)], 1).unwrap();
    let (tree, chain) = (&rows[0], &rows[1]);
    assert_eq!(tree.trajectories_per_prompt, 6.0, "M (1 + N L) leaves per prompt");
    assert_eq!(chain.trajectories_per_prompt, 4.0);
    assert_eq!((tree.nominal_budget, chain.nominal_budget), (4.0, 4.0), "modelled, spec 2.6");
    assert!(tree.generated_tokens > 0 && chain.generated_tokens > 0);
    // Re-encoding was measured by doing it: every generation's context encoded from scratch.
    // Chains share nothing but the prompt, so their replay re-encodes each turn's context in full.
    for r in [tree, chain] {
        assert!(r.prefill_tokens < r.reencode_tokens, "{r:?}");
        assert!(r.reencode_seconds > 0.0, "{r:?}");
    }
    let table = format_rows(&rows);
    assert!(table.contains("tree (2,2,1)") && table.contains("chain n=4"), "{table}");
    assert!(table.contains("modelled"), "{table}");
    assert_eq!(env.block_on(env.client().stats()).unwrap().episodes_live, 0);
}

/// `run_many` rolls several prompts out together: one engine batch per turn across all of them,
/// every prompt's trees built from its own episodes (and forks of them), the same shape as `run`.
#[test]
fn prompts_rolled_out_together_keep_their_own_trees() {
    let tok = Tokenizer::from_dir(&assets::qwen25_tokenizer_dir()).unwrap();
    let (_vs, lm) = tiny_policy(tok.vocab_size());
    let world = World::generate(&WorldConfig::default());
    let srv = WorldServer::start(&world);
    let env = EnvClient::connect(&srv.url, Default::default()).unwrap();
    let tasks: Vec<_> = world.questions(2, 3, 5).iter().map(task_of).collect();
    let config = AgentConfig {
        max_turns: 2,
        max_obs_tokens: 32,
        sampling: SamplingParams { max_new_tokens: 8, top_p: 1.0, ..SamplingParams::default() },
        ..AgentConfig::default()
    };
    let shape = TreeShape { m: 2, n: 2, l: 1, k: 3 };
    let mut engine = Engine::new(&lm);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut r = Rollout { engine: &mut engine, tok: &tok, env: &env, config: &config, cost: Default::default() };
    let rollouts = r.run_many(&tasks, shape, &mut rng).unwrap();
    assert_eq!(r.cost.forks, (tasks.len() * shape.m * shape.n * shape.l) as u64);
    assert_eq!(rollouts.len(), tasks.len());
    for (task, rollout) in tasks.iter().zip(&rollouts) {
        assert!(tok.decode(&rollout.prompt_tokens, false).unwrap().contains(&task.question));
        assert_eq!(rollout.trees.len(), shape.m);
        assert_eq!(rollout.episodes.len(), shape.m * (1 + shape.n * shape.l));
        for tree in &rollout.trees {
            assert_eq!(tree.leaves().len(), 1 + shape.n * shape.l);
        }
        // Every episode of this prompt, created or forked, holds this prompt's task.
        for &episode in &rollout.episodes {
            let t = env.block_on(env.client().transcript(episode)).unwrap();
            assert_eq!(t.task.question, task.question);
        }
        for tree in &rollout.trees {
            for id in 0..tree.len() {
                if let Some(step) = tree.node(id).and_then(|n| n.step.as_ref()) {
                    assert!(rollout.episodes.contains(&step.episode.unwrap()), "a step in another prompt's episode");
                }
            }
        }
    }
    // Generations ran across the prompts: a turn of the 3 x 2 first chains is one batch, so the
    // mean batch is above what one prompt's M = 2 chains could make.
    let stats = engine.stats;
    assert!(stats.generate_calls <= 2 * (u64::from(config.max_turns) + 1), "{stats:?}");
    assert!(stats.generated_sequences as f64 / stats.generate_calls as f64 > shape.m as f64, "{stats:?}");
    // One Create for all the prompts' trees, one Fork for the round's expansions of all of them.
    assert_eq!((env.requests().create, env.requests().fork), (1, 1));
    let mut all = Vec::new();
    for rollout in &rollouts {
        rollout.release(&mut engine);
        all.extend_from_slice(&rollout.episodes);
    }
    env.close(&all).unwrap();
    assert_eq!(env.requests().close, 1);
    assert_eq!(env.block_on(env.client().stats()).unwrap().episodes_live, 0);
}

/// What is trained is what was sent: when a stop string ends inside a token, the generation keeps
/// that token whole and the env-server receives exactly the decoding of the tokens that are
/// trained, not a text cut short at the stop string. The stop string here is "e", which the real
/// Qwen2.5 BPE tokenizer buries inside many tokens, so random generations straddle it often.
#[test]
fn the_env_server_receives_exactly_the_trained_tokens() {
    let tok = Tokenizer::from_dir(&assets::qwen25_tokenizer_dir()).unwrap();
    let (_vs, lm) = tiny_policy(tok.vocab_size());
    let world = World::generate(&WorldConfig::default());
    let srv = WorldServer::start(&world);
    let env = EnvClient::connect(&srv.url, Default::default()).unwrap();
    let tasks: Vec<_> = world.questions(2, 4, 9).iter().map(task_of).collect();
    let config = AgentConfig {
        max_turns: 2,
        max_obs_tokens: 32,
        sampling: SamplingParams {
            max_new_tokens: 24,
            top_p: 1.0,
            stop: vec!["e".into()],
            ..SamplingParams::default()
        },
        ..AgentConfig::default()
    };
    let mut engine = Engine::new(&lm);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut r = Rollout { engine: &mut engine, tok: &tok, env: &env, config: &config, cost: Default::default() };
    let rollouts = r.run_many(&tasks, Method::chain(3).shape(), &mut rng).unwrap();
    let (mut checked, mut straddled) = (0, 0);
    for rollout in &rollouts {
        for tree in &rollout.trees {
            for leaf in tree.leaves() {
                let path = tree.path(leaf);
                let episode = path[0].episode.unwrap();
                let transcript = env.block_on(env.client().transcript(episode)).unwrap();
                assert_eq!(transcript.steps.len(), path.len());
                for (step, sent) in path.iter().zip(&transcript.steps) {
                    let trained = tok.decode(&step.response, true).unwrap();
                    assert_eq!(sent.action, trained, "the server got other text than the trained tokens");
                    assert_eq!(step.logprobs.len(), step.response.len());
                    checked += 1;
                    // The stop string ended inside the last token: the text runs past it.
                    if trained.contains('e') && !trained.ends_with('e') {
                        straddled += 1;
                    }
                }
            }
        }
        rollout.release(&mut engine);
        env.close(&rollout.episodes).unwrap();
    }
    assert!(checked >= 12, "{checked} steps");
    assert!(straddled > 0, "no generation stopped inside a token: the test checked nothing");
}

/// One node: its parent, generated tokens and observation tokens.
type NodeTokens = (Option<usize>, Vec<u32>, Vec<u32>);

/// Node by node, what a prompt's trees hold: each step's generated and observation tokens, and
/// where it hangs.
fn tree_tokens(rollout: &grove_trainer::rl::rollout::agent::PromptRollout) -> Vec<Vec<NodeTokens>> {
    rollout
        .trees
        .iter()
        .map(|tree| {
            (1..tree.len())
                .map(|id| {
                    let node = tree.node(id).unwrap();
                    let step = node.step.as_ref().unwrap();
                    (node.parent, step.response.clone(), step.observation.clone())
                })
                .collect()
        })
        .collect()
}

/// The continuous schedule (one running batch, env steps answered while decoding goes on, each
/// prompt's round started when its own last round ended): greedy chains are those of the phased
/// schedule; trees have the shape, the episodes and the forks of the phased schedule's; and what
/// a prompt's rollout holds does not depend on the prompts it ran beside.
#[test]
fn continuous_rollouts_build_the_phased_schedules_trees() {
    use grove_trainer::rl::rollout::agent::Schedule;
    let tok = Tokenizer::from_dir(&assets::qwen25_tokenizer_dir()).unwrap();
    let (_vs, lm) = tiny_policy(tok.vocab_size());
    let world = World::generate(&WorldConfig::default());
    let srv = WorldServer::start(&world);
    let env = EnvClient::connect(&srv.url, Default::default()).unwrap();
    let tasks: Vec<_> = world.questions(2, 4, 8).iter().map(task_of).collect();
    let sampled = AgentConfig {
        max_turns: 2,
        max_obs_tokens: 32,
        sampling: SamplingParams { max_new_tokens: 10, top_k: 64, ..SamplingParams::default() },
        schedule: Schedule::Continuous,
        ..AgentConfig::default()
    };
    let mut engine = Engine::new(&lm);
    let roll = |engine: &mut Engine<'_>,
                config: &AgentConfig,
                tasks: &[grove_protocol::TaskSpec],
                shape: TreeShape,
                seed: u64| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut out = Vec::new();
        let mut r = Rollout { engine: &mut *engine, tok: &tok, env: &env, config, cost: Default::default() };
        out.extend(r.run_many(tasks, shape, &mut rng).unwrap());
        let cost = r.cost;
        let mut episodes = Vec::new();
        for rollout in &out {
            rollout.release(engine);
            episodes.extend_from_slice(&rollout.episodes);
        }
        let stats = engine.stats;
        (out, cost, episodes, stats)
    };

    // Greedy chains: the same tokens, observations and rewards under both schedules.
    let greedy = sampled.greedy();
    let chains = Method::chain(2).shape();
    let (phased, phased_cost, opened, _) =
        roll(&mut engine, &AgentConfig { schedule: Schedule::Phased, ..greedy.clone() }, &tasks, chains, 1);
    env.close(&opened).unwrap();
    let (continuous, continuous_cost, opened, _) = roll(&mut engine, &greedy, &tasks, chains, 1);
    env.close(&opened).unwrap();
    for (a, b) in phased.iter().zip(&continuous) {
        assert_eq!(tree_tokens(a), tree_tokens(b));
        let rewards = |r: &grove_trainer::rl::rollout::agent::PromptRollout| -> Vec<Option<f64>> {
            r.trees
                .iter()
                .flat_map(|t| t.leaves().into_iter().map(move |l| t.node(l).unwrap().step.as_ref().unwrap().reward))
                .collect()
        };
        assert_eq!(rewards(a), rewards(b));
    }
    assert_eq!(
        (phased_cost.generated_tokens, phased_cost.tool_calls),
        (continuous_cost.generated_tokens, continuous_cost.tool_calls)
    );

    // Evaluation's chains (`run_chains`) too.
    let mut evaluated = Vec::new();
    for schedule in [Schedule::Phased, Schedule::Continuous] {
        let config = AgentConfig { schedule, ..greedy.clone() };
        let mut r = Rollout { engine: &mut engine, tok: &tok, env: &env, config: &config, cost: Default::default() };
        let steps = r.run_chains(&tasks, 4).unwrap();
        evaluated.push(
            steps
                .iter()
                .map(|s| s.iter().map(|s| (s.response.clone(), s.reward)).collect::<Vec<_>>())
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(evaluated[0], evaluated[1]);
    assert_eq!(engine.kv_bytes(), 0, "evaluation released its sequences");

    // Sampled trees: the phased schedule's shape, episodes and forks.
    let shape = TreeShape { m: 2, n: 2, l: 2, k: 3 };
    let forks_before = env.requests().fork;
    let (together, cost, opened, stats) = roll(&mut engine, &sampled, &tasks, shape, 9);
    assert_eq!(cost.forks, (tasks.len() * shape.m * shape.n * shape.l) as u64);
    assert!(
        env.requests().fork - forks_before <= (tasks.len() * shape.l) as u64,
        "one Fork request per prompt and round"
    );
    assert_eq!(stats.step_transfers, stats.decode_steps + stats.compactions, "one transfer per decode step");
    for (task, rollout) in tasks.iter().zip(&together) {
        assert_eq!(rollout.episodes.len(), shape.m * (1 + shape.n * shape.l));
        for tree in &rollout.trees {
            assert_eq!(tree.leaves().len(), 1 + shape.n * shape.l);
            for leaf in tree.leaves() {
                let path = tree.path(leaf);
                assert!(path.last().unwrap().done && path.last().unwrap().reward.is_some());
            }
            // An expansion's first step runs in a fork of its parent's episode at its step.
            for id in 1..tree.len() {
                let node = tree.node(id).unwrap();
                let step = node.step.as_ref().unwrap();
                let parent = node.parent.and_then(|p| tree.node(p)).and_then(|p| p.step.as_ref());
                let t = env.block_on(env.client().transcript(step.episode.unwrap())).unwrap();
                assert_eq!(t.task.question, task.question);
                match parent {
                    Some(p) if p.episode != step.episode => {
                        assert_eq!(t.lineage.fork_step, Some(p.env_step));
                        assert_eq!(t.lineage.parent, p.episode);
                    }
                    _ => {}
                }
            }
        }
    }
    env.close(&opened).unwrap();

    // Prompt by prompt from the same stream: each prompt's trees are the same as beside the others.
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for (task, want) in tasks.iter().zip(&together) {
        let mut r = Rollout { engine: &mut engine, tok: &tok, env: &env, config: &sampled, cost: Default::default() };
        let alone = r.run_many(std::slice::from_ref(task), shape, &mut rng).unwrap().remove(0);
        assert_eq!(tree_tokens(&alone), tree_tokens(want));
        alone.release(&mut engine);
        env.close(&alone.episodes).unwrap();
    }
    // Two prompts in flight at a time, the next starting when one ends: the same trees again.
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let creates = env.requests().create;
    let mut r = Rollout { engine: &mut engine, tok: &tok, env: &env, config: &sampled, cost: Default::default() };
    let windowed = r.run_continuous(&tasks, 2, shape, &mut rng).unwrap();
    assert!(env.requests().create - creates >= 2, "prompts created as they enter");
    for (got, want) in windowed.iter().zip(&together) {
        assert_eq!(tree_tokens(got), tree_tokens(want));
        got.release(&mut engine);
        env.close(&got.episodes).unwrap();
    }
    // A row cap of one prompt's first chains (M = 2): prompts enter one at a time, each when the
    // one before has ended, no decode step draws for more than 2 rows (a round's 4 branches take
    // turns), and the trees are the same again. Without the cap, every prompt's first chains
    // decode together.
    assert!(stats.peak_rows >= (tasks.len() * shape.m) as u64, "{stats:?}");
    let capped = AgentConfig { max_rows: shape.m, ..sampled.clone() };
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let creates = env.requests().create;
    engine.stats.peak_rows = 0;
    let mut r = Rollout { engine: &mut engine, tok: &tok, env: &env, config: &capped, cost: Default::default() };
    let one_by_one = r.run_continuous(&tasks, 0, shape, &mut rng).unwrap();
    assert_eq!(env.requests().create - creates, tasks.len() as u64, "one prompt entered at a time");
    assert_eq!(engine.stats.peak_rows, shape.m as u64, "{:?}", engine.stats);
    for (got, want) in one_by_one.iter().zip(&together) {
        assert_eq!(tree_tokens(got), tree_tokens(want));
        got.release(&mut engine);
        env.close(&got.episodes).unwrap();
    }
    assert_eq!(engine.kv_bytes(), 0, "released");
    assert_eq!(env.block_on(env.client().stats()).unwrap().episodes_live, 0);
}
