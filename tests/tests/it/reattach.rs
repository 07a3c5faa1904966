//! Connections that survive a blip: a loopback proxy between a client and a real env-server cuts
//! the connection (closing both ends, only the client's, or freezing it so that only the
//! heartbeat notices), and the client reconnects, reattaches to its session and gets every reply
//! exactly once. A tree rollout of the trainer cut in the middle gives the same training rows as
//! an uncut one with the same seed. A session whose grace period runs out is closed, and the
//! client says why.

use std::sync::Arc;
use std::time::{Duration, Instant};

use grove_datasets::synthetic::{World, WorldConfig};
use grove_env_server::config::ServerConfig;
use grove_env_server::testkit::CutMode;
use grove_protocol::client::{Client, ClientError, ClientOptions, Reconnect};
use grove_protocol::{Action, EpisodeOptions, StepAction};
use grove_tests::{CutProxy, WorldServer, tiny_agent_config, tiny_policy};
use grove_trainer::engine::generate::Engine;
use grove_trainer::engine::tokenizer::Tokenizer;
use grove_trainer::rl::env::EnvClient;
use grove_trainer::rl::method::TreeShape;
use grove_trainer::rl::rollout::agent::Rollout;
use grove_trainer::rl::rollout::leaves::training_rows;
use grove_trainer::rl::rows::TrainingRow;
use grove_trainer::workflows::scripted::task_of;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn config(grace_secs: u64, heartbeat_secs: u64) -> ServerConfig {
    let mut c = ServerConfig::default();
    c.limits.reattach_grace_secs = grace_secs;
    c.limits.heartbeat_secs = heartbeat_secs;
    c
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn quick_reconnect() -> ClientOptions {
    ClientOptions {
        reconnect: Reconnect { first_delay: Duration::from_millis(50), ..Reconnect::default() },
        ..ClientOptions::default()
    }
}

/// Create `n` episodes and step each with a search, all at once on one connection, while the
/// proxy cuts the connection in `mode` part-way through the replies. Every step is answered
/// once, and every episode's transcript holds exactly one step (nothing ran twice).
fn replies_in_flight_survive(mode: CutMode) {
    let world = World::generate(&WorldConfig::default());
    let srv = WorldServer::start_with(&world, config(30, 15), None);
    let proxy = CutProxy::start(&srv.url);
    proxy.set_mode(mode);
    let rt = rt();
    rt.block_on(async {
        let client = Arc::new(Client::connect(&proxy.url, quick_reconnect()).await.unwrap());
        let tasks: Vec<_> = world.questions(2, 64, 1).iter().map(task_of).collect();
        let created = client.create_episodes(tasks, EpisodeOptions::default()).await.unwrap();
        let episodes: Vec<u64> = created.into_iter().map(|r| r.unwrap().episode).collect();
        // Cut after a few of the step replies have come down (each is a few hundred bytes).
        let before = proxy.down_bytes();
        proxy.cut_after(3000);
        let steps = episodes.iter().map(|&e| {
            let client = client.clone();
            tokio::spawn(async move {
                let action = Action::Text(format!("<search> passage {e} </search>"));
                client.step(vec![StepAction { episode: e, action, data: None }]).await
            })
        });
        let results = futures_join(steps).await;
        for (e, r) in episodes.iter().zip(&results) {
            let obs = r.as_ref().unwrap_or_else(|err| panic!("episode {e}: {err}"));
            assert_eq!(obs.len(), 1);
            let obs = obs[0].as_ref().unwrap();
            assert_eq!((obs.episode, obs.step), (*e, 1));
        }
        println!("{mode:?}: {} bytes of step replies came down, cut after 3000", proxy.down_bytes() - before);
        assert_eq!(proxy.cuts(), 1, "the proxy cut once");
        assert_eq!(client.reconnects(), 1, "one reattach");
        let (replayed, resent) = client.recovered();
        println!("{mode:?}: {replayed} replies replayed, {resent} requests sent again");
        assert!(replayed >= 1, "the reply cut mid-frame was replayed");
        for &e in &episodes {
            let t = client.transcript(e).await.unwrap();
            assert_eq!(t.steps.len(), 1, "episode {e} was stepped exactly once");
        }
        let stats = client.stats().await.unwrap();
        assert_eq!(stats.episodes_live, 64, "the reattached session still owns its episodes");
        // The old connection is gone on the server, whatever the cut left open.
        let deadline = Instant::now() + Duration::from_secs(10);
        while client.stats().await.unwrap().connections != 1 {
            assert!(Instant::now() < deadline, "the server still counts the old connection");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // And the episodes can be closed by their owner.
        let closed = client.close(episodes.clone()).await.unwrap();
        assert!(closed.iter().all(|r| r.is_ok()));
    });
}

async fn futures_join<T: Send + 'static>(handles: impl Iterator<Item = tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[test]
fn replies_in_flight_at_a_cut_arrive_exactly_once() {
    replies_in_flight_survive(CutMode::Close);
}

#[test]
fn a_reattach_ends_an_old_connection_the_server_still_holds() {
    replies_in_flight_survive(CutMode::KeepServerSide);
}

/// A connection that goes silent without closing (frozen by the proxy) is noticed by the
/// heartbeat, and the request waiting on it is answered after the reattach.
#[test]
fn a_frozen_connection_is_noticed_by_the_heartbeat() {
    let world = World::generate(&WorldConfig::default());
    let srv = WorldServer::start_with(&world, config(30, 1), None);
    let proxy = CutProxy::start(&srv.url);
    proxy.set_mode(CutMode::Freeze);
    let rt = rt();
    rt.block_on(async {
        let client = Client::connect(&proxy.url, quick_reconnect()).await.unwrap();
        assert_eq!(client.welcome().limits.heartbeat_ms, 1000);
        let task = task_of(&world.questions(2, 1, 1)[0]);
        let ep = client.create_episodes(vec![task], EpisodeOptions::default()).await.unwrap()[0].clone().unwrap();
        proxy.cut_now();
        let started = Instant::now();
        let obs = client.step_text(ep.episode, "<search> harbor </search>").await.unwrap();
        assert_eq!(obs.step, 1);
        assert_eq!(client.reconnects(), 1);
        let waited = started.elapsed();
        println!("frozen connection noticed and reattached after {waited:?}");
        assert!(waited >= Duration::from_millis(1500), "noticed by the heartbeat (2 x 1 s), not earlier");
    });
}

/// A client that cannot come back within the grace period finds its session closed: its
/// episodes are gone on the server and the waiting request fails with a clear error.
#[test]
fn a_session_past_its_grace_period_is_closed_and_the_client_says_why() {
    let world = World::generate(&WorldConfig::default());
    let srv = WorldServer::start_with(&world, config(1, 15), None);
    let proxy = CutProxy::start(&srv.url);
    let rt = rt();
    rt.block_on(async {
        let options = ClientOptions {
            reconnect: Reconnect {
                tries: 4,
                first_delay: Duration::from_millis(400),
                max_delay: Duration::from_secs(2),
                heartbeat: None,
            },
            ..ClientOptions::default()
        };
        let client = Client::connect(&proxy.url, options).await.unwrap();
        let tasks: Vec<_> = world.questions(2, 3, 1).iter().map(task_of).collect();
        let created = client.create_episodes(tasks, EpisodeOptions::default()).await.unwrap();
        // The first two attempts (after 0.4 s and 1.2 s) are refused; the third (2.8 s) comes
        // after the 1 s grace period.
        proxy.refuse_next(2);
        proxy.cut_now();
        let err = client.step_text(created[0].as_ref().unwrap().episode, "<search> x </search>").await.unwrap_err();
        let ClientError::Disconnected(why) = &err else { panic!("{err:?}") };
        assert!(why.contains("session_expired"), "{why}");
        println!("after the grace period: {err}");
        // Later requests fail the same way, and the server closed the episodes.
        assert!(matches!(client.ping(1).await, Err(ClientError::Disconnected(_))));
        let direct = Client::connect(&srv.url, ClientOptions::default()).await.unwrap();
        assert_eq!(direct.stats().await.unwrap().episodes_live, 0);
    });
}

/// Tree-GRPO's rollout of one prompt, (M, N, L) = (2, 2, 1), through `env`.
fn tree_rows(env: &EnvClient) -> Vec<TrainingRow> {
    let tok = Tokenizer::from_dir(&grove_datasets::assets::qwen25_tokenizer_dir()).unwrap();
    let (_vs, lm) = tiny_policy(tok.vocab_size());
    let world = World::generate(&WorldConfig::default());
    let task = task_of(&world.questions(2, 1, 3)[0]);
    let config = tiny_agent_config();
    let mut engine = Engine::new(&lm);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let shape = TreeShape { m: 2, n: 2, l: 1, k: 3 };
    let mut r = Rollout { engine: &mut engine, tok: &tok, env, config: &config, cost: Default::default() };
    let rollout = r.run(&task, shape, &mut rng).unwrap();
    let rows = training_rows(&rollout, shape.k, 0, config.max_response_tokens, &mut rng).unwrap();
    rollout.release(&mut engine);
    rows
}

/// The trainer's env client through a proxy that cuts the connection in the middle of a tree
/// rollout: the rollout completes, and its rows equal those of an uncut run with the same seed.
#[test]
fn a_tree_rollout_cut_in_the_middle_gives_the_rows_of_an_uncut_one() {
    let world = World::generate(&WorldConfig::default());
    // The uncut run, through a proxy too, to count the bytes a rollout brings down.
    let srv = WorldServer::start_with(&world, config(30, 15), None);
    let proxy = CutProxy::start(&srv.url);
    let env = EnvClient::connect(&proxy.url, quick_reconnect()).unwrap();
    let uncut = tree_rows(&env);
    let total = proxy.down_bytes();
    drop(env);

    for (mode, at) in [(CutMode::Close, total / 2), (CutMode::KeepServerSide, total / 3)] {
        let srv = WorldServer::start_with(&world, config(30, 15), None);
        let proxy = CutProxy::start(&srv.url);
        proxy.set_mode(mode);
        let env = EnvClient::connect(&proxy.url, quick_reconnect()).unwrap();
        proxy.cut_after(at - proxy.down_bytes());
        let cut = tree_rows(&env);
        assert_eq!(proxy.cuts(), 1, "{mode:?}: the proxy cut the rollout once");
        assert_eq!(env.client().reconnects(), 1, "{mode:?}: one reattach");
        println!("{mode:?}: cut after {at} of {total} bytes; {} rows, equal to the uncut run's", cut.len());
        assert_eq!(cut, uncut, "{mode:?}: the cut rollout's rows equal the uncut one's");
    }
}
