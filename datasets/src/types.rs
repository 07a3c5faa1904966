//! The data types every crate shares: [`QaExample`] (a question, its gold answers, its data
//! source and how it is scored), [`Passage`] (a corpus passage, and wiki-18's `contents` form of
//! it) and [`Metric`] (the wire's own, re-exported), with the reference routing of data sources
//! to EM or F1, the conversion of an example to the protocol's `TaskSpec`, and prompt rendering.

pub use grove_protocol::Metric;
use grove_protocol::TaskSpec;
use serde::{Deserialize, Serialize};

/// Sources that Search-R1 / Tree-GRPO score with EM; every other source is scored with F1.
pub const EM_SOURCES: [&str; 9] =
    ["nq", "triviaqa", "popqa", "web_questions", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle", "strategyqa"];

/// The reference routing: EM for the QA benchmarks, F1 for anything else (the web-agent data).
pub fn metric_for_source(data_source: &str) -> Metric {
    if EM_SOURCES.contains(&data_source) { Metric::Em } else { Metric::F1 }
}

/// One question with its gold answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QaExample {
    pub id: String,
    pub question: String,
    pub golden_answers: Vec<String>,
    #[serde(default)]
    pub data_source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<String>,
    /// Overrides [`metric_for_source`] when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<Metric>,
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

impl QaExample {
    pub fn metric(&self) -> Metric {
        self.metric.unwrap_or_else(|| metric_for_source(&self.data_source))
    }

    /// The task an env-server episode is created from: the question, its answers, its source,
    /// this example's id, and its metric resolved (so the server and the trainer cannot route
    /// the source differently).
    pub fn task_spec(&self) -> TaskSpec {
        TaskSpec {
            question: self.question.clone(),
            golden_answers: self.golden_answers.clone(),
            data_source: self.data_source.clone(),
            task_id: Some(self.id.clone()),
            metric: Some(self.metric()),
        }
    }
}

/// The metric a task is scored with: its own, else the reference routing of its data source.
pub fn task_metric(task: &TaskSpec) -> Metric {
    task.metric.unwrap_or_else(|| metric_for_source(&task.data_source))
}

/// The prompt an episode starts with: `template` with its `{question}` placeholder replaced by
/// the question, trimmed and ending in `?` (as Search-R1's data preparation writes it). The
/// env-server renders every episode's prompt with this, and anything that must see the same text
/// (a tokenizer trained on the prompts) uses it too.
pub fn render_prompt(template: &str, question: &str) -> String {
    let mut q = question.trim().to_string();
    if !q.ends_with('?') {
        q.push('?');
    }
    template.replace("{question}", &q)
}

/// One retrievable passage. In wiki-18 JSONL it is `{"id", "contents": "\"Title\"\ntext"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Passage {
    pub id: String,
    pub title: String,
    pub text: String,
}

impl Passage {
    /// The wiki-18 `contents` field: the title in double quotes, a newline, the text.
    pub fn contents(&self) -> String {
        format!("\"{}\"\n{}", self.title, self.text)
    }

    /// Split a wiki-18 `contents` field. The first line is the title; surrounding double quotes
    /// are removed from `title` (the Search-R1 renderer keeps them; see [`Passage::contents`]).
    pub fn from_contents(id: impl Into<String>, contents: &str) -> Self {
        let (first, rest) = contents.split_once('\n').unwrap_or((contents, ""));
        let title = first.strip_prefix('"').and_then(|t| t.strip_suffix('"')).unwrap_or(first);
        Passage { id: id.into(), title: title.to_string(), text: rest.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_end_in_one_question_mark() {
        let t = "Q: {question}\n";
        assert_eq!(render_prompt(t, "  who wrote it "), "Q: who wrote it?\n");
        assert_eq!(render_prompt(t, "who wrote it?"), "Q: who wrote it?\n");
    }

    #[test]
    fn a_task_carries_its_resolved_metric() {
        let e = |source: &str, metric| QaExample {
            id: "7".into(),
            question: "q".into(),
            golden_answers: vec!["a".into()],
            data_source: source.into(),
            split: None,
            metric,
            metadata: Default::default(),
        };
        assert_eq!(e("nq", None).task_spec().metric, Some(Metric::Em));
        assert_eq!(e("web", None).task_spec().metric, Some(Metric::F1));
        assert_eq!(e("nq", Some(Metric::F1)).task_spec().metric, Some(Metric::F1));
        let t = TaskSpec { metric: None, ..e("hotpotqa", None).task_spec() };
        assert_eq!(task_metric(&t), Metric::Em);
        assert_eq!(e("nq", None).task_spec().task_id.as_deref(), Some("7"));
    }
}
