//! `trainer view` on a real run: a short Tree-GRPO training run (2 steps of tree (2,2,1) with
//! the warm-started policy that searches and answers, against an in-process env-server over the
//! synthetic world) writes its run folder through `train::run`, trees, metrics and evaluations
//! included; grove-view serves that folder and headless Chromium checks the page against it
//! (`grove_view::browser_check::check_page`, the check grove-view's own browser test runs on a
//! folder written by hand). The screenshots go to `target/tmp/grove-view/`.

use std::path::PathBuf;

use grove_rundir::RunDir;
use grove_tests::{WorldServer, answering_policy};
use grove_trainer::engine::device::DeviceRequest;
use grove_trainer::rl::method::Method;
use grove_trainer::rl::train::{EnvUrls, RunOptions, TrainConfig, run};
use grove_view::browser_check::{check_page, chromium};

#[test]
fn the_tree_view_shows_the_trees_a_real_training_run_recorded() {
    // Before the training: without a browser there is nothing to check.
    let chromium = chromium();
    let p = answering_policy();
    let srv = WorldServer::start(&p.spec.world());
    let dir = tempfile::tempdir().unwrap();
    let cfg = TrainConfig {
        model: p.policy.clone(),
        env: EnvUrls(vec![srv.url]),
        train_data: p.world.train(),
        eval_data: Some(p.world.test()),
        prompt_template: Some(p.world.prompt()),
        data_source: "synthetic".into(),
        out_dir: dir.path().join("run"),
        steps: 2,
        prompts_per_step: 4,
        rollout_batch_prompts: 0,
        method: Method::tree(2, 2, 1, 3),
        lr: 1e-4,
        max_turns: 4,
        max_obs_tokens: 200,
        max_new_tokens: 48,
        max_response_tokens: 1024,
        max_context: 2048,
        top_p: 1.0,
        topk: Some(1),
        micro_batch: 8,
        mini_batches: 1,
        eval_every: 1,
        eval_before: true,
        eval_sampled: false,
        eval_max_questions: Some(4),
        save_every: 0,
        trees_every: 1,
        tree_prompts: 4,
        seed: 5,
        device: DeviceRequest::Cpu,
        ..TrainConfig::default()
    };
    let summary = run(&cfg, &RunOptions::default()).unwrap();
    assert_eq!(summary.metrics.len(), 2);

    // The run folder holds what the page shows: each step's trees, the metrics, evaluations.
    let folder = RunDir::new(&cfg.out_dir);
    assert_eq!(folder.tree_steps().unwrap(), [0, 1]);
    for step in [0, 1] {
        let prompts = folder.trees(step).unwrap();
        assert_eq!(prompts.len(), 4, "step {step}: tree_prompts prompts keep their trees");
        for prompt in &prompts {
            assert_eq!((prompt.step, prompt.method.as_str(), prompt.trees.len()), (step, "tree (2,2,1)", 2));
            assert!(prompt.prompt_text.contains(&prompt.question), "{prompt:?}");
        }
        let nodes = || prompts.iter().flat_map(|p| &p.trees).flat_map(|t| &t.nodes);
        assert!(nodes().any(|n| n.children.len() > 1), "step {step}: the forks made branch points");
        assert!(nodes().any(|n| n.leaf.as_ref().is_some_and(|l| l.kept && l.advantage.is_some())));
        assert!(nodes().any(|n| n.parent.is_some() && !n.action.is_empty()), "step {step}: turns were recorded");
    }
    assert_eq!(folder.metrics().unwrap().len(), 2);
    let evals: Vec<u64> = folder.evals().unwrap().iter().map(|e| e.step).collect();
    assert_eq!(evals, [0, 1, 2]);

    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("grove-view");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let written = rt.block_on(check_page(&chromium, &folder, &shots, "real-run"));
    assert!(written.tree_view.is_file() && written.curves.is_file(), "{written:?}");
    println!("the real run's tree view: {}", written.tree_view.display());
}
