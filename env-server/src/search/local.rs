//! Local BM25 (tantivy) over a wiki-18 JSONL corpus. The index is built once into a directory
//! next to the corpus, rebuilt when the corpus changes (size, modification time and a hash of its
//! first and last MiB), and memory-mapped afterwards. Scoring is tantivy's BM25 (k1 = 1.2,
//! b = 0.75, Lucene's defaults; pyserini runs often use 0.9 / 0.4). Queries written by a model are
//! parsed leniently: syntax the query language would reject is dropped, not an error.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tantivy::collector::TopDocs;
use tantivy::query::QueryParser;
use tantivy::schema::{Field, IndexRecordOption, STORED, STRING, Schema, TextFieldIndexing, TextOptions, Value};
use tantivy::{Index, IndexReader, ReloadPolicy, TantivyDocument, doc};

use super::{Hit, SearchBackend, SearchError, SearchFuture};

const FINGERPRINT: &str = "grove-corpus.json";

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("cannot read corpus {}: {source}", path.display())]
    Corpus {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Row(#[from] grove_datasets::RowError),
    #[error(transparent)]
    Dataset(#[from] grove_datasets::DatasetError),
    #[error("tantivy: {0}")]
    Tantivy(#[from] tantivy::TantivyError),
    #[error("index directory {}: {source}", path.display())]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Progress of an index build, for a progress bar in the command-line layer.
#[derive(Debug, Clone, Copy)]
pub struct BuildProgress {
    pub bytes_read: u64,
    pub bytes_total: u64,
    pub passages: u64,
}

#[derive(Debug, Clone, Copy)]
struct Fields {
    id: Field,
    contents: Field,
    text: Field,
}

/// A BM25 index. Cheap to clone; searches run on the blocking pool.
#[derive(Clone)]
pub struct LocalIndex {
    inner: Arc<Inner>,
}

struct Inner {
    reader: IndexReader,
    parser: QueryParser,
    fields: Fields,
    docs: u64,
}

impl std::fmt::Debug for LocalIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalIndex").field("docs", &self.inner.docs).finish()
    }
}

fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let id = b.add_text_field("id", STRING | STORED);
    let contents = b.add_text_field("contents", STORED);
    let text = b.add_text_field(
        "text",
        TextOptions::default().set_indexing_options(
            TextFieldIndexing::default().set_tokenizer("en_stem").set_index_option(IndexRecordOption::WithFreqs),
        ),
    );
    (b.build(), Fields { id, contents, text })
}

/// Identifies a corpus file without hashing all of it (wiki-18 is 13 GB).
fn fingerprint(corpus: &Path) -> Result<String, IndexError> {
    let err = |source| IndexError::Corpus { path: corpus.to_path_buf(), source };
    let meta = std::fs::metadata(corpus).map_err(err)?;
    let mtime = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).unwrap_or_default();
    let mut f = std::fs::File::open(corpus).map_err(err)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let n = f.read(&mut buf).map_err(err)?;
    h.update(&buf[..n]);
    if meta.len() > (2 << 20) {
        use std::io::Seek;
        f.seek(std::io::SeekFrom::End(-(1 << 20))).map_err(err)?;
        let n = f.read(&mut buf).map_err(err)?;
        h.update(&buf[..n]);
    }
    Ok(format!(
        "{{\"size\": {}, \"mtime_ns\": {}, \"sha256_ends\": \"{:x}\", \"schema\": 1}}",
        meta.len(),
        mtime.as_nanos(),
        h.finalize()
    ))
}

impl LocalIndex {
    /// The default index directory for a corpus: `<corpus>.index` beside it.
    pub fn default_dir(corpus: &Path) -> PathBuf {
        let mut name = corpus.file_name().unwrap_or_default().to_os_string();
        name.push(".index");
        corpus.with_file_name(name)
    }

    /// Open the index of `corpus` in `dir`, building it first if it is missing or stale.
    pub fn open_or_build(
        corpus: &Path,
        dir: Option<&Path>,
        progress: &mut dyn FnMut(BuildProgress),
    ) -> Result<LocalIndex, IndexError> {
        let dir = dir.map(Path::to_path_buf).unwrap_or_else(|| Self::default_dir(corpus));
        let want = fingerprint(corpus)?;
        let have = std::fs::read_to_string(dir.join(FINGERPRINT)).ok();
        if have.as_deref() != Some(want.as_str()) {
            Self::build(corpus, &dir, &want, progress)?;
        }
        Self::open(&dir)
    }

    fn build(
        corpus: &Path,
        dir: &Path,
        fingerprint: &str,
        progress: &mut dyn FnMut(BuildProgress),
    ) -> Result<(), IndexError> {
        let dir_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| IndexError::Dir { path, source }
        };
        let staging = dir.with_extension("partial");
        if staging.exists() {
            std::fs::remove_dir_all(&staging).map_err(dir_err(&staging))?;
        }
        std::fs::create_dir_all(&staging).map_err(dir_err(&staging))?;
        let (schema, f) = schema();
        let index = Index::create_in_dir(&staging, schema)?;
        let mut writer: tantivy::IndexWriter = index.writer(64 << 20)?;
        let total = std::fs::metadata(corpus).map(|m| m.len()).unwrap_or(0);
        let mut p = BuildProgress { bytes_read: 0, bytes_total: total, passages: 0 };
        for passage in grove_datasets::loaders::stream_wiki18(corpus)? {
            let passage = passage?;
            let contents = passage.contents();
            p.bytes_read += contents.len() as u64 + 24;
            p.passages += 1;
            writer.add_document(doc!(f.id => passage.id, f.contents => contents.clone(), f.text => contents))?;
            if p.passages.is_multiple_of(10_000) {
                progress(p);
            }
        }
        writer.commit()?;
        writer.wait_merging_threads()?;
        std::fs::write(staging.join(FINGERPRINT), fingerprint).map_err(dir_err(&staging))?;
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(dir_err(dir))?;
        }
        std::fs::rename(&staging, dir).map_err(dir_err(dir))?;
        p.bytes_read = total;
        progress(p);
        Ok(())
    }

    /// Open an existing index directory (memory-mapped).
    pub fn open(dir: &Path) -> Result<LocalIndex, IndexError> {
        let index = Index::open_in_dir(dir)?;
        let (_, fields) = schema();
        let reader = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into()?;
        let parser = QueryParser::for_index(&index, vec![fields.text]);
        let docs = reader.searcher().num_docs();
        Ok(LocalIndex { inner: Arc::new(Inner { reader, parser, fields, docs }) })
    }

    pub fn num_docs(&self) -> u64 {
        self.inner.docs
    }

    /// BM25 top-k for each query, on the calling thread.
    pub fn search_blocking(&self, queries: &[String], topk: usize) -> Result<Vec<Vec<Hit>>, SearchError> {
        let searcher = self.inner.reader.searcher();
        let f = self.inner.fields;
        let collector = TopDocs::with_limit(topk.max(1)).order_by_score();
        queries
            .iter()
            .map(|q| {
                let (query, _ignored) = self.inner.parser.parse_query_lenient(q);
                let top = searcher.search(&query, &collector).map_err(|e| SearchError::Index(e.to_string()))?;
                top.into_iter()
                    .map(|(score, addr)| {
                        let d: TantivyDocument = searcher.doc(addr).map_err(|e| SearchError::Index(e.to_string()))?;
                        let text = |field| d.get_first(field).and_then(|v| v.as_str()).unwrap_or_default().to_string();
                        Ok(Hit::doc(text(f.id), text(f.contents), score))
                    })
                    .collect()
            })
            .collect()
    }
}

impl SearchBackend for LocalIndex {
    fn name(&self) -> &str {
        "local"
    }

    fn search(&self, queries: Vec<String>, topk: usize) -> SearchFuture {
        let index = self.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || index.search_blocking(&queries, topk))
                .await
                .map_err(|e| SearchError::Internal(e.to_string()))?
        })
    }
}
