//! QA JSONL: FlashRAG's `{id, question, golden_answers}` rows, optionally with Grove's extra
//! fields (`data_source`, `split`, `metric`, `metadata`). Grove writes the same format.

use std::path::Path;

use super::{Loaded, OnBadRow, read_jsonl, str_field, str_list, write_jsonl};
use crate::error::Result;
use crate::types::{Metric, QaExample};

/// Read a QA JSONL file. Rows without `data_source` get `default_source` (FlashRAG files are
/// named by dataset, not labelled per row); rows without `split` get `split`.
pub fn load_qa_jsonl(
    path: &Path,
    default_source: &str,
    split: Option<&str>,
    on_bad: OnBadRow,
) -> Result<Loaded<QaExample>> {
    read_jsonl(path, on_bad, |v| {
        if !v.is_object() {
            return Err("row must be a JSON object".into());
        }
        let golden_answers = str_list(v, "golden_answers")?;
        if golden_answers.is_empty() {
            return Err("`golden_answers` is empty".into());
        }
        let metric = match v.get("metric") {
            None | Some(serde_json::Value::Null) => None,
            Some(m) => Some(serde_json::from_value::<Metric>(m.clone()).map_err(|e| format!("field `metric`: {e}"))?),
        };
        let metadata = match v.get("metadata") {
            Some(serde_json::Value::Object(m)) => m.clone(),
            None | Some(serde_json::Value::Null) => Default::default(),
            Some(_) => return Err("field `metadata` must be a map".into()),
        };
        Ok(QaExample {
            id: str_field(v, "id")?,
            question: str_field(v, "question")?,
            golden_answers,
            data_source: v.get("data_source").and_then(|s| s.as_str()).unwrap_or(default_source).to_string(),
            split: v.get("split").and_then(|s| s.as_str()).or(split).map(str::to_owned),
            metric,
            metadata,
        })
    })
}

/// Write QA examples as JSONL, readable by [`load_qa_jsonl`] and by FlashRAG.
pub fn write_qa_jsonl<'a>(path: &Path, examples: impl IntoIterator<Item = &'a QaExample>) -> Result<()> {
    write_jsonl(path, examples)
}
