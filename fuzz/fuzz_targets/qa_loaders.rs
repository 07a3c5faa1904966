//! grove-datasets' loaders on arbitrary files: wiki-18 corpus JSONL, FlashRAG QA JSONL and
//! Search-R1 parquet. The loaders take paths, so each input is written to one scratch file (in
//! /dev/shm where there is one) and every loader reads it. Anything may be an error; nothing may
//! panic, abort or allocate without bound.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::{Once, OnceLock};

use grove_datasets::loaders::{load_qa_jsonl, load_searchr1_parquet, load_wiki18, stream_wiki18};
use grove_datasets::{DatasetError, Loaded, OnBadRow};
use libfuzzer_sys::fuzz_target;

fn scratch() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let shm = Path::new("/dev/shm");
        let dir = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        dir.join(format!("grove-fuzz-qa-loaders-{}", std::process::id()))
    })
}

/// The rows a JSONL loader must account for: every line that is not blank (a line that is not
/// UTF-8 is a bad row, not a blank one).
fn rows(data: &[u8]) -> Vec<usize> {
    let mut lines: Vec<&[u8]> = data.split(|b| *b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
        .iter()
        .enumerate()
        .filter(|(_, l)| {
            let l = l.strip_suffix(b"\r").unwrap_or(l);
            std::str::from_utf8(l).map_or(true, |s| !s.trim().is_empty())
        })
        .map(|(i, _)| i + 1)
        .collect()
}

/// Skip mode accounts for every row, in order; Fail mode fails exactly when Skip saw a bad row.
fn check_jsonl<T: PartialEq + std::fmt::Debug>(
    data: &[u8],
    load: impl Fn(OnBadRow) -> Result<Loaded<T>, DatasetError>,
) {
    let rows = rows(data);
    let skipped = load(OnBadRow::Skip).expect("Skip mode only fails on I/O");
    assert_eq!(skipped.items.len() + skipped.bad_rows.len(), rows.len(), "rows lost or invented");
    for bad in &skipped.bad_rows {
        assert!(rows.contains(&bad.line), "bad row at line {} which is blank or absent", bad.line);
        assert_eq!(bad.path, scratch());
    }
    assert!(skipped.bad_rows.windows(2).all(|w| w[0].line < w[1].line), "bad rows out of order");
    match load(OnBadRow::Fail) {
        Ok(all) => {
            assert!(skipped.bad_rows.is_empty(), "Fail mode accepted a bad row");
            assert_eq!(all.items, skipped.items);
        }
        Err(DatasetError::Row(e)) => assert_eq!(Some(&e), skipped.bad_rows.first()),
        Err(e) => panic!("Fail mode: unexpected error {e}"),
    }
}

/// libfuzzer-sys aborts on every panic, even one caught: the parquet loader catches the parquet
/// crate's panics on corrupt files and returns an error, so those are let through quietly. A panic
/// raised in the standard library on its behalf (parquet's `Vec::with_capacity` of a negative
/// count is a "capacity overflow" in `alloc`) is recognised by the parquet frames on its stack.
/// Any other panic, or a parquet one that escapes the loader, still ends the run as a crash.
fn quiet_parquet_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let fuzzer_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let at = |file: &str| file.contains("/parquet-");
            let in_parquet = info.location().is_some_and(|l| at(l.file())) || {
                let stack = std::backtrace::Backtrace::force_capture().to_string();
                stack.lines().any(|frame| frame.contains("parquet::") || at(frame))
            };
            if !in_parquet {
                fuzzer_hook(info);
            }
        }));
    });
}

fuzz_target!(|data: &[u8]| {
    quiet_parquet_panics();
    let path = scratch();
    std::fs::write(path, data).expect("write scratch file");

    check_jsonl(data, |on_bad| load_wiki18(path, on_bad));
    let streamed = stream_wiki18(path).expect("stream").count();
    assert_eq!(streamed, rows(data).len());
    check_jsonl(data, |on_bad| load_qa_jsonl(path, "fuzz", Some("train"), on_bad));
    check_jsonl(data, |on_bad| load_qa_jsonl(path, "fuzz", None, on_bad));

    match load_searchr1_parquet(path, OnBadRow::Skip) {
        Ok(loaded) => {
            for q in &loaded.items {
                assert!(!q.golden_answers.is_empty());
            }
        }
        Err(DatasetError::Format { .. } | DatasetError::Row(_)) => {}
        Err(e) => panic!("parquet: unexpected error {e}"),
    }
});
