//! Evaluating a model behind an OpenAI-compatible server: a real env-server over the synthetic
//! world, and a loopback HTTP/1.1 server speaking `/v1/chat/completions` with a scripted oracle.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use grove_datasets::synthetic::{SyntheticQuestion, World, WorldConfig};
use grove_tests::WorldServer;
use grove_trainer::rl::env::EnvClient;
use grove_trainer::workflows::openai::{
    Message, Mode, OpenAiError, OpenAiEvalConfig, OpenAiEvalError, OpenAiPolicy, evaluate_openai,
};
use grove_trainer::workflows::scripted::task_of;

/// A reply: status, extra headers, body.
type Reply = (u16, Vec<(&'static str, String)>, String);
/// Called with the request number (from 0) and the parsed JSON body.
type Handler = Arc<dyn Fn(usize, &Value) -> Reply + Send + Sync>;

/// A minimal HTTP/1.1 server on 127.0.0.1 answering every POST with `handler`.
struct FakeModel {
    url: String,
    hits: Arc<AtomicUsize>,
    _rt: tokio::runtime::Runtime,
}

impl FakeModel {
    fn start(handler: Handler) -> FakeModel {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        rt.spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else { return };
                let (handler, counter) = (handler.clone(), counter.clone());
                tokio::spawn(async move {
                    let Some((path, body)) = read_request(&mut sock).await else { return };
                    let (status, headers, text) = if path != "/v1/chat/completions" {
                        (404, Vec::new(), format!("no route {path}"))
                    } else {
                        match serde_json::from_slice::<Value>(&body) {
                            Ok(v) => handler(counter.fetch_add(1, Ordering::SeqCst), &v),
                            Err(e) => (400, Vec::new(), format!("bad json: {e}")),
                        }
                    };
                    let mut head = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
                        text.len()
                    );
                    for (k, v) in headers {
                        head.push_str(&format!("{k}: {v}\r\n"));
                    }
                    head.push_str("\r\n");
                    let _ = sock.write_all(head.as_bytes()).await;
                    let _ = sock.write_all(text.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        FakeModel { url, hits, _rt: rt }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// The request path and body (by `content-length`).
async fn read_request(sock: &mut tokio::net::TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let header_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_string();
    let path = head.lines().next()?.split_whitespace().nth(1)?.to_string();
    let len = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    while buf.len() < header_end + len {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some((path, buf[header_end..header_end + len].to_vec()))
}

fn completion(content: &str, finish: &str) -> String {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "oracle",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    })
    .to_string()
}

fn ok(content: &str) -> Reply {
    (200, Vec::new(), completion(content, "stop"))
}

/// The request must have the real shape; anything else is a 400 the evaluation would surface.
fn check_shape(req: &Value) -> Result<&Vec<Value>, Reply> {
    let bad = |why: &str| (400, Vec::new(), json!({"error": {"message": why}}).to_string());
    if req["model"] != "oracle" {
        return Err(bad("model"));
    }
    if req["stop"] != json!(["</search>", "</answer>"]) {
        return Err(bad("stop"));
    }
    if !req["temperature"].is_number() || !req["max_tokens"].is_number() {
        return Err(bad("sampling"));
    }
    let messages = req["messages"].as_array().ok_or_else(|| bad("messages"))?;
    if messages.is_empty() || messages.iter().any(|m| !m["role"].is_string() || !m["content"].is_string()) {
        return Err(bad("message shape"));
    }
    Ok(messages)
}

/// Per question text: the chain's entity names and the answer's name.
type Chains = HashMap<String, (Vec<String>, String)>;

fn chains_of(world: &World, questions: &[SyntheticQuestion]) -> Chains {
    questions
        .iter()
        .map(|q| {
            let names = q.chain.iter().map(|&e| world.entities[e].name.clone()).collect();
            (q.example.question.clone(), (names, world.entities[q.answer].name.clone()))
        })
        .collect()
}

fn lookup<'a>(chains: &'a Chains, prompt: &str) -> Option<&'a (Vec<String>, String)> {
    chains.iter().find(|(q, _)| prompt.contains(q.as_str())).map(|(_, c)| c)
}

/// Searches each entity of the chain in turn, then answers; the server strips the stop string.
fn agent_oracle(chains: Chains) -> Handler {
    Arc::new(move |_, req| {
        let messages = match check_shape(req) {
            Ok(m) => m,
            Err(reply) => return reply,
        };
        let prompt = messages[0]["content"].as_str().unwrap_or_default();
        let Some((names, answer)) = lookup(&chains, prompt) else {
            return (400, Vec::new(), "unknown question".into());
        };
        let turn = messages.iter().filter(|m| m["role"] == "assistant").count();
        // Every assistant turn so far was put back with its stop string, and every observation
        // came back as a user message.
        for (i, m) in messages.iter().enumerate().skip(1) {
            let content = m["content"].as_str().unwrap_or_default();
            let ok = if i % 2 == 1 {
                m["role"] == "assistant" && content.ends_with("</search>")
            } else {
                m["role"] == "user" && content.contains("<information>")
            };
            if !ok {
                return (400, Vec::new(), format!("unexpected message {i}: {m}"));
            }
        }
        if messages.last().map(|m| m["role"] != "user").unwrap_or(true) {
            return (400, Vec::new(), "last message is not the user's".into());
        }
        match names.get(turn) {
            Some(name) => ok(&format!("<think>I need {name}.</think>\n<search> {name} ")),
            None => ok(&format!("<think>Found it.</think>\n<answer> {answer} ")),
        }
    })
}

/// Answers at once, right or wrong; it must be asked not to search.
fn direct_oracle(chains: Chains, right: bool) -> Handler {
    Arc::new(move |_, req| {
        let messages = match check_shape(req) {
            Ok(m) => m,
            Err(reply) => return reply,
        };
        let prompt = messages[0]["content"].as_str().unwrap_or_default();
        if messages.len() != 1 || !prompt.contains("without searching") {
            return (400, Vec::new(), "not a direct prompt".into());
        }
        let Some((names, answer)) = lookup(&chains, prompt) else {
            return (400, Vec::new(), "unknown question".into());
        };
        let said = if right { answer.clone() } else { format!("{} junior", names[0]) };
        ok(&format!("<answer> {said} "))
    })
}

fn policy(url: &str) -> OpenAiPolicy {
    let mut p = OpenAiPolicy::new(format!("{url}/v1/"), "oracle");
    p.api_key = None;
    p.timeout = Duration::from_secs(20);
    p.retries = 2;
    p.backoff = Duration::from_millis(10);
    p
}

fn questions(world: &World) -> Vec<SyntheticQuestion> {
    let mut qs = world.questions(2, 6, 11);
    qs.extend(world.questions(3, 6, 11));
    qs
}

#[test]
fn oracle_agent_scores_one_with_one_search_per_hop() {
    let world = World::generate(&WorldConfig::default());
    let srv = WorldServer::start(&world);
    let qs = questions(&world);
    let model = FakeModel::start(agent_oracle(chains_of(&world, &qs)));
    let tasks: Vec<_> = qs.iter().map(task_of).collect();
    let config = OpenAiEvalConfig { max_turns: 4, concurrency: 4, ..Default::default() };
    let report = evaluate_openai(&policy(&model.url), &srv.url, Default::default(), &tasks, &config).unwrap();

    let all = &report["all"];
    assert_eq!(all.questions, 12);
    assert_eq!(all.answered, 12);
    assert!((all.score - 1.0).abs() < 1e-9, "{report:?}");
    for hops in [2usize, 3] {
        let s = &report[&format!("synthetic_{hops}hop")];
        assert_eq!(s.questions, 6);
        assert!((s.score - 1.0).abs() < 1e-9);
        assert!((s.tool_calls_per_question - hops as f64).abs() < 1e-9, "{report:?}");
    }
    assert!((all.tool_calls_per_question - 2.5).abs() < 1e-9);
    // One model call per search plus the answer.
    assert_eq!(model.hits(), 6 * 3 + 6 * 4);
    // The table prints like the native one.
    let table = grove_trainer::workflows::eval::format_report(&report);
    assert!(table.contains("synthetic_3hop") && table.contains("1.000"), "{table}");
    // Every episode was closed.
    let env = EnvClient::connect(&srv.url, Default::default()).unwrap();
    assert_eq!(env.block_on(env.client().stats()).unwrap().episodes_live, 0);
}

#[test]
fn direct_inference_right_and_wrong() {
    let world = World::generate(&WorldConfig::default());
    let srv = WorldServer::start(&world);
    let qs = questions(&world);
    let tasks: Vec<_> = qs.iter().map(task_of).collect();
    let config = OpenAiEvalConfig { mode: Mode::Direct, max_turns: 4, concurrency: 3, ..Default::default() };

    let right = FakeModel::start(direct_oracle(chains_of(&world, &qs), true));
    let report = evaluate_openai(&policy(&right.url), &srv.url, Default::default(), &tasks, &config).unwrap();
    let all = &report["all"];
    assert_eq!((all.questions, all.answered), (12, 12));
    assert!((all.score - 1.0).abs() < 1e-9, "{report:?}");
    assert_eq!(all.tool_calls_per_question, 0.0);
    assert_eq!(right.hits(), 12);

    let wrong = FakeModel::start(direct_oracle(chains_of(&world, &qs), false));
    let report = evaluate_openai(&policy(&wrong.url), &srv.url, Default::default(), &tasks, &config).unwrap();
    let all = &report["all"];
    assert_eq!((all.questions, all.answered), (12, 12));
    assert_eq!(all.score, 0.0, "{report:?}");
    assert_eq!(all.tool_calls_per_question, 0.0);
}

fn chat(p: &OpenAiPolicy) -> Result<String, OpenAiError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let http = p.http_client()?;
    rt.block_on(p.chat(&http, &[Message::new("user", "hello")])).map(|r| r.text)
}

#[test]
fn rate_limit_is_retried_after_the_servers_delay() {
    let model = FakeModel::start(Arc::new(|n, req| {
        if let Err(reply) = check_shape(req) {
            return reply;
        }
        if n == 0 {
            (429, vec![("retry-after", "1".to_string())], r#"{"error":"slow down"}"#.into())
        } else {
            ok("<answer> hi ")
        }
    }));
    let t = Instant::now();
    assert_eq!(chat(&policy(&model.url)).unwrap(), "<answer> hi </answer>");
    assert_eq!(model.hits(), 2);
    // Retry-After (1 s) won over the 10 ms backoff.
    assert!(t.elapsed() >= Duration::from_millis(950), "{:?}", t.elapsed());
}

#[test]
fn server_errors_exhaust_the_retries_with_a_typed_error() {
    let model = FakeModel::start(Arc::new(|_, _| (500, Vec::new(), "engine crashed: out of blocks".into())));
    match chat(&policy(&model.url)) {
        Err(OpenAiError::Http { status: 500, body }) => assert!(body.contains("out of blocks")),
        other => panic!("{other:?}"),
    }
    // One attempt plus two retries.
    assert_eq!(model.hits(), 3);

    // Through the evaluation: the whole evaluation fails, naming the question.
    let world = World::generate(&WorldConfig::default());
    let srv = WorldServer::start(&world);
    let tasks: Vec<_> = world.questions(2, 1, 5).iter().map(task_of).collect();
    let err =
        evaluate_openai(&policy(&model.url), &srv.url, Default::default(), &tasks, &Default::default()).unwrap_err();
    match err {
        OpenAiEvalError::Model { question, source: OpenAiError::Http { status: 500, .. } } => {
            assert_eq!(question, tasks[0].question)
        }
        other => panic!("{other:?}"),
    }
    // Its episode was closed all the same.
    let env = EnvClient::connect(&srv.url, Default::default()).unwrap();
    assert_eq!(env.block_on(env.client().stats()).unwrap().episodes_live, 0);
}

#[test]
fn malformed_replies_are_typed_errors_and_not_retried() {
    let model = FakeModel::start(Arc::new(|n, _| match n {
        0 => (200, Vec::new(), "{\"choices\": [".into()),
        1 => (200, Vec::new(), r#"{"choices": []}"#.into()),
        2 => (200, Vec::new(), r#"{"choices": [{"message": 42}]}"#.into()),
        _ => (400, Vec::new(), "bad request: unknown field".into()),
    }));
    let p = policy(&model.url);
    assert!(matches!(chat(&p), Err(OpenAiError::MalformedJson { .. })));
    assert!(matches!(chat(&p), Err(OpenAiError::EmptyChoices)));
    assert!(matches!(chat(&p), Err(OpenAiError::MalformedJson { .. })));
    assert!(matches!(chat(&p), Err(OpenAiError::Http { status: 400, .. })));
    // None was retried.
    assert_eq!(model.hits(), 4);
}

#[test]
fn a_hung_server_times_out() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut p = policy(&format!("http://{}", listener.local_addr().unwrap()));
    p.timeout = Duration::from_millis(300);
    p.retries = 1;
    // Connections are accepted by the kernel backlog and never answered.
    assert!(matches!(chat(&p), Err(OpenAiError::Timeout(_))));
    drop(listener);
}
