//! Helpers for Grove's cross-crate integration tests (the tests themselves are in `tests/`).

use std::path::PathBuf;

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().map(PathBuf::from).unwrap_or_default()
}

/// `../shared` beside the repository: fixtures, golden model outputs, docs.
pub fn shared_dir() -> PathBuf {
    repo_root().join("..").join("shared")
}

/// A file of `../shared/fixtures`.
pub fn fixture(name: &str) -> PathBuf {
    shared_dir().join("fixtures").join(name)
}
