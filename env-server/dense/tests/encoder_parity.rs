//! Grove's BERT encoder against vectors written by Python sentence-transformers
//! (`tests/data/st_golden.py`, output committed as `tests/data/st_golden.json`) for the real
//! all-MiniLM-L6-v2 that `cargo xtask assets` fetches: the same token ids, and every vector
//! within 1e-4 of cosine of the reference.

use std::path::PathBuf;

use grove_dense::encoder::DeviceChoice;
use grove_dense::{Encoder, EncoderOptions, Pooling, TextKind};
use serde_json::Value;

fn golden() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/st_golden.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn model_dir() -> PathBuf {
    let dir = grove_datasets::assets::minilm_dir();
    assert!(dir.join("model.safetensors").exists(), "{} is missing: run `cargo xtask assets`", dir.display());
    dir
}

fn cpu() -> EncoderOptions {
    EncoderOptions { device: Some(DeviceChoice::Cpu), ..Default::default() }
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * y).sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y.powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

#[test]
fn minilm_matches_sentence_transformers() {
    let g = golden();
    let encoder = Encoder::load(&model_dir(), &cpu()).unwrap();
    assert_eq!(encoder.dim(), 384);
    assert_eq!(encoder.pooling(), Pooling::Mean);
    assert!(encoder.normalizes());
    assert_eq!(encoder.max_seq_length(), g["max_seq_length"].as_u64().unwrap() as usize);
    let texts: Vec<&str> = g["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let ids = g["input_ids"].as_array().unwrap();
    for (text, want) in texts.iter().zip(ids) {
        let want: Vec<u32> = want.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        assert_eq!(encoder.token_ids(text, TextKind::Passage).unwrap(), want, "token ids of {text:?}");
    }
    // All six in one call: sorted by length and padded within the batch.
    let vectors = encoder.encode(&texts, TextKind::Passage).unwrap();
    let reference = g["embeddings"].as_array().unwrap();
    let mut worst = 1f64;
    for (i, (got, want)) in vectors.chunks_exact(384).zip(reference).enumerate() {
        let c = cosine(got, &floats(want));
        worst = worst.min(c);
        assert!(c > 1.0 - 1e-4, "text {i} ({:?}): cosine {c}", texts[i]);
        let norm: f32 = got.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "text {i}: norm {norm}");
    }
    eprintln!("lowest cosine to sentence-transformers over {} texts: {worst:.9}", texts.len());
    // The documented reference pair.
    let c01 = cosine(&vectors[..384], &vectors[384..768].iter().map(|x| f64::from(*x)).collect::<Vec<_>>());
    assert!((c01 - 0.7553).abs() < 1e-4, "cosine of the reference pair: {c01}");
    // One at a time gives the same vectors as the batch.
    for (i, text) in texts.iter().enumerate() {
        let single = encoder.encode(&[text], TextKind::Passage).unwrap();
        let max = single.iter().zip(&vectors[i * 384..(i + 1) * 384]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(max < 1e-5, "text {i}: batch and single differ by {max}");
    }
}

/// e5-style prefixes: a query prefix given in the options is put before every query, so encoding
/// the bare question equals the reference vector of the prefixed text.
#[test]
fn prefixes_are_applied_by_kind() {
    let g = golden();
    let options =
        EncoderOptions { query_prefix: Some("query: ".into()), passage_prefix: Some("passage: ".into()), ..cpu() };
    let encoder = Encoder::load(&model_dir(), &options).unwrap();
    let q = encoder.encode(&["who wrote the origin of species"], TextKind::Query).unwrap();
    let p = encoder.encode(&["On the Origin of Species is a work by Charles Darwin."], TextKind::Passage).unwrap();
    let reference = g["embeddings"].as_array().unwrap();
    assert!(cosine(&q, &floats(&reference[2])) > 1.0 - 1e-4);
    assert!(cosine(&p, &floats(&reference[3])) > 1.0 - 1e-4);
    // Without the prefix the vector is a different one.
    let bare = Encoder::load(&model_dir(), &cpu()).unwrap();
    let q_bare = bare.encode(&["who wrote the origin of species"], TextKind::Query).unwrap();
    assert!(cosine(&q_bare, &floats(&reference[2])) < 0.999);
}

/// Truncation follows max_seq_length (the model folder's 256, not tokenizer.json's 128), and a
/// smaller value given in the options is honoured.
#[test]
fn truncation_follows_max_seq_length() {
    let g = golden();
    let long = g["texts"][4].as_str().unwrap();
    let options = EncoderOptions { max_seq_length: Some(128), ..cpu() };
    let short = Encoder::load(&model_dir(), &options).unwrap();
    assert_eq!(short.token_ids(long, TextKind::Passage).unwrap().len(), 128);
    let v = short.encode(&[long], TextKind::Passage).unwrap();
    let c = cosine(&v, &floats(&g["long_text_embedding_truncated_at_128"]));
    assert!(c > 1.0 - 1e-4, "cosine {c}");
    let too_long = EncoderOptions { max_seq_length: Some(513), ..cpu() };
    let err = Encoder::load(&model_dir(), &too_long).unwrap_err();
    assert!(err.to_string().contains("max_seq_length 513"), "{err}");
}

/// A folder the encoder cannot serve faithfully is refused with the reason, never approximated.
#[test]
fn unsupported_folders_are_typed_errors() {
    let src = model_dir();
    let dir = tempfile::tempdir().unwrap();
    let copy = |name: &str| {
        let to = dir.path().join(name);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(src.join(name), to).unwrap();
    };
    for name in ["config.json", "tokenizer.json", "modules.json", "sentence_bert_config.json", "1_Pooling/config.json"]
    {
        copy(name);
    }
    // No weights.
    let err = Encoder::load(dir.path(), &cpu()).unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    std::os::unix::fs::symlink(src.join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
    assert!(Encoder::load(dir.path(), &cpu()).is_ok());
    // Max pooling is not supported.
    let pooling = dir.path().join("1_Pooling/config.json");
    let original = std::fs::read_to_string(&pooling).unwrap();
    std::fs::write(
        &pooling,
        original.replace("\"pooling_mode_max_tokens\": false", "\"pooling_mode_max_tokens\": true"),
    )
    .unwrap();
    let err = Encoder::load(dir.path(), &cpu()).unwrap_err();
    assert!(err.to_string().contains("pooling modes"), "{err}");
    std::fs::write(&pooling, &original).unwrap();
    // Without modules.json the pooling must be given.
    std::fs::remove_file(dir.path().join("modules.json")).unwrap();
    let err = Encoder::load(dir.path(), &cpu()).unwrap_err();
    assert!(err.to_string().contains("say which pooling"), "{err}");
    let cls = Encoder::load(dir.path(), &EncoderOptions { pooling: Some(Pooling::Cls), ..cpu() }).unwrap();
    assert_eq!(cls.pooling(), Pooling::Cls);
    // Another architecture.
    let config = dir.path().join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("\"model_type\": \"bert\"", "\"model_type\": \"roberta\"")).unwrap();
    let err = Encoder::load(dir.path(), &cpu()).unwrap_err();
    assert!(err.to_string().contains("only BERT"), "{err}");
}
