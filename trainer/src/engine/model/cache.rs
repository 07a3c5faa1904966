//! The KV cache: each layer's keys and values with spare capacity, appended in place by decoding;
//! rows written and read by the generation engine's batch caches.

use tch::Tensor;

/// One layer's keys and values, `[batch, kv_heads, capacity, head_dim]` each, of which the first
/// `len` positions hold data: appending writes in place while there is room.
#[derive(Debug)]
pub(super) struct LayerKv {
    pub(super) k: Tensor,
    pub(super) v: Tensor,
    pub(super) len: i64,
}

impl LayerKv {
    pub(super) fn valid(&self) -> (Tensor, Tensor) {
        (self.k.narrow(2, 0, self.len), self.v.narrow(2, 0, self.len))
    }

    pub(super) fn of(k: Tensor, v: Tensor) -> Self {
        let len = k.size()[2];
        Self { k, v, len }
    }

    /// Append `k`, `v` (`[batch, kv_heads, new, head_dim]`) and return all valid positions.
    pub(super) fn append(&mut self, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let new = k.size()[2];
        if self.len + new > self.k.size()[2] {
            // Grow by doubling: amortised O(1) copies per position.
            let mut size = self.k.size();
            size[2] = (2 * (self.len + new)).max(16);
            let len = self.len;
            let grow = |old: &Tensor| {
                let mut t = Tensor::zeros(&size, (old.kind(), old.device()));
                t.narrow(2, 0, len).copy_(&old.narrow(2, 0, len));
                let _ = &mut t;
                t
            };
            self.k = grow(&self.k);
            self.v = grow(&self.v);
        }
        self.k.narrow(2, self.len, new).copy_(k);
        self.v.narrow(2, self.len, new).copy_(v);
        self.len += new;
        self.valid()
    }
}

/// Keys and values of earlier positions, per layer: `[batch, kv_heads, past, head_dim]`, stored
/// with spare capacity so that decoding appends in place.
#[derive(Debug, Default)]
pub struct KvCache {
    pub(super) layers: Vec<Option<LayerKv>>,
}

impl KvCache {
    pub fn new(layers: usize) -> Self {
        Self { layers: (0..layers).map(|_| None).collect() }
    }

    /// Positions held.
    pub fn len(&self) -> i64 {
        self.layers.first().and_then(|l| l.as_ref()).map_or(0, |l| l.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[cfg(feature = "bench-baseline")]
    fn map(&self, f: impl Fn(&Tensor) -> Tensor) -> KvCache {
        KvCache {
            layers: self
                .layers
                .iter()
                .map(|l| {
                    l.as_ref().map(|l| {
                        let (k, v) = l.valid();
                        LayerKv::of(f(&k), f(&v))
                    })
                })
                .collect(),
        }
    }

    /// Rows `rows` of the cache (e.g. `[0, 0, 0]` forks row 0 three times), copied; spare
    /// capacity is kept.
    pub fn select_rows(&self, rows: &Tensor) -> KvCache {
        KvCache {
            layers: self
                .layers
                .iter()
                .map(|l| {
                    l.as_ref().map(|l| LayerKv {
                        k: l.k.index_select(0, rows),
                        v: l.v.index_select(0, rows),
                        len: l.len,
                    })
                })
                .collect(),
        }
    }

    /// Concatenate caches of equal length along the batch dimension.
    #[cfg(feature = "bench-baseline")]
    pub fn cat(caches: &[&KvCache]) -> Option<KvCache> {
        let first = caches.first()?;
        let layers = (0..first.layers.len())
            .map(|i| {
                let parts: Option<Vec<(Tensor, Tensor)>> =
                    caches.iter().map(|c| c.layers[i].as_ref().map(LayerKv::valid)).collect();
                let parts = parts?;
                let ks: Vec<&Tensor> = parts.iter().map(|p| &p.0).collect();
                let vs: Vec<&Tensor> = parts.iter().map(|p| &p.1).collect();
                Some(LayerKv::of(Tensor::cat(&ks, 0), Tensor::cat(&vs, 0)))
            })
            .collect();
        Some(KvCache { layers })
    }

    /// Prepend zero positions so the cache holds `to` positions (for left-padded batches).
    #[cfg(feature = "bench-baseline")]
    pub fn left_pad(&self, to: i64) -> KvCache {
        self.map(|t| {
            let mut size = t.size();
            let missing = to - size[2];
            if missing <= 0 {
                return t.shallow_clone();
            }
            size[2] = missing;
            Tensor::cat(&[&Tensor::zeros(size, (t.kind(), t.device())), t], 2)
        })
    }

    /// Positions `start..start + len`, copied (so the larger tensor they came from can be freed).
    #[cfg(feature = "bench-baseline")]
    pub fn narrow_positions(&self, start: i64, len: i64) -> KvCache {
        self.map(|t| t.narrow(2, start, len).contiguous())
    }

    /// A shallow handle to the same tensors (no copy): what a forked sequence starts from.
    #[cfg(feature = "bench-baseline")]
    pub fn share(&self) -> KvCache {
        self.map(Tensor::shallow_clone)
    }

    /// Write positions `0..n` of `layers` (one `[kv_heads, >= n, head_dim]` pair per layer) at
    /// position `at` of batch row `row`. For filling a preallocated cache.
    pub fn write_row(&mut self, row: i64, at: i64, layers: &[(Tensor, Tensor)], n: i64) {
        for (slot, (k, v)) in self.layers.iter_mut().zip(layers) {
            if let Some(l) = slot {
                l.k.get(row).narrow(1, at, n).copy_(&k.narrow(1, 0, n));
                l.v.get(row).narrow(1, at, n).copy_(&v.narrow(1, 0, n));
            }
        }
    }

    /// Row `row`'s positions `at..at + n`, copied out: one `[kv_heads, n, head_dim]` pair per
    /// layer.
    pub fn read_row(&self, row: i64, at: i64, n: i64) -> Vec<(Tensor, Tensor)> {
        self.layers
            .iter()
            .filter_map(|l| l.as_ref())
            .map(|l| (l.k.get(row).narrow(1, at, n).contiguous(), l.v.get(row).narrow(1, at, n).contiguous()))
            .collect()
    }

    /// Copy every valid position of `src`'s rows into batch rows `rows` (int64, one per `src`
    /// row) of this cache from position `at`: one copy per layer for all the rows (admitting
    /// rows into a running batch). Layers `src` lacks are left alone.
    pub fn place_rows(&mut self, rows: &Tensor, at: i64, src: &KvCache) {
        for (slot, from) in self.layers.iter_mut().zip(&src.layers) {
            if let (Some(l), Some(f)) = (slot, from) {
                let (k, v) = f.valid();
                let _ = l.k.narrow(2, at, f.len).index_copy_(0, rows, &k);
                let _ = l.v.narrow(2, at, f.len).index_copy_(0, rows, &v);
            }
        }
    }

    /// A new cache of `batch` rows (at least this cache's) and `capacity` positions holding
    /// positions `from..from + len` of this cache's rows at position `to` (the rest zeros),
    /// `to + len` positions valid: a running batch moving its live window and growing.
    pub fn rebased(&self, batch: i64, capacity: i64, from: i64, len: i64, to: i64) -> KvCache {
        let layers = self
            .layers
            .iter()
            .map(|l| {
                l.as_ref().map(|l| {
                    let move_to = |old: &Tensor| {
                        let mut size = old.size();
                        let rows = size[0];
                        size[0] = batch.max(rows);
                        size[2] = capacity;
                        let t = Tensor::zeros(&size, (old.kind(), old.device()));
                        if len > 0 {
                            t.narrow(0, 0, rows).narrow(2, to, len).copy_(&old.narrow(2, from, len));
                        }
                        t
                    };
                    LayerKv { k: move_to(&l.k), v: move_to(&l.v), len: to + len }
                })
            })
            .collect();
        KvCache { layers }
    }

    /// Declare the first `len` positions valid (after [`KvCache::write_row`]).
    pub fn set_len(&mut self, len: i64) {
        for l in self.layers.iter_mut().flatten() {
            l.len = len.min(l.k.size()[2]);
        }
    }

    /// Bytes of the valid positions.
    pub fn bytes(&self) -> u64 {
        self.layers
            .iter()
            .flatten()
            .map(|l| {
                let per_position = l.k.size()[0] * l.k.size()[1] * l.k.size()[3];
                (2 * per_position * l.len) as u64 * l.k.kind().elt_size_in_bytes() as u64
            })
            .sum()
    }
}
