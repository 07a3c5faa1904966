//! trainer/src/engine/gguf.rs on arbitrary bytes (included by path: grove-trainer links libtorch).
//! `parse` must error on anything it cannot read, never panic or allocate what the file cannot
//! hold; every tensor of a parsed file must dequantise to exactly its element count.
#![no_main]

#[allow(dead_code)]
#[path = "../../trainer/src/engine/gguf.rs"]
mod gguf;

use gguf::{Gguf, MetaValue};
use libfuzzer_sys::fuzz_target;

/// Walk a metadata value with every accessor.
fn touch(v: &MetaValue) {
    let _ = (v.as_u64(), v.as_f64(), v.as_str());
    if let Some(items) = v.as_array() {
        items.iter().for_each(touch);
    }
}

fuzz_target!(|data: &[u8]| {
    let len = data.len();
    let Ok(g) = Gguf::parse(data.to_vec()) else {
        return;
    };
    assert!((2..=3).contains(&g.version));
    for (key, value) in &g.metadata {
        touch(value);
        // By identity: a NaN value is not equal to itself.
        assert!(g.meta(key).is_some_and(|v| std::ptr::eq(v, value)));
    }
    let _ = g.meta("general.architecture").and_then(MetaValue::as_str);
    let _ = g.meta("general.alignment").and_then(MetaValue::as_u64);
    for t in g.tensors.iter().take(64) {
        let _ = t.shape();
        let found = g.tensor(&t.name).expect("a listed tensor is found by name");
        match g.dequantize(&t.name) {
            Ok(values) => {
                // The first tensor of that name is the one dequantised.
                assert_eq!(values.len() as u64, found.elements(), "tensor `{}`", t.name);
                // Values come from the file: at most 32 floats per 18 bytes (Q4_0).
                assert!(values.len() <= len.saturating_mul(2));
            }
            Err(e) => panic!("tensor `{}` passed parse but does not dequantise: {e}", t.name),
        }
    }
});
