//! Bad input gets a typed error with the request id when it can be read, and the server and its
//! other clients carry on.

use std::time::Duration;

use crate::common::{TestServer, em_task, gauge};
use futures_util::{SinkExt, StreamExt};
use grove_env_server::config::ServerConfig;
use grove_protocol::client::{Client, ClientOptions};
use grove_protocol::*;
use tokio_tungstenite::tungstenite::Message;

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn raw(server: &TestServer) -> Ws {
    tokio_tungstenite::connect_async(server.url()).await.unwrap().0
}

async fn send(ws: &mut Ws, msg: Message) -> Envelope<Response> {
    ws.send(msg).await.unwrap();
    recv(ws).await
}

async fn recv(ws: &mut Ws) -> Envelope<Response> {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(5), ws.next()).await.unwrap().unwrap().unwrap();
        if let Message::Binary(b) = m {
            return decode_response(&b).unwrap();
        }
    }
}

fn frame(id: u64, msg: Request) -> Message {
    Message::Binary(encode(&Envelope::new(id, msg)).unwrap().into())
}

fn err_of(env: &Envelope<Response>) -> (u64, ErrorCode) {
    match &env.msg {
        Response::Error(e) => (env.id, e.code),
        other => panic!("expected an error, got {other:?}"),
    }
}

fn hello() -> Request {
    Request::Hello(Hello { protocol_version: PROTOCOL_VERSION, client: "raw".into(), resume: None })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversize_frames_are_typed_errors() {
    let mut config = ServerConfig::default();
    config.limits.max_frame_bytes = 4096;
    let server = TestServer::start(config).await;
    let good = server.client().await;
    let mut ws = raw(&server).await;

    // Before Hello: handshake_required, with the id.
    assert_eq!(err_of(&send(&mut ws, frame(5, Request::Stats)).await), (5, ErrorCode::HandshakeRequired));
    // Wrong version.
    let v2 = Request::Hello(Hello { protocol_version: 2, client: "x".into(), resume: None });
    assert_eq!(err_of(&send(&mut ws, frame(6, v2)).await), (6, ErrorCode::UnsupportedVersion));
    assert!(matches!(send(&mut ws, frame(7, hello())).await.msg, Response::Welcome(_)));
    assert_eq!(err_of(&send(&mut ws, frame(8, hello())).await), (8, ErrorCode::HandshakeRequired));

    // Garbage: no id can be read.
    assert_eq!(
        err_of(&send(&mut ws, Message::Binary(vec![0xc1, 0x00, 0xff].into())).await),
        (0, ErrorCode::MalformedFrame)
    );
    // A readable id with an unknown request: the id comes back.
    let bogus = rmp_serde::to_vec_named(&Envelope::new(9u64, serde_json::json!({"Teleport": {"to": "mars"}}))).unwrap();
    assert_eq!(err_of(&send(&mut ws, Message::Binary(bogus.into())).await), (9, ErrorCode::MalformedFrame));
    // Wrong field types.
    let wrong =
        rmp_serde::to_vec_named(&Envelope::new(10u64, serde_json::json!({"Fork": {"forks": "all of them"}}))).unwrap();
    assert_eq!(err_of(&send(&mut ws, Message::Binary(wrong.into())).await), (10, ErrorCode::MalformedFrame));
    // A text frame.
    assert_eq!(err_of(&send(&mut ws, Message::Text("{\"id\": 1}".into())).await).1, ErrorCode::UnsupportedFrame);
    // Over the frame limit but under the hard cap: typed error with the id, connection lives.
    let big = Request::Step(Step {
        actions: vec![StepAction { episode: 1, action: Action::Text("x".repeat(6000)), data: None }],
    });
    assert_eq!(err_of(&send(&mut ws, frame(11, big)).await), (11, ErrorCode::FrameTooLarge));
    // The connection still works after all of that.
    assert!(matches!(
        send(&mut ws, frame(12, Request::Ping(Ping { nonce: 3 }))).await.msg,
        Response::Pong(Ping { nonce: 3 })
    ));
    // Far over every cap: the server answers, then closes this connection only.
    let huge = vec![0x90u8; 200_000];
    assert_eq!(err_of(&send(&mut ws, Message::Binary(huge.into())).await).1, ErrorCode::FrameTooLarge);

    // The other client never noticed.
    assert_eq!(good.ping(77).await.unwrap(), 77);
    let ep = good.create_episodes(vec![em_task()], Default::default()).await.unwrap()[0].clone().unwrap();
    assert!(!good.step_text(ep.episode, "<search> Ada Kerrigan </search>").await.unwrap().text.is_empty());
    // And the errors were counted.
    let stats = good.stats().await.unwrap();
    assert!(stats.connections >= 1);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_episodes_and_ownership() {
    let server = TestServer::start(ServerConfig::default()).await;
    let (a, b) = (server.client().await, server.client().await);
    let ep = a.create_episodes(vec![em_task()], Default::default()).await.unwrap()[0].clone().unwrap().episode;
    let r = a.step(vec![StepAction { episode: 999, action: Action::Text("x".into()), data: None }]).await.unwrap();
    let e = r[0].clone().unwrap_err();
    assert_eq!((e.code, e.episode), (ErrorCode::UnknownEpisode, Some(999)));
    // b cannot step, fork, close or read a's episode.
    let r = b.step(vec![StepAction { episode: ep, action: Action::Text("x".into()), data: None }]).await.unwrap();
    assert_eq!(r[0].clone().unwrap_err().code, ErrorCode::NotOwner);
    assert_eq!(
        b.fork(vec![ForkSpec { episode: ep, at_step: 0, n: 1 }]).await.unwrap()[0].clone().unwrap_err().code,
        ErrorCode::NotOwner
    );
    assert_eq!(b.close(vec![ep]).await.unwrap()[0].clone().unwrap_err().code, ErrorCode::NotOwner);
    assert_eq!(b.transcript(ep).await.unwrap_err().code(), Some(ErrorCode::NotOwner));
    // The same episode twice in one Step.
    let twice = vec![
        StepAction { episode: ep, action: Action::Text("a".into()), data: None },
        StepAction { episode: ep, action: Action::Text("b".into()), data: None },
    ];
    let r = a.step(twice).await.unwrap();
    assert!(r[0].is_ok());
    assert_eq!(r[1].clone().unwrap_err().code, ErrorCode::DuplicateEpisode);
    // Unknown tool.
    let call = ToolCall { name: "teleport".into(), arguments: Default::default() };
    let r = a.step(vec![StepAction { episode: ep, action: Action::Tool(call), data: None }]).await.unwrap();
    assert_eq!(r[0].clone().unwrap_err().code, ErrorCode::InvalidAction);
    // Unknown backend.
    let opts = EpisodeOptions { backend: Some("bing".into()), ..Default::default() };
    assert_eq!(a.create_episodes(vec![em_task()], opts).await.unwrap_err().code(), Some(ErrorCode::UnknownBackend));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_enforced_with_typed_errors() {
    let mut config = ServerConfig::default();
    config.limits.max_batch = 8;
    config.limits.max_episodes_per_connection = 10;
    config.limits.max_episodes_total = 14;
    config.limits.max_forks_per_request = 5;
    config.limits.max_action_chars = 200;
    config.limits.max_query_chars = 20;
    config.limits.max_turns = 5;
    let server = TestServer::start(config).await;
    let (a, b) = (server.client().await, server.client().await);
    assert_eq!(a.welcome().limits.max_batch, 8);

    let code = |r: Result<Vec<Result<EpisodeStart, ErrorInfo>>, client::ClientError>| r.unwrap_err().code();
    assert_eq!(code(a.create_episodes(vec![em_task(); 9], Default::default()).await), Some(ErrorCode::BatchTooLarge));
    let opts = EpisodeOptions { max_turns: Some(6), ..Default::default() };
    assert_eq!(code(a.create_episodes(vec![em_task()], opts).await), Some(ErrorCode::BatchTooLarge));
    // A prompt template without the question's placeholder.
    let opts = EpisodeOptions { prompt_template: Some("Answer well.".into()), ..Default::default() };
    assert_eq!(code(a.create_episodes(vec![em_task()], opts).await), Some(ErrorCode::InvalidAction));
    let eps: Vec<_> = a.create_episodes(vec![em_task(); 8], Default::default()).await.unwrap();
    let ep = eps[0].clone().unwrap().episode;
    // Per connection: 8 held, 3 more would pass 10.
    assert_eq!(code(a.create_episodes(vec![em_task(); 3], Default::default()).await), Some(ErrorCode::TooManyEpisodes));
    // Total: b may create 6 (8 + 6 = 14) but not 7.
    assert_eq!(code(b.create_episodes(vec![em_task(); 7], Default::default()).await), Some(ErrorCode::TooManyEpisodes));
    // Forks: more than 5 children in one request.
    let r = a.fork(vec![ForkSpec { episode: ep, at_step: 0, n: 6 }]).await;
    assert_eq!(r.unwrap_err().code(), Some(ErrorCode::BatchTooLarge));
    // Forks count against the episode limits too: 8 held + 3 > 10.
    let r = a.fork(vec![ForkSpec { episode: ep, at_step: 0, n: 3 }]).await.unwrap();
    assert_eq!(r[0].clone().unwrap_err().code, ErrorCode::TooManyEpisodes);
    // Action and query length.
    let long = StepAction { episode: ep, action: Action::Text("x".repeat(201)), data: None };
    assert_eq!(a.step(vec![long]).await.unwrap()[0].clone().unwrap_err().code, ErrorCode::ActionTooLong);
    let long_query = StepAction {
        episode: ep,
        action: Action::Text("<search> a very long query indeed </search>".into()),
        data: None,
    };
    assert_eq!(a.step(vec![long_query]).await.unwrap()[0].clone().unwrap_err().code, ErrorCode::ActionTooLong);
    // The rejected steps were not counted as turns.
    assert_eq!(a.transcript(ep).await.unwrap().steps.len(), 0);
    assert_eq!(a.step_text(ep, "<search> Ada Kerrigan </search>").await.unwrap().step, 1);
    // Closing frees room.
    a.close(vec![ep]).await.unwrap();
    assert!(a.create_episodes(vec![em_task()], Default::default()).await.unwrap()[0].is_ok());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limit_is_a_typed_error() {
    let mut config = ServerConfig::default();
    config.limits.max_connections = 2;
    let server = TestServer::start(config).await;
    let (_a, _b) = (server.client().await, server.client().await);
    let mut third = raw(&server).await;
    assert_eq!(err_of(&recv(&mut third).await).1, ErrorCode::TooManyConnections);
    drop(_a);
    // A slot frees up once the first connection is gone.
    let mut ok = false;
    for _ in 0..50 {
        if let Ok(c) = Client::connect(&server.url(), ClientOptions::default()).await {
            ok = c.ping(1).await.is_ok();
            if ok {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_token_guards_websocket_and_http() {
    grove_http::install_tls_provider();
    let config = ServerConfig { token: Some("s3cret".into()), ..Default::default() };
    let server = TestServer::start(config).await;
    let with = |t: &str| ClientOptions { token: Some(t.into()), name: None, ..Default::default() };
    assert!(Client::connect(&server.url(), ClientOptions::default()).await.is_err());
    assert!(Client::connect(&server.url(), with("wrong")).await.is_err());
    let c = Client::connect(&server.url(), with("s3cret")).await.unwrap();
    assert_eq!(c.ping(5).await.unwrap(), 5);
    let http = reqwest::Client::new();
    let body = serde_json::json!({"queries": ["Ada Kerrigan"], "topk": 1});
    let r = http.post(server.http("/retrieve")).json(&body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = http.get(server.http("/metrics")).bearer_auth("wrong").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = http.post(server.http("/retrieve")).bearer_auth("s3cret").json(&body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    server.shutdown().await;
}

fn welcome_of(env: &Envelope<Response>) -> Welcome {
    match &env.msg {
        Response::Welcome(w) => w.clone(),
        other => panic!("expected a Welcome, got {other:?}"),
    }
}

fn resume(token: &str, pending: Vec<u64>) -> Request {
    Request::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        client: "raw".into(),
        resume: Some(Resume { token: token.into(), pending }),
    })
}

/// Reattach, frame by frame: the Welcome carries a session token; after a drop, a Hello with
/// that token and the pending ids gets a Welcome that names the ids never received (to send
/// again), then the replies the server still holds, replayed; ids whose replies fell out of the
/// replay buffer get `reply_lost`; an unknown token, or too many pending ids, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reattach_replays_held_replies_and_names_the_ones_never_received() {
    let mut config = ServerConfig::default();
    config.limits.replay_buffer_bytes = 600;
    config.limits.max_in_flight_per_connection = 8;
    let server = TestServer::start(config).await;
    let mut ws = raw(&server).await;
    let w = welcome_of(&send(&mut ws, frame(1, hello())).await);
    let session = w.session.expect("a session");
    assert_eq!((session.token.len(), session.grace_ms), (32, 60_000));
    assert_eq!((w.limits.heartbeat_ms, w.limits.max_in_flight), (15_000, 8));
    let created = send(
        &mut ws,
        frame(
            2,
            Request::CreateEpisodes(CreateEpisodes { tasks: vec![em_task()], options: EpisodeOptions::default() }),
        ),
    )
    .await;
    let Response::EpisodesCreated(c) = created.msg else { panic!() };
    let episode = c.episodes[0].as_ref().unwrap().episode;
    // Replies 3..=6: four pings, each small; the replay buffer holds only the last few.
    for id in 3..=6 {
        assert!(matches!(send(&mut ws, frame(id, Request::Ping(Ping { nonce: id }))).await.msg, Response::Pong(_)));
    }
    drop(ws);
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Unknown token.
    let mut other = raw(&server).await;
    assert_eq!(err_of(&send(&mut other, frame(1, resume("00", vec![]))).await), (1, ErrorCode::SessionExpired));
    // More pending ids than requests can be in flight.
    assert_eq!(
        err_of(&send(&mut other, frame(2, resume(&session.token, (1..=9).collect()))).await),
        (2, ErrorCode::MalformedFrame)
    );

    // Pending: 2 (create: its reply, over 600 bytes with the prompt, was pushed out), 6 (the last
    // ping, still held), 99 (never sent).
    let mut ws = raw(&server).await;
    let w = welcome_of(&send(&mut ws, frame(10, resume(&session.token, vec![2, 6, 99]))).await);
    assert_eq!(w.session.unwrap().token, session.token);
    let resumed = w.resumed.expect("resumed");
    assert_eq!((resumed.replayed, resumed.resend), (1, vec![99]));
    let mut got = [recv(&mut ws).await, recv(&mut ws).await];
    got.sort_by_key(|e| e.id);
    assert_eq!(err_of(&got[0]), (2, ErrorCode::ReplyLost));
    assert_eq!(got[1], Envelope::new(6, Response::Pong(Ping { nonce: 6 })));
    // The session's episode belongs to the new connection.
    let step = StepAction { episode, action: Action::Text("<answer> Ada Kerrigan </answer>".into()), data: None };
    let stepped = send(&mut ws, frame(99, Request::Step(Step { actions: vec![step] }))).await;
    let Response::Stepped(s) = stepped.msg else { panic!("{stepped:?}") };
    assert_eq!(s.results[0].as_ref().unwrap().reward.as_ref().unwrap().metric_value, 1.0);
}

/// The server-wide bound on replay memory acts like a session's own: with room for 1 MiB per
/// session but 600 bytes for all of them, the create reply is pushed out (the client gets
/// `reply_lost`), the newest ping is replayed, and `/metrics` counts the push-out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_memory_of_all_sessions_together_is_bounded() {
    let mut config = ServerConfig::default();
    config.limits.replay_buffer_bytes = 1 << 20;
    config.limits.max_replay_bytes_total = 600;
    let server = TestServer::start(config).await;
    let mut ws = raw(&server).await;
    let session = welcome_of(&send(&mut ws, frame(1, hello())).await).session.expect("a session");
    let create = CreateEpisodes { tasks: vec![em_task()], options: EpisodeOptions::default() };
    assert!(matches!(send(&mut ws, frame(2, Request::CreateEpisodes(create))).await.msg, Response::EpisodesCreated(_)));
    for id in 3..=6 {
        assert!(matches!(send(&mut ws, frame(id, Request::Ping(Ping { nonce: id }))).await.msg, Response::Pong(_)));
    }
    drop(ws);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut ws = raw(&server).await;
    let resumed = welcome_of(&send(&mut ws, frame(10, resume(&session.token, vec![2, 6]))).await).resumed.unwrap();
    assert_eq!((resumed.replayed, resumed.resend), (1, vec![]));
    let mut got = [recv(&mut ws).await, recv(&mut ws).await];
    got.sort_by_key(|e| e.id);
    assert_eq!(err_of(&got[0]), (2, ErrorCode::ReplyLost));
    assert_eq!(got[1], Envelope::new(6, Response::Pong(Ping { nonce: 6 })));
    let http = server.http("");
    let addr = http.trim_start_matches("http://");
    assert!(gauge(addr, "grove_replay_pushed_out_for_memory_total").await.unwrap() >= 1);
    assert!(gauge(addr, "grove_replay_bytes").await.unwrap() <= 600 + 200);
}

/// RFC 6455 tells a normal closure from a drop: a client that closes with code 1000 says
/// goodbye, and its session ends at once (episodes closed, token forgotten) at the default
/// 60 s grace; a close with another code (here 4000, "I will be back") or no Close frame at all
/// waits for a reattach, and the episodes are there when it comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_normal_close_ends_the_session_at_once_and_a_drop_waits_for_a_reattach() {
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    let server = TestServer::start(ServerConfig::default()).await;
    let watcher = server.client().await;
    let live = || async { watcher.stats().await.unwrap().episodes_live };
    let create = Request::CreateEpisodes(CreateEpisodes {
        tasks: vec![em_task(), em_task()],
        options: EpisodeOptions::default(),
    });
    for (code, ends) in [(CloseCode::Normal, true), (CloseCode::from(4000), false)] {
        let mut ws = raw(&server).await;
        let token = welcome_of(&send(&mut ws, frame(1, hello())).await).session.unwrap().token;
        assert!(matches!(send(&mut ws, frame(2, create.clone())).await.msg, Response::EpisodesCreated(_)));
        assert_eq!(live().await, 2);
        ws.close(Some(CloseFrame { code, reason: "".into() })).await.unwrap();
        let mut waited = Duration::ZERO;
        while live().await != 0 && waited < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            waited += Duration::from_millis(50);
        }
        let mut again = raw(&server).await;
        let reply = send(&mut again, frame(1, resume(&token, vec![]))).await;
        if ends {
            assert_eq!(live().await, 0, "closed within a second of the goodbye");
            assert_eq!(err_of(&reply), (1, ErrorCode::SessionExpired), "the token is forgotten");
        } else {
            assert_eq!(live().await, 2, "{code:?} waits for a reattach");
            assert_eq!(welcome_of(&reply).session.unwrap().token, token, "and the reattach finds it");
            let close = Request::Close(Close { episodes: vec![] });
            assert!(matches!(send(&mut again, frame(2, close)).await.msg, Response::Closed(_)));
            again.close(None).await.unwrap();
            let mut waited = Duration::ZERO;
            while live().await != 0 && waited < Duration::from_secs(1) {
                tokio::time::sleep(Duration::from_millis(50)).await;
                waited += Duration::from_millis(50);
            }
            assert_eq!(live().await, 0, "a close without a code is a goodbye too");
        }
    }
    server.shutdown().await;
}
