//! wiki-18 corpus JSONL, as Search-R1 and FlashRAG ship it: `{"id", "contents"}` where contents
//! is `"Title"\ntext`.

use std::path::Path;

use super::{Loaded, OnBadRow, read_jsonl, str_field, stream_jsonl, write_jsonl};
use crate::error::{Result, RowError};
use crate::types::Passage;

fn passage(v: &serde_json::Value) -> std::result::Result<Passage, String> {
    let id = str_field(v, "id")?;
    let contents = str_field(v, "contents")?;
    Ok(Passage::from_contents(id, &contents))
}

pub fn load_wiki18(path: &Path, on_bad: OnBadRow) -> Result<Loaded<Passage>> {
    read_jsonl(path, on_bad, passage)
}

/// Read a corpus one passage at a time (wiki-18 is 21M passages: never hold it whole). Each bad
/// row is an `Err` naming its line, and reading can go on after it.
pub fn stream_wiki18(path: &Path) -> Result<impl Iterator<Item = std::result::Result<Passage, RowError>>> {
    stream_jsonl(path, passage)
}

pub fn write_wiki18<'a>(path: &Path, passages: impl IntoIterator<Item = &'a Passage>) -> Result<()> {
    #[derive(serde::Serialize)]
    struct Row<'p> {
        id: &'p str,
        contents: String,
    }
    write_jsonl(path, passages.into_iter().map(|p| Row { id: &p.id, contents: p.contents() }))
}
