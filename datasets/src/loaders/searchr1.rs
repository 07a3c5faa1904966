//! Search-R1 / verl parquet rows: `prompt` (a one-message chat), `reward_model.ground_truth.target`
//! (gold answers), `data_source`, `extra_info.{split, index}`, and usually `id`, `question` and
//! `golden_answers` too. Each row is converted to JSON first, so any Arrow encoding pyarrow or
//! polars choose (large strings, string views, dictionaries) reads the same.

use std::path::Path;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type};
use arrow::datatypes::{UInt8Type, UInt16Type, UInt32Type, UInt64Type};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
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
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.build())
        .map_err(|e| DatasetError::format(path, format!("not a readable parquet file: {e}")))?;
    let mut out = Loaded { items: Vec::new(), bad_rows: Vec::new() };
    let mut row_number = 0;
    for batch in reader {
        let batch = batch.map_err(|e| DatasetError::format(path, format!("cannot decode row batch: {e}")))?;
        let schema = batch.schema();
        for row in 0..batch.num_rows() {
            row_number += 1;
            let mut obj = Map::new();
            for (field, column) in schema.fields().iter().zip(batch.columns()) {
                obj.insert(field.name().clone(), cell(column.as_ref(), row));
            }
            let parsed = example_from_row(&Value::Object(obj)).map_err(|message| RowError {
                path: path.to_path_buf(),
                line: row_number,
                message,
            });
            out.push(parsed, on_bad)?;
        }
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

/// One cell of an Arrow array as JSON.
fn cell(array: &dyn Array, row: usize) -> Value {
    if array.is_null(row) {
        return Value::Null;
    }
    match array.data_type() {
        DataType::Utf8 => array.as_string::<i32>().value(row).into(),
        DataType::LargeUtf8 => array.as_string::<i64>().value(row).into(),
        DataType::Utf8View => array.as_string_view().value(row).into(),
        DataType::Boolean => array.as_boolean().value(row).into(),
        DataType::Int8 => array.as_primitive::<Int8Type>().value(row).into(),
        DataType::Int16 => array.as_primitive::<Int16Type>().value(row).into(),
        DataType::Int32 => array.as_primitive::<Int32Type>().value(row).into(),
        DataType::Int64 => array.as_primitive::<Int64Type>().value(row).into(),
        DataType::UInt8 => array.as_primitive::<UInt8Type>().value(row).into(),
        DataType::UInt16 => array.as_primitive::<UInt16Type>().value(row).into(),
        DataType::UInt32 => array.as_primitive::<UInt32Type>().value(row).into(),
        DataType::UInt64 => array.as_primitive::<UInt64Type>().value(row).into(),
        DataType::Float32 => f64::from(array.as_primitive::<Float32Type>().value(row)).into(),
        DataType::Float64 => array.as_primitive::<Float64Type>().value(row).into(),
        DataType::List(_) => list(array.as_list::<i32>().value(row).as_ref()),
        DataType::LargeList(_) => list(array.as_list::<i64>().value(row).as_ref()),
        DataType::Struct(fields) => {
            let s = array.as_struct();
            let obj = fields
                .iter()
                .zip(s.columns())
                .map(|(f, c)| (f.name().clone(), cell(c.as_ref(), row)))
                .collect::<Map<_, _>>();
            Value::Object(obj)
        }
        DataType::Dictionary(_, _) => {
            let dict = array.as_any_dictionary();
            let key = dict.normalized_keys()[row];
            cell(dict.values().as_ref(), key)
        }
        other => Value::String(format!("<unsupported arrow type {other}>")),
    }
}

fn list(values: &dyn Array) -> Value {
    Value::Array((0..values.len()).map(|i| cell(values, i)).collect())
}
