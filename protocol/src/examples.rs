//! One example of every request and response variant, used by the round-trip and golden-byte
//! tests and by clients in other languages that check their decoders against ours.
//!
//! The examples tell one session, and PROTOCOL.md walks through it: a request and the reply with
//! the same id belong together, and each reply is what the server would answer given the requests
//! before it (`error` excepted: it answers a request sent before `Hello`; `hello_resume` and
//! `welcome_resumed` are the reattach of a connection that dropped with requests 3 and 5
//! unanswered).

use crate::error::{ErrorCode, ErrorInfo};
use crate::forest::*;
use crate::messages::*;

fn task() -> TaskSpec {
    TaskSpec {
        question: "who designed the harbor bridge in port elmsworth?".into(),
        golden_answers: vec!["Ada Kerrigan".into(), "A. Kerrigan".into()],
        data_source: "nq".into(),
        task_id: Some("train_0".into()),
        metric: Some(Metric::Em),
    }
}

/// The default prompt rendered for [`task`], elided in the middle.
const PROMPT: &str = "Answer the question below. ... Question: who designed the harbor bridge in port elmsworth?\n";

/// What the first search of episode 1 returns with `topk` 1 over the sample corpus
/// (`fuzz/seeds/qa_loaders/wiki18-sample.jsonl`).
const BRIDGE_DOCS: &str = "\n\n<information>Doc 1(Title: \"Elmsworth Harbor Bridge\") The Elmsworth Harbor Bridge \
is a steel arch bridge in Port Elmsworth. It was designed by the engineer Ada Kerrigan and opened in 1902 after six \
years of construction.</information>\n\n";

/// What its second search (the tool call) returns.
const KERRIGAN_DOCS: &str = "\n\n<information>Doc 1(Title: \"Ada Kerrigan\") Ada Kerrigan (1861-1939) was a civil \
engineer born in Tollmouth. She studied at the Quill Institute of Technology and is best known for the Elmsworth \
Harbor Bridge.</information>\n\n";

fn lineage() -> Lineage {
    Lineage { root: 1, parent: Some(1), depth: 1, fork_step: Some(2) }
}

fn reward() -> Reward {
    Reward {
        score: 1.0,
        metric: Metric::Em,
        metric_value: 1.0,
        answer: Some("Ada Kerrigan".into()),
        format_valid: true,
    }
}

/// Named examples of every [`Request`] variant (and of both [`Action`] forms).
pub fn requests() -> Vec<(&'static str, Envelope<Request>)> {
    let mut args = serde_json::Map::new();
    args.insert("query".into(), "Ada Kerrigan".into());
    vec![
        (
            "hello",
            Envelope::new(
                1,
                Request::Hello(Hello {
                    protocol_version: crate::PROTOCOL_VERSION,
                    client: "grove-trainer/0.1".into(),
                    resume: None,
                }),
            ),
        ),
        (
            "hello_resume",
            Envelope::new(
                6,
                Request::Hello(Hello {
                    protocol_version: crate::PROTOCOL_VERSION,
                    client: "grove-trainer/0.1".into(),
                    resume: Some(Resume { token: "5f0c9a4e2b7d4c1e8a3f6b2d9e0c7a15".into(), pending: vec![3, 5] }),
                }),
            ),
        ),
        (
            "create_episodes",
            Envelope::new(
                2,
                Request::CreateEpisodes(CreateEpisodes {
                    tasks: vec![task(), task()],
                    options: EpisodeOptions { max_turns: Some(3), topk: Some(1), backend: None, prompt_template: None },
                }),
            ),
        ),
        (
            "step_text",
            Envelope::new(
                3,
                Request::Step(Step {
                    actions: vec![
                        StepAction {
                            episode: 1,
                            action: Action::Text(
                                "<think>I need the designer.</think>\n<search> Elmsworth harbor bridge </search>"
                                    .into(),
                            ),
                            data: None,
                        },
                        StepAction {
                            episode: 2,
                            action: Action::Text("<think>I know this.</think>\n<answer> Ada Kerrigan </answer>".into()),
                            data: None,
                        },
                        StepAction {
                            episode: 99,
                            action: Action::Text("<answer> Ada Kerrigan </answer>".into()),
                            data: None,
                        },
                    ],
                }),
            ),
        ),
        (
            "step_tool",
            Envelope::new(
                4,
                Request::Step(Step {
                    actions: vec![StepAction {
                        episode: 1,
                        action: Action::Tool(ToolCall { name: "search".into(), arguments: args }),
                        data: None,
                    }],
                }),
            ),
        ),
        ("fork", Envelope::new(5, Request::Fork(Fork { forks: vec![ForkSpec { episode: 1, at_step: 2, n: 3 }] }))),
        ("close", Envelope::new(6, Request::Close(Close { episodes: vec![1, 99] }))),
        ("get_transcript", Envelope::new(7, Request::GetTranscript(GetTranscript { episode: 3 }))),
        ("stats", Envelope::new(8, Request::Stats)),
        (
            "join_forest",
            Envelope::new(
                11,
                Request::JoinForest(JoinForest {
                    key: "step-12/uid-3f2a".into(),
                    shape: ForestShape { m: 2, n: 2, l: 1, k: 3 },
                    seed: 7,
                    task: task(),
                    options: EpisodeOptions { max_turns: Some(3), ..Default::default() },
                }),
            ),
        ),
        (
            "step_with_data",
            Envelope::new(
                12,
                Request::Step(Step {
                    actions: vec![StepAction {
                        episode: 7,
                        action: Action::Text("<search> Ada Kerrigan </search>".into()),
                        data: Some(StepData(vec![0x82, 0xa3, b'i', b'd', b's', 0x91, 0x05])),
                    }],
                }),
            ),
        ),
        ("ping", Envelope::new(9, Request::Ping(Ping { nonce: 42 }))),
    ]
}

/// The Welcome of the examples' session; `resumed` after a reattach.
fn welcome(resumed: Option<Resumed>) -> Welcome {
    Welcome {
        protocol_version: crate::PROTOCOL_VERSION,
        server: "grove-env-server/0.1.0".into(),
        limits: Limits {
            max_frame_bytes: 1 << 20,
            max_episodes_per_connection: 4096,
            max_episodes_total: 65536,
            max_batch: 4096,
            max_forks_per_request: 4096,
            max_action_chars: 16384,
            max_query_chars: 1024,
            max_turns: 3,
            idle_timeout_ms: 600_000,
            connection_idle_ms: 900_000,
            heartbeat_ms: 15_000,
            max_in_flight: 1024,
            max_step_data_bytes: 262_144,
            max_forest_rows: 64,
            max_forests: 4096,
            forest_timeout_ms: 600_000,
        },
        session: Some(Session { token: "5f0c9a4e2b7d4c1e8a3f6b2d9e0c7a15".into(), grace_ms: 60_000 }),
        resumed,
    }
}

/// Named examples of every [`Response`] variant, including per-item errors.
pub fn responses() -> Vec<(&'static str, Envelope<Response>)> {
    vec![
        ("welcome", Envelope::new(1, Response::Welcome(welcome(None)))),
        (
            "welcome_resumed",
            Envelope::new(6, Response::Welcome(welcome(Some(Resumed { replayed: 1, resend: vec![5] })))),
        ),
        (
            "episodes_created",
            Envelope::new(
                2,
                Response::EpisodesCreated(EpisodesCreated {
                    episodes: vec![
                        Ok(EpisodeStart { episode: 1, prompt: PROMPT.into(), max_turns: 3 }),
                        Ok(EpisodeStart { episode: 2, prompt: PROMPT.into(), max_turns: 3 }),
                    ],
                }),
            ),
        ),
        (
            "stepped",
            Envelope::new(
                3,
                Response::Stepped(Stepped {
                    results: vec![
                        Ok(Observation {
                            episode: 1,
                            step: 1,
                            kind: ActionKind::Search,
                            text: BRIDGE_DOCS.into(),
                            done: false,
                            forced_final: false,
                            turns_left: 2,
                            reward: None,
                            error: None,
                        }),
                        Ok(Observation {
                            episode: 2,
                            step: 1,
                            kind: ActionKind::Answer,
                            text: String::new(),
                            done: true,
                            forced_final: false,
                            turns_left: 2,
                            reward: Some(reward()),
                            error: None,
                        }),
                        Err(ErrorInfo::for_episode(ErrorCode::UnknownEpisode, 99, "no episode 99")),
                    ],
                }),
            ),
        ),
        (
            "forked",
            Envelope::new(
                5,
                Response::Forked(Forked {
                    results: vec![Ok(ForkResult {
                        parent: 1,
                        at_step: 2,
                        children: vec![3, 4, 5],
                        lineage: lineage(),
                    })],
                }),
            ),
        ),
        (
            "closed",
            Envelope::new(
                6,
                Response::Closed(Closed {
                    results: vec![Ok(1), Err(ErrorInfo::for_episode(ErrorCode::UnknownEpisode, 99, "no episode 99"))],
                }),
            ),
        ),
        (
            "transcript",
            Envelope::new(
                7,
                Response::Transcript(Transcript {
                    episode: 3,
                    task: task(),
                    prompt: PROMPT.into(),
                    lineage: lineage(),
                    status: EpisodeStatus::Active,
                    steps: vec![
                        TranscriptStep {
                            action: "<think>I need the designer.</think>\n<search> Elmsworth harbor bridge </search>"
                                .into(),
                            kind: ActionKind::Search,
                            content: "Elmsworth harbor bridge".into(),
                            observation: BRIDGE_DOCS.into(),
                            data: None,
                        },
                        TranscriptStep {
                            action: "<search> Ada Kerrigan </search>".into(),
                            kind: ActionKind::Search,
                            content: "Ada Kerrigan".into(),
                            observation: KERRIGAN_DOCS.into(),
                            data: None,
                        },
                    ],
                    reward: None,
                }),
            ),
        ),
        (
            "stats",
            Envelope::new(
                8,
                Response::Stats(ServerStats {
                    episodes_live: 4,
                    episodes_created: 5,
                    episodes_closed: 1,
                    episodes_reaped: 0,
                    steps: 3,
                    forks: 3,
                    searches: 2,
                    connections: 1,
                    uptime_ms: 12_345,
                    forests_live: 0,
                    forests_finished: 0,
                    forests_expired: 0,
                    providers: Default::default(),
                }),
            ),
        ),
        ("pong", Envelope::new(9, Response::Pong(Ping { nonce: 42 }))),
        (
            "forest_joined",
            Envelope::new(
                11,
                Response::ForestJoined(ForestRole {
                    key: "step-12/uid-3f2a".into(),
                    row: 2,
                    tree: 0,
                    round: 1,
                    episode: 7,
                    prompt: PROMPT.into(),
                    max_turns: 3,
                    from: Some(ForestNode { episode: 5, step: 1 }),
                    prefix: vec![PrefixStep {
                        action: "<search> Elmsworth harbor bridge </search>".into(),
                        observation: BRIDGE_DOCS.into(),
                        data: Some(StepData(vec![0x82, 0xa3, b'i', b'd', b's', 0x91, 0x2a])),
                    }],
                }),
            ),
        ),
        ("error", Envelope::new(10, Response::Error(ErrorInfo::new(ErrorCode::HandshakeRequired, "send Hello first")))),
    ]
}

/// The variant name of a request; exhaustive, so a new variant must be named here.
pub fn request_variant(r: &Request) -> &'static str {
    match r {
        Request::Hello(_) => "Hello",
        Request::CreateEpisodes(_) => "CreateEpisodes",
        Request::Step(_) => "Step",
        Request::Fork(_) => "Fork",
        Request::Close(_) => "Close",
        Request::GetTranscript(_) => "GetTranscript",
        Request::Stats => "Stats",
        Request::Ping(_) => "Ping",
        Request::JoinForest(_) => "JoinForest",
    }
}

/// The variant name of a response; exhaustive, so a new variant must be named here.
pub fn response_variant(r: &Response) -> &'static str {
    match r {
        Response::Welcome(_) => "Welcome",
        Response::EpisodesCreated(_) => "EpisodesCreated",
        Response::Stepped(_) => "Stepped",
        Response::Forked(_) => "Forked",
        Response::Closed(_) => "Closed",
        Response::Transcript(_) => "Transcript",
        Response::Stats(_) => "Stats",
        Response::Pong(_) => "Pong",
        Response::Error(_) => "Error",
        Response::ForestJoined(_) => "ForestJoined",
    }
}

/// All request variant names.
pub const REQUEST_VARIANTS: [&str; 9] =
    ["Hello", "CreateEpisodes", "Step", "Fork", "Close", "GetTranscript", "Stats", "Ping", "JoinForest"];
/// All response variant names.
pub const RESPONSE_VARIANTS: [&str; 10] = [
    "Welcome",
    "EpisodesCreated",
    "Stepped",
    "Forked",
    "Closed",
    "Transcript",
    "Stats",
    "Pong",
    "Error",
    "ForestJoined",
];
