//! An approximate index for CPU-only serving: an HNSW graph (usearch, a maintained C++ library
//! with Rust bindings) built over the rows of a FAISS flat file, saved beside it and mapped back
//! in place when the server starts. Keys are flat-index rows, so results map to the corpus the
//! same way as the exact search's, and scores are reported as faiss does (inner product, or
//! squared L2 distance).

use std::path::{Path, PathBuf};

use crate::exact::Neighbour;
use crate::faiss::FlatIndex;
use crate::faiss::Metric;

#[derive(Debug, thiserror::Error)]
pub enum ApproxError {
    #[error("HNSW index {}: {message}", path.display())]
    Index { path: PathBuf, message: String },
    #[error("HNSW index {}: built for {found}, the flat index is {expected}", path.display())]
    Mismatch { path: PathBuf, found: String, expected: String },
}

/// Concurrent searches an opened index is prepared for; [`ApproxIndex::search_parallel`] uses
/// at most a quarter of them, so several calls can overlap. usearch refuses a search beyond its
/// prepared contexts, so callers beyond this many wait for a free one ([`Slots`]) instead.
const MAX_SEARCH_THREADS: usize = 64;

/// A counting semaphore over usearch's search contexts: a search holds one while it runs, and a
/// caller finding none free waits (in arrival order is not promised; every waiter is woken as
/// contexts free up). Blocking is right here: searches run on blocking threads, never on the
/// async runtime's workers.
#[derive(Debug)]
struct Slots {
    used: std::sync::Mutex<usize>,
    freed: std::sync::Condvar,
    max: usize,
}

struct SlotGuard<'a>(&'a Slots);

impl Slots {
    fn new(max: usize) -> Slots {
        Slots { used: std::sync::Mutex::new(0), freed: std::sync::Condvar::new(), max }
    }

    fn acquire(&self) -> SlotGuard<'_> {
        let mut used = self.used.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while *used >= self.max {
            used = self.freed.wait(used).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        *used += 1;
        SlotGuard(self)
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        let mut used = self.0.used.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *used -= 1;
        self.0.freed.notify_one();
    }
}

/// Graph parameters (the defaults are usearch's own); zero means usearch's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HnswParams {
    /// Edges per node (HNSW's M).
    pub connectivity: usize,
    /// Candidates kept while inserting (efConstruction).
    pub expansion_add: usize,
    /// Candidates kept while searching (efSearch): larger is slower and more exact.
    pub expansion_search: usize,
}

impl Default for HnswParams {
    fn default() -> Self {
        HnswParams { connectivity: 16, expansion_add: 128, expansion_search: 64 }
    }
}

/// An HNSW index over the rows of a flat index.
pub struct ApproxIndex {
    index: usearch::Index,
    metric: Metric,
    dim: usize,
    path: Option<PathBuf>,
    slots: Slots,
}

impl std::fmt::Debug for ApproxIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApproxIndex")
            .field("path", &self.path)
            .field("len", &self.index.size())
            .field("dim", &self.dim)
            .field("metric", &self.metric)
            .finish()
    }
}

fn options(dim: usize, metric: Metric, p: HnswParams) -> usearch::IndexOptions {
    usearch::IndexOptions {
        dimensions: dim,
        metric: match metric {
            Metric::InnerProduct => usearch::MetricKind::IP,
            Metric::L2 => usearch::MetricKind::L2sq,
        },
        quantization: usearch::ScalarKind::F32,
        connectivity: p.connectivity,
        expansion_add: p.expansion_add,
        expansion_search: p.expansion_search,
        multi: false,
    }
}

/// The default file of the HNSW index of a flat index: `<flat>.usearch`.
pub fn default_path(flat: &Path) -> PathBuf {
    let mut name = flat.file_name().unwrap_or_default().to_os_string();
    name.push(".usearch");
    flat.with_file_name(name)
}

impl ApproxIndex {
    /// Insert every row of `flat` (rows become keys), on `threads` threads (0 = every core).
    /// `progress` is called with the rows inserted so far, from time to time.
    pub fn build(
        flat: &FlatIndex,
        params: HnswParams,
        threads: usize,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<ApproxIndex, ApproxError> {
        let err = |e: cxx::Exception| ApproxError::Index { path: flat.path().to_path_buf(), message: e.to_string() };
        let threads = if threads == 0 { std::thread::available_parallelism().map_or(1, |t| t.get()) } else { threads };
        let index = usearch::Index::new(&options(flat.dim(), flat.metric(), params)).map_err(err)?;
        index.reserve_capacity_and_threads(flat.len(), threads).map_err(err)?;
        let n = flat.len();
        let done = std::sync::atomic::AtomicUsize::new(0);
        let chunk = n.div_ceil(threads).max(1);
        let failures: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (index, done) = (&index, &done);
                    s.spawn(move || -> Result<(), String> {
                        let (start, end) = ((t * chunk).min(n), ((t + 1) * chunk).min(n));
                        let mut v = vec![0f32; flat.dim()];
                        for row in start..end {
                            flat.decode_rows(row, &mut v);
                            index.add(row as u64, &v).map_err(|e| e.to_string())?;
                            let d = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                            if d.is_multiple_of(10_000) {
                                progress(d);
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().unwrap_or_else(|_| Err("a build thread panicked".into())).err())
                .collect()
        });
        if let Some(first) = failures.into_iter().next() {
            return Err(ApproxError::Index { path: flat.path().to_path_buf(), message: first });
        }
        progress(n);
        // Prepare as many search contexts as an opened index has.
        index.reserve_capacity_and_threads(n, MAX_SEARCH_THREADS.max(threads)).map_err(err)?;
        let slots = Slots::new(MAX_SEARCH_THREADS);
        Ok(ApproxIndex { index, metric: flat.metric(), dim: flat.dim(), path: None, slots })
    }

    /// Write the index to `path`.
    pub fn save(&mut self, path: &Path) -> Result<(), ApproxError> {
        let s = path
            .to_str()
            .ok_or_else(|| ApproxError::Index { path: path.to_path_buf(), message: "not UTF-8".into() })?;
        let partial = format!("{s}.partial");
        self.index
            .save(&partial)
            .map_err(|e| ApproxError::Index { path: path.to_path_buf(), message: e.to_string() })?;
        std::fs::rename(&partial, path)
            .map_err(|e| ApproxError::Index { path: path.to_path_buf(), message: e.to_string() })?;
        self.path = Some(path.to_path_buf());
        Ok(())
    }

    /// Map the index saved at `path` and check that it was built over `flat`.
    pub fn open(path: &Path, flat: &FlatIndex, expansion_search: usize) -> Result<ApproxIndex, ApproxError> {
        Self::open_with_contexts(path, flat, expansion_search, MAX_SEARCH_THREADS)
    }

    /// [`open`](Self::open) with `contexts` concurrent searches prepared (and at most that many
    /// running at once; more callers wait).
    fn open_with_contexts(
        path: &Path,
        flat: &FlatIndex,
        expansion_search: usize,
        contexts: usize,
    ) -> Result<ApproxIndex, ApproxError> {
        let err = |message: String| ApproxError::Index { path: path.to_path_buf(), message };
        let s = path.to_str().ok_or_else(|| err("not UTF-8".into()))?;
        if !path.exists() {
            return Err(err("no such file".into()));
        }
        let index = usearch::Index::restore_view(s).map_err(|e| err(e.to_string()))?;
        let metric = match index.metric_kind() {
            usearch::MetricKind::IP => Metric::InnerProduct,
            usearch::MetricKind::L2sq => Metric::L2,
            other => return Err(err(format!("metric {other:?} is neither inner product nor squared L2"))),
        };
        let found = (index.size(), index.dimensions(), metric);
        let expected = (flat.len(), flat.dim(), flat.metric());
        if found != expected {
            return Err(ApproxError::Mismatch {
                path: path.to_path_buf(),
                found: format!("{} vectors of dimension {}, {:?}", found.0, found.1, found.2),
                expected: format!("{} vectors of dimension {}, {:?}", expected.0, expected.1, expected.2),
            });
        }
        if expansion_search > 0 {
            index.change_expansion_search(expansion_search);
        }
        // usearch keeps one search context per concurrent caller and refuses a search beyond
        // them; a view starts with too few. Contexts are small (a visited set each).
        index.reserve_capacity_and_threads(index.size(), contexts).map_err(|e| err(e.to_string()))?;
        let slots = Slots::new(contexts);
        Ok(ApproxIndex { index, metric, dim: flat.dim(), path: Some(path.to_path_buf()), slots })
    }

    pub fn len(&self) -> usize {
        self.index.size()
    }

    pub fn is_empty(&self) -> bool {
        self.index.size() == 0
    }

    pub fn set_expansion_search(&self, n: usize) {
        self.index.change_expansion_search(n);
    }

    /// [`search`](Self::search) with the queries spread over `threads` threads (0 = every core).
    pub fn search_parallel(
        &self,
        queries: &[f32],
        k: usize,
        threads: usize,
    ) -> Result<Vec<Vec<Neighbour>>, ApproxError> {
        let nq = queries.len() / self.dim.max(1);
        let threads = if threads == 0 { std::thread::available_parallelism().map_or(1, |t| t.get()) } else { threads };
        let threads = threads.clamp(1, nq.max(1)).min(MAX_SEARCH_THREADS / 4);
        if threads == 1 {
            return self.search(queries, k);
        }
        let per = nq.div_ceil(threads) * self.dim;
        let parts: Vec<Result<Vec<Vec<Neighbour>>, ApproxError>> = std::thread::scope(|s| {
            let handles: Vec<_> = queries.chunks(per).map(|part| s.spawn(move || self.search(part, k))).collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(ApproxError::Index { path: PathBuf::new(), message: "a search thread panicked".into() })
                    })
                })
                .collect()
        });
        let mut out = Vec::with_capacity(nq);
        for part in parts {
            out.extend(part?);
        }
        Ok(out)
    }

    /// The (approximately) `k` nearest rows to each query, best first, scored as faiss scores.
    pub fn search(&self, queries: &[f32], k: usize) -> Result<Vec<Vec<Neighbour>>, ApproxError> {
        let err = |message: String| ApproxError::Index { path: self.path.clone().unwrap_or_default(), message };
        if !queries.len().is_multiple_of(self.dim) {
            return Err(err(format!("queries are not whole {}-dimensional rows", self.dim)));
        }
        if k == 0 || self.is_empty() {
            return Ok(vec![Vec::new(); queries.len() / self.dim]);
        }
        let _slot = self.slots.acquire();
        queries
            .chunks_exact(self.dim)
            .map(|q| {
                let m = self.index.search(q, k).map_err(|e| err(e.to_string()))?;
                Ok(m.keys
                    .iter()
                    .zip(&m.distances)
                    .map(|(&key, &d)| Neighbour {
                        row: key as usize,
                        score: match self.metric {
                            // usearch's inner-product distance is 1 - x.q.
                            Metric::InnerProduct => 1.0 - d,
                            Metric::L2 => d,
                        },
                    })
                    .collect())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faiss::FlatWriter;

    fn random_flat(dir: &Path, n: usize, dim: usize, metric: Metric) -> FlatIndex {
        let mut state = 99u64;
        let mut next = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let path = dir.join(format!("{metric:?}.index"));
        let mut w = FlatWriter::create_or_resume(&path, dim, metric).unwrap();
        let mut v: Vec<f32> = (0..n * dim).map(|_| next()).collect();
        for r in v.chunks_exact_mut(dim) {
            let norm = r.iter().map(|x| x * x).sum::<f32>().sqrt();
            r.iter_mut().for_each(|x| *x /= norm);
        }
        w.append(&v).unwrap();
        w.finish().unwrap();
        FlatIndex::open(&path).unwrap()
    }

    /// Recall@10 against the exact search, saved and mapped back, scores on faiss's scale.
    #[test]
    fn hnsw_finds_the_exact_neighbours_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        // Uniform random vectors are the hardest case for a graph: a wider search than the
        // defaults, fixed here so the test does not move with them.
        let params = HnswParams { connectivity: 32, expansion_add: 128, expansion_search: 128 };
        for metric in [Metric::InnerProduct, Metric::L2] {
            let flat = random_flat(dir.path(), 4000, 32, metric);
            let mut built = ApproxIndex::build(&flat, params, 2, &|_| {}).unwrap();
            let path = default_path(flat.path());
            built.save(&path).unwrap();
            let approx = ApproxIndex::open(&path, &flat, params.expansion_search).unwrap();
            assert_eq!(approx.len(), 4000);
            let queries: Vec<f32> = (0..50).flat_map(|r| flat.vector(r * 7)).collect();
            let exact = crate::exact::search(&flat, &queries, 10, 1);
            let found = approx.search(&queries, 10).unwrap();
            assert_eq!(approx.search_parallel(&queries, 10, 3).unwrap(), found);
            let (mut hits, mut self_first) = (0, 0);
            for (e, a) in exact.iter().zip(&found) {
                hits += a.iter().filter(|n| e.iter().any(|x| x.row == n.row)).count();
                // The query is row 7r itself: found first, with its exact score, for nearly every
                // query (the graph is approximate, and a parallel build is not deterministic).
                if (a[0].score - e[0].score).abs() < 1e-4 {
                    self_first += 1;
                }
            }
            assert!(self_first >= 45, "{metric:?}: the query itself came first for {self_first} of 50");
            let recall = hits as f64 / 500.0;
            assert!(recall > 0.9, "{metric:?}: recall@10 {recall}");
            // A graph of another index is refused.
            let other_dir = dir.path().join("other");
            std::fs::create_dir_all(&other_dir).unwrap();
            let other = random_flat(&other_dir, 10, 32, metric);
            let err = ApproxIndex::open(&path, &other, 0).unwrap_err();
            assert!(err.to_string().contains("built for 4000 vectors"), "{err}");
        }
    }

    /// More overlapping searches than usearch has contexts wait for one instead of failing
    /// ("Reserve capacity ahead of searches!"): 4 calls of 16 threads each against 2 contexts
    /// (against the default 64, the same overlap needs more cores than CI has to show).
    #[test]
    fn overlapping_searches_beyond_the_contexts_queue() {
        let dir = tempfile::tempdir().unwrap();
        let flat = random_flat(dir.path(), 2000, 16, Metric::InnerProduct);
        let mut built = ApproxIndex::build(&flat, HnswParams::default(), 2, &|_| {}).unwrap();
        let path = default_path(flat.path());
        built.save(&path).unwrap();
        for approx in [built, ApproxIndex::open_with_contexts(&path, &flat, 0, 2).unwrap()] {
            let queries: Vec<f32> = (0..640).flat_map(|r| flat.vector(r * 3)).collect();
            let alone = approx.search(&queries, 5).unwrap();
            std::thread::scope(|s| {
                let calls: Vec<_> = (0..4).map(|_| s.spawn(|| approx.search_parallel(&queries, 5, 64))).collect();
                for call in calls {
                    assert_eq!(call.join().unwrap().unwrap(), alone);
                }
            });
            assert_eq!(*approx.slots.used.lock().unwrap(), 0);
        }
    }
}
