//! Grove's data layer: QA examples and corpus passages, loaders for the formats the field uses
//! (FlashRAG JSONL, Search-R1 parquet, wiki-18 JSONL), the metrics and rewards of Search-R1 /
//! Tree-GRPO (normalisation, EM, F1, answer extraction, format validity, reward tables), a seeded
//! synthetic multi-hop world, and importers for the real data fetched by `cargo xtask assets`.
//!
//! Architecture invariant: no network I/O and no tensor work happen here. Files in, values out.

pub mod actions;
pub mod assets;
mod error;
pub mod import;
pub mod loaders;
pub mod metrics;
pub mod synthetic;
mod types;

pub use error::{DatasetError, Result, RowError};
pub use loaders::{Loaded, OnBadRow};
pub use types::{Metric, Passage, QaExample, metric_for_source, render_prompt, task_metric};
