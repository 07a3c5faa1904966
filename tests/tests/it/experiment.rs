//! The chain-vs-tree experiment end to end at toy size: a world written to disk, an env-server
//! serving it, a from-scratch tokenizer and model, every arm and seed trained and evaluated, and
//! the table, results and plots written.

use grove_tests::WorldServer;
use grove_trainer::engine::scratch::{SmallModel, init_model, train_bpe};
use grove_trainer::measure::experiment::{
    Arm, ExperimentConfig, LrSweep, Regime, comparisons, format_table, outputs, run_experiment, table_rows,
};
use grove_trainer::rl::method::Method;
use grove_trainer::rl::train::{EnvUrls, TrainConfig};
use grove_trainer::support::world::{WorldFiles, WorldSpec};

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
            model: model.clone(),
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
            device: grove_trainer::engine::device::DeviceRequest::Cpu,
            ..TrainConfig::default()
        },
        seeds: vec![0, 1],
        arms: vec![Arm::new(Method::chain(2)), Arm::new(Method::tree(1, 2, 1, 3))],
        regimes: vec![Regime { name: "start".into(), model, note: "random init".into() }],
        lr_sweep: Some(LrSweep { lrs: vec![1e-4, 1e-3], seeds: vec![7], budget: None, judge_last: 1.0 }),
        record: Some(dir.path().join("record")),
        analysis: Some(grove_trainer::measure::experiment::analysis::Analysis {
            last_evals: 1,
            no_effect_margin: 0.03,
        }),
        report_only: false,
    };
    let results = run_experiment(&cfg, false).unwrap();
    let regime = &results.regimes[0];
    assert_eq!(regime.runs.len(), 4, "2 arms x 2 seeds");
    // The start point saw every held-out question, per hop count.
    assert_eq!(regime.start.greedy["all"].questions, 4);
    assert_eq!(regime.start.greedy["synthetic_2hop"].questions, 2);
    // The sweep trained both arms (budget 2) at each rate with its own seed, never evaluated on
    // held-out questions, and the arms used the rate with the best training reward.
    let sweep = regime.sweep.as_ref().unwrap();
    assert_eq!(sweep.runs.len(), 4, "2 rates x 2 arms x 1 seed");
    assert!(sweep.runs.iter().all(|(_, r)| r.seed == 7 && r.summary.evals.is_empty()));
    let best = sweep.reward.iter().cloned().fold((0.0, f64::NEG_INFINITY), |b, x| if x.1 > b.1 { x } else { b });
    assert_eq!((regime.lr, sweep.chosen), (best.0, best.0));
    let sweep_run = out.join(format!("start/sweep/lr-{:e}/chain-n-2/seed-7", 1e-3));
    assert!(!sweep_run.join("eval-1.json").exists() && sweep_run.join("metrics.jsonl").exists());
    let chosen = std::fs::read_to_string(out.join("start/chain-n-2/seed-0/config.toml")).unwrap();
    assert!(chosen.contains(&format!("lr = {}", regime.lr)), "{chosen}");

    // Seeds are paired: the tree - chain difference is over the same seeds.
    let cmp = comparisons(&cfg, regime);
    assert_eq!(cmp.len(), 1);
    let all = cmp[0].diff["all"];
    assert_eq!(all.n, 2);
    let em = |arm: &str, seed: u64| {
        regime.runs.iter().find(|r| r.arm == arm && r.seed == seed).unwrap().summary.evals.last().unwrap().greedy["all"]
            .score
    };
    let expect = ((em("tree (1,2,1)", 0) - em("chain n=2", 0)) + (em("tree (1,2,1)", 1) - em("chain n=2", 1))) / 2.0;
    assert!((all.mean - expect).abs() < 1e-12 && all.lo <= all.mean && all.mean <= all.hi);

    let rows = table_rows(&cfg, regime);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].trajectories_per_prompt, 2.0);
    assert_eq!(rows[1].trajectories_per_prompt, 3.0, "a (1,2,1) tree keeps 1 + N L = 3 leaves");
    // The cost columns are what the runs measured, not the budget formula: the mean over steps
    // and seeds of each step's generated tokens and tool calls, per prompt.
    for (row, arm) in rows.iter().zip(["chain n=2", "tree (1,2,1)"]) {
        let steps: Vec<_> =
            regime.runs.iter().filter(|r| r.arm == arm).flat_map(|r| r.summary.metrics.iter()).collect();
        assert_eq!(steps.len(), 2, "1 step x 2 seeds");
        let mean = |f: &dyn Fn(&grove_trainer::rl::train::StepMetrics) -> u64| {
            steps.iter().map(|m| f(m) as f64).sum::<f64>() / steps.len() as f64 / 2.0
        };
        assert_eq!(row.generated_tokens_per_prompt, mean(&|m| m.generated_tokens));
        assert_eq!(row.tool_calls_per_prompt, mean(&|m| m.tool_calls));
        assert!(row.seeds == 2 && row.generated_tokens_per_prompt > 0.0);
    }
    // Measured, the tree's 3 trajectories cost about the chain's 2 (the paper's "budget 2"): a
    // branch regenerates only the steps after its node.
    let ratio = rows[1].generated_tokens_per_prompt / rows[0].generated_tokens_per_prompt;
    assert!((0.8..1.6).contains(&ratio), "tree / chain generated tokens {ratio}");
    // Each arm trained with its method's estimator.
    let config_of =
        |arm: &str| std::fs::read_to_string(out.join("start").join(arm).join("seed-0/config.toml")).unwrap();
    assert!(config_of("chain-n-2").contains("kind = \"chain\""));

    let table = format_table(&results);
    assert!(table.contains("### Pre-registered analysis") && table.contains("2 complete pairs"), "{table}");
    assert!(table.contains("Floor (no-search answer-kind guess)"), "the world's floor beside the EMs: {table}");
    assert!(table.contains("| start (before RL) |") && table.contains("| chain n=2 | 2 |"), "{table}");
    assert!(table.contains("| tree (1,2,1) | 2 |") && table.contains("synthetic_3hop EM"), "{table}");
    assert!(table.contains("| ≈2 | tree (1,2,1) | chain n=2 | 2 |"), "{table}");
    for path in outputs(&cfg) {
        assert!(path.exists(), "{}", path.display());
    }
    assert!(out.join("start/tree-1-2-1/seed-1/metrics.jsonl").exists());
    let svg = std::fs::read_to_string(out.join("start-em_vs_step.svg")).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 2, "one line per arm");

    // Run again: every finished run is reused (nothing retrains), and the results are the same.
    let stamp = |p: &std::path::Path| std::fs::metadata(p).unwrap().modified().unwrap();
    let metrics = out.join("start/tree-1-2-1/seed-1/metrics.jsonl");
    let before = stamp(&metrics);
    let again = run_experiment(&cfg, false).unwrap();
    assert_eq!(again.regimes, results.regimes);
    assert_eq!(stamp(&metrics), before, "a finished run is reused");
    // Another machine: an empty output folder and the committed record. Every run and the
    // start's evaluation come back from the record; nothing is trained or evaluated again
    // (a trained run would also write its rollout trees).
    let kept = dir.path().join("record").join("start/tree-1-2-1/seed-1");
    assert!(kept.join("metrics.jsonl").exists() && !kept.join("trees-0.jsonl.gz").exists());
    std::fs::rename(&out, dir.path().join("exp-first-machine")).unwrap();
    let restored = run_experiment(&cfg, false).unwrap();
    assert_eq!(restored.regimes, results.regimes);
    assert!(metrics.exists() && !out.join("start/tree-1-2-1/seed-1/trees-0.jsonl.gz").exists());
    assert!(out.join(format!("start/sweep/lr-{:e}/chain-n-2/seed-7/metrics.jsonl", 1e-3)).exists());
    // An unfinished run is started again; a finished run of other settings is refused.
    std::fs::remove_file(out.join("start/chain-n-2/seed-1/eval-1.json")).unwrap();
    let again = run_experiment(&cfg, false).unwrap();
    assert!(out.join("start/chain-n-2/seed-1/eval-1.json").exists());
    assert_eq!(again.regimes[0].runs.len(), 4);
    // Report only: a seed with no finished runs is left out (complete pairs only) and nothing
    // trains, whatever the seeds listed.
    let mut report = cfg.clone();
    report.seeds = vec![0, 1, 2];
    report.report_only = true;
    let reported = run_experiment(&report, false).unwrap();
    assert_eq!(reported.regimes[0].runs.len(), 4, "seed 2 has no run and none is trained");
    assert!(!out.join("start/chain-n-2/seed-2").exists());
    let a = grove_trainer::measure::experiment::analysis::analyse(
        &report,
        &reported.regimes[0],
        report.analysis.as_ref().unwrap(),
    );
    assert_eq!(a[0].pairs.len(), 2);
    let mut other = cfg;
    other.train.kl_coef = 0.5;
    let e = format!("{:#}", run_experiment(&other, false).unwrap_err());
    assert!(e.contains("other settings"), "{e}");
    // Every episode the runs opened was closed.
    let env = grove_trainer::rl::env::EnvClient::connect(&srv.url, Default::default()).unwrap();
    assert_eq!(env.block_on(env.client().stats()).unwrap().episodes_live, 0);
}

/// The experiment file: arms name a method (and, for ablations, an estimator); the default grid
/// is chain n=2 / tree (1,2,1) and chain n=4 / tree (2,2,1); an arm that is not a method of the
/// paper is refused before anything runs.
#[test]
fn experiment_files_name_methods_and_bad_arms_fail_early() {
    let text = r#"
seeds = [0, 1]
[train]
steps = 3
[[arms]]
method = { kind = "chain", n = 4 }
[[arms]]
method = { kind = "tree", m = 2, n = 2, l = 1, k = 3 }
estimator = "tree_inter"
"#;
    let cfg: ExperimentConfig = toml::from_str(text).unwrap();
    let labels: Vec<String> = cfg.arms.iter().map(Arm::label).collect();
    assert_eq!(labels, ["chain n=4", "tree (2,2,1) [tree_inter]"]);
    let default = ExperimentConfig::default();
    let labels: Vec<String> = default.arms.iter().map(Arm::label).collect();
    assert_eq!(labels, ["chain n=2", "tree (1,2,1)", "chain n=4", "tree (2,2,1)"]);
    assert_eq!(default.seeds.len(), 5);
    let e = toml::from_str::<ExperimentConfig>("[[arms]]\nmethod = { kind = \"chain\", chain_n = 4 }\n").unwrap_err();
    assert!(e.to_string().contains("unknown field `chain_n`"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let bad = ExperimentConfig {
        train: TrainConfig { out_dir: dir.path().join("exp"), ..TrainConfig::default() },
        seeds: vec![0],
        arms: vec![Arm {
            label: None,
            method: Method::chain(4),
            estimator: Some(grove_trainer::rl::algo::advantage::Estimator::Tree),
        }],
        ..ExperimentConfig::default()
    };
    let e = format!("{:#}", run_experiment(&bad, false).unwrap_err());
    assert!(e.contains("needs tree rollouts"), "{e}");
    assert!(!dir.path().join("exp").exists(), "nothing ran");
    // A sweep seed that is also a reported seed would choose on the runs it reports.
    let overlap = ExperimentConfig {
        train: TrainConfig {
            out_dir: dir.path().join("exp"),
            eval_data: Some("test.jsonl".into()),
            ..TrainConfig::default()
        },
        seeds: vec![0, 1],
        lr_sweep: Some(LrSweep { lrs: vec![1e-4], seeds: vec![1], budget: None, judge_last: 0.5 }),
        ..ExperimentConfig::default()
    };
    let e = format!("{:#}", run_experiment(&overlap, false).unwrap_err());
    assert!(e.contains("seed 1 is both a sweep seed and an experiment seed"), "{e}");
    let e = toml::from_str::<ExperimentConfig>("[lr_sweep]\nlrs = [1e-4]\njudge = 0.5\n").unwrap_err();
    assert!(e.to_string().contains("unknown field `judge`"), "{e}");
    assert!(!dir.path().join("exp").exists(), "nothing ran");
}
