//! The data types every crate shares: [`QaExample`] (a question, its gold answers, its data
//! source and how it is scored), [`Passage`] (a corpus passage, and wiki-18's `contents` form of
//! it) and [`Metric`], with the reference routing of data sources to EM or F1.

use serde::{Deserialize, Serialize};

/// How answers of a data source are scored (`docs/tree-grpo-spec.md` §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    Em,
    F1,
}

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
