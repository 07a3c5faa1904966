//! A GGUF reader: metadata, tensor directory, and dequantisation of F32, F16, BF16, Q8_0, Q4_0
//! and Q4_1 tensors to f32. Every length and offset read from the file is checked against the
//! file's size before use, so a truncated or hostile file is an error, never a panic.

use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file (magic {0:?})")]
    Magic([u8; 4]),
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    Version(u32),
    #[error("truncated or corrupt file: {0}")]
    Corrupt(String),
    #[error("tensor `{name}`: unsupported type {kind} (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)")]
    UnsupportedType { name: String, kind: u32 },
    #[error("no tensor `{0}`")]
    MissingTensor(String),
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U64(u64),
    I64(i64),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            MetaValue::U64(v) => Some(*v),
            MetaValue::I64(v) => u64::try_from(*v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            MetaValue::F64(v) => Some(*v),
            MetaValue::U64(v) => Some(*v as f64),
            MetaValue::I64(v) => Some(*v as f64),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor's directory entry. `dims` are as stored (innermost first).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub kind: u32,
    pub offset: u64,
}

impl TensorInfo {
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Row-major shape (dims reversed).
    pub fn shape(&self) -> Vec<i64> {
        self.dims.iter().rev().map(|d| *d as i64).collect()
    }
}

pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const Q4_0: u32 = 2;
pub const Q4_1: u32 = 3;
pub const Q8_0: u32 = 8;
pub const BF16: u32 = 30;

/// (bytes per block, elements per block) of a supported type.
fn block(kind: u32) -> Option<(u64, u64)> {
    match kind {
        F32 => Some((4, 1)),
        F16 | BF16 => Some((2, 1)),
        Q4_0 => Some((18, 32)),
        Q4_1 => Some((20, 32)),
        Q8_0 => Some((34, 32)),
        _ => None,
    }
}

#[derive(Debug)]
pub struct Gguf {
    bytes: Vec<u8>,
    pub version: u32,
    pub metadata: BTreeMap<String, MetaValue>,
    pub tensors: Vec<TensorInfo>,
    data_start: u64,
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], GgufError> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.b.len());
        let Some(end) = end else {
            return Err(GgufError::Corrupt(format!("read of {n} bytes at offset {} passes the end", self.pos)));
        };
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, GgufError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, GgufError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, GgufError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn len(&mut self, what: &str) -> Result<usize, GgufError> {
        let n = self.u64()?;
        // Nothing in a file can be longer than the file.
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= self.b.len())
            .ok_or_else(|| GgufError::Corrupt(format!("{what} length {n} exceeds the file")))
    }

    fn string(&mut self) -> Result<String, GgufError> {
        let n = self.len("string")?;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }

    fn value(&mut self, kind: u32, depth: u8) -> Result<MetaValue, GgufError> {
        Ok(match kind {
            0 => MetaValue::U64(u64::from(self.u8()?)),
            1 => MetaValue::I64(i64::from(self.u8()? as i8)),
            2 => {
                let b = self.take(2)?;
                MetaValue::U64(u64::from(u16::from_le_bytes([b[0], b[1]])))
            }
            3 => {
                let b = self.take(2)?;
                MetaValue::I64(i64::from(i16::from_le_bytes([b[0], b[1]])))
            }
            4 => MetaValue::U64(u64::from(self.u32()?)),
            5 => MetaValue::I64(i64::from(self.u32()? as i32)),
            6 => MetaValue::F64(f64::from(f32::from_bits(self.u32()?))),
            7 => MetaValue::Bool(self.u8()? != 0),
            8 => MetaValue::Str(self.string()?),
            9 => {
                if depth > 4 {
                    return Err(GgufError::Corrupt("arrays nested too deeply".into()));
                }
                let inner = self.u32()?;
                let n = self.len("array")?;
                let mut items = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    items.push(self.value(inner, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(self.u64()?),
            11 => MetaValue::I64(self.u64()? as i64),
            12 => MetaValue::F64(f64::from_bits(self.u64()?)),
            other => return Err(GgufError::Corrupt(format!("unknown metadata type {other}"))),
        })
    }
}

impl Gguf {
    pub fn open(path: &Path) -> Result<Gguf, GgufError> {
        let bytes = std::fs::read(path).map_err(|source| GgufError::Io { path: path.display().to_string(), source })?;
        Self::parse(bytes)
    }

    pub fn parse(bytes: Vec<u8>) -> Result<Gguf, GgufError> {
        let mut c = Cursor { b: &bytes, pos: 0 };
        let magic = c.take(4)?;
        if magic != b"GGUF" {
            return Err(GgufError::Magic([magic[0], magic[1], magic[2], magic[3]]));
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version(version));
        }
        let n_tensors = c.len("tensor count")?;
        let n_kv = c.len("metadata count")?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string()?;
            let kind = c.u32()?;
            metadata.insert(key, c.value(kind, 0)?);
        }
        let mut tensors = Vec::with_capacity(n_tensors.min(1 << 16));
        for _ in 0..n_tensors {
            let name = c.string()?;
            let n_dims = c.u32()?;
            if n_dims > 4 {
                return Err(GgufError::Corrupt(format!("tensor `{name}` has {n_dims} dimensions")));
            }
            let dims = (0..n_dims).map(|_| c.u64()).collect::<Result<Vec<_>, _>>()?;
            let kind = c.u32()?;
            let offset = c.u64()?;
            tensors.push(TensorInfo { name, dims, kind, offset });
        }
        let alignment = metadata.get("general.alignment").and_then(MetaValue::as_u64).unwrap_or(32).max(1);
        let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
        let gguf = Gguf { bytes, version, metadata, tensors, data_start };
        for t in &gguf.tensors {
            gguf.tensor_bytes(t)?;
        }
        Ok(gguf)
    }

    pub fn meta(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of a tensor, checked against the file.
    fn tensor_bytes(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        let (block_bytes, block_elems) =
            block(t.kind).ok_or_else(|| GgufError::UnsupportedType { name: t.name.clone(), kind: t.kind })?;
        let elems = t.dims.iter().try_fold(1u64, |a, d| a.checked_mul(*d));
        let Some(elems) = elems.filter(|e| e % block_elems == 0) else {
            return Err(GgufError::Corrupt(format!("tensor `{}` has a bad element count", t.name)));
        };
        // Declared dimensions can describe more bytes than a u64 holds: that is an error too.
        let len = (elems / block_elems).checked_mul(block_bytes);
        let start = self.data_start.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(len?));
        match (start, end) {
            (Some(s), Some(e)) if e <= self.bytes.len() as u64 => Ok(&self.bytes[s as usize..e as usize]),
            _ => Err(GgufError::Corrupt(format!("tensor `{}` runs past the end of the file", t.name))),
        }
    }

    /// A tensor dequantised to f32, in storage order (row-major for [`TensorInfo::shape`]).
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let t = self.tensor(name).ok_or_else(|| GgufError::MissingTensor(name.to_string()))?;
        let raw = self.tensor_bytes(t)?;
        let mut out = Vec::with_capacity(t.elements() as usize);
        match t.kind {
            F32 => out.extend(raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
            F16 => out.extend(raw.chunks_exact(2).map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))),
            BF16 => out
                .extend(raw.chunks_exact(2).map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))),
            Q8_0 => {
                for blk in raw.chunks_exact(34) {
                    let d = f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
                    out.extend(blk[2..].iter().map(|q| f32::from(*q as i8) * d));
                }
            }
            Q4_0 => {
                for blk in raw.chunks_exact(18) {
                    let d = f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
                    let qs = &blk[2..];
                    out.extend(qs.iter().map(|q| (f32::from(q & 0x0f) - 8.0) * d));
                    out.extend(qs.iter().map(|q| (f32::from(q >> 4) - 8.0) * d));
                }
            }
            Q4_1 => {
                for blk in raw.chunks_exact(20) {
                    let d = f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
                    let m = f16_to_f32(u16::from_le_bytes([blk[2], blk[3]]));
                    let qs = &blk[4..];
                    out.extend(qs.iter().map(|q| f32::from(q & 0x0f) * d + m));
                    out.extend(qs.iter().map(|q| f32::from(q >> 4) * d + m));
                }
            }
            other => return Err(GgufError::UnsupportedType { name: name.to_string(), kind: other }),
        }
        Ok(out)
    }
}

/// IEEE half to single precision, subnormals and specials included.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let frac = u32::from(h & 0x3ff);
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, f) => {
            // Subnormal: normalise.
            let mut e = 127 - 15 + 1;
            let mut f = f;
            while f & 0x400 == 0 {
                f <<= 1;
                e -= 1;
            }
            sign | (e << 23) | ((f & 0x3ff) << 13)
        }
        (0x1f, f) => sign | 0x7f80_0000 | (f << 13),
        (e, f) => sign | ((e + 127 - 15) << 23) | (f << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_floats() {
        for (h, f) in [
            (0x3c00u16, 1.0f32),
            (0xc000, -2.0),
            (0x0000, 0.0),
            (0x7bff, 65504.0),
            (0x0001, 5.960_464_5e-8),
            (0x3555, 0.333_251_95),
        ] {
            assert_eq!(f16_to_f32(h), f, "{h:#x}");
        }
        assert!(f16_to_f32(0x7c00).is_infinite() && f16_to_f32(0x7e00).is_nan());
    }

    /// A small GGUF written by hand: one F32, one Q8_0, one Q4_0 and one Q4_1 tensor.
    fn sample() -> Vec<u8> {
        let mut b = Vec::new();
        let s = |b: &mut Vec<u8>, x: &str| {
            b.extend((x.len() as u64).to_le_bytes());
            b.extend(x.as_bytes());
        };
        b.extend(b"GGUF");
        b.extend(3u32.to_le_bytes());
        b.extend(4u64.to_le_bytes()); // tensors
        b.extend(2u64.to_le_bytes()); // metadata
        s(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        s(&mut b, "llama");
        s(&mut b, "llama.block_count");
        b.extend(4u32.to_le_bytes());
        b.extend(2u32.to_le_bytes());
        let tensors: [(&str, u32, u64); 4] = [("a", F32, 0), ("b", Q8_0, 128), ("c", Q4_0, 192), ("d", Q4_1, 224)];
        for (name, kind, offset) in tensors {
            s(&mut b, name);
            b.extend(1u32.to_le_bytes());
            b.extend(32u64.to_le_bytes());
            b.extend(kind.to_le_bytes());
            b.extend(offset.to_le_bytes());
        }
        while b.len() % 32 != 0 {
            b.push(0);
        }
        // a: 0..32 as f32
        for i in 0..32 {
            b.extend((i as f32).to_le_bytes());
        }
        // b: d = 0.5, q = -16..16
        b.extend(0x3800u16.to_le_bytes());
        b.extend((0..32).map(|i| (i - 16) as i8 as u8));
        b.extend([0u8; 30]); // pad to offset 192
        // c: d = 1.0, low nibbles 0..16, high nibbles 15..0
        b.extend(0x3c00u16.to_le_bytes());
        b.extend((0..16u8).map(|i| i | ((15 - i) << 4)));
        b.extend([0u8; 14]); // pad to offset 224
        // d: d = 2.0, m = -1.0, all nibbles 3
        b.extend(0x4000u16.to_le_bytes());
        b.extend(0xbc00u16.to_le_bytes());
        b.extend([0x33u8; 16]);
        b
    }

    #[test]
    fn reads_and_dequantises() {
        let g = Gguf::parse(sample()).unwrap();
        assert_eq!(g.meta("general.architecture").and_then(MetaValue::as_str), Some("llama"));
        assert_eq!(g.meta("llama.block_count").and_then(MetaValue::as_u64), Some(2));
        assert_eq!(g.dequantize("a").unwrap(), (0..32).map(|i| i as f32).collect::<Vec<_>>());
        assert_eq!(g.dequantize("b").unwrap(), (0..32).map(|i| (i - 16) as f32 * 0.5).collect::<Vec<_>>());
        let c = g.dequantize("c").unwrap();
        assert_eq!(c[..16], (0..16).map(|i| i as f32 - 8.0).collect::<Vec<_>>()[..]);
        assert_eq!(c[16..], (0..16).map(|i| (15 - i) as f32 - 8.0).collect::<Vec<_>>()[..]);
        assert_eq!(g.dequantize("d").unwrap(), vec![5.0; 32]);
        assert!(matches!(g.dequantize("zz"), Err(GgufError::MissingTensor(_))));
    }

    /// Found by the `gguf_reader` fuzz target: a tensor whose byte size overflows a u64 (here
    /// 2^62 F32 elements) was sized with an unchecked multiply: a panic in debug builds, and in
    /// release a wrapped size of 0 that passed the bounds check, so `dequantize` then tried to
    /// reserve 2^62 floats.
    #[test]
    fn tensor_byte_size_overflow_is_an_error() {
        let mut b = Vec::new();
        b.extend(b"GGUF");
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes()); // tensors
        b.extend(0u64.to_le_bytes()); // metadata
        b.extend(1u64.to_le_bytes());
        b.extend(b"t");
        b.extend(1u32.to_le_bytes()); // one dimension
        b.extend((1u64 << 62).to_le_bytes());
        b.extend(F32.to_le_bytes());
        b.extend(0u64.to_le_bytes()); // offset
        b.resize(64, 0);
        assert!(matches!(Gguf::parse(b), Err(GgufError::Corrupt(_))));
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let full = sample();
        for cut in 0..full.len() {
            assert!(Gguf::parse(full[..cut].to_vec()).is_err(), "cut at {cut}");
        }
        let mut bad = full.clone();
        bad[0] = b'X';
        assert!(matches!(Gguf::parse(bad), Err(GgufError::Magic(_))));
        let mut huge = full;
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // metadata count
        assert!(Gguf::parse(huge).is_err());
    }
}
