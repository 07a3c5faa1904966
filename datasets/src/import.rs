//! Converters from the real data of `docs/offline-assets.md` into Grove's formats. They read
//! bytes already on disk (fetched by `cargo xtask assets`) and return values; writing is the
//! caller's job.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::metrics::normalize_answer;
use crate::types::{Metric, Passage, QaExample};

/// Attribution for Wikipedia-derived data (the summaries corpus and FanOutQA).
pub const WIKIPEDIA_NOTICE: &str = "Text from Wikipedia (https://en.wikipedia.org), licensed under the \
Creative Commons Attribution-ShareAlike 4.0 International License (CC BY-SA 4.0, \
https://creativecommons.org/licenses/by-sa/4.0/). Converted to wiki-18 JSONL by Grove; changes: \
one passage per article lead summary, title line added.\n";

pub const FANOUTQA_NOTICE: &str = "FanOutQA dev set (Zhu et al., 2024, https://github.com/zhudotexe/fanoutqa), \
data licensed under CC BY-SA 4.0 (https://creativecommons.org/licenses/by-sa/4.0/); its evidence is \
Wikipedia text under the same licence. Converted by Grove: one QA row per sub-question.\n";

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("unexpected shape: {0}")]
    Shape(String),
}

/// Import report: how many rows came in and what was dropped, with reasons.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportReport {
    pub read: usize,
    pub written: usize,
    pub skipped: Vec<String>,
}

/// `summaries_en-us.json` (`title -> {title, extract, ...}`) -> passages sorted by title, ids
/// `wiki-0`, `wiki-1`, ... Entries with an empty extract are skipped and reported.
pub fn wiki_summaries(json: &[u8]) -> Result<(Vec<Passage>, ImportReport), ImportError> {
    let map: Map<String, Value> = serde_json::from_slice(json)?;
    let mut report = ImportReport { read: map.len(), ..Default::default() };
    let mut entries: Vec<(String, String)> = Vec::with_capacity(map.len());
    for (key, v) in &map {
        let title = v.get("title").and_then(Value::as_str).unwrap_or(key).trim().to_string();
        let extract = v.get("extract").and_then(Value::as_str).unwrap_or("").trim().to_string();
        if extract.is_empty() || title.is_empty() {
            report.skipped.push(format!("{key}: empty title or extract"));
            continue;
        }
        // One passage per line: the extract's own newlines become spaces.
        let text = extract.split_whitespace().collect::<Vec<_>>().join(" ");
        entries.push((title, text));
    }
    entries.sort();
    let passages: Vec<Passage> = entries
        .into_iter()
        .enumerate()
        .map(|(i, (title, text))| Passage { id: format!("wiki-{i}"), title, text })
        .collect();
    report.written = passages.len();
    Ok((passages, report))
}

/// FanOutQA answers are strings, numbers, booleans, lists or maps. Scalars become one gold string
/// (booleans as `yes`/`no`); lists and maps become one comma-joined string of their values.
fn gold_strings(answer: &Value) -> (Vec<String>, &'static str) {
    fn scalar(v: &Value) -> Option<String> {
        match v {
            Value::String(s) => Some(s.trim().to_string()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(if *b { "yes" } else { "no" }.to_string()),
            _ => None,
        }
    }
    match answer {
        Value::Array(items) => (vec![items.iter().filter_map(scalar).collect::<Vec<_>>().join(", ")], "list"),
        Value::Object(m) => (vec![m.values().filter_map(scalar).collect::<Vec<_>>().join(", ")], "map"),
        other => (scalar(other).into_iter().collect(), "scalar"),
    }
}

/// FanOutQA `fanout-final-dev.json` -> one QA row per sub-question (all levels of the
/// decomposition), EM-scored, data source `fanoutqa`.
///
/// `corpus` maps passage titles to texts. Metadata per row: `parent_id`, `parent_question`,
/// `evidence_title`, `depends_on`, `answer_kind` (scalar/list/map), `leaf` (no further
/// decomposition), `in_corpus` (the evidence page is a corpus passage) and `answer_in_passage`
/// (a scalar answer whose normalised form occurs in that passage's normalised text: the set the
/// corpus provably answers).
pub fn fanoutqa(json: &[u8], corpus: &HashMap<String, String>) -> Result<(Vec<QaExample>, ImportReport), ImportError> {
    let top: Vec<Value> = serde_json::from_slice(json)?;
    let mut out = Vec::new();
    let mut report = ImportReport::default();
    let normalised_corpus: HashMap<&str, String> =
        corpus.iter().map(|(t, text)| (t.as_str(), normalize_answer(text))).collect();
    for q in &top {
        let parent_id =
            q.get("id").and_then(Value::as_str).ok_or_else(|| ImportError::Shape("question without id".into()))?;
        let parent_question = q.get("question").and_then(Value::as_str).unwrap_or_default();
        let mut stack: Vec<&Value> =
            q.get("decomposition").and_then(Value::as_array).map(|d| d.iter().rev().collect()).unwrap_or_default();
        while let Some(sub) = stack.pop() {
            report.read += 1;
            let children = sub.get("decomposition").and_then(Value::as_array);
            if let Some(children) = children {
                stack.extend(children.iter().rev());
            }
            let (Some(id), Some(question)) =
                (sub.get("id").and_then(Value::as_str), sub.get("question").and_then(Value::as_str))
            else {
                report.skipped.push(format!("{parent_id}: sub-question without id or question"));
                continue;
            };
            let (golds, answer_kind) = gold_strings(sub.get("answer").unwrap_or(&Value::Null));
            if golds.iter().all(|g| g.is_empty()) {
                report.skipped.push(format!("{id}: no usable answer"));
                continue;
            }
            let evidence_title = sub.pointer("/evidence/title").and_then(Value::as_str);
            let passage = evidence_title.and_then(|t| normalised_corpus.get(t));
            let answer_in_passage = answer_kind == "scalar"
                && passage.is_some_and(|p| {
                    golds.iter().map(|g| normalize_answer(g)).any(|g| !g.is_empty() && p.contains(&g))
                });
            let mut metadata = Map::new();
            metadata.insert("parent_id".into(), parent_id.into());
            metadata.insert("parent_question".into(), parent_question.into());
            metadata.insert("evidence_title".into(), evidence_title.map(Value::from).unwrap_or(Value::Null));
            metadata.insert("depends_on".into(), sub.get("depends_on").cloned().unwrap_or(Value::Array(vec![])));
            metadata.insert("answer_kind".into(), answer_kind.into());
            metadata.insert("leaf".into(), children.is_none_or(|c| c.is_empty()).into());
            metadata.insert("in_corpus".into(), passage.is_some().into());
            metadata.insert("answer_in_passage".into(), answer_in_passage.into());
            out.push(QaExample {
                id: id.to_string(),
                question: question.trim().to_string(),
                golden_answers: golds,
                data_source: "fanoutqa".into(),
                split: Some("dev".into()),
                metric: Some(Metric::Em),
                metadata,
            });
        }
    }
    report.written = out.len();
    Ok((out, report))
}
