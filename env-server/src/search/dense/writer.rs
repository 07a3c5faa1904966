//! Writing a dense index (the `dense` feature): every passage of a wiki-18 style corpus encoded
//! and appended to a FAISS flat index whose row i is passage i, resuming `<out>.partial` when an
//! earlier run was interrupted. `env-server index --dense` and `env-server bench-dense` both write
//! through [`write_flat_index`]; the caller is told of the progress (a bar on a terminal).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Instant;

use grove_dense::{Encoder, FlatWriter, Metric, Storage, TextKind};

use super::DenseSetupError;

/// How far a write has got: bytes of the corpus read (of `total_bytes`) and rows written, of
/// which `resumed` an earlier run had written. The first report comes before any encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteProgress {
    pub bytes_read: u64,
    pub total_bytes: u64,
    pub rows: usize,
    pub resumed: u64,
}

/// What a finished write did.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteReport {
    /// The index file written.
    pub path: PathBuf,
    /// Vectors in it (the corpus's passages).
    pub rows: usize,
    /// Passages a previous run had already encoded (0 on a fresh write).
    pub resumed: u64,
    /// Passages this run encoded.
    pub encoded: u64,
    pub dim: usize,
    pub secs: f64,
}

/// Where `env-server index --dense` writes when not told: beside the corpus,
/// `<corpus file>.<model folder>.flat.index` (f32) or `.fp16.index` (f16).
pub fn default_index_path(corpus: &Path, model: &Path, storage: Storage) -> PathBuf {
    let model_name = model.file_name().unwrap_or_default().to_string_lossy();
    let kind = match storage {
        Storage::F32 => "flat",
        Storage::F16 => "fp16",
    };
    let mut name = corpus.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{model_name}.{kind}.index"));
    corpus.with_file_name(name)
}

/// Encode every passage of `corpus` with `encoder` into a FAISS flat index at `out`, `batch_size`
/// texts per forward pass (several passes per write and sync), resuming `<out>.partial` when an
/// earlier run left one. Each passage's `contents` field is encoded exactly as the corpus has it
/// (Search-R1 encodes it so), one row per non-empty line, as the server's corpus reader counts
/// rows. A line that is not a passage is an error naming its line.
pub fn write_flat_index(
    encoder: &Encoder,
    corpus: &Path,
    out: &Path,
    metric: Metric,
    storage: Storage,
    batch_size: usize,
    progress: &mut dyn FnMut(WriteProgress),
) -> Result<WriteReport, DenseSetupError> {
    if batch_size == 0 {
        return Err(DenseSetupError::Missing("a batch size of at least 1"));
    }
    let corpus_error = |message: String| DenseSetupError::Corpus { path: corpus.to_path_buf(), message };
    let mut writer = FlatWriter::create_or_resume_as(out, encoder.dim(), metric, storage)?;
    let resumed = writer.rows() as u64;
    let total_bytes = std::fs::metadata(corpus).map_err(|e| corpus_error(e.to_string()))?.len();
    progress(WriteProgress { bytes_read: 0, total_bytes, rows: writer.rows(), resumed });
    let started = Instant::now();
    let per_write = batch_size * 4;
    let mut batch: Vec<String> = Vec::with_capacity(per_write);
    let (mut seen, mut bytes_read) = (0u64, 0u64);
    let flush = |batch: &mut Vec<String>, writer: &mut FlatWriter| -> Result<(), DenseSetupError> {
        if batch.is_empty() {
            return Ok(());
        }
        let texts: Vec<&str> = batch.iter().map(String::as_str).collect();
        let vectors = encoder.encode(&texts, TextKind::Passage).map_err(|e| corpus_error(format!("encoding: {e}")))?;
        writer.append(&vectors)?;
        writer.sync()?;
        batch.clear();
        Ok(())
    };
    #[derive(serde::Deserialize)]
    struct Row {
        contents: String,
    }
    let file = std::fs::File::open(corpus).map_err(|e| corpus_error(e.to_string()))?;
    let reader = std::io::BufReader::with_capacity(1 << 20, file);
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| corpus_error(format!("line {}: {e}", i + 1)))?;
        bytes_read += line.len() as u64 + 1;
        if line.trim_ascii().is_empty() {
            continue;
        }
        seen += 1;
        if seen <= resumed {
            continue;
        }
        let row: Row = serde_json::from_str(&line)
            .map_err(|e| corpus_error(format!("line {}: not a wiki-18 passage: {e}", i + 1)))?;
        batch.push(row.contents);
        if batch.len() == per_write {
            flush(&mut batch, &mut writer)?;
            progress(WriteProgress {
                bytes_read: bytes_read.min(total_bytes),
                total_bytes,
                rows: writer.rows(),
                resumed,
            });
        }
    }
    flush(&mut batch, &mut writer)?;
    let rows = writer.rows();
    progress(WriteProgress { bytes_read: total_bytes, total_bytes, rows, resumed });
    let path = writer.finish()?;
    Ok(WriteReport {
        path,
        rows,
        resumed,
        encoded: seen.saturating_sub(resumed),
        dim: encoder.dim(),
        secs: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_path_sits_beside_the_corpus_and_names_model_and_precision() {
        let corpus = Path::new("/data/wiki-18.jsonl");
        let model = Path::new("/models/e5-base-v2");
        assert_eq!(
            default_index_path(corpus, model, Storage::F32),
            PathBuf::from("/data/wiki-18.jsonl.e5-base-v2.flat.index")
        );
        assert_eq!(
            default_index_path(corpus, model, Storage::F16),
            PathBuf::from("/data/wiki-18.jsonl.e5-base-v2.fp16.index")
        );
    }
}
