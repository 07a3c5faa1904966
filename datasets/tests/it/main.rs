//! The datasets crate's integration tests, one binary: the loaders on files written by the
//! field's own tools, the importers, the metric tables of spec §4 and the synthetic world. The
//! parquet-reading modules need the default `parquet` feature.

#[cfg(feature = "parquet")]
mod fixtures;
#[cfg(feature = "parquet")]
mod import;
mod metrics;
mod synthetic;
