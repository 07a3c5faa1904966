//! The data layer's errors: [`RowError`] (one unreadable row, shown as `path:line: message`) and
//! [`DatasetError`] (a file that cannot be read, a bad row, a malformed file), and its `Result`.

use std::path::PathBuf;

/// One unreadable row: where it is and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}: {message}", path.display())]
pub struct RowError {
    pub path: PathBuf,
    /// 1-based line (JSONL) or row number (parquet).
    pub line: usize,
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Row(#[from] RowError),
    #[error("{}: {message}", path.display())]
    Format { path: PathBuf, message: String },
}

impl DatasetError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DatasetError::Io { path: path.into(), source }
    }

    pub(crate) fn format(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        DatasetError::Format { path: path.into(), message: message.into() }
    }
}

pub type Result<T, E = DatasetError> = std::result::Result<T, E>;
