//! The chain-vs-tree experiment end to end at toy size: a world written to disk, an env-server
//! serving it, a from-scratch tokenizer and model, every arm and seed trained and evaluated, and
//! the table, results and plots written.

use grove_tests::WorldServer;
use grove_trainer::experiment::{Arm, ExperimentConfig, format_table, outputs, run_experiment, table_rows};
use grove_trainer::scratch::{SmallModel, init_model, train_bpe};
use grove_trainer::train::{EnvUrls, TrainConfig};
use grove_trainer::world::{WorldFiles, WorldSpec};

#[test]
fn chain_and_tree_arms_train_evaluate_and_tabulate() {
    let dir = tempfile::tempdir().unwrap();
    let spec = WorldSpec { seed: 3, scale: 1, train_per_hops: 4, test_per_hops: 2 };
    let files: WorldFiles = spec.write(&dir.path().join("world")).unwrap();
    assert_eq!(WorldSpec::read(&files.dir).unwrap(), spec);
    let world = spec.world();
    let srv = WorldServer::start(&world);

    let model = dir.path().join("model");
    let texts: Vec<String> = world.passages.iter().map(|p| p.text.clone()).collect();
    let vocab = train_bpe(&texts, 400, &model).unwrap();
    let shape = SmallModel { hidden: 32, layers: 1, heads: 2, kv_heads: 1, intermediate: 64 };
    init_model(&model, vocab, shape, 0).unwrap();

    let out = dir.path().join("exp");
    let cfg = ExperimentConfig {
        train: TrainConfig {
            model,
            env: EnvUrls(vec![srv.url.clone()]),
            train_data: files.train(),
            eval_data: Some(files.test()),
            prompt_template: Some(files.prompt()),
            data_source: "synthetic".into(),
            out_dir: out.clone(),
            steps: 1,
            prompts_per_step: 2,
            lr: 1e-3,
            max_turns: 2,
            max_new_tokens: 6,
            max_obs_tokens: 32,
            micro_batch: 8,
            mini_batches: 1,
            eval_every: 1,
            eval_sampled: false,
            save_every: 0,
            device: "cpu".into(),
            ..TrainConfig::default()
        },
        seeds: vec![0, 1],
        arms: vec![Arm::chain(2), Arm::tree(1, 2, 1, 3)],
    };
    let results = run_experiment(&cfg, false).unwrap();
    assert_eq!(results.runs.len(), 4, "2 arms x 2 seeds");
    // The start point saw every held-out question, per hop count.
    assert_eq!(results.start.greedy["all"].questions, 4);
    assert_eq!(results.start.greedy["synthetic_2hop"].questions, 2);

    let rows = table_rows(&results);
    assert_eq!(rows.len(), 2);
    assert_eq!((rows[0].budget, rows[1].budget), (2.0, 2.0), "equal budget (spec 2.6)");
    assert_eq!(rows[0].trajectories_per_prompt, 2.0);
    assert_eq!(rows[1].trajectories_per_prompt, 3.0, "a (1,2,1) tree keeps 1 + N L = 3 leaves");
    assert!(rows.iter().all(|r| r.seeds == 2 && r.generated_tokens_per_step > 0.0));

    let table = format_table(&results);
    assert!(table.contains("| start (before RL) |") && table.contains("| chain n=2 | 2 |"), "{table}");
    assert!(table.contains("| tree (1,2,1) | 2 |") && table.contains("synthetic_3hop EM"), "{table}");
    for path in outputs(&out) {
        assert!(path.exists(), "{}", path.display());
    }
    assert!(out.join("tree-1-2-1/seed-1/metrics.jsonl").exists());
    let svg = std::fs::read_to_string(out.join("em_vs_step.svg")).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 2, "one line per arm");
    // Every episode the runs opened was closed.
    let env = grove_trainer::rollout::agent::EnvClient::connect(&srv.url, Default::default()).unwrap();
    assert_eq!(env.block_on(env.client().stats()).unwrap().episodes_live, 0);
}

#[test]
fn arm_budgets_follow_the_spec() {
    assert_eq!(Arm::tree(1, 2, 1, 3).budget(), 2.0);
    assert_eq!(Arm::tree(2, 2, 1, 3).budget(), 4.0);
    assert_eq!(Arm::tree(4, 2, 1, 3).budget(), 8.0);
    assert_eq!(Arm::tree(2, 6, 1, 7).budget(), 8.0);
    assert_eq!(Arm::tree(8, 2, 1, 3).budget(), 16.0);
    assert_eq!(Arm::chain(4).budget(), 4.0);
    let default = ExperimentConfig::default();
    assert_eq!(default.seeds.len(), 3);
    let labels: Vec<&str> = default.arms.iter().map(|a| a.label.as_str()).collect();
    assert_eq!(labels, ["chain n=2", "tree (1,2,1)", "chain n=4", "tree (2,2,1)"]);
}
