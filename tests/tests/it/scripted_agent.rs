//! The scripted warm-start agent plays the synthetic world through a real env-server: perfect
//! when told to be, deliberately imperfect by default, and its trajectories feed SFT.

use grove_datasets::synthetic::{World, WorldConfig};
use grove_tests::WorldServer;
use grove_trainer::rl::env::EnvClient;
use grove_trainer::workflows::scripted::{ScriptConfig, play};

#[test]
fn scripted_agent_plays_the_world() {
    let world = World::generate(&WorldConfig::default());
    let srv = WorldServer::start(&world);
    let env = EnvClient::connect(&srv.url, Default::default()).unwrap();
    let mut questions = world.questions(2, 20, 4);
    questions.extend(world.questions(3, 20, 4));

    let perfect =
        play(&world, &questions, &env, &ScriptConfig { early_answer: 0.0, vague_query: 0.0, ..Default::default() })
            .unwrap();
    assert_eq!(perfect.len(), 40);
    for p in &perfect {
        assert!(p.correct && p.reward == 1.0, "{:?}", p.trajectory);
        // Every search found the entity it looked for: BM25 over the world answers by name.
        let hops = p.trajectory.steps.len() - 1;
        assert!((2..=3).contains(&hops));
        for step in &p.trajectory.steps[..hops] {
            assert!(step.observation.contains("<information>Doc 1(Title:"), "{}", step.observation);
        }
    }
    // One result per search when asked for one.
    let one = ScriptConfig { early_answer: 0.0, vague_query: 0.0, topk: Some(1), ..Default::default() };
    let top1 = play(&world, &questions[..4], &env, &one).unwrap();
    for p in &top1 {
        assert!(p.correct, "{:?}", p.trajectory);
        let searched = &p.trajectory.steps[..p.trajectory.steps.len() - 1];
        assert!(searched.iter().all(|s| s.observation.contains("Doc 1(") && !s.observation.contains("Doc 2(")));
    }
    let imperfect = play(&world, &questions, &env, &ScriptConfig::default()).unwrap();
    let rate = imperfect.iter().filter(|p| p.correct).count() as f64 / imperfect.len() as f64;
    assert!((0.4..0.95).contains(&rate), "success rate {rate}");
    // Wrong answers are well formed: the format score 0.2, not 0.
    assert!(imperfect.iter().filter(|p| !p.correct).all(|p| (p.reward - 0.2).abs() < 1e-9));
    assert_eq!(env.block_on(env.client().stats()).unwrap().episodes_live, 0);
}
