//! Exact top-k over a flat index, as faiss's `IndexFlat::search` answers it: by inner product
//! (largest first) or by squared L2 distance (smallest first). All the queries of a call are
//! scored together: the index is read in blocks of rows, each block decoded once and multiplied
//! by the query matrix in one `sgemm`, so the index is streamed from memory once per call
//! however many queries it holds. Blocks are spread over threads.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::faiss::{FlatIndex, Metric};

/// One result: the index row and its score (the inner product, or the squared L2 distance).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Neighbour {
    pub row: usize,
    pub score: f32,
}

/// Rows per block: 256 rows of 768 floats is 768 KiB, which stays in L2 next to the queries.
const BLOCK_ROWS: usize = 256;

/// A heap entry ordered so that the heap's top is the worst of the kept results.
#[derive(Debug, Clone, Copy)]
struct Kept {
    /// Larger is better (the inner product, or minus the L2 distance).
    goodness: f32,
    row: usize,
}

impl PartialEq for Kept {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Kept {}
impl PartialOrd for Kept {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Kept {
    /// "Greater" = worse: lower goodness, then the higher row (faiss keeps the lower row on ties).
    fn cmp(&self, other: &Self) -> Ordering {
        other.goodness.total_cmp(&self.goodness).then(self.row.cmp(&other.row))
    }
}

/// The best `k` results of each query so far.
struct TopK {
    k: usize,
    heaps: Vec<BinaryHeap<Kept>>,
}

impl TopK {
    fn new(queries: usize, k: usize) -> TopK {
        TopK { k, heaps: (0..queries).map(|_| BinaryHeap::with_capacity(k + 1)).collect() }
    }

    fn offer(&mut self, query: usize, item: Kept) {
        let heap = &mut self.heaps[query];
        if heap.len() < self.k {
            heap.push(item);
        } else if let Some(worst) = heap.peek()
            && item < *worst
        {
            heap.pop();
            heap.push(item);
        }
    }

    fn merge(&mut self, other: TopK) {
        for (q, heap) in other.heaps.into_iter().enumerate() {
            for item in heap {
                self.offer(q, item);
            }
        }
    }
}

/// The `k` nearest rows of `index` to each query. `queries` holds the queries row-major, each of
/// the index's dimension. Results come best first; fewer than `k` when the index is smaller.
/// `threads` = 0 uses every core.
pub fn search(index: &FlatIndex, queries: &[f32], k: usize, threads: usize) -> Vec<Vec<Neighbour>> {
    let dim = index.dim();
    assert!(queries.len().is_multiple_of(dim), "queries must be whole {dim}-dimensional rows");
    let nq = queries.len() / dim;
    let n = index.len();
    if nq == 0 || k == 0 || n == 0 {
        return vec![Vec::new(); nq];
    }
    let metric = index.metric();
    let query_norms: Vec<f32> = queries.chunks_exact(dim).map(|q| q.iter().map(|x| x * x).sum()).collect();
    let threads = if threads == 0 { std::thread::available_parallelism().map_or(1, |t| t.get()) } else { threads };
    let blocks = n.div_ceil(BLOCK_ROWS);
    let threads = threads.clamp(1, blocks);
    let per_thread = blocks.div_ceil(threads);

    let scan = |first_block: usize, last_block: usize| -> TopK {
        let mut top = TopK::new(nq, k);
        let mut rows = vec![0f32; BLOCK_ROWS * dim];
        let mut scores = vec![0f32; BLOCK_ROWS * nq];
        for block in first_block..last_block {
            let start = block * BLOCK_ROWS;
            let count = BLOCK_ROWS.min(n - start);
            let rows = &mut rows[..count * dim];
            index.decode_rows(start, rows);
            let scores = &mut scores[..count * nq];
            inner_products(rows, queries, dim, scores);
            for (r, (row_scores, row)) in scores.chunks_exact(nq).zip(rows.chunks_exact(dim)).enumerate() {
                let row_norm: f32 = match metric {
                    Metric::L2 => row.iter().map(|x| x * x).sum(),
                    Metric::InnerProduct => 0.0,
                };
                for (q, &ip) in row_scores.iter().enumerate() {
                    let goodness = match metric {
                        Metric::InnerProduct => ip,
                        Metric::L2 => -(row_norm + query_norms[q] - 2.0 * ip).max(0.0),
                    };
                    top.offer(q, Kept { goodness, row: start + r });
                }
            }
        }
        top
    };

    let mut top = if threads == 1 {
        scan(0, blocks)
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (a, b) = (t * per_thread, ((t + 1) * per_thread).min(blocks));
                    s.spawn(move || scan(a, b))
                })
                .collect();
            let mut parts = handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            let mut first = parts.next().unwrap_or_else(|| TopK::new(nq, k));
            for part in parts {
                first.merge(part);
            }
            first
        })
    };
    top.heaps
        .iter_mut()
        .map(|heap| {
            let mut kept = std::mem::take(heap).into_sorted_vec();
            kept.truncate(k);
            kept.into_iter()
                .map(|item| Neighbour {
                    row: item.row,
                    score: match metric {
                        Metric::InnerProduct => item.goodness,
                        Metric::L2 => -item.goodness,
                    },
                })
                .collect()
        })
        .collect()
}

/// Below this many queries a matrix product's packing costs more than it saves: plain dot
/// products instead.
const GEMM_MIN_QUERIES: usize = 4;

/// A dot product the compiler vectorises: eight independent partial sums.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for ((s, x), y) in acc.iter_mut().zip(x).zip(y) {
            *s += x * y;
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `scores[r * nq + q] = rows[r] · queries[q]`, as one matrix product.
#[allow(unsafe_code)]
fn inner_products(rows: &[f32], queries: &[f32], dim: usize, scores: &mut [f32]) {
    let m = rows.len() / dim;
    let nq = queries.len() / dim;
    assert!(rows.len() == m * dim && queries.len() == nq * dim && scores.len() == m * nq);
    if nq < GEMM_MIN_QUERIES {
        for (row, out) in rows.chunks_exact(dim).zip(scores.chunks_exact_mut(nq)) {
            for (q, o) in queries.chunks_exact(dim).zip(out) {
                *o = dot(row, q);
            }
        }
        return;
    }
    // SAFETY: the three slices hold exactly m x dim, nq x dim and m x nq floats (checked above),
    // and the strides below address A = rows (m x dim, row-major), B = queries transposed
    // (dim x nq: element (i, j) at queries[j * dim + i]) and C = scores (m x nq, row-major)
    // within those bounds. C does not alias A or B.
    unsafe {
        matrixmultiply::sgemm(
            m,
            dim,
            nq,
            1.0,
            rows.as_ptr(),
            dim as isize,
            1,
            queries.as_ptr(),
            1,
            dim as isize,
            0.0,
            scores.as_mut_ptr(),
            nq as isize,
            1,
        );
    }
}
