//! Reciprocal-rank fusion (Cormack, Clarke and Büttcher, SIGIR 2009): a document's fused score
//! is the sum over the ranked lists that hold it of `1 / (k + rank)`, ranks counted from 1.
//! Scores of different retrievers (BM25 against cosine) are never compared, only ranks.

use std::collections::HashMap;
use std::hash::Hash;

/// The constant of the paper, used by Elasticsearch, OpenSearch and pyserini's fusion.
pub const DEFAULT_K: f64 = 60.0;

/// Fuse `lists` (each best first) and keep the best `topk`. Ties are broken by the best rank a
/// document had in any list, then by the first list that holds it, so the result is
/// deterministic. Returns each kept document with its fused score.
pub fn reciprocal_rank_fusion<K: Eq + Hash + Clone>(lists: &[Vec<K>], k: f64, topk: usize) -> Vec<(K, f64)> {
    struct Acc {
        score: f64,
        best_rank: usize,
        first_list: usize,
        first_pos: usize,
    }
    let mut acc: HashMap<&K, Acc> = HashMap::new();
    for (l, list) in lists.iter().enumerate() {
        let mut seen = std::collections::HashSet::new();
        for (i, doc) in list.iter().enumerate() {
            // A document listed twice in one list counts once, at its better rank.
            if !seen.insert(doc) {
                continue;
            }
            let rank = i + 1;
            let e = acc.entry(doc).or_insert(Acc { score: 0.0, best_rank: rank, first_list: l, first_pos: i });
            e.score += 1.0 / (k + rank as f64);
            e.best_rank = e.best_rank.min(rank);
        }
    }
    let mut fused: Vec<(&K, Acc)> = acc.into_iter().collect();
    fused.sort_by(|(_, a), (_, b)| {
        b.score
            .total_cmp(&a.score)
            .then(a.best_rank.cmp(&b.best_rank))
            .then(a.first_list.cmp(&b.first_list))
            .then(a.first_pos.cmp(&b.first_pos))
    });
    fused.into_iter().take(topk).map(|(doc, a)| (doc.clone(), a.score)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuses_by_rank() {
        let bm25 = vec!["a", "b", "c"];
        let dense = vec!["c", "a", "d"];
        let fused = reciprocal_rank_fusion(&[bm25, dense], 60.0, 10);
        let order: Vec<&str> = fused.iter().map(|(d, _)| *d).collect();
        // a: 1/61 + 1/62, c: 1/63 + 1/61, b: 1/62, d: 1/63.
        assert_eq!(order, ["a", "c", "b", "d"]);
        assert!((fused[0].1 - (1.0 / 61.0 + 1.0 / 62.0)).abs() < 1e-12);
    }

    #[test]
    fn ties_are_deterministic_and_duplicates_count_once() {
        // x and y tie (1/61 each); x came from the first list.
        let fused = reciprocal_rank_fusion(&[vec!["x", "x"], vec!["y"]], 60.0, 10);
        assert_eq!(fused.iter().map(|(d, _)| *d).collect::<Vec<_>>(), ["x", "y"]);
        assert_eq!(fused[0].1, fused[1].1);
        assert_eq!(reciprocal_rank_fusion::<&str>(&[], 60.0, 3), vec![]);
        assert_eq!(reciprocal_rank_fusion(&[vec![1, 2, 3]], 60.0, 2).len(), 2);
    }
}
