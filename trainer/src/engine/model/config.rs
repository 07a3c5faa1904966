//! The decoder configuration, read from a Hugging Face `config.json` in either layout: the
//! transformers 5 one (`rope_parameters`) or the older one (`rope_theta` at the top level,
//! `rope_scaling` for Llama 3) that released Qwen2.5 and Llama 3.2 checkpoints use.

use serde_json::Value;

/// Which family the weights come from; decides defaults the config may omit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Qwen2 / Qwen2.5: q/k/v projections have biases.
    Qwen2,
    /// Llama 3.x, SmolLM2 and other `LlamaForCausalLM` checkpoints.
    Llama,
}

/// Llama 3 frequency-dependent RoPE scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub family: Family,
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<Llama3Scaling>,
    pub attention_bias: bool,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: i64,
    pub bos_token_id: Option<i64>,
    pub eos_token_ids: Vec<i64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config.json is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("config.json: missing or invalid `{0}`")]
    Missing(&'static str),
    #[error("config.json: unsupported model_type `{0}` (supported: qwen2, llama)")]
    UnsupportedModel(String),
    #[error("config.json: unsupported rope type `{0}` (supported: default, llama3)")]
    UnsupportedRope(String),
    #[error("config.json: {0}")]
    Invalid(String),
}

fn int(v: &Value, key: &'static str) -> Result<i64, ConfigError> {
    v.get(key).and_then(Value::as_i64).ok_or(ConfigError::Missing(key))
}

fn ids(v: Option<&Value>) -> Vec<i64> {
    match v {
        Some(Value::Number(n)) => n.as_i64().into_iter().collect(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_i64).collect(),
        _ => Vec::new(),
    }
}

impl ModelConfig {
    pub fn from_json(text: &str) -> Result<ModelConfig, ConfigError> {
        let v: Value = serde_json::from_str(text)?;
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or_default();
        let family = match model_type {
            "qwen2" => Family::Qwen2,
            "llama" => Family::Llama,
            other => return Err(ConfigError::UnsupportedModel(other.to_string())),
        };
        let hidden_size = int(&v, "hidden_size")?;
        let num_attention_heads = int(&v, "num_attention_heads")?;
        let num_key_value_heads = v.get("num_key_value_heads").and_then(Value::as_i64).unwrap_or(num_attention_heads);
        let head_dim = v.get("head_dim").and_then(Value::as_i64).unwrap_or(hidden_size / num_attention_heads.max(1));
        // RoPE: `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (older).
        let rope = v.get("rope_parameters").filter(|r| r.is_object());
        let rope_theta = rope
            .and_then(|r| r.get("rope_theta"))
            .or_else(|| v.get("rope_theta"))
            .and_then(Value::as_f64)
            .unwrap_or(10_000.0);
        let scaling = rope.or_else(|| v.get("rope_scaling").filter(|r| r.is_object()));
        let rope_scaling = match scaling {
            None => None,
            Some(s) => {
                let kind = s.get("rope_type").or_else(|| s.get("type")).and_then(Value::as_str).unwrap_or("default");
                match kind {
                    "default" => None,
                    "llama3" => {
                        let f = |k: &'static str| s.get(k).and_then(Value::as_f64).ok_or(ConfigError::Missing(k));
                        Some(Llama3Scaling {
                            factor: f("factor")?,
                            low_freq_factor: f("low_freq_factor")?,
                            high_freq_factor: f("high_freq_factor")?,
                            original_max_position_embeddings: f("original_max_position_embeddings")?,
                        })
                    }
                    other => return Err(ConfigError::UnsupportedRope(other.to_string())),
                }
            }
        };
        let attention_bias = match family {
            Family::Qwen2 => true,
            Family::Llama => v.get("attention_bias").and_then(Value::as_bool).unwrap_or(false),
        };
        let cfg = ModelConfig {
            family,
            vocab_size: int(&v, "vocab_size")?,
            hidden_size,
            intermediate_size: int(&v, "intermediate_size")?,
            num_hidden_layers: int(&v, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: v.get("rms_norm_eps").and_then(Value::as_f64).unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            attention_bias,
            tie_word_embeddings: v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false),
            max_position_embeddings: v.get("max_position_embeddings").and_then(Value::as_i64).unwrap_or(32_768),
            bos_token_id: v.get("bos_token_id").and_then(Value::as_i64),
            eos_token_ids: ids(v.get("eos_token_id")),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ];
        for (name, value) in positive {
            if value <= 0 {
                return Err(ConfigError::Invalid(format!("{name} must be positive, got {value}")));
            }
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(ConfigError::Invalid(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            )));
        }
        if self.head_dim % 2 != 0 {
            return Err(ConfigError::Invalid(format!("head_dim {} must be even for RoPE", self.head_dim)));
        }
        Ok(())
    }

    /// The inverse RoPE frequencies, `head_dim / 2` of them, with Llama 3 scaling if configured.
    pub fn inv_freq(&self) -> Vec<f64> {
        let dim = self.head_dim as f64;
        let base: Vec<f64> = (0..self.head_dim / 2).map(|i| 1.0 / self.rope_theta.powf((2 * i) as f64 / dim)).collect();
        let Some(s) = self.rope_scaling else { return base };
        let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
        let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
        base.into_iter()
            .map(|f| {
                let wavelen = 2.0 * std::f64::consts::PI / f;
                if wavelen < high_wavelen {
                    f
                } else if wavelen > low_wavelen {
                    f / s.factor
                } else {
                    let smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor)
                        / (s.high_freq_factor - s.low_freq_factor);
                    (1.0 - smooth) * f / s.factor + smooth * f
                }
            })
            .collect()
    }
}
