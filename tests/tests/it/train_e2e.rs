//! Training end to end on CPU against in-process env-servers over the synthetic world:
//! - Tree-GRPO and chain-GRPO steps train a tiny random policy, in one Fork request per
//!   expansion round and one Close per batch per server;
//! - a run stopped after one step and resumed from its checkpoint ends with exactly the
//!   parameters of an uninterrupted run;
//! - with a policy that answers, the rewards recomputed from the trained tokens agree with the
//!   env-server's (answer, EM, format, training score), and a wrong one is caught;
//! - at T = 0.7 the update's first ratio to the sampling distribution is 1 up to rounding;
//! - refused episodes (a full episode table, an over-long query) and failing tool calls (a
//!   retriever answering 500) stay local to their trajectories and are counted by kind.

use std::sync::Arc;

use grove_datasets::assets;
use grove_datasets::synthetic::{World, WorldConfig};
use grove_rundir::{RunDir, TrainState};
use grove_tests::{WorldServer, answering_policy, tiny_config_json, tiny_policy};
use grove_trainer::engine::generate::SamplingParams;
use grove_trainer::engine::model::load_model;
use grove_trainer::engine::optim::{AdamW, AdamWConfig};
use grove_trainer::engine::tokenizer::Tokenizer;
use grove_trainer::rl::algo::advantage::Estimator;
use grove_trainer::rl::algo::schedule::WarmupConstant;
use grove_trainer::rl::algo::update::UpdateConfig;
use grove_trainer::rl::env::EnvClient;
use grove_trainer::rl::method::Method;
use grove_trainer::rl::rollout::agent::AgentConfig;
use grove_trainer::rl::train::checkpoint;
use grove_trainer::rl::train::{StepConfig, train_step};
use grove_trainer::workflows::scripted::task_of;

fn params(vs: &tch::nn::VarStore) -> Vec<f32> {
    let mut v: Vec<_> = vs.variables().into_iter().collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v.iter().flat_map(|(_, t)| Vec::<f32>::try_from(t.flatten(0, -1)).unwrap()).collect()
}

fn tasks(world: &World) -> Vec<grove_protocol::TaskSpec> {
    world.questions(2, 6, 1).iter().map(task_of).collect()
}

fn step_config(method: Method, estimator: Estimator) -> StepConfig {
    StepConfig {
        prompts_per_step: 2,
        rollout_batch_prompts: 0,
        method,
        estimator,
        agent: AgentConfig {
            max_turns: 2,
            max_obs_tokens: 32,
            max_response_tokens: 512,
            sampling: SamplingParams { max_new_tokens: 6, top_k: 64, ..SamplingParams::default() },
            prompt_template: None,
            max_context: 4096,
            topk: None,
            schedule: Default::default(),
            max_rows: 0,
        },
        update: UpdateConfig { mini_batches: 1, micro_batch: 4, ..Default::default() },
        schedule: WarmupConstant { lr: 1e-3, warmup_steps: 0 },
        seed: 11,
        trees: Default::default(),
    }
}

fn tokenizer() -> Tokenizer {
    let dir = assets::qwen25_tokenizer_dir();
    assert!(dir.join("tokenizer.json").exists(), "run `cargo xtask assets`");
    Tokenizer::from_dir(&dir).unwrap()
}

#[test]
fn tree_and_chain_grpo_steps_train_the_policy() {
    let tok = tokenizer();
    let world = World::generate(&WorldConfig::default());
    // Two env-servers: prompts are sharded over them, forks stay on their prompt's server.
    let (srv1, srv2) = (WorldServer::start(&world), WorldServer::start(&world));
    let envs = [
        EnvClient::connect(&srv1.url, Default::default()).unwrap(),
        EnvClient::connect(&srv2.url, Default::default()).unwrap(),
    ];
    let tasks = tasks(&world);
    let (vs, lm) = tiny_policy(tok.vocab_size());
    let (_rvs, reference) = tiny_policy(tok.vocab_size());
    let mut opt = AdamW::new(&vs, AdamWConfig::default());
    let out = tempfile::tempdir().unwrap();
    let run = RunDir::new(out.path());
    let initial = params(&vs);
    let tree = step_config(Method::tree(2, 2, 1, 3), Estimator::Tree);
    let chain = step_config(Method::chain(4), Estimator::Grpo);
    let mut all = Vec::new();
    for (step, cfg) in [(0u64, &tree), (1, &tree), (2, &chain), (3, &chain)] {
        let m = train_step(&lm, &reference, &mut opt, &tok, &envs, &tasks, cfg, step).unwrap().metrics;
        run.append_metrics(&m).unwrap();
        all.push(m);
    }
    // Tree steps: 2 prompts x M * k = 12 rows, 2 x M * N * L = 8 forks; chain steps: 2 x 4 rows.
    assert_eq!((all[0].rows, all[0].forks), (12, 8));
    assert_eq!((all[2].rows, all[2].forks), (8, 0));
    assert!(all.iter().all(|m| m.generated_tokens > 0 && m.trained_tokens > 0 && m.grad_norm > 0.0));
    assert!(all.iter().all(|m| m.reward_check_mismatches == 0), "local reward recomputation agrees with the server");
    assert!(all.iter().all(|m| m.masked_rows == 0 && m.failures.is_empty()));
    assert_ne!(params(&vs), initial, "the parameters changed");
    // The metrics file has one record per step.
    let back = run.metrics().unwrap();
    assert_eq!(back, all);
    // Each server got one prompt per step (4 forks per tree step each), and every episode of
    // the finished steps was closed: per step and server one Create, one Close, and for a tree
    // step one Fork request for the whole expansion round.
    for env in &envs {
        let stats = env.block_on(env.client().stats()).unwrap();
        assert_eq!(stats.forks, 8);
        assert_eq!(stats.episodes_live, 0);
        let r = env.requests();
        assert_eq!((r.create, r.fork, r.close), (4, 2, 4), "{r:?}");
    }
}

#[test]
fn resume_from_a_checkpoint_is_exact() {
    let tok = tokenizer();
    let world = World::generate(&WorldConfig::default());
    let srv = WorldServer::start(&world);
    let env = EnvClient::connect(&srv.url, Default::default()).unwrap();
    let tasks = tasks(&world);
    let cfg = step_config(Method::tree(2, 1, 1, 2), Estimator::Tree);
    let (_rvs, reference) = tiny_policy(tok.vocab_size());
    // Three steps straight.
    let (vs_a, lm_a) = tiny_policy(tok.vocab_size());
    let mut opt_a = AdamW::new(&vs_a, AdamWConfig::default());
    for step in 0..3 {
        train_step(&lm_a, &reference, &mut opt_a, &tok, std::slice::from_ref(&env), &tasks, &cfg, step).unwrap();
    }
    // One step, a checkpoint, a fresh process state, then two more.
    let dir = tempfile::tempdir().unwrap();
    let run = RunDir::new(dir.path());
    {
        let (vs_b, lm_b) = tiny_policy(tok.vocab_size());
        let mut opt_b = AdamW::new(&vs_b, AdamWConfig::default());
        train_step(&lm_b, &reference, &mut opt_b, &tok, std::slice::from_ref(&env), &tasks, &cfg, 0).unwrap();
        let state = TrainState { next_step: 1, seed: cfg.seed };
        checkpoint::save(&run, &vs_b, &tiny_config_json(tok.vocab_size()), &[], &opt_b, &state).unwrap();
    }
    let (vs_c, lm_c) = tiny_policy(tok.vocab_size());
    let mut opt_c = AdamW::new(&vs_c, AdamWConfig::default());
    let ckpt = run.latest_checkpoint().unwrap();
    assert!(ckpt.ends_with("checkpoint-1"));
    let state = checkpoint::load(&ckpt, &vs_c, &mut opt_c).unwrap();
    for step in state.next_step..3 {
        train_step(&lm_c, &reference, &mut opt_c, &tok, std::slice::from_ref(&env), &tasks, &cfg, step).unwrap();
    }
    let (a, c) = (params(&vs_a), params(&vs_c));
    let diff = a.iter().zip(&c).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(a == c, "resumed run differs from the uninterrupted one by up to {diff}");
    // The checkpoint is a loadable HF folder.
    let (_v, _m) = load_model(&ckpt, tch::Device::Cpu, tch::Kind::Float).unwrap();
}

/// The answering policy's rollouts on the world's training questions, as step settings.
fn answering_config(method: Method, temperature: f64) -> StepConfig {
    let p = answering_policy();
    let prompt = std::fs::read_to_string(p.world.prompt()).unwrap();
    let mut cfg = step_config(method, method.default_estimator());
    cfg.prompts_per_step = 6;
    cfg.agent = AgentConfig {
        max_turns: 4,
        max_obs_tokens: 200,
        max_response_tokens: 1024,
        sampling: SamplingParams { max_new_tokens: 48, temperature, top_p: 1.0, ..SamplingParams::default() },
        prompt_template: Some(prompt),
        max_context: 2048,
        topk: Some(1),
        schedule: Default::default(),
        max_rows: 0,
    };
    cfg.update.temperature = temperature;
    cfg
}

fn answering_tasks() -> Vec<grove_protocol::TaskSpec> {
    let p = answering_policy();
    grove_trainer::support::data::load_tasks(&p.world.train(), "synthetic").unwrap()
}

#[test]
fn rewards_recomputed_from_the_trained_tokens_agree_with_the_server() {
    let p = answering_policy();
    let srv = WorldServer::start(&p.spec.world());
    let env = EnvClient::connect(&srv.url, Default::default()).unwrap();
    let (vs, lm) = load_model(&p.policy, tch::Device::Cpu, tch::Kind::Float).unwrap();
    let (_r, reference) = load_model(&p.policy, tch::Device::Cpu, tch::Kind::Float).unwrap();
    let tok = Tokenizer::from_dir(&p.policy).unwrap();
    let mut opt = AdamW::new(&vs, AdamWConfig::default());
    let cfg = answering_config(Method::chain(4), 1.0);
    let tasks = answering_tasks();
    let mut rewards = Vec::new();
    for step in 0..2 {
        let r = train_step(&lm, &reference, &mut opt, &tok, std::slice::from_ref(&env), &tasks, &cfg, step).unwrap();
        assert_eq!(r.metrics.reward_check_mismatches, 0, "{:?}", r.metrics);
        rewards.extend(r.rows.iter().map(|row| row.reward));
    }
    // The comparison had something to compare: answers, right and wrong.
    assert!(rewards.iter().any(|r| *r >= 0.2), "{rewards:?}");
    assert!(rewards.iter().any(|r| *r < 1.0), "{rewards:?}");

    // A server reward that disagrees with the tokens is caught.
    use grove_trainer::engine::generate::Engine;
    use grove_trainer::rl::rollout::agent::Rollout;
    use rand::SeedableRng;
    let mut engine = Engine::new(&lm);
    let mut r = Rollout { engine: &mut engine, tok: &tok, env: &env, config: &cfg.agent, cost: Default::default() };
    let mut rollout =
        r.run(&tasks[0], Method::chain(4).shape(), &mut rand_chacha::ChaCha8Rng::seed_from_u64(1)).unwrap();
    assert_eq!(grove_trainer::rl::train::step::reward_mismatches(&tok, &tasks[0], &rollout).unwrap(), 0);
    let leaf = rollout.trees[0].leaves()[0];
    let mut steps: Vec<_> = rollout.trees[0].path(leaf).into_iter().cloned().collect();
    let last = steps.last_mut().unwrap();
    let outcome = last.outcome.as_mut().unwrap();
    outcome.score += 0.5;
    let mut tampered = grove_trainer::rl::rollout::tree::Tree::new();
    let n = steps.len();
    tampered.add_chain(0, steps.into_iter().enumerate().map(|(i, s)| (s, i + 1 == n)).collect()).unwrap();
    rollout.trees[0] = tampered;
    assert_eq!(grove_trainer::rl::train::step::reward_mismatches(&tok, &tasks[0], &rollout).unwrap(), 1);
    rollout.release(&mut engine);
    env.close(&rollout.episodes).unwrap();
}

/// Old, new and reference log-probs are those of the sampling distribution: at T = 0.7 the
/// update's starting policy gives every sampled token the probability it was drawn with. Scored
/// at T = 1 instead (what the trainer did before), the ratios are far from 1.
#[test]
fn log_probs_are_on_policy_at_the_sampling_temperature() {
    let p = answering_policy();
    let srv = WorldServer::start(&p.spec.world());
    let env = EnvClient::connect(&srv.url, Default::default()).unwrap();
    let tok = Tokenizer::from_dir(&p.policy).unwrap();
    let tasks = answering_tasks();
    let run = |update_temperature: f64| {
        let (vs, lm) = load_model(&p.policy, tch::Device::Cpu, tch::Kind::Float).unwrap();
        let (_r, reference) = load_model(&p.policy, tch::Device::Cpu, tch::Kind::Float).unwrap();
        let mut opt = AdamW::new(&vs, AdamWConfig::default());
        let mut cfg = answering_config(Method::tree(2, 2, 1, 3), 0.7);
        cfg.update.temperature = update_temperature;
        let r = train_step(&lm, &reference, &mut opt, &tok, std::slice::from_ref(&env), &tasks, &cfg, 0).unwrap();
        assert!(r.metrics.trained_tokens > 100, "{:?}", r.metrics);
        r.metrics.first_ratio_max_dev
    };
    let on_policy = run(0.7);
    assert!(on_policy < 1e-3, "first PPO ratio off 1 by {on_policy}");
    let scored_at_one = run(1.0);
    assert!(scored_at_one > 0.05, "scoring at T = 1 should be off-policy: {scored_at_one}");
}

/// Failures stay local. Server A refuses episodes past 3 per connection (so every Create of a
/// step's 4 trees); server B takes the trees but has no room for their forks and refuses every
/// search query (at most 1 character); server C's retriever answers HTTP 500 to every call. The
/// steps complete; refused trajectories are masked out of the loss and counted by request and
/// error code; failed tool calls are trained on (the model saw the server's error text) and
/// counted by code.
#[test]
fn refused_episodes_and_failing_tools_stay_local() {
    use grove_env_server::config::{RemoteConfig, ServerConfig};
    use grove_env_server::search::RemoteRetriever;
    use grove_env_server::testkit::{Canned, ScriptedServer};
    let p = answering_policy();
    let world = p.spec.world();
    let mut no_room = ServerConfig::default();
    no_room.limits.max_episodes_per_connection = 3;
    let a = WorldServer::start_with(&world, no_room, None);
    let mut strict = ServerConfig::default();
    strict.limits.max_episodes_per_connection = 5;
    strict.limits.max_query_chars = 1;
    let b = WorldServer::start_with(&world, strict, None);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let failing = rt.block_on(ScriptedServer::start(|_| Canned::status(500, "retriever overloaded"))).unwrap();
    let remote = RemoteRetriever::new(
        format!("{}/retrieve", failing.url()),
        RemoteConfig { retries: 0, deadline_ms: 5_000, ..RemoteConfig::default() },
    )
    .unwrap();
    let c = WorldServer::start_with(&world, ServerConfig::default(), Some(Arc::new(remote)));
    let envs: Vec<EnvClient> =
        [&a, &b, &c].iter().map(|s| EnvClient::connect(&s.url, Default::default()).unwrap()).collect();
    let (vs, lm) = load_model(&p.policy, tch::Device::Cpu, tch::Kind::Float).unwrap();
    let (_r, reference) = load_model(&p.policy, tch::Device::Cpu, tch::Kind::Float).unwrap();
    let tok = Tokenizer::from_dir(&p.policy).unwrap();
    let mut opt = AdamW::new(&vs, AdamWConfig::default());
    let mut cfg = answering_config(Method::tree(2, 2, 1, 3), 1.0);
    cfg.prompts_per_step = 6;
    let tasks = answering_tasks();
    let mut seen = std::collections::BTreeMap::<String, u64>::new();
    let mut tool_errors = 0;
    for step in 0..2 {
        let r = train_step(&lm, &reference, &mut opt, &tok, &envs, &tasks, &cfg, step).unwrap();
        let m = &r.metrics;
        assert_eq!(m.rows, 6 * 6);
        assert_eq!(m.masked_rows, m.failures.values().sum::<u64>());
        assert!(m.masked_rows < m.rows as u64 && m.trained_tokens > 0, "{m:?}");
        // Masked rows carry no advantage; the others are normalised without them.
        for (row, adv) in r.rows.iter().zip(&r.advantages) {
            if row.failure.is_some() {
                assert_eq!(*adv, 0.0);
            }
        }
        // Server C's rows (prompts 2 and 5) were trained on, error observations and all.
        assert!(r.rows.iter().filter(|row| row.prompt_group % 3 == 2).all(|row| row.trains()));
        for (k, v) in &m.failures {
            *seen.entry(k.clone()).or_default() += v;
        }
        tool_errors += m.tool_errors.get("backend_error").copied().unwrap_or(0);
        assert_eq!(m.tool_errors.keys().filter(|k| *k != "backend_error").count(), 0, "{m:?}");
    }
    for kind in ["create:too_many_episodes", "fork:too_many_episodes", "step:action_too_long"] {
        assert!(seen.get(kind).copied().unwrap_or(0) > 0, "no {kind}: {seen:?}");
    }
    assert!(tool_errors > 0 && failing.count() > 0, "the failing retriever was called");
    // Nothing is left open on any server.
    for env in &envs {
        assert_eq!(env.block_on(env.client().stats()).unwrap().episodes_live, 0);
    }
}

/// While the trainer is busy (an update, an evaluation, a checkpoint), its env connections stay
/// open: the client pings a server that closes connections silent for 1 second, so a 2.5-second
/// pause between steps loses nothing. A protocol client without the keep-alive (and without
/// reattach), connected to the same server at the same time, is closed as idle.
#[test]
fn a_long_pause_keeps_the_env_connection_alive() {
    use grove_env_server::config::ServerConfig;
    let tok = tokenizer();
    let world = World::generate(&WorldConfig::default());
    let mut cfg = ServerConfig::default();
    cfg.limits.connection_idle_secs = 1;
    let srv = WorldServer::start_with(&world, cfg, None);
    let env = EnvClient::connect(&srv.url, Default::default()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Without the keep-alive and without reattach (which would open a new connection after the
    // idle close).
    let no_reattach = grove_protocol::client::ClientOptions {
        reconnect: grove_protocol::client::Reconnect { tries: 0, ..Default::default() },
        ..Default::default()
    };
    let bare = rt.block_on(grove_protocol::client::Client::connect(&srv.url, no_reattach)).unwrap();
    assert_eq!(env.client().welcome().limits.connection_idle_ms, 1000, "the server announces its idle limit");
    let tasks = tasks(&world);
    let (vs, lm) = tiny_policy(tok.vocab_size());
    let (_rvs, reference) = tiny_policy(tok.vocab_size());
    let mut opt = AdamW::new(&vs, AdamWConfig::default());
    let cfg = step_config(Method::tree(2, 1, 1, 2), Estimator::Tree);
    train_step(&lm, &reference, &mut opt, &tok, std::slice::from_ref(&env), &tasks, &cfg, 0).unwrap();
    // The tensor thread is busy for 2.5 s.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let second = train_step(&lm, &reference, &mut opt, &tok, std::slice::from_ref(&env), &tasks, &cfg, 1);
    assert!(second.is_ok(), "{:?}", second.err());
    assert!(env.requests().ping >= 3, "{:?}", env.requests());
    let idle = rt.block_on(bare.stats());
    assert!(idle.is_err(), "the bare client should have been closed as idle: {idle:?}");
}
