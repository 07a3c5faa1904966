//! wiki-18 corpus JSONL, as Search-R1 and FlashRAG ship it: `{"id", "contents"}` where contents
//! is `"Title"\ntext`.

use std::path::Path;

use super::{Loaded, OnBadRow, read_jsonl, str_field, write_jsonl};
use crate::error::Result;
use crate::types::Passage;

pub fn load_wiki18(path: &Path, on_bad: OnBadRow) -> Result<Loaded<Passage>> {
    read_jsonl(path, on_bad, |v| {
        let id = str_field(&v, "id")?;
        let contents = str_field(&v, "contents")?;
        Ok(Passage::from_contents(id, &contents))
    })
}

pub fn write_wiki18<'a>(path: &Path, passages: impl IntoIterator<Item = &'a Passage>) -> Result<()> {
    #[derive(serde::Serialize)]
    struct Row<'p> {
        id: &'p str,
        contents: String,
    }
    write_jsonl(path, passages.into_iter().map(|p| Row { id: &p.id, contents: p.contents() }))
}
