//! FAISS flat index files, read in place and written in the same format, with vectors stored as
//! f32 (`IndexFlatIP` / `IndexFlatL2`) or as f16 (`IndexScalarQuantizer` of type `QT_fp16`,
//! faiss's `"SQfp16"`: half the memory, and faiss searches it exactly over the decoded values).
//!
//! Layout (faiss `index_write.cpp`; little-endian, no padding): the fourcc `IxFI`
//! (`IndexFlatIP`) or `IxF2` (`IndexFlatL2`); the index header: `d` i32, `ntotal` i64, two i64
//! fields faiss writes as 2^20 and ignores, `is_trained` u8, `metric_type` i32 (0 inner
//! product, 1 L2; a metric above 1 is followed by an f32 argument); then the vectors as a u64
//! count of **floats** (`ntotal * d`) and the floats, row-major, from byte 45. An f16 file is the
//! fourcc `IxSQ`, the same index header, the scalar quantizer (`qtype` i32 = 4 for fp16,
//! `rangestat` i32, `rangestat_arg` f32, `d` u64, `code_size` u64 = 2d, a u64 count of trained
//! floats (none for fp16) and those floats), then a u64 count of **bytes** (`ntotal * 2d`) and
//! the IEEE half-precision values, row-major, from byte 81. An `IxMp` / `IxM2`
//! (`IndexIDMap` / `IndexIDMap2`) file is the same header, the whole nested index, then a
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

/// How a flat index compares vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Inner product, larger is nearer (cosine for normalised vectors).
    InnerProduct,
    /// Squared Euclidean distance, smaller is nearer.
    L2,
}

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
/// Bytes before the first vector of an f16 (`SQfp16`) file that Grove writes.
pub const SQ_FP16_HEADER_BYTES: usize = 81;
/// faiss's `ScalarQuantizer::QT_fp16`.
const QT_FP16: i32 = 4;

/// How an index file stores its vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Storage {
    /// 4 bytes a component: `IndexFlatIP` / `IndexFlatL2`, what Search-R1 ships.
    #[default]
    F32,
    /// 2 bytes a component: `IndexScalarQuantizer` `QT_fp16`. Half the file and the memory;
    /// components are rounded to the nearest half (about 3 significant digits), which moves
    /// inner products of normalised 768-d vectors by about 1e-4.
    F16,
}

impl Storage {
    /// Bytes per component.
    pub fn bytes(self) -> usize {
        match self {
            Storage::F32 => 4,
            Storage::F16 => 2,
        }
    }

    fn header_len(self) -> usize {
        match self {
            Storage::F32 => FLAT_HEADER_BYTES,
            Storage::F16 => SQ_FP16_HEADER_BYTES,
        }
    }
}

impl std::fmt::Display for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Storage::F32 => "f32",
            Storage::F16 => "f16",
        })
    }
}

/// A FAISS flat index mapped from its file.
pub struct FlatIndex {
    map: memmap2::Mmap,
    path: PathBuf,
    dim: usize,
    len: usize,
    metric: Metric,
    storage: Storage,
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
            .field("storage", &self.storage)
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
    fn f32(&mut self) -> Result<f32, String> {
        Ok(f32::from_le_bytes(self.take(4)?.try_into().map_err(|_| "short read")?))
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

/// Parse a flat index at the cursor: fourcc, header, vectors. Returns the header, how the
/// vectors are stored and the byte offset of the first vector.
fn flat(c: &mut Cursor<'_>) -> Result<(Header, Storage, usize), String> {
    let fourcc = c.fourcc()?;
    let storage = match &fourcc {
        b"IxFI" | b"IxF2" => Storage::F32,
        b"IxSQ" => Storage::F16,
        b"IxFl" => return Err("a flat index with a metric other than inner product or L2".into()),
        other => {
            return Err(format!(
                "expected a flat index (IxFI / IxF2) or an fp16 scalar quantizer (IxSQ), found fourcc {:?}",
                String::from_utf8_lossy(other)
            ));
        }
    };
    let h = header(c)?;
    let count = match storage {
        Storage::F32 => {
            let floats = c.u64()?;
            let expected = (h.len as u64).checked_mul(h.dim as u64).ok_or("vector count times dimension overflows")?;
            if floats != expected {
                return Err(format!(
                    "the vector block holds {floats} floats but the header says {} vectors of dimension {} ({expected})",
                    h.len, h.dim
                ));
            }
            floats.checked_mul(4).ok_or("vector block too large")?
        }
        Storage::F16 => {
            let qtype = c.i32()?;
            if qtype != QT_FP16 {
                return Err(format!(
                    "scalar quantizer type {qtype}: only fp16 ({QT_FP16}) is served exactly; 8-, 6- and 4-bit codes are not"
                ));
            }
            let (_rangestat, _rangestat_arg) = (c.i32()?, c.f32()?);
            let (d, code_size) = (c.u64()?, c.u64()?);
            if d != h.dim as u64 || code_size != 2 * d {
                return Err(format!(
                    "the fp16 quantizer says dimension {d} and {code_size} bytes a vector; the header says dimension {}",
                    h.dim
                ));
            }
            let trained = c.u64()?;
            c.take(usize::try_from(trained.saturating_mul(4)).map_err(|_| "trained block too large")?)?;
            let bytes = c.u64()?;
            let expected = (h.len as u64).checked_mul(code_size).ok_or("vector count times code size overflows")?;
            if bytes != expected {
                return Err(format!(
                    "the code block holds {bytes} bytes but the header says {} vectors of {code_size} bytes ({expected})",
                    h.len
                ));
            }
            bytes
        }
    };
    let data = c.at;
    c.take(usize::try_from(count).map_err(|_| "vector block too large")?)?;
    Ok((h, storage, data))
}

type Parsed = (Header, Storage, usize, Option<Vec<i64>>);

fn parse(bytes: &[u8]) -> Result<Parsed, String> {
    let mut c = Cursor { bytes, at: 0 };
    let fourcc = c.fourcc()?;
    match &fourcc {
        b"IxMp" | b"IxM2" => {
            let outer = header(&mut c)?;
            let (inner, storage, data) = flat(&mut c)?;
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
            Ok((inner, storage, data, Some(ids)))
        }
        _ => {
            let mut c = Cursor { bytes, at: 0 };
            let (h, storage, data) = flat(&mut c)?;
            Ok((h, storage, data, None))
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
        let (h, storage, data, ids) =
            parse(&map).map_err(|message| FaissError::Format { path: path.to_path_buf(), message })?;
        Ok(FlatIndex { map, path: path.to_path_buf(), dim: h.dim, len: h.len, metric: h.metric, storage, data, ids })
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

    /// How the file stores its vectors.
    pub fn storage(&self) -> Storage {
        self.storage
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

    /// Decode rows `start..start + out.len() / dim` into `out` (f16 values widened exactly).
    pub fn decode_rows(&self, start: usize, out: &mut [f32]) {
        let size = self.storage.bytes();
        let from = self.data + start * self.dim * size;
        let bytes = &self.map[from..from + out.len() * size];
        match self.storage {
            Storage::F32 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            Storage::F16 => {
                // In bulk, through `half`'s slice conversion (F16C where the CPU has it, checked
                // at run time): widening one value at a time in software made a one-query search
                // of a million vectors 4x slower than on the f32 file. The bytes are copied into
                // an aligned buffer first (rows start at an odd offset in the file).
                use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
                const CHUNK: usize = 1024;
                let mut bits = [0u16; CHUNK];
                for (o, b) in out.chunks_mut(CHUNK).zip(bytes.chunks(2 * CHUNK)) {
                    let bits = &mut bits[..o.len()];
                    for (x, b) in bits.iter_mut().zip(b.chunks_exact(2)) {
                        *x = u16::from_le_bytes([b[0], b[1]]);
                    }
                    let halves: &[half::f16] = bits.reinterpret_cast();
                    halves.convert_to_f32_slice(o);
                }
            }
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

/// Writes a flat index in FAISS's format (f32 flat or fp16 scalar quantizer), vector by vector,
/// into `<path>.partial`, and renames it into place when [`finish`](Self::finish)ed. An
/// interrupted write can be resumed: the rows already complete in the partial file are kept.
#[derive(Debug)]
pub struct FlatWriter {
    file: File,
    partial: PathBuf,
    path: PathBuf,
    dim: usize,
    metric: Metric,
    storage: Storage,
    rows: usize,
}

fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}

fn header_bytes(dim: usize, rows: usize, metric: Metric, storage: Storage) -> Vec<u8> {
    let mut h = Vec::with_capacity(storage.header_len());
    h.extend_from_slice(match (storage, metric) {
        (Storage::F32, Metric::InnerProduct) => b"IxFI",
        (Storage::F32, Metric::L2) => b"IxF2",
        (Storage::F16, _) => b"IxSQ",
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
    match storage {
        Storage::F32 => h.extend_from_slice(&((rows * dim) as u64).to_le_bytes()),
        Storage::F16 => {
            h.extend_from_slice(&QT_FP16.to_le_bytes());
            h.extend_from_slice(&0i32.to_le_bytes()); // rangestat: RS_minmax (unused by fp16)
            h.extend_from_slice(&0f32.to_le_bytes()); // rangestat_arg
            h.extend_from_slice(&(dim as u64).to_le_bytes());
            h.extend_from_slice(&(2 * dim as u64).to_le_bytes()); // code_size
            h.extend_from_slice(&0u64.to_le_bytes()); // no trained values
            h.extend_from_slice(&((rows * dim * 2) as u64).to_le_bytes());
        }
    }
    h
}

/// `x` as IEEE half-precision bits, rounded as faiss's `encode_fp16` rounds: to nearest, ties
/// **away from zero** (not to even), so that a file Grove writes is byte for byte the one faiss
/// writes from the same vectors. Overflow gives infinity, NaN stays NaN.
pub fn encode_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32 - 127;
    let mant = bits & 0x7f_ffff;
    if (-14..=15).contains(&exp) {
        // A normal half: keep 10 of the 23 mantissa bits, and add one when the dropped 13 are at
        // least half of the last kept one. A carry runs into the exponent, up to infinity
        // (0x7c00), which is the right answer there.
        let h = (((exp + 15) as u32) << 10 | (mant >> 13)) + u32::from(mant & 0x1000 != 0);
        sign | h as u16
    } else if exp < -14 {
        // A subnormal half (or zero): the magnitude in units of 2^-24, rounded half away.
        let units = (f64::from(x.abs()) * 16_777_216.0 + 0.5).floor();
        sign | units as u16
    } else {
        // Beyond the largest half, infinity or NaN.
        half::f16::from_f32(x).to_bits()
    }
}

/// The header's bytes that hold counts (`ntotal` and the vector block's size): everything else
/// must match for a partial file to be resumed.
fn same_shape(a: &[u8], b: &[u8]) -> bool {
    let counts = |i: usize| (8..16).contains(&i) || i >= a.len() - 8;
    a.len() == b.len() && a.iter().zip(b).enumerate().all(|(i, (x, y))| counts(i) || x == y)
}

impl FlatWriter {
    /// Start writing `path` with f32 vectors, or resume `<path>.partial` (see
    /// [`create_or_resume_as`](Self::create_or_resume_as)).
    pub fn create_or_resume(path: &Path, dim: usize, metric: Metric) -> Result<FlatWriter, FaissError> {
        Self::create_or_resume_as(path, dim, metric, Storage::F32)
    }

    /// Start writing `path`, or resume `<path>.partial` if a previous write left one with the
    /// same dimension, metric and storage. [`rows`](Self::rows) says how many vectors it already
    /// holds.
    pub fn create_or_resume_as(
        path: &Path,
        dim: usize,
        metric: Metric,
        storage: Storage,
    ) -> Result<FlatWriter, FaissError> {
        if dim == 0 || dim > MAX_DIM as usize {
            return Err(FaissError::Format { path: path.to_path_buf(), message: format!("dimension {dim}") });
        }
        let partial = partial_path(path);
        let io = |source| FaissError::Io { path: partial.clone(), source };
        let mut rows = 0;
        let file = if partial.exists() {
            let mut file = std::fs::OpenOptions::new().read(true).write(true).open(&partial).map_err(io)?;
            let header_len = storage.header_len();
            let mut head = vec![0u8; header_len];
            let fresh = header_bytes(dim, 0, metric, storage);
            let len = file.metadata().map_err(io)?.len();
            let same = len >= header_len as u64 && {
                use std::io::Read;
                file.read_exact(&mut head).map_err(io)?;
                // Everything but the counts must match; the counts are patched at the end.
                same_shape(&head, &fresh)
            };
            if !same {
                return Err(FaissError::Format {
                    path: partial.clone(),
                    message: format!(
                        "an interrupted write of another dimension, metric or storage is in the way; remove it to \
                         start over (wanted dimension {dim}, {metric:?}, {storage})"
                    ),
                });
            }
            let row_bytes = (storage.bytes() * dim) as u64;
            rows = ((len - header_len as u64) / row_bytes) as usize;
            // Drop a row that was only partly written.
            file.set_len(header_len as u64 + rows as u64 * row_bytes).map_err(io)?;
            file.seek(SeekFrom::End(0)).map_err(io)?;
            file
        } else {
            let mut file = File::create(&partial).map_err(io)?;
            file.write_all(&header_bytes(dim, 0, metric, storage)).map_err(io)?;
            file
        };
        Ok(FlatWriter { file, partial, path: path.to_path_buf(), dim, metric, storage, rows })
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
        let mut bytes = Vec::with_capacity(vectors.len() * self.storage.bytes());
        match self.storage {
            Storage::F32 => vectors.iter().for_each(|v| bytes.extend_from_slice(&v.to_le_bytes())),
            Storage::F16 => vectors.iter().for_each(|v| bytes.extend_from_slice(&encode_f16(*v).to_le_bytes())),
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
        self.file.write_all(&header_bytes(self.dim, self.rows, self.metric, self.storage)).map_err(io)?;
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
    fn f16_files_round_to_half_read_back_and_resume() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.index");
        let mut w = FlatWriter::create_or_resume_as(&path, 2, Metric::InnerProduct, Storage::F16).unwrap();
        w.append(&[1.0, 1.0 / 3.0]).unwrap();
        drop(w);
        std::fs::OpenOptions::new().append(true).open(partial_path(&path)).unwrap().write_all(&[7u8; 3]).unwrap();
        let mut w = FlatWriter::create_or_resume_as(&path, 2, Metric::InnerProduct, Storage::F16).unwrap();
        assert_eq!(w.rows(), 1);
        w.append(&[-2.5, 65504.0]).unwrap();
        w.finish().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), (SQ_FP16_HEADER_BYTES + 2 * 2 * 2) as u64);
        let index = FlatIndex::open(&path).unwrap();
        assert_eq!((index.dim(), index.len(), index.storage()), (2, 2, Storage::F16));
        // 1/3 in half precision is 0.333251953125.
        assert_eq!(encode_f16(1.0 / 3.0), 0x3555);
        // A tie rounds away from zero as faiss rounds it (half would round it to even).
        let tie = f32::from_bits(0x3EEE_1000); // between halves 0x3770 and 0x3771
        assert_eq!((encode_f16(tie), encode_f16(-tie)), (0x3771, 0xb771));
        assert_eq!(encode_f16(5.960_464_5e-8), 1); // the smallest subnormal
        assert_eq!(encode_f16(1e9), 0x7c00);
        assert_eq!(encode_f16(-0.0), 0x8000);
        assert_eq!(index.vector(0), [1.0, 0.333_251_95]);
        assert_eq!(index.vector(1), [-2.5, 65504.0]);
        // Another quantizer type (8-bit) is a typed error, not a misread.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[37..41].copy_from_slice(&0i32.to_le_bytes());
        let bad = dir.path().join("sq8.index");
        std::fs::write(&bad, &bytes).unwrap();
        let err = FlatIndex::open(&bad).unwrap_err();
        assert!(err.to_string().contains("only fp16"), "{err}");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[57..65].copy_from_slice(&3u64.to_le_bytes());
        std::fs::write(&bad, &bytes).unwrap();
        assert!(FlatIndex::open(&bad).unwrap_err().to_string().contains("bytes a vector"));
    }

    #[test]
    fn a_resume_with_another_shape_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.index");
        FlatWriter::create_or_resume(&path, 3, Metric::InnerProduct).unwrap();
        let err = FlatWriter::create_or_resume(&path, 4, Metric::InnerProduct).unwrap_err();
        assert!(err.to_string().contains("another dimension, metric or storage"), "{err}");
        let err = FlatWriter::create_or_resume(&path, 3, Metric::L2).unwrap_err();
        assert!(err.to_string().contains("another dimension, metric or storage"), "{err}");
        let err = FlatWriter::create_or_resume_as(&path, 3, Metric::InnerProduct, Storage::F16).unwrap_err();
        assert!(err.to_string().contains("another dimension, metric or storage"), "{err}");
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
