//! FAISS flat index files, read in place and written in the same format.
//!
//! Layout (faiss `index_write.cpp`; little-endian, no padding): the fourcc `IxFI`
//! (`IndexFlatIP`) or `IxF2` (`IndexFlatL2`); the index header: `d` i32, `ntotal` i64, two i64
//! fields faiss writes as 2^20 and ignores, `is_trained` u8, `metric_type` i32 (0 inner
//! product, 1 L2; a metric above 1 is followed by an f32 argument); then the vectors as a u64
//! count of **floats** (`ntotal * d`) and the floats, row-major, from byte 45. An `IxMp` / `IxM2`
//! (`IndexIDMap` / `IndexIDMap2`) file is the same header, the whole nested flat index, then a
//! u64 count and that many i64 ids, one per row. As in faiss, the header's metric decides how the
//! index searches, whatever its fourcc.
//!
//! [`FlatIndex::open`] maps the file and reads vectors from the mapping (the data starts at an
//! offset that is not 4-aligned, so vectors are decoded block by block, never cast in place);
//! nothing is converted or copied at start-up, so a 60 GB index answers its first query as soon
//! as the pages it needs are read. [`FlatWriter`] writes such a file in a stream and can resume an
//! interrupted write.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::exact::Metric;

#[derive(Debug, thiserror::Error)]
pub enum FaissError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a FAISS flat index this server reads: {message}", path.display())]
    Format { path: PathBuf, message: String },
}

/// faiss's `MAX_D` check on read.
const MAX_DIM: i32 = 1 << 20;
/// What faiss writes in the two unused header fields.
const DUMMY: i64 = 1 << 20;
/// Bytes before the first vector of a flat IP / L2 file.
pub const FLAT_HEADER_BYTES: usize = 45;

/// A FAISS flat index mapped from its file.
pub struct FlatIndex {
    map: memmap2::Mmap,
    path: PathBuf,
    dim: usize,
    len: usize,
    metric: Metric,
    /// Byte offset of the first vector.
    data: usize,
    /// Row ids of an `IndexIDMap` file; `None` when row `i` is id `i`.
    ids: Option<Vec<i64>>,
}

impl std::fmt::Debug for FlatIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlatIndex")
            .field("path", &self.path)
            .field("dim", &self.dim)
            .field("len", &self.len)
            .field("metric", &self.metric)
            .field("id_map", &self.ids.is_some())
            .finish()
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or_else(|| {
            format!("the file ends at byte {} but {} more bytes were expected at byte {}", self.bytes.len(), n, self.at)
        })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_le_bytes(self.take(4)?.try_into().map_err(|_| "short read")?))
    }
    fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().map_err(|_| "short read")?))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().map_err(|_| "short read")?))
    }
    fn fourcc(&mut self) -> Result<[u8; 4], String> {
        self.take(4)?.try_into().map_err(|_| "short read".into())
    }
}

struct Header {
    dim: usize,
    len: usize,
    metric: Metric,
}

fn header(c: &mut Cursor<'_>) -> Result<Header, String> {
    let d = c.i32()?;
    let ntotal = c.i64()?;
    let _dummy = (c.i64()?, c.i64()?);
    let _is_trained = c.take(1)?;
    let metric = c.i32()?;
    if !(1..=MAX_DIM).contains(&d) {
        return Err(format!("dimension {d} is outside 1..={MAX_DIM}"));
    }
    if ntotal < 0 {
        return Err(format!("negative vector count {ntotal}"));
    }
    let metric = match metric {
        0 => Metric::InnerProduct,
        1 => Metric::L2,
        2..=64 => {
            return Err(format!(
                "metric type {metric} (L1, Linf, Lp, ...): only inner product (0) and L2 (1) are served"
            ));
        }
        other => return Err(format!("unknown metric type {other}")),
    };
    Ok(Header { dim: d as usize, len: usize::try_from(ntotal).map_err(|_| "vector count too large")?, metric })
}

/// Parse a flat index at the cursor: fourcc, header, vectors. Returns the header and the byte
/// offset of the first vector.
fn flat(c: &mut Cursor<'_>) -> Result<(Header, usize), String> {
    let fourcc = c.fourcc()?;
    match &fourcc {
        b"IxFI" | b"IxF2" => {}
        b"IxFl" => return Err("a flat index with a metric other than inner product or L2".into()),
        other => {
            return Err(format!(
                "expected a flat index (IxFI / IxF2), found fourcc {:?}",
                String::from_utf8_lossy(other)
            ));
        }
    }
    let h = header(c)?;
    let floats = c.u64()?;
    let expected = (h.len as u64).checked_mul(h.dim as u64).ok_or("vector count times dimension overflows")?;
    if floats != expected {
        return Err(format!(
            "the vector block holds {floats} floats but the header says {} vectors of dimension {} ({expected})",
            h.len, h.dim
        ));
    }
    let data = c.at;
    let bytes = usize::try_from(floats.checked_mul(4).ok_or("vector block too large")?)
        .map_err(|_| "vector block too large")?;
    c.take(bytes)?;
    Ok((h, data))
}

fn parse(bytes: &[u8]) -> Result<(Header, usize, Option<Vec<i64>>), String> {
    let mut c = Cursor { bytes, at: 0 };
    let fourcc = c.fourcc()?;
    match &fourcc {
        b"IxMp" | b"IxM2" => {
            let outer = header(&mut c)?;
            let (inner, data) = flat(&mut c)?;
            if inner.len != outer.len || inner.dim != outer.dim {
                return Err(format!(
                    "the id map says {} vectors of dimension {}, its flat index {} of dimension {}",
                    outer.len, outer.dim, inner.len, inner.dim
                ));
            }
            let count = c.u64()?;
            if count != outer.len as u64 {
                return Err(format!("{count} ids for {} vectors", outer.len));
            }
            let raw = c.take(outer.len.checked_mul(8).ok_or("id block too large")?)?;
            let ids = raw.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8]))).collect();
            Ok((inner, data, Some(ids)))
        }
        _ => {
            let mut c = Cursor { bytes, at: 0 };
            let (h, data) = flat(&mut c)?;
            Ok((h, data, None))
        }
    }
}

impl FlatIndex {
    /// Map and check the file at `path`. The file must not be changed while it is open (as with
    /// faiss's own `IO_FLAG_MMAP_IFC`).
    pub fn open(path: &Path) -> Result<FlatIndex, FaissError> {
        let io = |source| FaissError::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        let map = map_read_only(&file).map_err(io)?;
        let (h, data, ids) = parse(&map).map_err(|message| FaissError::Format { path: path.to_path_buf(), message })?;
        Ok(FlatIndex { map, path: path.to_path_buf(), dim: h.dim, len: h.len, metric: h.metric, data, ids })
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn metric(&self) -> Metric {
        self.metric
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The id of row `row`: the id map's entry, or the row number itself.
    pub fn id(&self, row: usize) -> i64 {
        match &self.ids {
            Some(ids) => ids[row],
            None => row as i64,
        }
    }

    /// The ids of an `IndexIDMap` file.
    pub fn ids(&self) -> Option<&[i64]> {
        self.ids.as_deref()
    }

    /// Decode rows `start..start + out.len() / dim` into `out`.
    pub fn decode_rows(&self, start: usize, out: &mut [f32]) {
        let from = self.data + start * self.dim * 4;
        let bytes = &self.map[from..from + out.len() * 4];
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }

    /// One row as a vector.
    pub fn vector(&self, row: usize) -> Vec<f32> {
        let mut v = vec![0f32; self.dim];
        self.decode_rows(row, &mut v);
        v
    }
}

#[allow(unsafe_code)]
fn map_read_only(file: &File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the mapping is read-only and private to this process; the documented contract of
    // `FlatIndex::open` is that the file is not modified while it is open. Every read through
    // the mapping is bounds-checked against the length validated by `parse`.
    unsafe { memmap2::Mmap::map(file) }
}

/// Writes a flat index in FAISS's format, vector by vector, into `<path>.partial`, and renames
/// it into place when [`finish`](Self::finish)ed. An interrupted write can be resumed: the rows
/// already complete in the partial file are kept.
#[derive(Debug)]
pub struct FlatWriter {
    file: File,
    partial: PathBuf,
    path: PathBuf,
    dim: usize,
    metric: Metric,
    rows: usize,
}

fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}

fn header_bytes(dim: usize, rows: usize, metric: Metric) -> Vec<u8> {
    let mut h = Vec::with_capacity(FLAT_HEADER_BYTES);
    h.extend_from_slice(match metric {
        Metric::InnerProduct => b"IxFI",
        Metric::L2 => b"IxF2",
    });
    h.extend_from_slice(&(dim as i32).to_le_bytes());
    h.extend_from_slice(&(rows as i64).to_le_bytes());
    h.extend_from_slice(&DUMMY.to_le_bytes());
    h.extend_from_slice(&DUMMY.to_le_bytes());
    h.push(1);
    h.extend_from_slice(
        &match metric {
            Metric::InnerProduct => 0i32,
            Metric::L2 => 1,
        }
        .to_le_bytes(),
    );
    h.extend_from_slice(&((rows * dim) as u64).to_le_bytes());
    h
}

impl FlatWriter {
    /// Start writing `path`, or resume `<path>.partial` if a previous write left one with the
    /// same dimension and metric. [`rows`](Self::rows) says how many vectors it already holds.
    pub fn create_or_resume(path: &Path, dim: usize, metric: Metric) -> Result<FlatWriter, FaissError> {
        if dim == 0 || dim > MAX_DIM as usize {
            return Err(FaissError::Format { path: path.to_path_buf(), message: format!("dimension {dim}") });
        }
        let partial = partial_path(path);
        let io = |source| FaissError::Io { path: partial.clone(), source };
        let mut rows = 0;
        let file = if partial.exists() {
            let mut file = std::fs::OpenOptions::new().read(true).write(true).open(&partial).map_err(io)?;
            let mut head = [0u8; FLAT_HEADER_BYTES];
            let fresh = header_bytes(dim, 0, metric);
            let len = file.metadata().map_err(io)?.len();
            let same = len >= FLAT_HEADER_BYTES as u64 && {
                use std::io::Read;
                file.read_exact(&mut head).map_err(io)?;
                // fourcc, dimension and metric must match; the counts are patched at the end.
                head[..8] == fresh[..8] && head[33..37] == fresh[33..37]
            };
            if !same {
                return Err(FaissError::Format {
                    path: partial.clone(),
                    message: format!(
                        "an interrupted write of another dimension or metric is in the way; remove it to start over \
                         (wanted dimension {dim}, {metric:?})"
                    ),
                });
            }
            let row_bytes = 4 * dim as u64;
            rows = ((len - FLAT_HEADER_BYTES as u64) / row_bytes) as usize;
            // Drop a row that was only partly written.
            file.set_len(FLAT_HEADER_BYTES as u64 + rows as u64 * row_bytes).map_err(io)?;
            file.seek(SeekFrom::End(0)).map_err(io)?;
            file
        } else {
            let mut file = File::create(&partial).map_err(io)?;
            file.write_all(&header_bytes(dim, 0, metric)).map_err(io)?;
            file
        };
        Ok(FlatWriter { file, partial, path: path.to_path_buf(), dim, metric, rows })
    }

    /// Vectors written so far (including those found when resuming).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Append rows (a multiple of the dimension, row-major).
    pub fn append(&mut self, vectors: &[f32]) -> Result<(), FaissError> {
        if !vectors.len().is_multiple_of(self.dim) {
            return Err(FaissError::Format {
                path: self.partial.clone(),
                message: format!("{} floats is not a whole number of {}-dimensional rows", vectors.len(), self.dim),
            });
        }
        let mut bytes = Vec::with_capacity(vectors.len() * 4);
        for v in vectors {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        self.file.write_all(&bytes).map_err(|source| FaissError::Io { path: self.partial.clone(), source })?;
        self.rows += vectors.len() / self.dim;
        Ok(())
    }

    /// Flush what is written so far to disk (a resume point).
    pub fn sync(&mut self) -> Result<(), FaissError> {
        self.file.sync_data().map_err(|source| FaissError::Io { path: self.partial.clone(), source })
    }

    /// Write the final counts into the header and move the file into place.
    pub fn finish(mut self) -> Result<PathBuf, FaissError> {
        let io = |source| FaissError::Io { path: self.partial.clone(), source };
        self.file.seek(SeekFrom::Start(0)).map_err(io)?;
        self.file.write_all(&header_bytes(self.dim, self.rows, self.metric)).map_err(io)?;
        self.file.sync_all().map_err(io)?;
        drop(self.file);
        std::fs::rename(&self.partial, &self.path)
            .map_err(|source| FaissError::Io { path: self.path.clone(), source })?;
        Ok(self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_files_read_back_and_resume() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.index");
        let mut w = FlatWriter::create_or_resume(&path, 3, Metric::InnerProduct).unwrap();
        w.append(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        drop(w);
        // A torn row at the end of the partial file is dropped on resume.
        let partial = partial_path(&path);
        std::fs::OpenOptions::new().append(true).open(&partial).unwrap().write_all(&[0u8; 5]).unwrap();
        let mut w = FlatWriter::create_or_resume(&path, 3, Metric::InnerProduct).unwrap();
        assert_eq!(w.rows(), 2);
        w.append(&[7.0, 8.0, 9.0]).unwrap();
        w.finish().unwrap();
        let index = FlatIndex::open(&path).unwrap();
        assert_eq!((index.dim(), index.len(), index.metric()), (3, 3, Metric::InnerProduct));
        assert_eq!(index.vector(2), [7.0, 8.0, 9.0]);
        assert_eq!(index.id(1), 1);
        assert!(FlatWriter::create_or_resume(&path, 4, Metric::InnerProduct).is_ok());
        let mut other = FlatWriter::create_or_resume(&dir.path().join("y.index"), 3, Metric::L2).unwrap();
        other.append(&[1.0, 1.0]).unwrap_err();
    }

    #[test]
    fn a_resume_with_another_shape_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.index");
        FlatWriter::create_or_resume(&path, 3, Metric::InnerProduct).unwrap();
        let err = FlatWriter::create_or_resume(&path, 4, Metric::InnerProduct).unwrap_err();
        assert!(err.to_string().contains("another dimension or metric"), "{err}");
        let err = FlatWriter::create_or_resume(&path, 3, Metric::L2).unwrap_err();
        assert!(err.to_string().contains("another dimension or metric"), "{err}");
    }

    #[test]
    fn damaged_files_are_typed_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.index");
        let mut w = FlatWriter::create_or_resume(&path, 2, Metric::L2).unwrap();
        w.append(&[1.0, 2.0, 3.0, 4.0]).unwrap();
        w.finish().unwrap();
        let good = std::fs::read(&path).unwrap();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (good[..good.len() - 1].to_vec(), "the file ends"),
            (good[..10].to_vec(), "the file ends"),
            (vec![], "the file ends"),
            (
                {
                    let mut b = good.clone();
                    b[0..4].copy_from_slice(b"IxHN");
                    b
                },
                "fourcc",
            ),
            (
                {
                    let mut b = good.clone();
                    b[4..8].copy_from_slice(&0i32.to_le_bytes());
                    b
                },
                "dimension 0",
            ),
            (
                {
                    let mut b = good.clone();
                    b[8..16].copy_from_slice(&(-1i64).to_le_bytes());
                    b
                },
                "negative",
            ),
            (
                {
                    let mut b = good.clone();
                    b[8..16].copy_from_slice(&i64::MAX.to_le_bytes());
                    b
                },
                "floats",
            ),
            (
                {
                    let mut b = good.clone();
                    b[33..37].copy_from_slice(&99i32.to_le_bytes());
                    b
                },
                "unknown metric",
            ),
            (
                {
                    let mut b = good.clone();
                    b[37..45].copy_from_slice(&u64::MAX.to_le_bytes());
                    b
                },
                "floats",
            ),
        ];
        for (i, (bytes, expect)) in cases.into_iter().enumerate() {
            let p = dir.path().join(format!("bad{i}.index"));
            std::fs::write(&p, bytes).unwrap();
            let err = FlatIndex::open(&p).unwrap_err();
            assert!(matches!(err, FaissError::Format { .. }), "{err}");
            assert!(err.to_string().contains(expect), "case {i}: {err}");
        }
    }
}
