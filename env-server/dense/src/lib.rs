//! Dense retrieval for the env-server, in one crate so that a BM25-only build of the server does
//! not link libtorch (the server turns it on with its `dense` feature).
//!
//! - [`encoder`]: BERT-family sentence encoders (e5, BGE, MiniLM) loaded from a Hugging Face
//!   folder, with the folder's pooling, normalisation and prefixes, run with tch (libtorch, as the
//!   trainer uses: CPU always, CUDA when libtorch has it).
//! - [`faiss`]: FAISS `IndexFlatIP` / `IndexFlatL2` files (as Search-R1 ships `e5_Flat.index`)
//!   mapped in place and written in the same format.
//! - [`exact`]: exact top-k over such an index, one matrix product per block for all the queries
//!   of a tick.
//! - [`approx`]: an HNSW graph (usearch) over a flat index's rows, for CPU-only serving.
//! - [`fusion`]: reciprocal-rank fusion of ranked lists (hybrid BM25 + dense).

pub mod approx;
pub mod encoder;
pub mod exact;
pub mod faiss;
pub mod fusion;

pub use approx::{ApproxError, ApproxIndex, HnswParams};
pub use encoder::{DeviceChoice, Encoder, EncoderError, EncoderOptions, Pooling, TextKind};
pub use exact::{Neighbour, search};
pub use faiss::{FaissError, FlatIndex, FlatWriter, Metric, Storage, encode_f16};
pub use fusion::reciprocal_rank_fusion;
