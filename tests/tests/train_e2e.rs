//! Training end to end on CPU: an in-process env-server over the synthetic world and a tiny,
//! randomly initialised Qwen2 policy; two Tree-GRPO steps and two chain-GRPO steps change the
//! parameters and write the metrics; a run stopped after one step and resumed from its
//! checkpoint ends with exactly the parameters of an uninterrupted run.

use grove_datasets::assets;
use grove_datasets::synthetic::{World, WorldConfig};
use grove_tests::{WorldServer, tiny_config_json, tiny_policy};
use grove_trainer::algo::advantage::Estimator;
use grove_trainer::algo::schedule::WarmupConstant;
use grove_trainer::algo::update::UpdateConfig;
use grove_trainer::generate::SamplingParams;
use grove_trainer::optim::{AdamW, AdamWConfig};
use grove_trainer::rollout::agent::{AgentConfig, EnvClient, TreeShape};
use grove_trainer::scripted::task_of;
use grove_trainer::tokenizer::Tokenizer;
use grove_trainer::train::{
    StepConfig, StepMetrics, TrainState, append_metrics, latest_checkpoint, load_checkpoint, save_checkpoint,
    train_step,
};

fn params(vs: &tch::nn::VarStore) -> Vec<f32> {
    let mut v: Vec<_> = vs.variables().into_iter().collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v.iter().flat_map(|(_, t)| Vec::<f32>::try_from(t.flatten(0, -1)).unwrap()).collect()
}

fn tasks(world: &World) -> Vec<grove_protocol::TaskSpec> {
    world.questions(2, 6, 1).iter().map(task_of).collect()
}

fn step_config(shape: TreeShape, estimator: Estimator) -> StepConfig {
    StepConfig {
        prompts_per_step: 2,
        rollout_batch_prompts: 0,
        shape,
        estimator,
        agent: AgentConfig {
            max_turns: 2,
            max_obs_tokens: 32,
            max_response_tokens: 512,
            sampling: SamplingParams { max_new_tokens: 6, top_k: 64, ..SamplingParams::default() },
            prompt_template: None,
            max_context: 4096,
            topk: None,
        },
        update: UpdateConfig { mini_batches: 1, micro_batch: 4, ..Default::default() },
        schedule: WarmupConstant { lr: 1e-3, warmup_steps: 0 },
        seed: 11,
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
    let initial = params(&vs);
    let tree = step_config(TreeShape { m: 2, n: 2, l: 1, k: 3 }, Estimator::Tree);
    let chain = step_config(TreeShape::chain(4), Estimator::Grpo);
    let mut all = Vec::new();
    for (step, cfg) in [(0u64, &tree), (1, &tree), (2, &chain), (3, &chain)] {
        let m = train_step(&lm, &reference, &mut opt, &tok, &envs, &tasks, cfg, step).unwrap();
        append_metrics(out.path(), &m).unwrap();
        all.push(m);
    }
    // Tree steps: 2 prompts x M * k = 12 rows, 2 x M * N * L = 8 forks; chain steps: 2 x 4 rows.
    assert_eq!((all[0].rows, all[0].forks), (12, 8));
    assert_eq!((all[2].rows, all[2].forks), (8, 0));
    assert!(all.iter().all(|m| m.generated_tokens > 0 && m.trained_tokens > 0 && m.grad_norm > 0.0));
    assert!(all.iter().all(|m| m.reward_check_mismatches == 0), "local reward recomputation agrees with the server");
    assert_ne!(params(&vs), initial, "the parameters changed");
    // The metrics file has one line per step with the expected fields.
    let text = std::fs::read_to_string(out.path().join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 4);
    for field in [
        "step",
        "lr",
        "reward_mean",
        "metric_mean",
        "kl",
        "entropy",
        "clip_fraction",
        "grad_norm",
        "generated_tokens",
        "prefill_tokens",
        "tool_calls",
        "rollout_seconds",
        "update_seconds",
    ] {
        assert!(lines.iter().all(|l| l.get(field).is_some()), "missing {field}");
    }
    let back: StepMetrics = serde_json::from_value(lines[3].clone()).unwrap();
    assert_eq!(back.step, 3);
    // Each server got one prompt per step (4 forks per tree step each), and every episode of
    // the finished steps was closed.
    for env in &envs {
        let stats = env.block_on(env.client().stats()).unwrap();
        assert_eq!(stats.forks, 8);
        assert_eq!(stats.episodes_live, 0);
    }
}

#[test]
fn resume_from_a_checkpoint_is_exact() {
    let tok = tokenizer();
    let world = World::generate(&WorldConfig::default());
    let srv = WorldServer::start(&world);
    let env = EnvClient::connect(&srv.url, Default::default()).unwrap();
    let tasks = tasks(&world);
    let cfg = step_config(TreeShape { m: 2, n: 1, l: 1, k: 2 }, Estimator::Tree);
    let (_rvs, reference) = tiny_policy(tok.vocab_size());
    // Three steps straight.
    let (vs_a, lm_a) = tiny_policy(tok.vocab_size());
    let mut opt_a = AdamW::new(&vs_a, AdamWConfig::default());
    for step in 0..3 {
        train_step(&lm_a, &reference, &mut opt_a, &tok, std::slice::from_ref(&env), &tasks, &cfg, step).unwrap();
    }
    // One step, a checkpoint, a fresh process state, then two more.
    let dir = tempfile::tempdir().unwrap();
    {
        let (vs_b, lm_b) = tiny_policy(tok.vocab_size());
        let mut opt_b = AdamW::new(&vs_b, AdamWConfig::default());
        train_step(&lm_b, &reference, &mut opt_b, &tok, std::slice::from_ref(&env), &tasks, &cfg, 0).unwrap();
        let state = TrainState { next_step: 1, seed: cfg.seed };
        save_checkpoint(dir.path(), &vs_b, &tiny_config_json(tok.vocab_size()), &[], &opt_b, &state).unwrap();
    }
    let (vs_c, lm_c) = tiny_policy(tok.vocab_size());
    let mut opt_c = AdamW::new(&vs_c, AdamWConfig::default());
    let ckpt = latest_checkpoint(dir.path()).unwrap();
    assert!(ckpt.ends_with("checkpoint-1"));
    let state = load_checkpoint(&ckpt, &vs_c, &mut opt_c).unwrap();
    for step in state.next_step..3 {
        train_step(&lm_c, &reference, &mut opt_c, &tok, std::slice::from_ref(&env), &tasks, &cfg, step).unwrap();
    }
    let (a, c) = (params(&vs_a), params(&vs_c));
    let diff = a.iter().zip(&c).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(a == c, "resumed run differs from the uninterrupted one by up to {diff}");
    // The checkpoint is a loadable HF folder.
    let (_v, _m) = grove_trainer::model::load_model(&ckpt, tch::Device::Cpu, tch::Kind::Float).unwrap();
}
