//! Forests over real sockets: rows of one prompt on different connections get roles by join
//! order, expansions wait for their tree and continue from a forked node with its step data; a
//! disconnect does not take a forest's episodes; mismatches, full forests, bad shapes and
//! expiry are typed errors; a finished forest closes its episodes.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{TestServer, em_task};
use grove_env_server::config::ServerConfig;
use grove_protocol::*;

const SEARCH: &str = "<search> Elmsworth Harbor Bridge designer </search>";
const ANSWER: &str = "<answer> Ada Kerrigan </answer>";

fn join(key: &str, shape: ForestShape) -> JoinForest {
    JoinForest {
        key: key.into(),
        shape,
        seed: 11,
        task: em_task(),
        options: EpisodeOptions { max_turns: Some(3), ..Default::default() },
    }
}

const TREE_221: ForestShape = ForestShape { m: 2, n: 2, l: 1, k: 3 };

fn data(tag: u8) -> Option<StepData> {
    Some(StepData(vec![tag; 4]))
}

async fn step(c: &client::Client, episode: EpisodeId, text: &str, tag: u8) -> Observation {
    let r = c.step(vec![StepAction { episode, action: Action::Text(text.into()), data: data(tag) }]).await.unwrap();
    r.into_iter().next().unwrap().unwrap()
}

/// Play a chain to its end: search until one tool turn is left, then answer.
async fn play(c: &client::Client, role: &ForestRole, tag: u8) -> Observation {
    play_at(c, role.episode, role.prefix.len() as u32, tag).await
}

/// [`play`] from an episode that has taken `turn` steps.
async fn play_at(c: &client::Client, episode: EpisodeId, mut turn: u32, tag: u8) -> Observation {
    loop {
        let text = if turn < 2 { SEARCH } else { ANSWER };
        let obs = step(c, episode, text, tag + turn as u8).await;
        turn += 1;
        if obs.done {
            return obs;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_rows_on_two_connections_grow_two_trees_of_three() {
    let server = TestServer::start(ServerConfig::default()).await;
    let (a, b) = (Arc::new(server.client().await), Arc::new(server.client().await));
    // Two roots first: one per tree, answered at once.
    let r0 = a.join_forest(join("p1", TREE_221)).await.unwrap();
    let r1 = b.join_forest(join("p1", TREE_221)).await.unwrap();
    assert_eq!((r0.row, r0.tree, r0.round, r0.from), (0, 0, 0, None));
    assert_eq!((r1.row, r1.tree, r1.round), (1, 1, 0));
    assert!(r0.prompt.contains("harbor bridge") && r0.prefix.is_empty());
    // Four expansions join at once, from both connections, before any root has finished: their
    // replies wait. Each role stays with the connection that joined.
    let clients = [a.clone(), b.clone()];
    let waiting: Vec<_> = (0..4)
        .map(|i| {
            let c = clients[i % 2].clone();
            tokio::spawn(async move { (i % 2, c.join_forest(join("p1", TREE_221)).await) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(waiting.iter().all(|w| !w.is_finished()), "expansions wait for their tree's chain");
    play(&a, &r0, 10).await;
    play(&b, &r1, 20).await;
    let mut roles: Vec<(usize, ForestRole)> = Vec::new();
    for w in waiting {
        let (who, role) = w.await.unwrap();
        roles.push((who, role.unwrap()));
    }
    let mut rows: Vec<u32> = roles.iter().map(|(_, r)| r.row).collect();
    rows.sort_unstable();
    assert_eq!(rows, [2, 3, 4, 5]);
    for (who, role) in &roles {
        let node = role.from.expect("an expansion continues from a node");
        let root = if role.tree == 0 { &r0 } else { &r1 };
        assert_eq!(role.round, 1);
        assert!(node.episode == root.episode, "round 1 picks from the initial chain");
        assert!(node.step <= 2, "the last step is a leaf, never picked: {node:?}");
        assert_eq!(role.prefix.len() as u32, node.step);
        let tag = if role.tree == 0 { 10 } else { 20 };
        for (i, p) in role.prefix.iter().enumerate() {
            assert_eq!(p.data, data(tag + i as u8), "the prefix carries the node's step data");
            assert_eq!(p.action, SEARCH);
            assert!(p.observation.contains("<information>"));
        }
        // The episode is forked at the node: its transcript is the prefix, with lineage.
        let c = &clients[*who];
        let t = c.transcript(role.episode).await.unwrap();
        assert_eq!(t.steps.len() as u32, node.step);
        assert_eq!((t.lineage.parent, t.lineage.fork_step), (Some(node.episode), Some(node.step)));
        // Only the forest forks or closes its episodes.
        let fork = c.fork(vec![ForkSpec { episode: role.episode, at_step: 0, n: 1 }]).await.unwrap();
        assert_eq!(fork[0].as_ref().unwrap_err().code, ErrorCode::NotOwner);
        // Nor may another connection step it.
        let other = &clients[1 - *who];
        let r = other.step(vec![StepAction { episode: role.episode, action: Action::Text(ANSWER.into()), data: None }]);
        assert_eq!(r.await.unwrap()[0].as_ref().unwrap_err().code, ErrorCode::NotOwner);
        // A continuation from depth d has max_turns - d tool turns left.
        let t = c.transcript(role.episode).await.unwrap();
        assert_eq!(t.steps.len() as u32, node.step);
    }
    // Each expansion plays on; the forest finishes when the last leaf is done.
    for (who, role) in &roles {
        let c = &clients[*who];
        let first = step(c, role.episode, if role.prefix.len() < 2 { SEARCH } else { ANSWER }, 30).await;
        let used = role.prefix.len() as u32 + 1;
        assert_eq!(first.turns_left, 3u32.saturating_sub(used), "{role:?}");
        if !first.done {
            assert!(play_at(c, role.episode, used, 30).await.reward.is_some());
        }
    }
    let stats = a.stats().await.unwrap();
    assert_eq!((stats.forests_live, stats.forests_finished), (0, 1));
    // A finished forest's episodes stay readable until its deadline.
    assert_eq!(stats.episodes_live, 6);
    let t = a.transcript(r0.episode).await.unwrap();
    assert_eq!((t.steps.len(), t.status), (3, EpisodeStatus::Done));
    assert_eq!(t.steps[0].data, data(10), "the transcript keeps each step's data");
    // A late row of a finished forest is refused, not given a new forest.
    let late = a.join_forest(join("p1", TREE_221)).await.unwrap_err();
    assert_eq!(late.code(), Some(ErrorCode::ForestFull));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_forest_closes_its_episodes_at_its_deadline() {
    let mut config = ServerConfig::default();
    config.limits.forest_timeout_secs = 3;
    let server = TestServer::start(config).await;
    let c = server.client().await;
    let shape = ForestShape { m: 2, n: 0, l: 0, k: 1 };
    for _ in 0..2 {
        let r = c.join_forest(join("short", shape)).await.unwrap();
        play(&c, &r, 1).await;
    }
    assert_eq!(c.stats().await.unwrap().forests_finished, 1);
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let stats = c.stats().await.unwrap();
    assert_eq!((stats.episodes_live, stats.forests_live, stats.forests_expired), (0, 0, 0));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn picks_do_not_depend_on_which_tree_finishes_first() {
    let mut picks = Vec::new();
    for tree_1_first in [false, true] {
        let server = TestServer::start(ServerConfig::default()).await;
        let c = Arc::new(server.client().await);
        let roots =
            [c.join_forest(join("p", TREE_221)).await.unwrap(), c.join_forest(join("p", TREE_221)).await.unwrap()];
        let waiting: Vec<_> = (0..4)
            .map(|_| {
                let c = c.clone();
                tokio::spawn(async move { c.join_forest(join("p", TREE_221)).await.unwrap() })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let order = if tree_1_first { [1, 0] } else { [0, 1] };
        for t in order {
            play(&c, &roots[t], 1).await;
        }
        let mut got = Vec::new();
        for w in waiting {
            let r = w.await.unwrap();
            got.push((r.tree, r.from.unwrap().step));
        }
        got.sort_unstable();
        picks.push(got);
        server.shutdown().await;
    }
    assert_eq!(picks[0], picks[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rounds_pick_from_the_first_rounds_chains_too() {
    let server = TestServer::start(ServerConfig::default()).await;
    let c = server.client().await;
    let shape = ForestShape { m: 1, n: 1, l: 2, k: 3 };
    let root = c.join_forest(join("deep", shape)).await.unwrap();
    play(&c, &root, 1).await;
    let r1 = c.join_forest(join("deep", shape)).await.unwrap();
    assert_eq!((r1.row, r1.round), (1, 1));
    play(&c, &r1, 5).await;
    let r2 = c.join_forest(join("deep", shape)).await.unwrap();
    assert_eq!((r2.row, r2.round), (2, 2));
    let node = r2.from.unwrap();
    // Round 2 draws over the root, the first chain's non-leaf steps and those the round-1 chain
    // added after its fork point; the node's prefix is that chain's.
    assert!(node.episode == root.episode || node.episode == r1.episode, "{node:?}");
    if node.episode == r1.episode {
        assert!(node.step > r1.from.unwrap().step, "only the steps the continuation added: {node:?}");
    }
    assert_eq!(r2.prefix.len() as u32, node.step);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chain_mode_gives_every_row_a_root_at_once() {
    let server = TestServer::start(ServerConfig::default()).await;
    let c = server.client().await;
    let shape = ForestShape { m: 4, n: 0, l: 0, k: 1 };
    let mut episodes = Vec::new();
    for row in 0..4 {
        let r = c.join_forest(join("chains", shape)).await.unwrap();
        assert_eq!((r.row, r.tree, r.round, r.from), (row, row, 0, None));
        episodes.push(r.episode);
    }
    episodes.sort_unstable();
    episodes.dedup();
    assert_eq!(episodes.len(), 4);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_joins_are_typed_errors() {
    let server = TestServer::start(ServerConfig::default()).await;
    let c = server.client().await;
    let code = |r: Result<ForestRole, client::ClientError>| r.unwrap_err().code();
    let bad_k = ForestShape { m: 2, n: 2, l: 1, k: 2 };
    assert_eq!(code(c.join_forest(join("x", bad_k)).await), Some(ErrorCode::InvalidForest));
    let no_trees = ForestShape { m: 0, n: 0, l: 0, k: 1 };
    assert_eq!(code(c.join_forest(join("x", no_trees)).await), Some(ErrorCode::InvalidForest));
    let huge = ForestShape { m: 100, n: 0, l: 0, k: 1 };
    assert_eq!(code(c.join_forest(join("x", huge)).await), Some(ErrorCode::InvalidForest));
    assert_eq!(code(c.join_forest(join("", TREE_221)).await), Some(ErrorCode::InvalidForest));
    assert_eq!(code(c.join_forest(join(&"k".repeat(257), TREE_221)).await), Some(ErrorCode::InvalidForest));
    // A root that cannot be created (no gold answer) fails its row and ends the forest at once.
    let mut no_gold = join("nogold", TREE_221);
    no_gold.task.golden_answers.clear();
    assert_eq!(code(c.join_forest(no_gold.clone()).await), Some(ErrorCode::InvalidAction));
    assert_eq!(code(c.join_forest(no_gold).await), Some(ErrorCode::ForestExpired));
    c.join_forest(join("x", TREE_221)).await.unwrap();
    let mut other = join("x", TREE_221);
    other.seed = 12;
    assert_eq!(code(c.join_forest(other).await), Some(ErrorCode::ForestMismatch));
    let mut other = join("x", TREE_221);
    other.task.question = "another question".into();
    assert_eq!(code(c.join_forest(other).await), Some(ErrorCode::ForestMismatch));
    let mut other = join("x", TREE_221);
    other.options.max_turns = Some(4);
    assert_eq!(code(c.join_forest(other).await), Some(ErrorCode::ForestMismatch), "options are part of a forest");
    let chains = ForestShape { m: 1, n: 0, l: 0, k: 1 };
    c.join_forest(join("one", chains)).await.unwrap();
    assert_eq!(code(c.join_forest(join("one", chains)).await), Some(ErrorCode::ForestFull));
    // Step data above the limit.
    let r = c.join_forest(join("y", chains)).await.unwrap();
    let big = StepData(vec![0; 300 << 10]);
    let res = c.step(vec![StepAction { episode: r.episode, action: Action::Text(SEARCH.into()), data: Some(big) }]);
    let err = res.await.unwrap().pop().unwrap().unwrap_err();
    assert_eq!(err.code, ErrorCode::DataTooLarge);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forest_whose_rows_never_arrive_expires_and_is_reclaimed() {
    let mut config = ServerConfig::default();
    config.limits.forest_timeout_secs = 2;
    let server = TestServer::start(config).await;
    let c = server.client().await;
    let shape = ForestShape { m: 1, n: 2, l: 1, k: 3 };
    let root = c.join_forest(join("late", shape)).await.unwrap();
    play(&c, &root, 1).await;
    // One of the two expansions never joins: the forest cannot finish, and expires.
    c.join_forest(join("late", shape)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let stats = c.stats().await.unwrap();
    assert_eq!((stats.forests_live, stats.forests_expired, stats.episodes_live), (0, 1, 0));
    assert_eq!(
        c.join_forest(join("late", shape)).await.unwrap_err().code(),
        Some(ErrorCode::ForestExpired),
        "a late row of an expired forest does not start a new one"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_ends_keeps_its_finished_chains_and_breaks_its_unfinished_ones() {
    let mut config = ServerConfig::default();
    // No reattach: a dropped connection ends its session at once.
    config.limits.reattach_grace_secs = 0;
    let server = TestServer::start(config).await;
    let shape = ForestShape { m: 1, n: 2, l: 1, k: 3 };
    // The root's worker finishes its chain and goes: the forest owns the episode, later rounds
    // still fork it.
    let a = server.client().await;
    let root = a.join_forest(join("kept", shape)).await.unwrap();
    play(&a, &root, 1).await;
    drop(a);
    let b = server.client().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(b.stats().await.unwrap().episodes_live, 1, "the finished chain outlives its session");
    for _ in 0..2 {
        let r = b.join_forest(join("kept", shape)).await.unwrap();
        assert_eq!(r.from.unwrap().episode, root.episode);
        play(&b, &r, 2).await;
    }
    assert_eq!(b.stats().await.unwrap().forests_finished, 1);
    // A worker that dies mid-chain: the forest cannot finish, so it ends at once and the row
    // waiting for that chain hears so well before the 600 s deadline.
    let a = server.client().await;
    let root = a.join_forest(join("broken", shape)).await.unwrap();
    step(&a, root.episode, SEARCH, 1).await;
    let waiting = {
        let b = Arc::new(b);
        let bb = b.clone();
        (b, tokio::spawn(async move { bb.join_forest(join("broken", shape)).await }))
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(a);
    let err = tokio::time::timeout(Duration::from_secs(10), waiting.1).await.unwrap().unwrap().unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::ForestExpired));
    assert_eq!(waiting.0.stats().await.unwrap().forests_expired, 1);
    server.shutdown().await;
}
