//! A bounds check of a parquet footer before the parquet crate decodes it. The footer is a
//! `FileMetaData` struct in the Thrift compact protocol; parquet 57.3 reserves memory for every
//! list it reads from the list's declared length (`Vec::with_capacity`), so a corrupt 5 KB file
//! declaring a list of 10^11 schema elements makes it allocate 174 GB and the process abort,
//! which no `catch_unwind` can stop (found by the `qa_loaders` fuzz target).
//!
//! The walk below decodes nothing: it follows the compact protocol's framing, field by field,
//! and rejects any length that cannot fit in the bytes that remain (every list or set element
//! takes at least one byte, every map entry two), any unknown type, and nesting deeper than
//! [`MAX_DEPTH`]. What passes can still be wrong in a hundred ways; those the parquet crate
//! reports as errors.

use std::io::{Read, Seek, SeekFrom};

/// Deepest nesting of structs and containers accepted (a real footer nests about 6 deep).
pub const MAX_DEPTH: usize = 64;

/// Read the footer of the parquet file `file` and check its Thrift framing. `Err` says what is
/// wrong, in words for a [`crate::DatasetError::Format`].
pub fn check_parquet_footer(file: &mut std::fs::File) -> Result<(), String> {
    let len = file.seek(SeekFrom::End(0)).map_err(|e| format!("cannot seek: {e}"))?;
    if len < 12 {
        return Err(format!("{len} bytes is too short for a parquet file"));
    }
    let mut tail = [0u8; 8];
    file.seek(SeekFrom::End(-8)).map_err(|e| format!("cannot seek: {e}"))?;
    file.read_exact(&mut tail).map_err(|e| format!("cannot read the footer: {e}"))?;
    if &tail[4..] != b"PAR1" {
        return Err("no PAR1 magic at the end of the file".into());
    }
    let meta_len = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    if meta_len > len - 8 {
        return Err(format!("the footer declares {meta_len} bytes of metadata in a {len}-byte file"));
    }
    let mut meta = vec![0u8; meta_len as usize];
    file.seek(SeekFrom::End(-8 - meta_len as i64)).map_err(|e| format!("cannot seek: {e}"))?;
    file.read_exact(&mut meta).map_err(|e| format!("cannot read the footer: {e}"))?;
    file.seek(SeekFrom::Start(0)).map_err(|e| format!("cannot seek: {e}"))?;
    let mut walk = Walk { bytes: &meta, at: 0 };
    walk.value(STRUCT, 0).map_err(|e| format!("corrupt footer metadata at byte {}: {e}", walk.at))
}

// Compact protocol type codes.
const BOOL_TRUE: u8 = 1;
const BOOL_FALSE: u8 = 2;
const BYTE: u8 = 3;
const I16: u8 = 4;
const I32: u8 = 5;
const I64: u8 = 6;
const DOUBLE: u8 = 7;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const SET: u8 = 10;
const MAP: u8 = 11;
const STRUCT: u8 = 12;
const UUID: u8 = 13;

struct Walk<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Walk<'_> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn byte(&mut self) -> Result<u8, String> {
        let b = *self.bytes.get(self.at).ok_or("unexpected end of the metadata")?;
        self.at += 1;
        Ok(b)
    }

    fn skip(&mut self, n: usize) -> Result<(), String> {
        if n > self.remaining() {
            return Err(format!("{n} bytes declared, {} left", self.remaining()));
        }
        self.at += n;
        Ok(())
    }

    /// An unsigned LEB128 varint of at most 10 bytes.
    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    /// A length that must fit in what remains, `min_bytes` per item.
    fn length(&mut self, declared: u64, min_bytes: usize, what: &str) -> Result<usize, String> {
        let room = (self.remaining() / min_bytes) as u64;
        if declared > room {
            return Err(format!("{what} of {declared} items declared, at most {room} fit in what is left"));
        }
        Ok(declared as usize)
    }

    /// Skip one value of type `ty` (list elements of type bool take one byte each).
    fn value(&mut self, ty: u8, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(format!("nested deeper than {MAX_DEPTH}"));
        }
        match ty {
            BOOL_TRUE | BOOL_FALSE | BYTE => self.skip(1),
            I16 | I32 | I64 => self.varint().map(drop),
            DOUBLE => self.skip(8),
            UUID => self.skip(16),
            BINARY => {
                let n = self.varint()?;
                let n = self.length(n, 1, "a binary value")?;
                self.skip(n)
            }
            LIST | SET => {
                let header = self.byte()?;
                let elem = header & 0x0f;
                let short = u64::from(header >> 4);
                let n = if short == 15 { self.varint()? } else { short };
                let n = self.length(n, 1, "a list")?;
                for _ in 0..n {
                    self.value(elem, depth + 1)?;
                }
                Ok(())
            }
            MAP => {
                let n = self.varint()?;
                if n == 0 {
                    return Ok(());
                }
                let types = self.byte()?;
                let n = self.length(n, 2, "a map")?;
                for _ in 0..n {
                    self.value(types >> 4, depth + 1)?;
                    self.value(types & 0x0f, depth + 1)?;
                }
                Ok(())
            }
            STRUCT => loop {
                let header = self.byte()?;
                if header == 0 {
                    return Ok(());
                }
                if header >> 4 == 0 {
                    self.varint()?; // a field id that is not a delta
                }
                match header & 0x0f {
                    // A bool field carries its value in the header.
                    BOOL_TRUE | BOOL_FALSE => {}
                    t => self.value(t, depth + 1)?,
                }
            },
            t => Err(format!("unknown thrift type {t}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk(bytes: &[u8]) -> Result<(), String> {
        Walk { bytes, at: 0 }.value(STRUCT, 0)
    }

    #[test]
    fn well_formed_structs_pass() {
        // field 1 i32 = 150 (zigzag 300 = ac 02), field 2 binary "ab", field 3 list<i32> [1, 2],
        // field 4 bool true, field 5 struct {}, stop.
        let bytes = [0x15, 0xac, 0x02, 0x18, 0x02, b'a', b'b', 0x19, 0x25, 0x02, 0x04, 0x11, 0x1c, 0x00, 0x00];
        walk(&bytes).unwrap();
        // A long-form field id (delta 0) and a map {1: 2} of i32 to i32.
        walk(&[0x05, 0x14, 0x02, 0x1b, 0x01, 0x55, 0x02, 0x04, 0x00]).unwrap();
    }

    #[test]
    fn lengths_that_cannot_fit_are_rejected() {
        // A list of i32 declared with 2^40 elements (long form).
        let err = walk(&[0x19, 0xf5, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20, 0x00]).unwrap_err();
        assert!(err.contains("a list of 1099511627776 items"), "{err}");
        // A binary of 100 bytes with 2 left.
        let err = walk(&[0x18, 0x64, b'a', b'b']).unwrap_err();
        assert!(err.contains("a binary value of 100"), "{err}");
        // A map of 10 entries with 3 bytes left.
        let err = walk(&[0x1b, 0x0a, 0x55, 0x02, 0x04]).unwrap_err();
        assert!(err.contains("a map of 10"), "{err}");
    }

    #[test]
    fn truncation_unknown_types_and_depth_are_rejected() {
        assert!(walk(&[0x15]).unwrap_err().contains("unexpected end"));
        assert!(walk(&[0x1e, 0x00]).unwrap_err().contains("unknown thrift type 14"));
        assert!(walk(&[0x15, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]).is_err());
        let deep: Vec<u8> = std::iter::repeat_n(0x1c, 100).chain(std::iter::repeat_n(0, 101)).collect();
        assert!(walk(&deep).unwrap_err().contains("nested deeper than 64"));
        let ok: Vec<u8> = std::iter::repeat_n(0x1c, 10).chain(std::iter::repeat_n(0, 11)).collect();
        walk(&ok).unwrap();
    }
}
