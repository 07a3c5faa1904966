//! Evaluate a model served by any OpenAI-compatible server (vLLM, SGLang, llama.cpp server) as a
//! ReAct search agent through an env-server, producing the same [`EvalReport`] as the native
//! evaluation in [`crate::workflows::eval`].
//!
//! Agent mode: one env episode per question; the conversation starts with the env-server's prompt
//! as the user message; each model reply (with the stop string the server stripped put back) is
//! stepped in the env, and the observation becomes the next user message, until the env ends the
//! episode (an answer, or its forced final turn).
//!
//! Direct mode (the paper's "direct inference"): one model call with a prompt asking for the
//! answer inside `<answer></answer>` without searching; the extracted answer is stepped in the
//! env as `<answer> ... </answer>`, so the env-server scores it exactly as it scores agents.
//!
//! A question whose model calls still fail after the retries fails the whole evaluation with a
//! typed [`OpenAiEvalError::Model`] naming the question (the rest are cancelled).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use grove_protocol::client::{Client, ClientError, ClientOptions};
use grove_protocol::{ActionKind, EpisodeOptions, ErrorInfo, TaskSpec};

use crate::workflows::eval::{EvalReport, QuestionScore, report};

/// The stop sequences of the Search-R1 tag grammar; servers strip them from the returned text.
pub const STOP: [&str; 2] = ["</search>", "</answer>"];

/// The default direct-inference prompt (a `{question}` placeholder, as the env-server expects).
pub const DIRECT_PROMPT: &str = "Answer the question below directly, without searching and without \
explanation. Write only the final answer between <answer> and </answer>, for example \
<answer> Beijing </answer>.\nQuestion: {question}\n";

/// How much of an error body is kept in an error.
const BODY_EXCERPT: usize = 500;

/// A chat completion's reply is read up to this many bytes.
const MAX_REPLY_BYTES: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum OpenAiError {
    #[error("cannot build the HTTP client: {0}")]
    Build(String),
    #[error("HTTP {status} from the model server: {body}")]
    Http { status: u16, body: String },
    #[error("model server timed out after {0:?}")]
    Timeout(Duration),
    #[error("cannot reach the model server: {0}")]
    Transport(String),
    #[error("malformed JSON from the model server ({error}): {body}")]
    MalformedJson { error: String, body: String },
    #[error("the model server returned no choices")]
    EmptyChoices,
    #[error("the model server's reply is larger than {0} bytes")]
    TooLarge(usize),
}

#[derive(Debug, thiserror::Error)]
pub enum OpenAiEvalError {
    #[error("env-server: {0}")]
    Client(#[from] ClientError),
    #[error("env-server refused: {0}")]
    Env(ErrorInfo),
    #[error(transparent)]
    Http(OpenAiError),
    #[error("model call failed on question {question:?}: {source}")]
    Model {
        question: String,
        #[source]
        source: OpenAiError,
    },
    #[error("cannot start the evaluation runtime: {0}")]
    Runtime(std::io::Error),
    #[error("evaluation task failed: {0}")]
    Join(String),
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Self { role: role.to_string(), content: content.into() }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub total_tokens: u64,
}

/// What one chat call returned (the first choice).
#[derive(Debug, Clone, PartialEq)]
pub struct ChatReply {
    /// The text with the stop string put back when the server cut it at one.
    pub text: String,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
}

#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: &'a [Message],
    temperature: f64,
    max_tokens: usize,
    stop: [&'static str; 2],
}

#[derive(Deserialize)]
struct ChatResponse {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    message: Option<ReplyMessage>,
    #[serde(default)]
    finish_reason: Option<String>,
    /// vLLM / SGLang: the stop string that ended the text (a string), or a token id (a number).
    #[serde(default)]
    stop_reason: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct ReplyMessage {
    #[serde(default)]
    content: Option<String>,
}

/// A model behind an OpenAI-compatible `/v1/chat/completions` endpoint.
#[derive(Clone)]
pub struct OpenAiPolicy {
    /// With or without a trailing `/v1`.
    pub base_url: String,
    /// The served model's name.
    pub model: String,
    /// Sent as `Authorization: Bearer`; never logged.
    pub api_key: Option<String>,
    pub temperature: f64,
    pub max_tokens: usize,
    /// Per request.
    pub timeout: Duration,
    /// Extra attempts after the first on 429, 5xx, timeouts and connection errors.
    pub retries: u32,
    /// First backoff; doubled on every retry (a `Retry-After` in seconds wins).
    pub backoff: Duration,
}

impl std::fmt::Debug for OpenAiPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiPolicy")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("temperature", &self.temperature)
            .field("max_tokens", &self.max_tokens)
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .field("backoff", &self.backoff)
            .finish()
    }
}

impl OpenAiPolicy {
    /// Greedy, 500 tokens, 120 s, 3 retries; the API key from `OPENAI_API_KEY` when set.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            api_key: std::env::var("OPENAI_API_KEY").ok().filter(|k| !k.is_empty()),
            temperature: 0.0,
            max_tokens: 500,
            timeout: Duration::from_secs(120),
            retries: 3,
            backoff: Duration::from_millis(500),
        }
    }

    /// `{base}/v1/chat/completions`, whether or not `base_url` already ends in `/v1`.
    pub fn endpoint(&self) -> String {
        let base = self.base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        format!("{base}/v1/chat/completions")
    }

    /// The HTTP client this policy's calls use.
    pub fn http_client(&self) -> Result<reqwest::Client, OpenAiError> {
        grove_http::install_tls_provider();
        reqwest::Client::builder().timeout(self.timeout).build().map_err(|e| OpenAiError::Build(e.to_string()))
    }

    /// One chat completion under Grove's outbound HTTP policy: each attempt within `timeout`,
    /// retried on 429 / 5xx / timeouts / connection errors (a `Retry-After` up to 300 s wins over
    /// the backoff), the reply read up to 16 MiB, the API key blanked out of every error.
    pub async fn chat(&self, http: &reqwest::Client, messages: &[Message]) -> Result<ChatReply, OpenAiError> {
        let body = ChatRequest {
            model: &self.model,
            messages,
            temperature: self.temperature,
            max_tokens: self.max_tokens,
            stop: STOP,
        };
        let max_wait = Duration::from_secs(300);
        let policy = grove_http::Policy {
            deadline: (self.timeout + max_wait).saturating_mul(self.retries + 1),
            attempt_timeout: Some(self.timeout),
            retries: self.retries,
            backoff: self.backoff,
            max_retry_after: max_wait,
            max_body: MAX_REPLY_BYTES,
            overflow: grove_http::Overflow::Fail,
        };
        let secrets: Vec<String> = self.api_key.iter().cloned().collect();
        let endpoint = self.endpoint();
        let reply = grove_http::send(&policy, &secrets, |attempt| {
            let mut req = http.post(&endpoint).json(&body);
            if let Some(key) = &self.api_key {
                req = req.bearer_auth(key);
            }
            if attempt > 0 {
                tracing::warn!(attempt, "model call failed, retrying");
            }
            async move { Ok((req, ())) }
        })
        .await
        .and_then(grove_http::Reply::error_for_status)
        .map_err(|e| match e {
            grove_http::HttpError::Unreachable(m) => OpenAiError::Transport(m),
            grove_http::HttpError::Timeout(_) => OpenAiError::Timeout(self.timeout),
            grove_http::HttpError::Status { status, body } => OpenAiError::Http { status, body },
            grove_http::HttpError::TooLarge { limit } => OpenAiError::TooLarge(limit),
            grove_http::HttpError::Request(m) => OpenAiError::Build(m),
        })?;
        parse_reply(&reply.body)
    }
}

fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    match text.char_indices().nth(BODY_EXCERPT) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.into_owned(),
    }
}

/// Parse a `/v1/chat/completions` response body; put back a stop string the server stripped.
pub fn parse_reply(bytes: &[u8]) -> Result<ChatReply, OpenAiError> {
    let resp: ChatResponse = serde_json::from_slice(bytes)
        .map_err(|e| OpenAiError::MalformedJson { error: e.to_string(), body: excerpt(bytes) })?;
    let choice = resp.choices.into_iter().next().ok_or(OpenAiError::EmptyChoices)?;
    let mut text = choice.message.and_then(|m| m.content).unwrap_or_default();
    let stopped_at = match &choice.stop_reason {
        Some(serde_json::Value::String(s)) => STOP.iter().find(|x| **x == s.as_str()).copied(),
        _ => None,
    };
    let stopped_at =
        stopped_at.or_else(|| if choice.finish_reason.as_deref() == Some("stop") { unclosed_tag(&text) } else { None });
    if let Some(stop) = stopped_at
        && !text.ends_with(stop)
    {
        text.push_str(stop);
    }
    Ok(ChatReply { text, finish_reason: choice.finish_reason, usage: resp.usage })
}

/// The closing tag a text cut at a stop sequence is missing: the `<search>` or `<answer>` opened
/// last and not closed after it.
fn unclosed_tag(text: &str) -> Option<&'static str> {
    let open = |tag: &str, close: &str| {
        let o = text.rfind(tag)?;
        match text.rfind(close) {
            Some(c) if c > o => None,
            _ => Some(o),
        }
    };
    match (open("<search>", "</search>"), open("<answer>", "</answer>")) {
        (Some(s), Some(a)) => Some(if s > a { "</search>" } else { "</answer>" }),
        (Some(_), None) => Some("</search>"),
        (None, Some(_)) => Some("</answer>"),
        (None, None) => None,
    }
}

/// ReAct agent with search, or direct inference without tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Agent,
    Direct,
}

/// What the evaluation asks of the env-server and how many questions run at once.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiEvalConfig {
    pub mode: Mode,
    pub max_turns: u32,
    /// Agent prompt with a `{question}` placeholder; `None`: the env-server's default in agent
    /// mode, [`DIRECT_PROMPT`] in direct mode.
    pub prompt_template: Option<String>,
    pub topk: Option<u32>,
    pub concurrency: usize,
}

impl Default for OpenAiEvalConfig {
    fn default() -> Self {
        Self { mode: Mode::Agent, max_turns: 3, prompt_template: None, topk: None, concurrency: 8 }
    }
}

/// One question's outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QuestionOutcome {
    /// The env's pure EM / F1 of the final answer (0 without one).
    pub metric: f64,
    pub tool_calls: u64,
    pub answered: bool,
    pub usage: Usage,
}

/// Evaluate `tasks` against the env-server at `env_url` (blocking; builds its own runtime).
pub fn evaluate_openai(
    policy: &OpenAiPolicy,
    env_url: &str,
    env_options: ClientOptions,
    tasks: &[TaskSpec],
    config: &OpenAiEvalConfig,
) -> Result<EvalReport, OpenAiEvalError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(OpenAiEvalError::Runtime)?;
    rt.block_on(async {
        let client = Arc::new(Client::connect(env_url, env_options).await?);
        evaluate_openai_async(policy, client, tasks, config).await
    })
}

/// Evaluate `tasks` with up to `config.concurrency` questions in flight.
pub async fn evaluate_openai_async(
    policy: &OpenAiPolicy,
    client: Arc<Client>,
    tasks: &[TaskSpec],
    config: &OpenAiEvalConfig,
) -> Result<EvalReport, OpenAiEvalError> {
    let http = policy.http_client().map_err(OpenAiEvalError::Http)?;
    let policy = Arc::new(policy.clone());
    let config = Arc::new(config.clone());
    let permits = Arc::new(tokio::sync::Semaphore::new(config.concurrency.max(1)));
    let mut set = tokio::task::JoinSet::new();
    for (i, task) in tasks.iter().enumerate() {
        let (policy, config, client, http, permits) =
            (policy.clone(), config.clone(), client.clone(), http.clone(), permits.clone());
        let task = task.clone();
        set.spawn(async move {
            let _permit = permits.acquire_owned().await.map_err(|e| OpenAiEvalError::Join(e.to_string()))?;
            let outcome = run_question(&policy, &http, &client, &task, &config).await?;
            Ok::<_, OpenAiEvalError>((i, outcome))
        });
    }
    let mut outcomes = vec![QuestionOutcome::default(); tasks.len()];
    while let Some(joined) = set.join_next().await {
        let (i, outcome) = joined.map_err(|e| OpenAiEvalError::Join(e.to_string()))??;
        outcomes[i] = outcome;
    }
    let usage = outcomes.iter().fold(Usage::default(), |mut u, o| {
        u.prompt_tokens += o.usage.prompt_tokens;
        u.completion_tokens += o.usage.completion_tokens;
        u.total_tokens += o.usage.total_tokens;
        u
    });
    tracing::info!(
        questions = tasks.len(),
        prompt_tokens = usage.prompt_tokens,
        completion_tokens = usage.completion_tokens,
        "openai evaluation done"
    );
    Ok(report_of(tasks, &outcomes))
}

/// Aggregate per data source and `"all"`: the report [`crate::workflows::eval::evaluate`] makes too.
pub fn report_of(tasks: &[TaskSpec], outcomes: &[QuestionOutcome]) -> EvalReport {
    let scores =
        outcomes.iter().map(|o| QuestionScore { metric: o.metric, tool_calls: o.tool_calls, answered: o.answered });
    report(tasks.iter().map(|t| t.data_source.as_str()).zip(scores))
}

/// Play one question; the episode is closed whatever happens.
pub async fn run_question(
    policy: &OpenAiPolicy,
    http: &reqwest::Client,
    client: &Client,
    task: &TaskSpec,
    config: &OpenAiEvalConfig,
) -> Result<QuestionOutcome, OpenAiEvalError> {
    let template = match config.mode {
        Mode::Agent => config.prompt_template.clone(),
        Mode::Direct => Some(config.prompt_template.clone().unwrap_or_else(|| DIRECT_PROMPT.to_string())),
    };
    let opts = EpisodeOptions {
        max_turns: Some(config.max_turns),
        prompt_template: template,
        topk: config.topk,
        ..Default::default()
    };
    let start = match client.create_episodes(vec![task.clone()], opts).await?.into_iter().next() {
        Some(Ok(s)) => s,
        Some(Err(e)) => return Err(OpenAiEvalError::Env(e)),
        None => return Err(OpenAiEvalError::Client(ClientError::Closed)),
    };
    let played = play(policy, http, client, start.episode, start.prompt, config).await;
    // Best effort: a failed close must not hide the question's own outcome or error.
    let _ = client.close(vec![start.episode]).await;
    played.map_err(|e| match e {
        OpenAiEvalError::Http(source) => OpenAiEvalError::Model { question: task.question.clone(), source },
        other => other,
    })
}

async fn play(
    policy: &OpenAiPolicy,
    http: &reqwest::Client,
    client: &Client,
    episode: grove_protocol::EpisodeId,
    prompt: String,
    config: &OpenAiEvalConfig,
) -> Result<QuestionOutcome, OpenAiEvalError> {
    let mut out = QuestionOutcome::default();
    let mut messages = vec![Message::new("user", prompt)];
    // The env ends an episode by its forced final turn after `max_turns` tool turns; the cap only
    // guards against a server that never ends one.
    let cap = 2 * (config.max_turns as usize + 1);
    for _ in 0..cap {
        let reply = policy.chat(http, &messages).await.map_err(OpenAiEvalError::Http)?;
        if let Some(u) = reply.usage {
            out.usage.prompt_tokens += u.prompt_tokens;
            out.usage.completion_tokens += u.completion_tokens;
            out.usage.total_tokens += u.total_tokens;
        }
        let action = match config.mode {
            Mode::Agent => reply.text,
            Mode::Direct => {
                let answer = grove_datasets::metrics::extract_answer_from_response(&reply.text)
                    .unwrap_or_else(|| reply.text.trim().to_string());
                format!("<answer> {answer} </answer>")
            }
        };
        let obs = client.step_text(episode, &action).await?;
        if obs.kind == ActionKind::Search && !obs.forced_final {
            out.tool_calls += 1;
        }
        if obs.done || config.mode == Mode::Direct {
            out.answered = obs.done && obs.kind == ActionKind::Answer;
            out.metric = obs.reward.as_ref().map(|r| r.metric_value).unwrap_or(0.0);
            return Ok(out);
        }
        messages.push(Message::new("assistant", action));
        messages.push(Message::new("user", obs.text));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_with_or_without_v1() {
        for base in ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"] {
            assert_eq!(OpenAiPolicy::new(base, "m").endpoint(), "http://h:1/v1/chat/completions");
        }
    }

    #[test]
    fn stop_string_is_put_back() {
        let body = br#"{"choices":[{"message":{"role":"assistant","content":"<think>x</think> <search> a b"},"finish_reason":"stop"}]}"#;
        assert_eq!(parse_reply(body).unwrap().text, "<think>x</think> <search> a b</search>");
        let body = br#"{"choices":[{"message":{"content":"<search> q </search> <answer> a"},"finish_reason":"stop","stop_reason":"</answer>"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#;
        let r = parse_reply(body).unwrap();
        assert_eq!(r.text, "<search> q </search> <answer> a</answer>");
        assert_eq!(r.usage.unwrap().total_tokens, 5);
        // Cut by length: nothing appended.
        let body = br#"{"choices":[{"message":{"content":"<search> a"},"finish_reason":"length"}]}"#;
        assert_eq!(parse_reply(body).unwrap().text, "<search> a");
    }

    #[test]
    fn bad_bodies_are_typed_errors() {
        assert!(matches!(parse_reply(b"{not json"), Err(OpenAiError::MalformedJson { .. })));
        assert!(matches!(parse_reply(br#"{"choices":[]}"#), Err(OpenAiError::EmptyChoices)));
        assert!(matches!(parse_reply(br#"{"choices":7}"#), Err(OpenAiError::MalformedJson { .. })));
    }

    #[test]
    fn api_key_is_not_in_debug() {
        let mut p = OpenAiPolicy::new("http://h", "m");
        p.api_key = Some("sk-secret".into());
        assert!(!format!("{p:?}").contains("sk-secret"));
    }
}
