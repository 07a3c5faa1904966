//! Episodes over real sockets: search, answer and rewards; invalid actions; the forced final turn;
//! forks at every step; closing a parent.

use crate::common::{TestServer, em_task, f1_task};
use grove_env_server::config::ServerConfig;
use grove_env_server::sim::INVALID_ACTION_FEEDBACK;
use grove_protocol::*;

const SEARCH: &str =
    "<think>I need the bridge's designer.</think>\n<search> Elmsworth Harbor Bridge designer </search>";

fn opts(max_turns: u32) -> EpisodeOptions {
    EpisodeOptions { max_turns: Some(max_turns), ..Default::default() }
}

async fn one(client: &client::Client, task: TaskSpec, max_turns: u32) -> EpisodeStart {
    client.create_episodes(vec![task], opts(max_turns)).await.unwrap().pop().unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_then_answer_with_em_reward() {
    let server = TestServer::start(ServerConfig::default()).await;
    let c = server.client().await;
    let ep = one(&c, em_task(), 3).await;
    assert!(ep.prompt.contains("Question: who designed the harbor bridge in port elmsworth?\n"), "{}", ep.prompt);
    assert!(ep.prompt.contains("<answer> Beijing </answer>"));

    let obs = c.step_text(ep.episode, SEARCH).await.unwrap();
    assert_eq!((obs.kind, obs.step, obs.done, obs.turns_left), (ActionKind::Search, 1, false, 2));
    assert!(
        obs.text.starts_with("\n\n<information>Doc 1(Title: \"Elmsworth Harbor Bridge\") The Elmsworth"),
        "{:?}",
        obs.text
    );
    assert!(obs.text.ends_with("</information>\n\n"));
    assert_eq!(obs.text.matches("Doc ").count(), 3, "top-3 by default");

    let obs =
        c.step_text(ep.episode, "<think>It says Ada Kerrigan.</think>\n<answer> Ada Kerrigan </answer>").await.unwrap();
    assert!(obs.done && !obs.forced_final);
    assert_eq!(obs.text, "");
    let r = obs.reward.unwrap();
    assert_eq!((r.score, r.metric, r.metric_value, r.format_valid), (1.0, Metric::Em, 1.0, true));
    assert_eq!(r.answer.as_deref(), Some("Ada Kerrigan"));

    // A finished episode takes no more steps.
    let err = c.step_text(ep.episode, "<answer>x</answer>").await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::EpisodeDone));
    let t = c.transcript(ep.episode).await.unwrap();
    assert_eq!(t.status, EpisodeStatus::Done);
    assert_eq!(t.steps.len(), 2);
    assert_eq!(t.steps[0].content, "Elmsworth Harbor Bridge designer");
    assert_eq!(t.reward.unwrap().score, 1.0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reward_tables_over_the_wire() {
    let server = TestServer::start(ServerConfig::default()).await;
    let c = server.client().await;
    let cases: [(TaskSpec, &str, f64); 5] = [
        (em_task(), "<think>t</think><answer> Marten Quill </answer>", 0.2),
        (em_task(), "<answer> Ada Kerrigan </answer>", 0.8),
        (em_task(), "<answer> Marten Quill </answer>", 0.1),
        (f1_task(), "<think>t</think><answer> Kerrigan </answer>", 2.0 * 0.5 / 1.5),
        (f1_task(), "<answer> Kerrigan </answer>", 2.0 * 0.5 / 1.5 - 0.2),
    ];
    for (task, action, want) in cases {
        let metric = if task.data_source == "nq" { Metric::Em } else { Metric::F1 };
        let ep = one(&c, task, 3).await;
        let r = c.step_text(ep.episode, action).await.unwrap().reward.unwrap();
        assert!((r.score - want).abs() < 1e-9, "{action}: {} != {want}", r.score);
        assert_eq!(r.metric, metric);
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_action_gets_the_corrective_message() {
    let server = TestServer::start(ServerConfig::default()).await;
    let c = server.client().await;
    let ep = one(&c, em_task(), 3).await;
    let obs = c.step_text(ep.episode, "I think the answer is Ada Kerrigan.").await.unwrap();
    assert_eq!((obs.kind, obs.done, obs.turns_left), (ActionKind::Invalid, false, 2));
    assert_eq!(obs.text, INVALID_ACTION_FEEDBACK);
    assert!(obs.text.starts_with("\nMy previous action is invalid."));
    // Structured tool calls work as well, and are recorded in tag form.
    let call = ToolCall {
        name: "answer".into(),
        arguments: [("answer".to_string(), "Ada Kerrigan".into())].into_iter().collect(),
    };
    let res = c.step(vec![StepAction { episode: ep.episode, action: Action::Tool(call), data: None }]).await.unwrap();
    let obs = res.into_iter().next().unwrap().unwrap();
    assert!(obs.done);
    // Correct answer, but the corrective message in the trajectory makes the format invalid.
    assert_eq!(obs.reward.unwrap().score, 0.8);
    assert_eq!(c.transcript(ep.episode).await.unwrap().steps[1].action, "<answer> Ada Kerrigan </answer>");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_turns_then_forced_final_turn() {
    let server = TestServer::start(ServerConfig::default()).await;
    let c = server.client().await;
    let ep = one(&c, em_task(), 2).await;
    assert_eq!(ep.max_turns, 2);
    for step in 1..=2 {
        let obs = c.step_text(ep.episode, SEARCH).await.unwrap();
        assert_eq!((obs.step, obs.done, obs.turns_left, obs.forced_final), (step, false, 2 - step, false));
    }
    // Third turn: a search is parsed but not executed; the episode ends without an answer.
    let obs = c.step_text(ep.episode, SEARCH).await.unwrap();
    assert!(obs.done && obs.forced_final);
    assert_eq!((obs.kind, obs.text.as_str(), obs.step), (ActionKind::Search, "", 3));
    let r = obs.reward.unwrap();
    assert_eq!((r.answer, r.score, r.format_valid), (None, 0.0, false));
    let stats = c.stats().await.unwrap();
    assert_eq!(stats.searches, 2, "the forced final turn ran no search");

    // An answer in the final turn is scored normally.
    let ep = one(&c, em_task(), 1).await;
    c.step_text(ep.episode, SEARCH).await.unwrap();
    let obs = c.step_text(ep.episode, "<think>found it</think><answer>Ada Kerrigan</answer>").await.unwrap();
    assert!(obs.forced_final && obs.done);
    assert_eq!(obs.reward.unwrap().score, 1.0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_at_every_step_share_the_prefix_then_diverge() {
    let server = TestServer::start(ServerConfig::default()).await;
    let c = server.client().await;
    let parent = one(&c, em_task(), 3).await.episode;
    c.step_text(parent, SEARCH).await.unwrap();
    c.step_text(parent, "<think>more</think><search> Ada Kerrigan </search>").await.unwrap();
    c.step_text(parent, "<think>done</think><answer> Ada Kerrigan </answer>").await.unwrap();
    let full = c.transcript(parent).await.unwrap();
    assert_eq!(full.steps.len(), 3);

    let specs: Vec<ForkSpec> = (0..=3).map(|k| ForkSpec { episode: parent, at_step: k, n: 2 }).collect();
    let forked = c.fork(specs).await.unwrap();
    for (k, f) in forked.iter().enumerate() {
        let f = f.as_ref().unwrap();
        assert_eq!((f.parent, f.at_step, f.children.len()), (parent, k as u32, 2));
        assert_eq!(f.lineage, Lineage { root: parent, parent: Some(parent), depth: 1, fork_step: Some(k as u32) });
        for &child in &f.children {
            let t = c.transcript(child).await.unwrap();
            assert_eq!(t.steps, full.steps[..k]);
            assert_eq!(t.prompt, full.prompt);
            assert_eq!(t.status, if k == 3 { EpisodeStatus::Done } else { EpisodeStatus::Active });
        }
    }
    // Children at steps 0-2 continue independently of each other and of the parent.
    for (k, f) in forked.iter().take(3).enumerate() {
        let f = f.as_ref().unwrap();
        let (a, b) = (f.children[0], f.children[1]);
        let oa = c.step_text(a, "<think>x</think><answer> Marten Quill </answer>").await.unwrap();
        let ob = c.step_text(b, "no tool call here").await.unwrap();
        assert_eq!(oa.step, k as u32 + 1);
        assert!(oa.done && !ob.done);
        assert_eq!(oa.reward.unwrap().score, 0.2);
        let (ta, tb) = (c.transcript(a).await.unwrap(), c.transcript(b).await.unwrap());
        assert_eq!(ta.steps[..k], tb.steps[..k]);
        assert_ne!(ta.steps[k], tb.steps[k]);
    }
    assert_eq!(c.transcript(parent).await.unwrap().steps, full.steps, "the parent is untouched");
    // A fork of a fork records its depth.
    let grandchild =
        c.fork(vec![ForkSpec { episode: forked[1].as_ref().unwrap().children[1], at_step: 1, n: 1 }]).await.unwrap();
    let g = grandchild[0].as_ref().unwrap();
    assert_eq!((g.lineage.root, g.lineage.depth), (parent, 2));
    // Forking beyond the completed steps is an error.
    let bad = c.fork(vec![ForkSpec { episode: parent, at_step: 4, n: 1 }]).await.unwrap();
    assert_eq!(bad[0].as_ref().unwrap_err().code, ErrorCode::InvalidStep);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_parent_leaves_children_intact() {
    let server = TestServer::start(ServerConfig::default()).await;
    let c = server.client().await;
    let parent = one(&c, em_task(), 3).await.episode;
    c.step_text(parent, SEARCH).await.unwrap();
    let before = c.transcript(parent).await.unwrap();
    let children =
        c.fork(vec![ForkSpec { episode: parent, at_step: 1, n: 3 }]).await.unwrap()[0].clone().unwrap().children;
    let closed = c.close(vec![parent]).await.unwrap();
    assert_eq!(closed, vec![Ok(parent)]);
    assert_eq!(c.transcript(parent).await.unwrap_err().code(), Some(ErrorCode::UnknownEpisode));
    for &child in &children {
        let t = c.transcript(child).await.unwrap();
        assert_eq!(t.steps, before.steps);
        let obs = c.step_text(child, "<think>t</think><answer>Ada Kerrigan</answer>").await.unwrap();
        assert_eq!(obs.reward.unwrap().score, 1.0);
    }
    let stats = c.stats().await.unwrap();
    assert_eq!((stats.episodes_live, stats.forks, stats.episodes_closed), (3, 3, 1));
    // Closing twice, or someone else's id, is a per-item error.
    let again = c.close(vec![parent, children[0]]).await.unwrap();
    assert_eq!(again[0].as_ref().unwrap_err().code, ErrorCode::UnknownEpisode);
    assert_eq!(again[1], Ok(children[0]));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_episodes_step_in_one_frame_and_searches_batch() {
    let server = TestServer::start(ServerConfig::default()).await;
    let c = server.client().await;
    let eps: Vec<EpisodeId> = c
        .create_episodes(vec![em_task(); 64], opts(3))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.unwrap().episode)
        .collect();
    let actions = eps
        .iter()
        .enumerate()
        .map(|(i, &e)| StepAction {
            episode: e,
            action: Action::Text(if i % 2 == 0 {
                SEARCH.to_string()
            } else {
                "<answer>Ada Kerrigan</answer>".to_string()
            }),
            data: None,
        })
        .collect();
    let results = c.step(actions).await.unwrap();
    assert_eq!(results.len(), 64);
    for (i, r) in results.into_iter().enumerate() {
        let obs = r.unwrap();
        assert_eq!(obs.episode, eps[i], "results come back in request order");
        assert_eq!(obs.kind, if i % 2 == 0 { ActionKind::Search } else { ActionKind::Answer });
    }
    // Prometheus counters saw the search batches.
    let metrics = reqwest_get(&server.http("/metrics")).await;
    assert!(metrics.contains("grove_searches_total 32"), "{metrics}");
    server.shutdown().await;
}

async fn reqwest_get(url: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("http://");
    let (host, path) = addr.split_once('/').unwrap();
    let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
    s.write_all(format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}
