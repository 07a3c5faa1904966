//! A BERT-family sentence encoder (e5, BGE, all-MiniLM) loaded from a Hugging Face folder:
//! `config.json`, `model.safetensors` and `tokenizer.json`, plus the sentence-transformers files
//! when present (`modules.json`, the pooling module's `config.json`, `sentence_bert_config.json`,
//! `config_sentence_transformers.json`), which give the pooling, whether vectors are normalised,
//! the maximum sequence length and the query / passage prompts. Anything the folder does not say
//! can be given in [`EncoderOptions`]; anything it says that this encoder cannot do is an error,
//! never a silent approximation.
//!
//! The forward pass is BertModel's: word + position + token-type embeddings, LayerNorm, then per
//! layer self-attention (scaled dot product with the padding mask), output projection, residual,
//! LayerNorm, feed-forward (GELU), residual, LayerNorm. Texts are truncated to the maximum
//! sequence length and never padded beyond the longest text of their batch; pooling uses the
//! attention mask, as sentence-transformers does.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tch::{Device, Kind, Tensor};
use tokenizers::{Tokenizer, TruncationParams};

#[derive(Debug, thiserror::Error)]
pub enum EncoderError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    Config { path: PathBuf, message: String },
    #[error("{0}")]
    Unsupported(String),
    #[error("model weights: missing tensor `{0}`")]
    Missing(String),
    #[error("model weights: tensor `{name}` has shape {found:?}, expected {expected:?}")]
    Shape { name: String, found: Vec<i64>, expected: Vec<i64> },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

type Result<T, E = EncoderError> = std::result::Result<T, E>;

/// How token vectors become one text vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// The mean of the token vectors under the attention mask (e5, all-MiniLM).
    Mean,
    /// The first token's vector (`[CLS]`; BGE).
    Cls,
}

/// Whether a text is a query or a passage: e5 and BGE prefix them differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextKind {
    Query,
    Passage,
}

/// Where the encoder runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceChoice {
    /// CUDA when libtorch has it and a GPU is present, else CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
}

/// What the caller may set; `None` means "as the model folder says".
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncoderOptions {
    /// Required when the folder has no sentence-transformers pooling module.
    pub pooling: Option<Pooling>,
    /// L2-normalise the text vectors. Default: whether the folder's modules include `Normalize`
    /// (true when there is no `modules.json`).
    pub normalize: Option<bool>,
    /// Put before every query, e.g. `"query: "` for e5. Default: the folder's `query` prompt.
    pub query_prefix: Option<String>,
    /// Put before every passage, e.g. `"passage: "` for e5. Default: the folder's `passage` (or
    /// `document`) prompt.
    pub passage_prefix: Option<String>,
    /// Tokens per text, special tokens included. Default: `sentence_bert_config.json`'s
    /// `max_seq_length`, else the model's `max_position_embeddings`.
    pub max_seq_length: Option<usize>,
    /// Texts per forward pass (sorted by length within a call, so padding stays small).
    pub batch_size: Option<usize>,
    pub device: Option<DeviceChoice>,
}

/// The fields of a BERT `config.json` the forward pass depends on.
#[derive(Debug, Clone, Deserialize)]
struct BertConfig {
    model_type: Option<String>,
    vocab_size: i64,
    hidden_size: i64,
    num_hidden_layers: i64,
    num_attention_heads: i64,
    intermediate_size: i64,
    #[serde(default = "default_act")]
    hidden_act: String,
    max_position_embeddings: i64,
    #[serde(default = "default_type_vocab")]
    type_vocab_size: i64,
    #[serde(default = "default_eps")]
    layer_norm_eps: f64,
    #[serde(default = "default_position")]
    position_embedding_type: String,
}

fn default_act() -> String {
    "gelu".into()
}
fn default_type_vocab() -> i64 {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_position() -> String {
    "absolute".into()
}

/// The GELU variants BERT checkpoints name in `hidden_act`.
#[derive(Debug, Clone, Copy)]
enum Activation {
    Gelu,
    GeluTanh,
    Relu,
}

#[derive(Debug, Deserialize)]
struct StModule {
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Debug, Deserialize)]
struct StPooling {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
    #[serde(default = "yes")]
    include_prompt: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
struct StConfig {
    max_seq_length: Option<usize>,
    #[serde(default)]
    do_lower_case: bool,
}

#[derive(Debug, Default, Deserialize)]
struct StTopConfig {
    #[serde(default)]
    prompts: HashMap<String, String>,
}

/// What the folder's sentence-transformers files say.
#[derive(Debug, Default)]
struct FolderSettings {
    pooling: Option<Pooling>,
    normalize: Option<bool>,
    max_seq_length: Option<usize>,
    lower_case: bool,
    query_prompt: Option<String>,
    passage_prompt: Option<String>,
}

struct Layer {
    q: (Tensor, Tensor),
    k: (Tensor, Tensor),
    v: (Tensor, Tensor),
    attn_out: (Tensor, Tensor),
    attn_norm: (Tensor, Tensor),
    ff_in: (Tensor, Tensor),
    ff_out: (Tensor, Tensor),
    ff_norm: (Tensor, Tensor),
}

/// A loaded encoder. Encoding runs under `no_grad`; one encoder may be shared across threads
/// behind a mutex (libtorch parallelises each forward pass itself).
pub struct Encoder {
    tokenizer: Tokenizer,
    word: Tensor,
    position: Tensor,
    token_type: Tensor,
    embed_norm: (Tensor, Tensor),
    layers: Vec<Layer>,
    heads: i64,
    hidden: i64,
    eps: f64,
    act: Activation,
    pooling: Pooling,
    normalize: bool,
    lower_case: bool,
    query_prefix: String,
    passage_prefix: String,
    max_seq_length: usize,
    batch_size: usize,
    device: Device,
    dir: PathBuf,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("dir", &self.dir)
            .field("layers", &self.layers.len())
            .field("dim", &self.hidden)
            .field("pooling", &self.pooling)
            .field("normalize", &self.normalize)
            .field("max_seq_length", &self.max_seq_length)
            .field("device", &self.device)
            .finish()
    }
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| EncoderError::Io { path: path.to_path_buf(), source })
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = read_text(path)?;
    serde_json::from_str(&text).map_err(|e| EncoderError::Config { path: path.to_path_buf(), message: e.to_string() })
}

fn folder_settings(dir: &Path) -> Result<FolderSettings> {
    let mut s = FolderSettings::default();
    let modules_path = dir.join("modules.json");
    if modules_path.exists() {
        let modules: Vec<StModule> = read_json(&modules_path)?;
        s.normalize = Some(false);
        for m in &modules {
            let kind = m.kind.rsplit('.').next().unwrap_or(&m.kind);
            match kind {
                "Transformer" => {}
                "Pooling" => {
                    let path = dir.join(&m.path).join("config.json");
                    let p: StPooling = read_json(&path)?;
                    let modes = [
                        (p.pooling_mode_mean_tokens, "mean"),
                        (p.pooling_mode_cls_token, "cls"),
                        (p.pooling_mode_max_tokens, "max"),
                        (p.pooling_mode_mean_sqrt_len_tokens, "mean_sqrt_len"),
                        (p.pooling_mode_weightedmean_tokens, "weightedmean"),
                        (p.pooling_mode_lasttoken, "lasttoken"),
                    ];
                    let on: Vec<&str> = modes.iter().filter(|(set, _)| *set).map(|(_, n)| *n).collect();
                    s.pooling = Some(match on.as_slice() {
                        ["mean"] => Pooling::Mean,
                        ["cls"] => Pooling::Cls,
                        other => {
                            return Err(EncoderError::Config {
                                path,
                                message: format!("pooling modes {other:?}: only one of `mean` or `cls` is supported"),
                            });
                        }
                    });
                    if !p.include_prompt {
                        return Err(EncoderError::Config {
                            path,
                            message: "include_prompt = false (pooling without the prompt tokens) is not supported"
                                .into(),
                        });
                    }
                }
                "Normalize" => s.normalize = Some(true),
                other => {
                    return Err(EncoderError::Config {
                        path: modules_path,
                        message: format!("module type `{other}` is not supported (Transformer, Pooling, Normalize)"),
                    });
                }
            }
        }
    }
    let st_path = dir.join("sentence_bert_config.json");
    if st_path.exists() {
        let st: StConfig = read_json(&st_path)?;
        s.max_seq_length = st.max_seq_length;
        s.lower_case = st.do_lower_case;
    }
    let top_path = dir.join("config_sentence_transformers.json");
    if top_path.exists() {
        let top: StTopConfig = read_json(&top_path)?;
        s.query_prompt = top.prompts.get("query").cloned();
        s.passage_prompt = top.prompts.get("passage").or_else(|| top.prompts.get("document")).cloned();
    }
    Ok(s)
}

impl Encoder {
    /// Load the model folder `dir`.
    pub fn load(dir: &Path, options: &EncoderOptions) -> Result<Encoder> {
        let config_path = dir.join("config.json");
        let config: BertConfig = read_json(&config_path)?;
        let bad = |message: String| EncoderError::Config { path: config_path.clone(), message };
        match config.model_type.as_deref() {
            Some("bert") | None => {}
            Some(other) => return Err(bad(format!("model_type `{other}`: only BERT encoders are supported"))),
        }
        if config.position_embedding_type != "absolute" {
            return Err(bad(format!(
                "position_embedding_type `{}`: only `absolute` is supported",
                config.position_embedding_type
            )));
        }
        let act = match config.hidden_act.as_str() {
            "gelu" => Activation::Gelu,
            "gelu_new" | "gelu_pytorch_tanh" => Activation::GeluTanh,
            "relu" => Activation::Relu,
            other => return Err(bad(format!("hidden_act `{other}` is not supported"))),
        };
        let positive = [
            ("vocab_size", config.vocab_size),
            ("hidden_size", config.hidden_size),
            ("num_hidden_layers", config.num_hidden_layers),
            ("num_attention_heads", config.num_attention_heads),
            ("intermediate_size", config.intermediate_size),
            ("max_position_embeddings", config.max_position_embeddings),
            ("type_vocab_size", config.type_vocab_size),
        ];
        for (name, value) in positive {
            if value <= 0 || value > 1 << 24 {
                return Err(bad(format!("{name} = {value} is out of range")));
            }
        }
        if config.num_hidden_layers > 256 || config.hidden_size % config.num_attention_heads != 0 {
            return Err(bad("hidden_size must be a multiple of num_attention_heads, and at most 256 layers".into()));
        }

        let folder = folder_settings(dir)?;
        let pooling = options.pooling.or(folder.pooling).ok_or_else(|| {
            EncoderError::Unsupported(format!(
                "{}: no sentence-transformers pooling module; say which pooling to use (mean or cls)",
                dir.display()
            ))
        })?;
        let normalize = options.normalize.or(folder.normalize).unwrap_or(true);
        let max_positions = config.max_position_embeddings as usize;
        let max_seq_length = options.max_seq_length.or(folder.max_seq_length).unwrap_or(max_positions);
        if max_seq_length < 2 || max_seq_length > max_positions {
            return Err(EncoderError::Unsupported(format!(
                "max_seq_length {max_seq_length} must be between 2 and the model's {max_positions} positions"
            )));
        }
        let batch_size = options.batch_size.unwrap_or(32);
        if batch_size == 0 {
            return Err(EncoderError::Unsupported("batch_size must be at least 1".into()));
        }
        let device = match options.device.unwrap_or_default() {
            DeviceChoice::Auto => Device::cuda_if_available(),
            DeviceChoice::Cpu => Device::Cpu,
            DeviceChoice::Cuda if tch::Cuda::is_available() => Device::Cuda(0),
            DeviceChoice::Cuda => return Err(EncoderError::Unsupported("device cuda: no CUDA device".into())),
        };

        let tokenizer_path = dir.join("tokenizer.json");
        if !tokenizer_path.exists() {
            return Err(EncoderError::Io {
                path: tokenizer_path,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no tokenizer.json"),
            });
        }
        let mut tokenizer =
            Tokenizer::from_file(&tokenizer_path).map_err(|e| EncoderError::Tokenizer(format!("{e}")))?;
        // sentence-transformers truncates to max_seq_length and pads only within a batch; some
        // tokenizer.json files pad every text to a fixed length, which would change mean pooling.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams { max_length: max_seq_length, ..Default::default() }))
            .map_err(|e| EncoderError::Tokenizer(format!("{e}")))?;

        let weights_path = dir.join("model.safetensors");
        if !weights_path.exists() {
            return Err(EncoderError::Io {
                path: weights_path,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no model.safetensors"),
            });
        }
        let mut tensors: HashMap<String, Tensor> = Tensor::read_safetensors(&weights_path)?
            .into_iter()
            .map(|(name, t)| (name.strip_prefix("bert.").map(str::to_owned).unwrap_or(name), t))
            .collect();
        let h = config.hidden_size;
        let mut take = |name: String, shape: &[i64]| -> Result<Tensor> {
            let t = tensors.remove(&name).ok_or_else(|| EncoderError::Missing(name.clone()))?;
            if t.size() != shape {
                return Err(EncoderError::Shape { name, found: t.size(), expected: shape.to_vec() });
            }
            Ok(t.f_to_kind(Kind::Float)?.f_to_device(device)?)
        };
        let mut pair = |prefix: &str, out: i64, inp: Option<i64>| -> Result<(Tensor, Tensor)> {
            let w = match inp {
                Some(i) => take(format!("{prefix}.weight"), &[out, i])?,
                None => take(format!("{prefix}.weight"), &[out])?,
            };
            Ok((w, take(format!("{prefix}.bias"), &[out])?))
        };
        let embed_norm = pair("embeddings.LayerNorm", h, None)?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers as usize);
        for i in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            let ff = config.intermediate_size;
            layers.push(Layer {
                q: pair(&format!("{p}.attention.self.query"), h, Some(h))?,
                k: pair(&format!("{p}.attention.self.key"), h, Some(h))?,
                v: pair(&format!("{p}.attention.self.value"), h, Some(h))?,
                attn_out: pair(&format!("{p}.attention.output.dense"), h, Some(h))?,
                attn_norm: pair(&format!("{p}.attention.output.LayerNorm"), h, None)?,
                ff_in: pair(&format!("{p}.intermediate.dense"), ff, Some(h))?,
                ff_out: pair(&format!("{p}.output.dense"), h, Some(ff))?,
                ff_norm: pair(&format!("{p}.output.LayerNorm"), h, None)?,
            });
        }
        let word = take("embeddings.word_embeddings.weight".into(), &[config.vocab_size, h])?;
        let position = take("embeddings.position_embeddings.weight".into(), &[config.max_position_embeddings, h])?;
        let token_type = take("embeddings.token_type_embeddings.weight".into(), &[config.type_vocab_size, h])?;

        Ok(Encoder {
            tokenizer,
            word,
            position,
            token_type,
            embed_norm,
            layers,
            heads: config.num_attention_heads,
            hidden: h,
            eps: config.layer_norm_eps,
            act,
            pooling,
            normalize,
            lower_case: folder.lower_case,
            query_prefix: options.query_prefix.clone().or(folder.query_prompt).unwrap_or_default(),
            passage_prefix: options.passage_prefix.clone().or(folder.passage_prompt).unwrap_or_default(),
            max_seq_length,
            batch_size,
            device,
            dir: dir.to_path_buf(),
        })
    }

    /// Length of the text vectors.
    pub fn dim(&self) -> usize {
        self.hidden as usize
    }

    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    pub fn normalizes(&self) -> bool {
        self.normalize
    }

    pub fn max_seq_length(&self) -> usize {
        self.max_seq_length
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// The prefix put before texts of this kind.
    pub fn prefix(&self, kind: TextKind) -> &str {
        match kind {
            TextKind::Query => &self.query_prefix,
            TextKind::Passage => &self.passage_prefix,
        }
    }

    /// The token ids a text is encoded from (prefix, lower-casing and truncation applied).
    pub fn token_ids(&self, text: &str, kind: TextKind) -> Result<Vec<u32>> {
        let text = self.prepare(text, kind);
        let enc = self.tokenizer.encode(text, true).map_err(|e| EncoderError::Tokenizer(format!("{e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    fn prepare(&self, text: &str, kind: TextKind) -> String {
        let text = format!("{}{text}", self.prefix(kind));
        if self.lower_case { text.to_lowercase() } else { text }
    }

    /// Encode `texts` into one row of [`dim`](Self::dim) floats each, in order, as one flat
    /// vector (row-major).
    pub fn encode(&self, texts: &[&str], kind: TextKind) -> Result<Vec<f32>> {
        let dim = self.dim();
        let mut out = vec![0f32; texts.len() * dim];
        if texts.is_empty() {
            return Ok(out);
        }
        let prepared: Vec<String> = texts.iter().map(|t| self.prepare(t, kind)).collect();
        let encodings = self
            .tokenizer
            .encode_batch(prepared.iter().map(String::as_str).collect::<Vec<_>>(), true)
            .map_err(|e| EncoderError::Tokenizer(format!("{e}")))?;
        // Longest first, so each batch pads to about its own length.
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(encodings[i].get_ids().len()));
        for chunk in order.chunks(self.batch_size) {
            let width = chunk.iter().map(|&i| encodings[i].get_ids().len()).max().unwrap_or(0).max(1);
            let mut ids = vec![0i64; chunk.len() * width];
            let mut types = vec![0i64; chunk.len() * width];
            let mut mask = vec![false; chunk.len() * width];
            for (row, &i) in chunk.iter().enumerate() {
                let e = &encodings[i];
                for (j, (&id, &ty)) in e.get_ids().iter().zip(e.get_type_ids()).enumerate() {
                    ids[row * width + j] = i64::from(id);
                    types[row * width + j] = i64::from(ty);
                    mask[row * width + j] = true;
                }
            }
            let vectors = tch::no_grad(|| self.forward(&ids, &types, &mask, chunk.len() as i64, width as i64))?;
            for (row, &i) in chunk.iter().enumerate() {
                out[i * dim..(i + 1) * dim].copy_from_slice(&vectors[row * dim..(row + 1) * dim]);
            }
        }
        Ok(out)
    }

    fn forward(&self, ids: &[i64], types: &[i64], mask: &[bool], b: i64, l: i64) -> Result<Vec<f32>> {
        let d = self.device;
        let vocab = self.word.size()[0];
        let type_vocab = self.token_type.size()[0];
        if ids.iter().any(|&i| i < 0 || i >= vocab) || types.iter().any(|&t| t < 0 || t >= type_vocab) {
            return Err(EncoderError::Tokenizer("the tokenizer gave a token id outside the model's vocabulary".into()));
        }
        let ids = Tensor::from_slice(ids).f_view([b, l])?.f_to_device(d)?;
        let types = Tensor::from_slice(types).f_view([b, l])?.f_to_device(d)?;
        let mask = Tensor::from_slice(mask).f_view([b, l])?.f_to_device(d)?;
        let positions = Tensor::f_arange(l, (Kind::Int64, d))?;
        let mut x = Tensor::f_embedding(&self.word, &ids, -1, false, false)?
            .f_add(&Tensor::f_embedding(&self.position, &positions, -1, false, false)?.f_unsqueeze(0)?)?
            .f_add(&Tensor::f_embedding(&self.token_type, &types, -1, false, false)?)?;
        x = self.norm(&x, &self.embed_norm)?;
        let h = self.hidden;
        let hd = h / self.heads;
        let attend = mask.f_view([b, 1, 1, l])?;
        for layer in &self.layers {
            let split = |t: Tensor| -> Result<Tensor> { Ok(t.f_view([b, l, self.heads, hd])?.f_transpose(1, 2)?) };
            let q = split(x.f_linear(&layer.q.0, Some(&layer.q.1))?)?;
            let k = split(x.f_linear(&layer.k.0, Some(&layer.k.1))?)?;
            let v = split(x.f_linear(&layer.v.0, Some(&layer.v.1))?)?;
            let ctx = Tensor::f_scaled_dot_product_attention(&q, &k, &v, Some(&attend), 0.0, false, None, false)?
                .f_transpose(1, 2)?
                .f_contiguous()?
                .f_view([b, l, h])?;
            let a = ctx.f_linear(&layer.attn_out.0, Some(&layer.attn_out.1))?;
            x = self.norm(&a.f_add(&x)?, &layer.attn_norm)?;
            let f = x.f_linear(&layer.ff_in.0, Some(&layer.ff_in.1))?;
            let f = match self.act {
                Activation::Gelu => f.f_gelu("none")?,
                Activation::GeluTanh => f.f_gelu("tanh")?,
                Activation::Relu => f.f_relu()?,
            };
            let o = f.f_linear(&layer.ff_out.0, Some(&layer.ff_out.1))?;
            x = self.norm(&o.f_add(&x)?, &layer.ff_norm)?;
        }
        let mut pooled = match self.pooling {
            Pooling::Cls => x.f_select(1, 0)?,
            Pooling::Mean => {
                let m = mask.f_to_kind(Kind::Float)?.f_unsqueeze(-1)?;
                let sum = x.f_mul(&m)?.f_sum_dim_intlist(1, false, Kind::Float)?;
                let count = m.f_sum_dim_intlist(1, false, Kind::Float)?.f_clamp_min(1e-9)?;
                sum.f_div(&count)?
            }
        };
        if self.normalize {
            let norm = pooled.f_norm_scalaropt_dim(2, [1i64], true)?.f_clamp_min(1e-12)?;
            pooled = pooled.f_div(&norm)?;
        }
        let flat = pooled.f_to_kind(Kind::Float)?.f_to_device(Device::Cpu)?.f_contiguous()?.f_view([-1])?;
        Ok(Vec::<f32>::try_from(&flat)?)
    }

    fn norm(&self, x: &Tensor, (w, b): &(Tensor, Tensor)) -> Result<Tensor> {
        Ok(x.f_layer_norm([self.hidden], Some(w), Some(b), self.eps, false)?)
    }
}
