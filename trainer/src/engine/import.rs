//! GGUF (llama architecture) -> Hugging Face folder: `config.json`, `model.safetensors` (f32),
//! `tokenizer.json` and `tokenizer_config.json` rebuilt from the GGUF metadata.
//!
//! llama.cpp permutes the rows of `attn_q` / `attn_k` for its rotary layout; they are put back
//! into HF's rotate-half layout here: view (heads, head_dim/2, 2, in), swap axes 1 and 2,
//! reshape back.

use std::path::Path;

use serde_json::{Value, json};
use tch::{Kind, Tensor};

use crate::engine::gguf::{Gguf, GgufError, MetaValue};

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported architecture `{0}` (supported: llama)")]
    Architecture(String),
    #[error("missing metadata `{0}`")]
    Metadata(String),
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    Shape { name: String, found: Vec<i64>, expected: Vec<i64> },
    #[error("cannot write {path}: {message}")]
    Write { path: String, message: String },
}

/// What was converted.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportSummary {
    pub tensors: usize,
    pub parameters: i64,
    pub vocab: usize,
    pub tied_embeddings: bool,
}

fn meta_u64(g: &Gguf, key: &str) -> Result<u64, ImportError> {
    g.meta(key).and_then(MetaValue::as_u64).ok_or_else(|| ImportError::Metadata(key.to_string()))
}

/// Undo llama.cpp's Q/K row permutation.
fn unpermute(w: &Tensor, heads: i64) -> Tensor {
    let (out, inp) = (w.size()[0], w.size()[1]);
    w.view([heads, out / heads / 2, 2, inp]).transpose(1, 2).reshape([out, inp])
}

pub fn import_gguf(gguf_path: &Path, out_dir: &Path) -> Result<ImportSummary, ImportError> {
    let g = Gguf::open(gguf_path)?;
    let arch = g.meta("general.architecture").and_then(MetaValue::as_str).unwrap_or_default().to_string();
    if arch != "llama" {
        return Err(ImportError::Architecture(arch));
    }
    let layers = meta_u64(&g, "llama.block_count")? as i64;
    let hidden = meta_u64(&g, "llama.embedding_length")? as i64;
    let ffn = meta_u64(&g, "llama.feed_forward_length")? as i64;
    let heads = meta_u64(&g, "llama.attention.head_count")? as i64;
    let kv_heads = g.meta("llama.attention.head_count_kv").and_then(MetaValue::as_u64).map_or(heads, |v| v as i64);
    let eps = g.meta("llama.attention.layer_norm_rms_epsilon").and_then(MetaValue::as_f64).unwrap_or(1e-5);
    let theta = g.meta("llama.rope.freq_base").and_then(MetaValue::as_f64).unwrap_or(10_000.0);
    let ctx = g.meta("llama.context_length").and_then(MetaValue::as_u64).unwrap_or(2048);
    let tokens: Vec<String> = g
        .meta("tokenizer.ggml.tokens")
        .and_then(MetaValue::as_array)
        .ok_or_else(|| ImportError::Metadata("tokenizer.ggml.tokens".into()))?
        .iter()
        .map(|t| t.as_str().unwrap_or_default().to_string())
        .collect();
    let vocab = tokens.len() as i64;
    let head_dim = hidden / heads.max(1);

    let mut out: Vec<(String, Tensor)> = Vec::new();
    let mut take =
        |gguf_name: &str, hf_name: String, expected: Vec<i64>, permute_heads: Option<i64>| -> Result<(), ImportError> {
            let info = g.tensor(gguf_name).ok_or_else(|| GgufError::MissingTensor(gguf_name.to_string()))?;
            let shape = info.shape();
            if shape != expected {
                return Err(ImportError::Shape { name: gguf_name.to_string(), found: shape, expected });
            }
            let mut t = Tensor::from_slice(&g.dequantize(gguf_name)?).view(shape.as_slice());
            if let Some(h) = permute_heads {
                t = unpermute(&t, h);
            }
            out.push((hf_name, t.to_kind(Kind::Float)));
            Ok(())
        };
    take("token_embd.weight", "model.embed_tokens.weight".into(), vec![vocab, hidden], None)?;
    take("output_norm.weight", "model.norm.weight".into(), vec![hidden], None)?;
    let tied = g.tensor("output.weight").is_none();
    if !tied {
        take("output.weight", "lm_head.weight".into(), vec![vocab, hidden], None)?;
    }
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        let b = |n: &str| format!("blk.{i}.{n}.weight");
        take(&b("attn_norm"), format!("{p}.input_layernorm.weight"), vec![hidden], None)?;
        take(&b("ffn_norm"), format!("{p}.post_attention_layernorm.weight"), vec![hidden], None)?;
        take(&b("attn_q"), format!("{p}.self_attn.q_proj.weight"), vec![heads * head_dim, hidden], Some(heads))?;
        take(&b("attn_k"), format!("{p}.self_attn.k_proj.weight"), vec![kv_heads * head_dim, hidden], Some(kv_heads))?;
        take(&b("attn_v"), format!("{p}.self_attn.v_proj.weight"), vec![kv_heads * head_dim, hidden], None)?;
        take(&b("attn_output"), format!("{p}.self_attn.o_proj.weight"), vec![hidden, heads * head_dim], None)?;
        take(&b("ffn_gate"), format!("{p}.mlp.gate_proj.weight"), vec![ffn, hidden], None)?;
        take(&b("ffn_up"), format!("{p}.mlp.up_proj.weight"), vec![ffn, hidden], None)?;
        take(&b("ffn_down"), format!("{p}.mlp.down_proj.weight"), vec![hidden, ffn], None)?;
    }
    let write_err = |path: &Path, e: &dyn std::fmt::Display| ImportError::Write {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(out_dir).map_err(|e| write_err(out_dir, &e))?;
    let weights = out_dir.join("model.safetensors");
    Tensor::write_safetensors(&out, &weights).map_err(|e| write_err(&weights, &e))?;
    let parameters = out.iter().map(|(_, t)| t.numel() as i64).sum();

    let bos = g.meta("tokenizer.ggml.bos_token_id").and_then(MetaValue::as_u64);
    let eos = g.meta("tokenizer.ggml.eos_token_id").and_then(MetaValue::as_u64);
    let pad = g.meta("tokenizer.ggml.padding_token_id").and_then(MetaValue::as_u64);
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": eps,
        "rope_theta": theta,
        "max_position_embeddings": ctx,
        "tie_word_embeddings": tied,
        "attention_bias": false,
        "mlp_bias": false,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": "float32",
    });
    write_json(&out_dir.join("config.json"), &config)?;

    let token_types: Vec<u64> = g
        .meta("tokenizer.ggml.token_type")
        .and_then(MetaValue::as_array)
        .map(|a| a.iter().map(|v| v.as_u64().unwrap_or(1)).collect())
        .unwrap_or_default();
    let merges: Vec<Value> = g
        .meta("tokenizer.ggml.merges")
        .and_then(MetaValue::as_array)
        .map(|a| a.iter().filter_map(|m| m.as_str().map(|s| Value::String(s.to_string()))).collect())
        .unwrap_or_default();
    let vocab_map: serde_json::Map<String, Value> =
        tokens.iter().enumerate().map(|(i, t)| (t.clone(), Value::from(i))).collect();
    // Token type 3 is "control": special tokens such as <|im_start|>.
    let added: Vec<Value> = tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| token_types.get(*i) == Some(&3))
        .map(|(i, t)| {
            json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab_map, "merges": merges}
    });
    write_json(&out_dir.join("tokenizer.json"), &tokenizer)?;
    let name = |id: Option<u64>| id.and_then(|i| tokens.get(i as usize)).cloned();
    let mut tok_cfg = json!({
        "bos_token": name(bos),
        "eos_token": name(eos),
        "pad_token": name(pad),
        "add_bos_token": false,
        "clean_up_tokenization_spaces": false,
        "model_max_length": ctx,
    });
    if let Some(t) = g.meta("tokenizer.chat_template").and_then(MetaValue::as_str) {
        tok_cfg["chat_template"] = Value::String(t.to_string());
    }
    write_json(&out_dir.join("tokenizer_config.json"), &tok_cfg)?;
    Ok(ImportSummary { tensors: out.len(), parameters, vocab: tokens.len(), tied_embeddings: tied })
}

fn write_json(path: &Path, v: &Value) -> Result<(), ImportError> {
    let text = serde_json::to_string_pretty(v)
        .map_err(|e| ImportError::Write { path: path.display().to_string(), message: e.to_string() })?;
    std::fs::write(path, text)
        .map_err(|e| ImportError::Write { path: path.display().to_string(), message: e.to_string() })
}
