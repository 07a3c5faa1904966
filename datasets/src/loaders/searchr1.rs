//! Search-R1 / verl parquet rows: `prompt` (a one-message chat), `reward_model.ground_truth.target`
//! (gold answers), `data_source`, `extra_info.{split, index}`, and usually `id`, `question` and
//! `golden_answers` too. Rows are read with the parquet crate's record reader (no Arrow: it is the
//! largest part of a cold build and buys nothing here) and converted to JSON first, so any
//! encoding pyarrow or polars choose (large strings, string views, dictionaries) reads the same.

use std::path::Path;

use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use serde_json::{Map, Value};

use super::{Loaded, OnBadRow, str_list};
use crate::error::{DatasetError, Result, RowError};
use crate::types::QaExample;

/// Read a Search-R1 parquet file. The group id of a row is its `id` column when present, else
/// `<data_source>_<split>_<extra_info.index>`; never the bare per-file index (spec §9.16).
pub fn load_searchr1_parquet(path: &Path, on_bad: OnBadRow) -> Result<Loaded<QaExample>> {
    // The parquet crate can panic on a corrupt file (57.3 unwraps a malformed thrift field in
    // the footer; found by the `qa_loaders` fuzz target). A corrupt file is an error here.
    std::panic::catch_unwind(|| read_parquet(path, on_bad)).unwrap_or_else(|panic| {
        let why =
            panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
        let why = why.unwrap_or_default();
        Err(DatasetError::format(path, format!("not a readable parquet file: the parquet reader panicked ({why})")))
    })
}

fn read_parquet(path: &Path, on_bad: OnBadRow) -> Result<Loaded<QaExample>> {
    let mut file = std::fs::File::open(path).map_err(|e| DatasetError::io(path, e))?;
    super::thrift_check::check_parquet_footer(&mut file)
        .map_err(|e| DatasetError::format(path, format!("not a readable parquet file: {e}")))?;
    let reader = SerializedFileReader::new(file)
        .map_err(|e| DatasetError::format(path, format!("not a readable parquet file: {e}")))?;
    let rows = reader
        .get_row_iter(None)
        .map_err(|e| DatasetError::format(path, format!("not a readable parquet file: {e}")))?;
    let mut out = Loaded { items: Vec::new(), bad_rows: Vec::new() };
    for (i, row) in rows.enumerate() {
        let row = row.map_err(|e| DatasetError::format(path, format!("cannot decode row {}: {e}", i + 1)))?;
        let obj = row.get_column_iter().map(|(name, field)| (name.clone(), cell(field))).collect::<Map<_, _>>();
        let parsed = example_from_row(&Value::Object(obj)).map_err(|message| RowError {
            path: path.to_path_buf(),
            line: i + 1,
            message,
        });
        out.push(parsed, on_bad)?;
    }
    Ok(out)
}

fn example_from_row(v: &Value) -> std::result::Result<QaExample, String> {
    let data_source = v.get("data_source").and_then(Value::as_str).ok_or("missing field `data_source`")?.to_string();
    let ground_truth = v.pointer("/reward_model/ground_truth").ok_or("missing field `reward_model.ground_truth`")?;
    let golden_answers = str_list(ground_truth, "target").map_err(|e| format!("reward_model.ground_truth: {e}"))?;
    if golden_answers.is_empty() {
        return Err("`reward_model.ground_truth.target` is empty".into());
    }
    let prompt =
        v.pointer("/prompt/0/content").and_then(Value::as_str).ok_or("missing `prompt[0].content`")?.to_string();
    let split = v.pointer("/extra_info/split").and_then(Value::as_str).map(str::to_owned);
    let index = v.pointer("/extra_info/index").and_then(Value::as_i64);
    let id = match (v.get("id").and_then(Value::as_str), index) {
        (Some(id), _) => id.to_string(),
        (None, Some(index)) => format!("{data_source}_{}_{index}", split.as_deref().unwrap_or("unknown")),
        (None, None) => return Err("row has neither `id` nor `extra_info.index`".into()),
    };
    let question = match v.get("question").and_then(Value::as_str) {
        Some(q) => q.to_string(),
        None => question_from_prompt(&prompt).ok_or("no `question` column and no `Question:` in the prompt")?,
    };
    let mut metadata = Map::new();
    metadata.insert("prompt".into(), Value::String(prompt));
    if let Some(index) = index {
        metadata.insert("index".into(), index.into());
    }
    if let Some(ability) = v.get("ability").filter(|a| !a.is_null()) {
        metadata.insert("ability".into(), ability.clone());
    }
    Ok(QaExample { id, question, golden_answers, data_source, split, metric: None, metadata })
}

/// The text after the last `Question:` of a Search-R1 prompt, trimmed.
fn question_from_prompt(prompt: &str) -> Option<String> {
    let (_, q) = prompt.rsplit_once("Question:")?;
    let q = q.trim();
    (!q.is_empty()).then(|| q.to_string())
}

/// One parquet field as JSON. Byte arrays without a string annotation are read as UTF-8 when they
/// are (some writers leave the annotation off); other binary, and the date/time/decimal types no
/// Search-R1 column uses, become their display text.
fn cell(field: &Field) -> Value {
    match field {
        Field::Null => Value::Null,
        Field::Bool(b) => (*b).into(),
        Field::Byte(v) => (*v).into(),
        Field::Short(v) => (*v).into(),
        Field::Int(v) => (*v).into(),
        Field::Long(v) => (*v).into(),
        Field::UByte(v) => (*v).into(),
        Field::UShort(v) => (*v).into(),
        Field::UInt(v) => (*v).into(),
        Field::ULong(v) => (*v).into(),
        Field::Float16(v) => f64::from(f32::from(*v)).into(),
        Field::Float(v) => f64::from(*v).into(),
        Field::Double(v) => (*v).into(),
        Field::Str(s) => s.as_str().into(),
        Field::Bytes(b) => match std::str::from_utf8(b.data()) {
            Ok(s) => s.into(),
            Err(_) => Value::String(format!("{field}")),
        },
        Field::Group(row) => Value::Object(row.get_column_iter().map(|(name, f)| (name.clone(), cell(f))).collect()),
        Field::ListInternal(list) => Value::Array(list.elements().iter().map(cell).collect()),
        Field::MapInternal(map) => {
            Value::Array(map.entries().iter().map(|(k, v)| Value::Array(vec![cell(k), cell(v)])).collect())
        }
        other => Value::String(format!("{other}")),
    }
}
