//! One example of every request and response variant, used by the round-trip and golden-byte
//! tests and by clients in other languages that check their decoders against ours.

use crate::error::{ErrorCode, ErrorInfo};
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
    args.insert("query".into(), "Elmsworth harbor bridge".into());
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
                1,
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
                    tasks: vec![task()],
                    options: EpisodeOptions { max_turns: Some(3), topk: Some(3), backend: None, prompt_template: None },
                }),
            ),
        ),
        (
            "step_text",
            Envelope::new(
                3,
                Request::Step(Step {
                    actions: vec![StepAction {
                        episode: 1,
                        action: Action::Text(
                            "<think>I need the designer.</think>\n<search> Elmsworth harbor bridge </search>".into(),
                        ),
                    }],
                }),
            ),
        ),
        (
            "step_tool",
            Envelope::new(
                4,
                Request::Step(Step {
                    actions: vec![StepAction {
                        episode: 2,
                        action: Action::Tool(ToolCall { name: "search".into(), arguments: args }),
                    }],
                }),
            ),
        ),
        ("fork", Envelope::new(5, Request::Fork(Fork { forks: vec![ForkSpec { episode: 1, at_step: 2, n: 3 }] }))),
        ("close", Envelope::new(6, Request::Close(Close { episodes: vec![1, 2] }))),
        ("get_transcript", Envelope::new(7, Request::GetTranscript(GetTranscript { episode: 1 }))),
        ("stats", Envelope::new(8, Request::Stats)),
        ("ping", Envelope::new(9, Request::Ping(Ping { nonce: 42 }))),
    ]
}

/// Named examples of every [`Response`] variant, including per-item errors.
pub fn responses() -> Vec<(&'static str, Envelope<Response>)> {
    vec![
        (
            "welcome",
            Envelope::new(
                1,
                Response::Welcome(Welcome {
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
                    },
                    session: Some(Session { token: "5f0c9a4e2b7d4c1e8a3f6b2d9e0c7a15".into(), grace_ms: 60_000 }),
                    resumed: None,
                }),
            ),
        ),
        (
            "welcome_resumed",
            Envelope::new(
                1,
                Response::Welcome(Welcome {
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
                    },
                    session: Some(Session { token: "5f0c9a4e2b7d4c1e8a3f6b2d9e0c7a15".into(), grace_ms: 60_000 }),
                    resumed: Some(Resumed { replayed: 1, resend: vec![5] }),
                }),
            ),
        ),
        (
            "episodes_created",
            Envelope::new(
                2,
                Response::EpisodesCreated(EpisodesCreated {
                    episodes: vec![
                        Ok(EpisodeStart {
                            episode: 1,
                            prompt: "Answer the given question. ... Question: who designed the harbor bridge?\n"
                                .into(),
                            max_turns: 3,
                        }),
                        Err(ErrorInfo::new(ErrorCode::TooManyEpisodes, "connection holds 4096 episodes")),
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
                            text: "\n\n<information>Doc 1(Title: \"Ada Kerrigan\") Ada Kerrigan was a civil engineer.\n</information>\n\n".into(),
                            done: false,
                            forced_final: false,
                            turns_left: 2,
                            reward: None,
                            error: None,
                        }),
                        Ok(Observation {
                            episode: 3,
                            step: 2,
                            kind: ActionKind::Answer,
                            text: String::new(),
                            done: true,
                            forced_final: false,
                            turns_left: 1,
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
                    results: vec![Ok(ForkResult { parent: 1, at_step: 2, children: vec![4, 5, 6], lineage: lineage() })],
                }),
            ),
        ),
        (
            "closed",
            Envelope::new(
                6,
                Response::Closed(Closed {
                    results: vec![Ok(1), Err(ErrorInfo::for_episode(ErrorCode::UnknownEpisode, 2, "no episode 2"))],
                }),
            ),
        ),
        (
            "transcript",
            Envelope::new(
                7,
                Response::Transcript(Transcript {
                    episode: 4,
                    task: task(),
                    prompt: "Answer the given question. ...".into(),
                    lineage: lineage(),
                    status: EpisodeStatus::Done,
                    steps: vec![TranscriptStep {
                        action: "<answer> Ada Kerrigan </answer>".into(),
                        kind: ActionKind::Answer,
                        content: "Ada Kerrigan".into(),
                        observation: String::new(),
                    }],
                    reward: Some(reward()),
                }),
            ),
        ),
        (
            "stats",
            Envelope::new(
                8,
                Response::Stats(ServerStats {
                    episodes_live: 3,
                    episodes_created: 5,
                    episodes_closed: 2,
                    episodes_reaped: 0,
                    steps: 17,
                    forks: 3,
                    searches: 11,
                    connections: 1,
                    uptime_ms: 12_345,
                    providers: Default::default(),
                }),
            ),
        ),
        ("pong", Envelope::new(9, Response::Pong(Ping { nonce: 42 }))),
        (
            "error",
            Envelope::new(
                10,
                Response::Error(ErrorInfo::new(ErrorCode::HandshakeRequired, "send Hello first")),
            ),
        ),
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
    }
}

/// All request variant names.
pub const REQUEST_VARIANTS: [&str; 8] =
    ["Hello", "CreateEpisodes", "Step", "Fork", "Close", "GetTranscript", "Stats", "Ping"];
/// All response variant names.
pub const RESPONSE_VARIANTS: [&str; 9] =
    ["Welcome", "EpisodesCreated", "Stepped", "Forked", "Closed", "Transcript", "Stats", "Pong", "Error"];
