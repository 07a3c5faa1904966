//! Readers (and writers) for the file formats real users bring.
//!
//! Every loader reports a bad row with its file and line. With [`OnBadRow::Fail`] the first bad
//! row is the error; with [`OnBadRow::Skip`] bad rows are collected in [`Loaded::bad_rows`] and
//! the rest is returned, so nothing is dropped silently.

mod flashrag;
#[cfg(feature = "parquet")]
mod searchr1;
#[cfg(feature = "parquet")]
mod thrift_check;
mod wiki18;

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;

pub use flashrag::{load_qa_jsonl, write_qa_jsonl};
#[cfg(feature = "parquet")]
pub use searchr1::load_searchr1_parquet;
pub use wiki18::{load_wiki18, stream_wiki18, write_wiki18};

use crate::error::{DatasetError, Result, RowError};

/// What to do with a row that cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnBadRow {
    #[default]
    Fail,
    Skip,
}

/// Rows that were read, and the rows that were not (only with [`OnBadRow::Skip`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded<T> {
    pub items: Vec<T>,
    pub bad_rows: Vec<RowError>,
}

impl<T> Loaded<T> {
    fn push(&mut self, row: std::result::Result<T, RowError>, on_bad: OnBadRow) -> Result<()> {
        match row {
            Ok(item) => self.items.push(item),
            Err(e) if on_bad == OnBadRow::Skip => self.bad_rows.push(e),
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }
}

/// Parse each non-blank line of a JSONL file with `parse`, lazily; each bad row is an `Err`
/// naming its line, and reading goes on after it.
fn stream_jsonl<T>(
    path: &Path,
    mut parse: impl FnMut(&serde_json::Value) -> std::result::Result<T, String>,
) -> Result<impl Iterator<Item = std::result::Result<T, RowError>>> {
    let file = std::fs::File::open(path).map_err(|e| DatasetError::io(path, e))?;
    let path = path.to_path_buf();
    Ok(BufReader::new(file).lines().enumerate().filter_map(move |(i, line)| {
        let parsed = match line {
            Err(e) => Err(format!("cannot read line: {e}")),
            Ok(l) if l.trim().is_empty() => return None,
            Ok(l) => serde_json::from_str::<serde_json::Value>(&l)
                .map_err(|e| format!("invalid JSON: {e}"))
                .and_then(|v| parse(&v)),
        };
        Some(parsed.map_err(|message| RowError { path: path.clone(), line: i + 1, message }))
    }))
}

/// Read a whole JSONL file, failing on or collecting bad rows.
fn read_jsonl<T>(
    path: &Path,
    on_bad: OnBadRow,
    parse: impl FnMut(&serde_json::Value) -> std::result::Result<T, String>,
) -> Result<Loaded<T>> {
    let mut out = Loaded { items: Vec::new(), bad_rows: Vec::new() };
    for row in stream_jsonl(path, parse)? {
        out.push(row, on_bad)?;
    }
    Ok(out)
}

/// Write one JSON value per line, atomically (a temporary file renamed into place).
fn write_jsonl<T: serde::Serialize>(path: &Path, rows: impl IntoIterator<Item = T>) -> Result<()> {
    let tmp = path.with_extension("jsonl.tmp");
    let io = |e| DatasetError::io(path, e);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut w = BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    for row in rows {
        serde_json::to_writer(&mut w, &row).map_err(|e| DatasetError::format(path, e.to_string()))?;
        w.write_all(b"\n").map_err(io)?;
    }
    w.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// A required string field.
fn str_field(v: &serde_json::Value, key: &str) -> std::result::Result<String, String> {
    match v.get(key) {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(serde_json::Value::Number(n)) => Ok(n.to_string()),
        Some(other) => Err(format!("field `{key}` must be a string, found {}", kind(other))),
        None => Err(format!("missing field `{key}`")),
    }
}

/// A list of strings, or a bare string (wrapped into a list, as the reference code does).
fn str_list(v: &serde_json::Value, key: &str) -> std::result::Result<Vec<String>, String> {
    match v.get(key) {
        Some(serde_json::Value::String(s)) => Ok(vec![s.clone()]),
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .map(|x| match x {
                serde_json::Value::String(s) => Ok(s.clone()),
                serde_json::Value::Number(n) => Ok(n.to_string()),
                other => Err(format!("field `{key}` must hold strings, found {}", kind(other))),
            })
            .collect(),
        Some(other) => Err(format!("field `{key}` must be a list of strings, found {}", kind(other))),
        None => Err(format!("missing field `{key}`")),
    }
}

fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "a map",
    }
}
