//! Questions as env tasks: loading a Search-R1 parquet or a QA JSONL file, and choosing which
//! questions an evaluation uses (all of them, or a seeded random sample that says so).

use std::path::Path;

use rand::SeedableRng;
use rand::seq::index::sample;
use rand_chacha::ChaCha8Rng;

pub use grove_rundir::EvalSelection;

/// Questions from a Search-R1 parquet or a QA JSONL file, as env tasks.
pub fn load_tasks(
    path: &Path,
    data_source: &str,
) -> Result<Vec<grove_protocol::TaskSpec>, grove_datasets::DatasetError> {
    load_tasks_where(path, data_source, None)
}

/// As [`load_tasks`], keeping only rows whose metadata has `flag` set to true (e.g.
/// `answer_in_passage` for the FanOutQA questions the mini-Wikipedia corpus answers).
pub fn load_tasks_where(
    path: &Path,
    data_source: &str,
    flag: Option<&str>,
) -> Result<Vec<grove_protocol::TaskSpec>, grove_datasets::DatasetError> {
    use grove_datasets::loaders::{load_qa_jsonl, load_searchr1_parquet};
    let examples = if path.extension().is_some_and(|e| e == "parquet") {
        load_searchr1_parquet(path, grove_datasets::OnBadRow::Fail)?.items
    } else {
        load_qa_jsonl(path, data_source, None, grove_datasets::OnBadRow::Fail)?.items
    };
    Ok(examples
        .into_iter()
        .filter(|e| flag.is_none_or(|f| e.metadata.get(f).and_then(serde_json::Value::as_bool) == Some(true)))
        .map(|e| e.task_spec())
        .collect())
}

/// The questions to evaluate: every one when `max` is `None` or not smaller than the file, else
/// `max` of them drawn uniformly without replacement with `seed` (kept in file order). Never
/// silently the first rows.
pub fn select<T: Clone>(items: &[T], max: Option<usize>, seed: u64) -> (Vec<T>, EvalSelection) {
    match max {
        Some(n) if n < items.len() => {
            let mut chosen = sample(&mut ChaCha8Rng::seed_from_u64(seed), items.len(), n).into_vec();
            chosen.sort_unstable();
            let picked = chosen.into_iter().map(|i| items[i].clone()).collect();
            (picked, EvalSelection::Sample { questions: n, of: items.len(), seed })
        }
        _ => (items.to_vec(), EvalSelection::All { questions: items.len() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_file_by_default_else_a_seeded_sample() {
        let items: Vec<u32> = (0..100).collect();
        let (all, sel) = select(&items, None, 3);
        assert_eq!((all.len(), sel), (100, EvalSelection::All { questions: 100 }));
        assert_eq!(select(&items, Some(500), 3).1, EvalSelection::All { questions: 100 });
        let (a, sel) = select(&items, Some(10), 3);
        assert_eq!(sel, EvalSelection::Sample { questions: 10, of: 100, seed: 3 });
        assert_eq!(a.len(), 10);
        assert!(a.windows(2).all(|w| w[0] < w[1]), "file order");
        assert_ne!(a, (0..10).collect::<Vec<_>>(), "not the first rows");
        assert_eq!(select(&items, Some(10), 3).0, a, "seeded");
        assert_ne!(select(&items, Some(10), 4).0, a, "another seed, another sample");
    }
}
