//! Dense and hybrid retrieval: the `[dense]` configuration ([`DenseConfig`] and its enums),
//! compiled in every build so that a configuration parses (and is refused with a clear message)
//! without the `dense` feature; and, with the feature, the backends themselves (`backend.rs`:
//! the encoder, the FAISS flat index, HNSW, the hybrid fusion; `writer.rs`: encoding a corpus
//! into a flat index), re-exported here.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[cfg(feature = "dense")]
mod backend;
#[cfg(feature = "dense")]
mod writer;

#[cfg(feature = "dense")]
pub use backend::{
    CorpusRows, DenseBackend, DenseSetupError, HybridBackend, encoder_options, hnsw_params, load_encoder,
    open_or_build_hnsw,
};
#[cfg(feature = "dense")]
pub use writer::{WriteProgress, WriteReport, default_index_path, write_flat_index};

/// The dense and hybrid backends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DenseConfig {
    /// A FAISS `IndexFlatIP` / `IndexFlatL2` file (e.g. Search-R1's `e5_Flat.index`), or an
    /// `IndexIDMap` over one whose ids are corpus rows.
    pub index: Option<PathBuf>,
    /// The encoder: a Hugging Face folder with `config.json`, `model.safetensors` and
    /// `tokenizer.json` (and the sentence-transformers files when it has them).
    pub model: Option<PathBuf>,
    /// Pooling when the folder has no sentence-transformers pooling module.
    pub pooling: Option<DensePooling>,
    /// L2-normalise query vectors (default: as the folder says; true without `modules.json`).
    pub normalize: Option<bool>,
    /// Put before every query; `"query: "` for e5 (default: the folder's `query` prompt).
    pub query_prefix: Option<String>,
    /// Put before every passage when building an index; `"passage: "` for e5.
    pub passage_prefix: Option<String>,
    /// Tokens per text (default: the folder's `max_seq_length`).
    pub max_seq_length: Option<usize>,
    /// Texts per encoder forward pass.
    pub batch_size: usize,
    pub device: DenseDevice,
    /// `exact` (every vector scored: faiss's `IndexFlat`) or `hnsw` (an approximate graph over
    /// the same vectors, for CPU-only serving of large indexes).
    pub search: DenseSearch,
    /// The HNSW graph file (default `<index>.usearch`); built and saved at start-up if missing.
    pub hnsw_index: Option<PathBuf>,
    /// HNSW edges per node (M).
    pub hnsw_connectivity: usize,
    /// HNSW candidates while inserting (efConstruction).
    pub hnsw_expansion_add: usize,
    /// HNSW candidates while searching (efSearch): larger is slower and closer to exact.
    pub hnsw_expansion_search: usize,
    /// Threads for the exact search and the HNSW build (0 = every core).
    pub search_threads: usize,
    /// Hybrid: results taken from each retriever before fusion (at least the request's top-k).
    pub hybrid_depth: usize,
    /// Hybrid: the constant k of reciprocal-rank fusion, 1 / (k + rank).
    pub rrf_k: f64,
}

impl Default for DenseConfig {
    fn default() -> Self {
        Self {
            index: None,
            model: None,
            pooling: None,
            normalize: None,
            query_prefix: None,
            passage_prefix: None,
            max_seq_length: None,
            batch_size: 64,
            device: DenseDevice::Auto,
            search: DenseSearch::Exact,
            hnsw_index: None,
            hnsw_connectivity: 16,
            hnsw_expansion_add: 128,
            hnsw_expansion_search: 64,
            search_threads: 0,
            hybrid_depth: 50,
            rrf_k: 60.0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum DenseSearch {
    Exact,
    Hnsw,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum DensePooling {
    Mean,
    Cls,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum DenseDevice {
    /// CUDA when libtorch has it and a GPU is present, else CPU.
    Auto,
    Cpu,
    Cuda,
}
