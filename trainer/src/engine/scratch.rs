//! A small policy from scratch, produced offline: a byte-level BPE tokenizer trained with the
//! `tokenizers` crate on a corpus (and prompts), and a randomly initialised Qwen2-architecture
//! model of a few million parameters, saved as a Hugging Face folder.

use std::path::Path;

use serde_json::json;
use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer as HfTokenizer};

use crate::engine::model::{CausalLm, ModelConfig, WeightsError, init_normal, save_model};

/// Special tokens of the ChatML format, in id order (0, 1, 2).
pub const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

#[derive(Debug, thiserror::Error)]
pub enum ScratchError {
    #[error("tokenizer training: {0}")]
    Tokenizer(String),
    #[error("cannot write {path}: {message}")]
    Write { path: String, message: String },
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error(transparent)]
    Config(#[from] crate::engine::model::ConfigError),
}

/// The texts a small policy's tokenizer is trained on: every passage of a wiki-18 corpus, and
/// the questions of a QA file rendered as the prompts the model will read (through `template`,
/// with its `{question}` placeholder, when given).
pub fn tokenizer_corpus(
    corpus: &Path,
    questions: Option<&Path>,
    template: Option<&str>,
) -> Result<Vec<String>, grove_datasets::DatasetError> {
    use grove_datasets::OnBadRow;
    let mut texts: Vec<String> =
        grove_datasets::loaders::load_wiki18(corpus, OnBadRow::Fail)?.items.iter().map(|p| p.contents()).collect();
    if let Some(q) = questions {
        let examples = grove_datasets::loaders::load_qa_jsonl(q, "qa", None, OnBadRow::Fail)?.items;
        texts.extend(examples.into_iter().map(|e| match template {
            Some(t) => grove_datasets::render_prompt(t, &e.question),
            None => e.question,
        }));
    }
    Ok(texts)
}

/// Train a byte-level BPE of about `vocab_size` tokens on `texts`; write `tokenizer.json` and a
/// `tokenizer_config.json` (ChatML template) into `out_dir`. Returns the real vocabulary size.
pub fn train_bpe<S: AsRef<str> + Send + Sync>(
    texts: &[S],
    vocab_size: usize,
    out_dir: &Path,
) -> Result<usize, ScratchError> {
    let terr = |e: &dyn std::fmt::Display| ScratchError::Tokenizer(e.to_string());
    let mut tok = HfTokenizer::new(BPE::default());
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(ByteLevel::new(false, true, true)));
    let specials: Vec<AddedToken> = SPECIAL_TOKENS.iter().map(|t| AddedToken::from(t.to_string(), true)).collect();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    tok.train(&mut trainer, texts.iter()).map_err(|e| terr(&e))?;
    std::fs::create_dir_all(out_dir).map_err(|e| write_err(out_dir, &e))?;
    let path = out_dir.join("tokenizer.json");
    tok.save(&path, false).map_err(|e| write_err(&path, &e))?;
    let config = json!({
        "bos_token": null,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": false,
        "chat_template": crate::engine::tokenizer::CHATML,
        "model_max_length": 4096,
    });
    let cfg_path = out_dir.join("tokenizer_config.json");
    std::fs::write(&cfg_path, serde_json::to_string_pretty(&config).unwrap_or_default())
        .map_err(|e| write_err(&cfg_path, &e))?;
    Ok(tok.get_vocab_size(true))
}

fn write_err(path: &Path, e: &dyn std::fmt::Display) -> ScratchError {
    ScratchError::Write { path: path.display().to_string(), message: e.to_string() }
}

/// Shape of a small Qwen2 model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmallModel {
    pub hidden: i64,
    pub layers: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub intermediate: i64,
}

impl Default for SmallModel {
    /// About 2M parameters with a 4k vocabulary.
    fn default() -> Self {
        Self { hidden: 128, layers: 4, heads: 4, kv_heads: 2, intermediate: 384 }
    }
}

/// A randomly initialised Qwen2 model (tied embeddings, small-std init) saved with the
/// tokenizer files of `out_dir`. Returns the parameter count.
pub fn init_model(out_dir: &Path, vocab: usize, shape: SmallModel, seed: i64) -> Result<i64, ScratchError> {
    let config = json!({
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": true,
        "hidden_act": "silu",
        "bos_token_id": null,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "float32",
    })
    .to_string();
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let _model = CausalLm::new(&vs.root(), ModelConfig::from_json(&config)?);
    // HF-style initialisation: normal(0, 0.02) for matrices, ones for norms.
    init_normal(&vs, seed as u64, 0.02);
    let params = vs.variables().values().map(|t| t.numel() as i64).sum();
    // The tokenizer files written by `train_bpe` are already in `out_dir`.
    save_model(&vs, &config, out_dir, tch::Kind::Float, &[])?;
    Ok(params)
}
