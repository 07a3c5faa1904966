//! Dense and hybrid retrieval (the `dense` feature): queries are encoded by a BERT-family encoder
//! ([`grove_dense::Encoder`]) and searched exactly in a FAISS flat index whose row i is passage i
//! of the corpus, as Search-R1's retriever pairs `e5_Flat.index` with `wiki-18.jsonl`. All the
//! queries of a tick are encoded in one batch and scored in one pass over the index. The hybrid
//! backend fuses BM25 and dense lists by reciprocal rank.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use grove_dense::{ApproxIndex, Encoder, EncoderOptions, FlatIndex, HnswParams, TextKind};

use super::{DenseConfig, DenseDevice, DensePooling, DenseSearch};
use crate::search::{Hit, LocalIndex, SearchBackend, SearchError, SearchFuture};

#[derive(Debug, thiserror::Error)]
pub enum DenseSetupError {
    #[error("the dense backend needs {0}")]
    Missing(&'static str),
    #[error("encoder {}: {source}", path.display())]
    Encoder {
        path: PathBuf,
        #[source]
        source: grove_dense::EncoderError,
    },
    #[error(transparent)]
    Index(#[from] grove_dense::FaissError),
    #[error(transparent)]
    Approx(#[from] grove_dense::ApproxError),
    #[error("corpus {}: {message}", path.display())]
    Corpus { path: PathBuf, message: String },
    #[error(
        "the index and the corpus do not match: {index} has {vectors} vectors, {corpus} has {passages} passages \
         (row i of the index must be passage i of the corpus)"
    )]
    Count { index: PathBuf, vectors: usize, corpus: PathBuf, passages: usize },
    #[error("the index's dimension is {index}, the encoder's {encoder}: they were not made by the same model")]
    Dim { index: usize, encoder: usize },
    #[error("{} maps row {row} to id {id}, which is not a row of the corpus ({passages} passages)", index.display())]
    Id { index: PathBuf, row: usize, id: i64, passages: usize },
}

/// The encoder options a configuration gives.
pub fn encoder_options(config: &DenseConfig) -> EncoderOptions {
    EncoderOptions {
        pooling: config.pooling.map(|p| match p {
            DensePooling::Mean => grove_dense::Pooling::Mean,
            DensePooling::Cls => grove_dense::Pooling::Cls,
        }),
        normalize: config.normalize,
        query_prefix: config.query_prefix.clone(),
        passage_prefix: config.passage_prefix.clone(),
        max_seq_length: config.max_seq_length,
        batch_size: Some(config.batch_size),
        device: Some(match config.device {
            DenseDevice::Auto => grove_dense::DeviceChoice::Auto,
            DenseDevice::Cpu => grove_dense::DeviceChoice::Cpu,
            DenseDevice::Cuda => grove_dense::DeviceChoice::Cuda,
        }),
    }
}

/// Load the encoder a configuration names.
pub fn load_encoder(config: &DenseConfig) -> Result<Encoder, DenseSetupError> {
    let model = config.model.as_ref().ok_or(DenseSetupError::Missing("a model folder (--model or dense.model)"))?;
    Encoder::load(model, &encoder_options(config))
        .map_err(|source| DenseSetupError::Encoder { path: model.clone(), source })
}

/// A wiki-18 JSONL corpus read by row: the byte offset of every non-empty line, found once at
/// start-up, and the file read at those offsets on demand, so 21M passages cost 8 bytes each in
/// memory rather than their text.
#[derive(Debug)]
pub struct CorpusRows {
    path: PathBuf,
    file: File,
    /// Start of line i, plus one final entry: the end of the last line.
    offsets: Vec<(u64, u32)>,
}

impl CorpusRows {
    pub fn open(path: &Path) -> Result<CorpusRows, DenseSetupError> {
        let bad = |message: String| DenseSetupError::Corpus { path: path.to_path_buf(), message };
        let file = File::open(path).map_err(|e| bad(e.to_string()))?;
        let mut reader = BufReader::with_capacity(1 << 20, file.try_clone().map_err(|e| bad(e.to_string()))?);
        let mut offsets = Vec::new();
        let mut at = 0u64;
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = reader.read_until(b'\n', &mut line).map_err(|e| bad(e.to_string()))?;
            if n == 0 {
                break;
            }
            let content = line.trim_ascii_end().len();
            if !line.trim_ascii().is_empty() {
                let len =
                    u32::try_from(content).map_err(|_| bad(format!("line {} is over 4 GiB", offsets.len() + 1)))?;
                offsets.push((at, len));
            }
            at += n as u64;
        }
        Ok(CorpusRows { path: path.to_path_buf(), file, offsets })
    }

    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Passage `row` as `(id, contents)`.
    pub fn get(&self, row: usize) -> Result<(String, String), SearchError> {
        let &(start, len) =
            self.offsets.get(row).ok_or_else(|| SearchError::Index(format!("row {row} is not in the corpus")))?;
        let mut buf = vec![0u8; len as usize];
        self.file
            .read_exact_at(&mut buf, start)
            .map_err(|e| SearchError::Index(format!("corpus {}: {e}", self.path.display())))?;
        #[derive(serde::Deserialize)]
        struct Row {
            id: serde_json::Value,
            contents: String,
        }
        let r: Row = serde_json::from_slice(&buf)
            .map_err(|e| SearchError::Index(format!("corpus {} line of row {row}: {e}", self.path.display())))?;
        let id = match r.id {
            serde_json::Value::String(s) => s,
            other => other.to_string(),
        };
        Ok((id, r.contents))
    }
}

struct DenseInner {
    encoder: Mutex<Encoder>,
    index: FlatIndex,
    /// The HNSW graph when `search = "hnsw"`.
    approx: Option<ApproxIndex>,
    corpus: CorpusRows,
    threads: usize,
}

/// The HNSW parameters of a configuration.
pub fn hnsw_params(config: &DenseConfig) -> HnswParams {
    HnswParams {
        connectivity: config.hnsw_connectivity,
        expansion_add: config.hnsw_expansion_add,
        expansion_search: config.hnsw_expansion_search,
    }
}

/// Map the HNSW graph of `flat` (at `path`, default `<flat>.usearch`), building and saving it
/// first when the file is missing.
pub fn open_or_build_hnsw(
    flat: &FlatIndex,
    path: Option<&Path>,
    config: &DenseConfig,
) -> Result<ApproxIndex, DenseSetupError> {
    let path = path.map(Path::to_path_buf).unwrap_or_else(|| grove_dense::approx::default_path(flat.path()));
    if !path.exists() {
        tracing::info!(vectors = flat.len(), path = %path.display(), "building the HNSW graph (once; saved for the next start)");
        let started = std::time::Instant::now();
        let total = flat.len();
        let mut built = ApproxIndex::build(flat, hnsw_params(config), config.search_threads, &|done| {
            tracing::info!("HNSW: {done} of {total} vectors inserted");
        })?;
        built.save(&path)?;
        tracing::info!(seconds = started.elapsed().as_secs_f64(), "HNSW graph saved");
    }
    Ok(ApproxIndex::open(&path, flat, config.hnsw_expansion_search)?)
}

/// Exact dense retrieval over a FAISS flat index. Cheap to clone.
#[derive(Clone)]
pub struct DenseBackend {
    inner: Arc<DenseInner>,
}

impl std::fmt::Debug for DenseBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenseBackend")
            .field("index", &self.inner.index)
            .field("passages", &self.inner.corpus.len())
            .finish()
    }
}

impl DenseBackend {
    /// Open the index, load the encoder and index the corpus rows; every mismatch between them is
    /// an error here, not a wrong answer later.
    pub fn open(config: &DenseConfig, corpus: &Path) -> Result<DenseBackend, DenseSetupError> {
        let index_path =
            config.index.as_ref().ok_or(DenseSetupError::Missing("an index file (--index or dense.index)"))?;
        let index = FlatIndex::open(index_path)?;
        let encoder = load_encoder(config)?;
        let rows = CorpusRows::open(corpus)?;
        if index.dim() != encoder.dim() {
            return Err(DenseSetupError::Dim { index: index.dim(), encoder: encoder.dim() });
        }
        match index.ids() {
            None if index.len() != rows.len() => {
                return Err(DenseSetupError::Count {
                    index: index_path.clone(),
                    vectors: index.len(),
                    corpus: corpus.to_path_buf(),
                    passages: rows.len(),
                });
            }
            None => {}
            Some(ids) => {
                if let Some((row, &id)) =
                    ids.iter().enumerate().find(|(_, id)| usize::try_from(**id).map_or(true, |i| i >= rows.len()))
                {
                    return Err(DenseSetupError::Id { index: index_path.clone(), row, id, passages: rows.len() });
                }
            }
        }
        let approx = match config.search {
            DenseSearch::Exact => None,
            DenseSearch::Hnsw => Some(open_or_build_hnsw(&index, config.hnsw_index.as_deref(), config)?),
        };
        Ok(DenseBackend {
            inner: Arc::new(DenseInner {
                encoder: Mutex::new(encoder),
                index,
                approx,
                corpus: rows,
                threads: config.search_threads,
            }),
        })
    }

    pub fn len(&self) -> usize {
        self.inner.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inner.index.is_empty()
    }

    /// Blocking: encode and search a batch.
    fn search_blocking(&self, queries: &[String], topk: usize) -> Result<Vec<Vec<Hit>>, SearchError> {
        let inner = &self.inner;
        let texts: Vec<&str> = queries.iter().map(String::as_str).collect();
        let vectors = {
            let encoder = inner.encoder.lock().map_err(|_| SearchError::Internal("encoder lock poisoned".into()))?;
            encoder.encode(&texts, TextKind::Query).map_err(|e| SearchError::Internal(format!("encoder: {e}")))?
        };
        let found = match &inner.approx {
            None => grove_dense::search(&inner.index, &vectors, topk, inner.threads),
            Some(approx) => {
                approx.search_parallel(&vectors, topk, inner.threads).map_err(|e| SearchError::Index(e.to_string()))?
            }
        };
        found
            .into_iter()
            .map(|list| {
                list.into_iter()
                    .map(|n| {
                        let row = inner.index.id(n.row) as usize;
                        let (id, contents) = inner.corpus.get(row)?;
                        Ok(Hit::doc(id, contents, n.score))
                    })
                    .collect()
            })
            .collect()
    }
}

impl SearchBackend for DenseBackend {
    fn name(&self) -> &str {
        "dense"
    }

    fn search(&self, queries: Vec<String>, topk: usize) -> SearchFuture {
        let this = self.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || this.search_blocking(&queries, topk))
                .await
                .map_err(|e| SearchError::Internal(format!("dense search task: {e}")))?
        })
    }
}

/// BM25 and dense lists fused by reciprocal rank; the score of a hit is its fused score.
#[derive(Debug, Clone)]
pub struct HybridBackend {
    bm25: LocalIndex,
    dense: DenseBackend,
    depth: usize,
    k: f64,
}

impl HybridBackend {
    pub fn new(bm25: LocalIndex, dense: DenseBackend, depth: usize, k: f64) -> HybridBackend {
        HybridBackend { bm25, dense, depth, k }
    }
}

impl SearchBackend for HybridBackend {
    fn name(&self) -> &str {
        "hybrid"
    }

    fn search(&self, queries: Vec<String>, topk: usize) -> SearchFuture {
        let depth = self.depth.max(topk);
        let lexical = self.bm25.search(queries.clone(), depth);
        let dense = self.dense.search(queries, depth);
        let k = self.k;
        Box::pin(async move {
            let (lexical, dense) = (lexical.await?, dense.await?);
            if lexical.len() != dense.len() {
                return Err(SearchError::Internal("the two retrievers answered different query counts".into()));
            }
            Ok(lexical
                .into_iter()
                .zip(dense)
                .map(|(a, b)| {
                    let mut contents = std::collections::HashMap::new();
                    let ids = |hits: Vec<Hit>, contents: &mut std::collections::HashMap<String, String>| {
                        hits.into_iter()
                            .map(|h| {
                                contents.entry(h.id.clone()).or_insert(h.contents);
                                h.id
                            })
                            .collect::<Vec<_>>()
                    };
                    let lists = [ids(a, &mut contents), ids(b, &mut contents)];
                    grove_dense::reciprocal_rank_fusion(&lists, k, topk)
                        .into_iter()
                        .map(|(id, score)| {
                            let text = contents.remove(&id).unwrap_or_default();
                            Hit::doc(id, text, score as f32)
                        })
                        .collect()
                })
                .collect())
        })
    }
}
