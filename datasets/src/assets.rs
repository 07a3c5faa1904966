//! Where fetched and converted assets live. `cargo xtask assets` writes them; tests and demos
//! read them. The cache is outside the repository: `$GROVE_CACHE`, else
//! `$XDG_CACHE_HOME/grove`, else `$HOME/.cache/grove`.

use std::path::PathBuf;

pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("GROVE_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("grove");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("grove")
}

/// Converted assets, each in its own folder with a NOTICE file.
pub fn assets_dir() -> PathBuf {
    cache_dir().join("assets")
}

/// 10,033 Wikipedia lead summaries as wiki-18 JSONL.
pub fn wiki_summaries_corpus() -> PathBuf {
    assets_dir().join("wiki-summaries").join("corpus.jsonl")
}

/// FanOutQA dev sub-questions as QA JSONL.
pub fn fanoutqa_dev() -> PathBuf {
    assets_dir().join("fanoutqa").join("dev.jsonl")
}

/// The Qwen2.5 tokenizer folder (`tokenizer.json`, `tokenizer_config.json`).
pub fn qwen25_tokenizer_dir() -> PathBuf {
    assets_dir().join("qwen2.5-tokenizer")
}

/// The SmolLM2-135M-Instruct GGUF file.
pub fn smollm2_gguf() -> PathBuf {
    assets_dir().join("smollm2-135m-instruct").join("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// all-MiniLM-L6-v2 as a Hugging Face / sentence-transformers folder (`config.json`,
/// `model.safetensors`, `tokenizer.json`, `modules.json`, `1_Pooling/`): a BERT sentence encoder
/// for dense retrieval.
pub fn minilm_dir() -> PathBuf {
    assets_dir().join("all-minilm-l6-v2")
}
