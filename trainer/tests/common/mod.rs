//! Shared by the trainer's command-line tests: a tiny Qwen2-shaped model folder with the real
//! Qwen tokenizer, and a synthetic world written as a corpus and a QA file.

#![allow(dead_code)]

/// libtorch's RNG is one global and tests run in parallel: whoever seeds it and draws holds this.
pub static TORCH_RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

use std::path::{Path, PathBuf};

use grove_datasets::assets;
use grove_datasets::synthetic::{World, WorldConfig};
use grove_trainer::engine::model::{CausalLm, ModelConfig, init_normal, save_model};

pub fn tiny_model_folder(dir: &Path) {
    let tok_dir = assets::qwen25_tokenizer_dir();
    assert!(tok_dir.join("tokenizer.json").exists(), "run `cargo xtask assets`");
    let cfg = r#"{"model_type": "qwen2", "vocab_size": 151665, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": true}"#;
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let _lm = CausalLm::new(&vs.root(), ModelConfig::from_json(cfg).unwrap());
    init_normal(&vs, 0, 0.02);
    let files = [tok_dir.join("tokenizer.json"), tok_dir.join("tokenizer_config.json")];
    save_model(&vs, cfg, dir, tch::Kind::Float, &files).unwrap();
}

/// The default synthetic world as `world.jsonl` (wiki-18) and `train.jsonl` (4 two-hop
/// questions) in `dir`; returns (corpus, data).
pub fn world_files(dir: &Path) -> (PathBuf, PathBuf) {
    let world = World::generate(&WorldConfig::default());
    let corpus = dir.join("world.jsonl");
    grove_datasets::loaders::write_wiki18(&corpus, &world.passages).unwrap();
    let examples: Vec<_> = world.questions(2, 4, 1).into_iter().map(|q| q.example).collect();
    let data = dir.join("train.jsonl");
    grove_datasets::loaders::write_qa_jsonl(&data, &examples).unwrap();
    (corpus, data)
}
