//! One decoder-only transformer covering Qwen2 / Qwen2.5 (q/k/v biases), Llama 3.x (RoPE
//! scaling) and SmolLM2: RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU. Pure tensor
//! code: the only I/O is loading and saving weights (`weights.rs`).
//!
//! Shapes: `input_ids` and `position_ids` are `[batch, new]`; `attention_mask` is
//! `[batch, past + new]` with 1 for real tokens (left padding is expressed by zeros and position
//! ids); logits come back as `[batch, new, vocab]` in f32.

mod cache;
mod config;
mod init;
mod weights;

pub use cache::KvCache;
use cache::LayerKv;
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

pub use config::{ConfigError, Family, Llama3Scaling, ModelConfig};
pub use init::init_normal;
pub use weights::{WeightsError, load_model, save_model};

/// A linear layer whose parameters start at zero: building a model draws nothing from
/// libtorch's global RNG (loading overwrites every parameter; [`init_normal`] gives a fresh one).
fn linear(vs: nn::Path<'_>, inputs: i64, outputs: i64, bias: bool) -> nn::Linear {
    let zero = nn::Init::Const(0.0);
    nn::linear(vs, inputs, outputs, nn::LinearConfig { ws_init: zero, bs_init: Some(zero), bias })
}

#[derive(Debug)]
struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn new(vs: &nn::Path<'_>, size: i64, eps: f64) -> Self {
        Self { weight: vs.ones("weight", &[size]), eps }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let kind = x.kind();
        let x32 = x.to_kind(Kind::Float);
        let var = x32.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
        let normed = (x32 * (var + self.eps).rsqrt()).to_kind(kind);
        &self.weight * normed
    }
}

#[derive(Debug)]
struct Mlp {
    gate: nn::Linear,
    up: nn::Linear,
    down: nn::Linear,
}

impl Mlp {
    fn new(vs: &nn::Path<'_>, cfg: &ModelConfig) -> Self {
        Self {
            gate: linear(vs / "gate_proj", cfg.hidden_size, cfg.intermediate_size, false),
            up: linear(vs / "up_proj", cfg.hidden_size, cfg.intermediate_size, false),
            down: linear(vs / "down_proj", cfg.intermediate_size, cfg.hidden_size, false),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        self.down.forward(&(self.gate.forward(x).silu() * self.up.forward(x)))
    }
}

#[derive(Debug)]
struct Attention {
    q: nn::Linear,
    k: nn::Linear,
    v: nn::Linear,
    o: nn::Linear,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
}

impl Attention {
    fn new(vs: &nn::Path<'_>, cfg: &ModelConfig) -> Self {
        let qkv = cfg.attention_bias;
        let (h, kvh, d) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
        Self {
            q: linear(vs / "q_proj", cfg.hidden_size, h * d, qkv),
            k: linear(vs / "k_proj", cfg.hidden_size, kvh * d, qkv),
            v: linear(vs / "v_proj", cfg.hidden_size, kvh * d, qkv),
            o: linear(vs / "o_proj", h * d, cfg.hidden_size, false),
            heads: h,
            kv_heads: kvh,
            head_dim: d,
        }
    }

    /// `mask`: an additive `[batch, 1, new, past + new]` tensor, or plain causal attention.
    fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &AttnMask,
        cache: Option<&mut Option<LayerKv>>,
    ) -> Tensor {
        let (b, t) = (x.size()[0], x.size()[1]);
        let q = self.q.forward(x).view([b, t, self.heads, self.head_dim]).transpose(1, 2);
        let k = self.k.forward(x).view([b, t, self.kv_heads, self.head_dim]).transpose(1, 2);
        let v = self.v.forward(x).view([b, t, self.kv_heads, self.head_dim]).transpose(1, 2);
        let q = apply_rope(&q, cos, sin);
        let k = apply_rope(&k, cos, sin);
        let (k, v) = match cache {
            Some(slot) => match slot {
                Some(l) => l.append(&k, &v),
                None => {
                    let l = LayerKv::of(k, v);
                    let out = l.valid();
                    *slot = Some(l);
                    out
                }
            },
            None => (k, v),
        };
        // Grouped-query attention without copying keys and values: each KV head serves `groups`
        // consecutive query heads (SDPA's `enable_gqa`). libtorch's fused attention keeps no
        // [batch, heads, new, total] scores for backward when the mask is plain causal, which is
        // what makes training fit and run fast.
        let gqa = self.heads != self.kv_heads;
        let out = match mask {
            AttnMask::Causal => Tensor::scaled_dot_product_attention::<Tensor>(&q, &k, &v, None, 0.0, true, None, gqa),
            AttnMask::None => Tensor::scaled_dot_product_attention::<Tensor>(&q, &k, &v, None, 0.0, false, None, gqa),
            AttnMask::Additive(m) => Tensor::scaled_dot_product_attention(&q, &k, &v, Some(m), 0.0, false, None, gqa),
        };
        let out = out.transpose(1, 2).contiguous().view([b, t, self.heads * self.head_dim]);
        self.o.forward(&out)
    }
}

/// The attention kernel libtorch's `scaled_dot_product_attention` dispatches to (its
/// `SDPBackend`), as `_fused_sdp_choice` reports it for given shapes, dtype, device and mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SdpaKernel {
    Math,
    Flash,
    MemoryEfficient,
    Cudnn,
    Overrideable,
    /// A value this build does not know (a newer libtorch), or the query failed.
    Other(i64),
}

impl SdpaKernel {
    fn of(code: i64) -> Self {
        match code {
            0 => SdpaKernel::Math,
            1 => SdpaKernel::Flash,
            2 => SdpaKernel::MemoryEfficient,
            3 => SdpaKernel::Cudnn,
            4 => SdpaKernel::Overrideable,
            other => SdpaKernel::Other(other),
        }
    }

    pub fn name(&self) -> String {
        match self {
            SdpaKernel::Math => "math (unfused)".into(),
            SdpaKernel::Flash => "flash".into(),
            SdpaKernel::MemoryEfficient => "memory-efficient".into(),
            SdpaKernel::Cudnn => "cuDNN".into(),
            SdpaKernel::Overrideable => "overrideable".into(),
            SdpaKernel::Other(c) => format!("unknown ({c})"),
        }
    }
}

/// What every layer of one forward pass shares: RoPE tables and the attention mask.
#[derive(Debug)]
pub struct Pass {
    cos: Tensor,
    sin: Tensor,
    mask: AttnMask,
}

/// How a forward pass masks attention.
#[derive(Debug)]
enum AttnMask {
    /// Plain causal attention without past positions (fused kernel).
    Causal,
    /// Every query sees every key (one new position after an unpadded past).
    None,
    /// Additive `[batch, 1, new, past + new]` mask.
    Additive(Tensor),
}

/// What the caller knows about a pass's padding, so that the mask needs no look at the data.
#[derive(Debug, Clone, Copy)]
pub enum Masking<'a> {
    /// No padding before any real token (right padding, if any, is harmless under causal
    /// attention) and no cache: plain causal attention.
    Causal,
    /// No padding at all; the new positions follow a cache of past positions.
    CausalAfterPast,
    /// `[batch, past + new]` attention mask, 1 on real positions.
    Padding(&'a Tensor),
}

fn rotate_half(x: &Tensor) -> Tensor {
    let half = x.size()[x.dim() - 1] / 2;
    let x1 = x.narrow(-1, 0, half);
    let x2 = x.narrow(-1, half, half);
    Tensor::cat(&[&(-x2), &x1], -1)
}

/// `x`: `[batch, heads, new, head_dim]`; `cos`, `sin`: `[batch, 1, new, head_dim]`.
fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    x * cos + rotate_half(x) * sin
}

#[derive(Debug)]
struct DecoderLayer {
    input_norm: RmsNorm,
    attn: Attention,
    post_norm: RmsNorm,
    mlp: Mlp,
}

/// A causal LM: embeddings, decoder layers, final norm, LM head (tied or not).
#[derive(Debug)]
pub struct CausalLm {
    pub config: ModelConfig,
    embed: nn::Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Option<nn::Linear>,
    inv_freq: Tensor,
    device: Device,
}

impl CausalLm {
    /// Build the module tree under `vs` with HF parameter names (`model.layers.0.self_attn...`).
    /// Matrices and biases start at zero and norms at one; nothing is drawn from libtorch's
    /// global RNG, so building is deterministic and safe beside other threads. Load weights
    /// ([`load_model`]) or call [`init_normal`] before use.
    pub fn new(vs: &nn::Path<'_>, config: ModelConfig) -> Self {
        let m = vs / "model";
        let embed_init = nn::EmbeddingConfig { ws_init: nn::Init::Const(0.0), ..Default::default() };
        let embed = nn::embedding(&m / "embed_tokens", config.vocab_size, config.hidden_size, embed_init);
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let l = &m / "layers" / i;
                DecoderLayer {
                    input_norm: RmsNorm::new(&(&l / "input_layernorm"), config.hidden_size, config.rms_norm_eps),
                    attn: Attention::new(&(&l / "self_attn"), &config),
                    post_norm: RmsNorm::new(
                        &(&l / "post_attention_layernorm"),
                        config.hidden_size,
                        config.rms_norm_eps,
                    ),
                    mlp: Mlp::new(&(&l / "mlp"), &config),
                }
            })
            .collect();
        let norm = RmsNorm::new(&(&m / "norm"), config.hidden_size, config.rms_norm_eps);
        let lm_head =
            (!config.tie_word_embeddings).then(|| linear(vs / "lm_head", config.hidden_size, config.vocab_size, false));
        let inv: Vec<f32> = config.inv_freq().into_iter().map(|f| f as f32).collect();
        let inv_freq = Tensor::from_slice(&inv).to_device(vs.device());
        Self { config, embed, layers, norm, lm_head, inv_freq, device: vs.device() }
    }

    /// The parameters' dtype.
    pub fn kind(&self) -> Kind {
        self.embed.ws.kind()
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.layers.len())
    }

    /// A cache of `len` zero positions for one row (a sequence with nothing encoded yet, padded
    /// into a batch; its positions are masked out).
    pub fn zero_cache(&self, len: i64) -> KvCache {
        let mut cache = self.cache_with_capacity(1, len);
        cache.set_len(len);
        cache
    }

    /// RoPE tables for `position_ids` `[batch, new]`: `[batch, 1, new, head_dim]` each, in `kind`.
    fn rope(&self, position_ids: &Tensor, kind: Kind) -> (Tensor, Tensor) {
        let pos = position_ids.to_kind(Kind::Float).unsqueeze(-1);
        let freqs = pos * self.inv_freq.view([1, 1, -1]);
        let emb = Tensor::cat(&[&freqs, &freqs], -1).unsqueeze(1);
        (emb.cos().to_kind(kind), emb.sin().to_kind(kind))
    }

    /// The attention mask of a forward pass. Without a cache and with padding (if any) only at
    /// the right end of each row, plain causal attention gives every real token exactly what the
    /// full mask would (padding comes after it), so the fused causal kernel is used; otherwise
    /// the causal-plus-padding additive mask.
    fn mask(&self, attention_mask: &Tensor, new: i64, kind: Kind) -> AttnMask {
        let total = attention_mask.size()[1];
        let past = total - new;
        let right_padded = total < 2
            || attention_mask
                .narrow(1, 1, total - 1)
                .le_tensor(&attention_mask.narrow(1, 0, total - 1))
                .all()
                .int64_value(&[])
                == 1;
        if past == 0 && right_padded {
            return AttnMask::Causal;
        }
        AttnMask::Additive(self.additive_mask(attention_mask, new, kind))
    }

    /// Causal plus padding mask as an additive `[batch, 1, new, past + new]` tensor: 0 where a
    /// query may attend, the dtype's lowest value elsewhere (finite, as HF's eager attention,
    /// so fully masked padding rows stay finite).
    fn additive_mask(&self, attention_mask: &Tensor, new: i64, kind: Kind) -> Tensor {
        let total = attention_mask.size()[1];
        let past = total - new;
        let q = Tensor::arange_start(past, total, (Kind::Int64, self.device)).view([1, 1, new, 1]);
        let k = Tensor::arange(total, (Kind::Int64, self.device)).view([1, 1, 1, total]);
        let causal = k.le_tensor(&q);
        let keep = causal.logical_and(&attention_mask.to_kind(Kind::Bool).view([-1, 1, 1, total]));
        let low = match kind {
            Kind::BFloat16 => -3.389_531_389_251_535_5e38,
            Kind::Half => -65504.0,
            Kind::Double => f64::MIN,
            _ => f32::MIN as f64,
        };
        Tensor::zeros(keep.size(), (kind, self.device)).masked_fill(&keep.logical_not(), low)
    }

    /// Hidden states after the final norm, `[batch, new, hidden]`.
    pub fn hidden(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        attention_mask: &Tensor,
        mut cache: Option<&mut KvCache>,
    ) -> Tensor {
        let (mut x, pass) = self.begin(input_ids, position_ids, attention_mask);
        for i in 0..self.layers.len() {
            let slot = cache.as_deref_mut().map(|c| &mut c.layers[i]);
            x = self.layer_forward_cached(i, &x, &pass, slot);
        }
        self.final_norm(&x)
    }

    /// [`CausalLm::hidden`] with the masking stated by the caller (no look at the mask's data).
    pub fn hidden_with(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        masking: Masking<'_>,
        mut cache: Option<&mut KvCache>,
    ) -> Tensor {
        let past = cache.as_deref().map_or(0, KvCache::len);
        let (mut x, pass) = self.begin_with(input_ids, position_ids, masking, past);
        for i in 0..self.layers.len() {
            let slot = cache.as_deref_mut().map(|c| &mut c.layers[i]);
            x = self.layer_forward_cached(i, &x, &pass, slot);
        }
        self.final_norm(&x)
    }

    /// Logits of the last new position only, `[batch, vocab]`, with the masking stated.
    pub fn forward_last_with(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        masking: Masking<'_>,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        let h = self.hidden_with(input_ids, position_ids, masking, cache);
        let t = h.size()[1];
        self.logits(&h.narrow(1, t - 1, 1).squeeze_dim(1))
    }

    /// Like [`CausalLm::begin`], with the masking stated and `past` cached positions before
    /// the new ones.
    pub fn begin_with(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        masking: Masking<'_>,
        past: i64,
    ) -> (Tensor, Pass) {
        let new = input_ids.size()[1];
        let x = self.embed.forward(input_ids);
        let kind = x.kind();
        let (cos, sin) = self.rope(position_ids, kind);
        let mask = match masking {
            Masking::Causal if past == 0 => AttnMask::Causal,
            Masking::Causal | Masking::CausalAfterPast if new == 1 => AttnMask::None,
            Masking::Causal | Masking::CausalAfterPast => {
                let all = Tensor::ones([input_ids.size()[0], past + new], (Kind::Int64, self.device));
                AttnMask::Additive(self.additive_mask(&all, new, kind))
            }
            Masking::Padding(m) => AttnMask::Additive(self.additive_mask(m, new, kind)),
        };
        (x, Pass { cos, sin, mask })
    }

    /// The kernel libtorch picks for one layer's attention of a pass of `batch` rows x `new`
    /// positions after `past` cached ones, masked as that pass would be: `padded` means a
    /// padding mask (an additive mask, as any multi-row call with rows of unequal length);
    /// otherwise plain causal without a past, no mask for one new position, or the causal
    /// additive mask. Asked of libtorch with tensors of the model's dtype on its device.
    pub fn sdpa_kernel(&self, batch: i64, new: i64, past: i64, padded: bool) -> SdpaKernel {
        let c = &self.config;
        let opts = (self.kind(), self.device);
        let total = past + new;
        let q = Tensor::zeros([batch, c.num_attention_heads, new, c.head_dim], opts);
        let kv = Tensor::zeros([batch, c.num_key_value_heads, total, c.head_dim], opts);
        let gqa = c.num_attention_heads != c.num_key_value_heads;
        let additive = || Tensor::zeros([batch, 1, new, total], opts);
        let choice = if padded || (past > 0 && new > 1) {
            Tensor::f_internal_fused_sdp_choice(&q, &kv, &kv, Some(additive()), 0.0, false, None, gqa)
        } else {
            Tensor::f_internal_fused_sdp_choice::<Tensor>(&q, &kv, &kv, None, 0.0, past == 0, None, gqa)
        };
        choice.map_or(SdpaKernel::Other(-1), SdpaKernel::of)
    }

    /// Decoder layer `i` on `x` (no cache).
    pub fn layer_forward(&self, i: usize, x: &Tensor, pass: &Pass) -> Tensor {
        self.layer_forward_cached(i, x, pass, None)
    }

    /// An empty cache with room for `capacity` positions of `batch` rows (zeros), for
    /// [`KvCache::write_row`] and in-place decoding.
    pub fn cache_with_capacity(&self, batch: i64, capacity: i64) -> KvCache {
        let c = &self.config;
        let kind = self.embed.ws.kind();
        let z = || Tensor::zeros([batch, c.num_key_value_heads, capacity, c.head_dim], (kind, self.device));
        KvCache { layers: self.layers.iter().map(|_| Some(LayerKv { k: z(), v: z(), len: 0 })).collect() }
    }

    /// The embeddings of a pass and what every layer of it shares (RoPE tables, mask); with
    /// [`CausalLm::layer_forward`] and [`CausalLm::final_norm`], the pieces of
    /// [`CausalLm::hidden`], for running layers one at a time (activation checkpointing).
    pub fn begin(&self, input_ids: &Tensor, position_ids: &Tensor, attention_mask: &Tensor) -> (Tensor, Pass) {
        let new = input_ids.size()[1];
        let x = self.embed.forward(input_ids);
        let kind = x.kind();
        let (cos, sin) = self.rope(position_ids, kind);
        let mask = self.mask(attention_mask, new, kind);
        (x, Pass { cos, sin, mask })
    }

    /// Decoder layer `i` on `x`.
    fn layer_forward_cached(&self, i: usize, x: &Tensor, pass: &Pass, cache: Option<&mut Option<LayerKv>>) -> Tensor {
        let layer = &self.layers[i];
        let h = layer.attn.forward(&layer.input_norm.forward(x), &pass.cos, &pass.sin, &pass.mask, cache);
        // Not `+=`: tch's `+=` is in place and would break autograd.
        let after_attn = x + h;
        &after_attn + layer.mlp.forward(&layer.post_norm.forward(&after_attn))
    }

    /// The final RMSNorm.
    pub fn final_norm(&self, x: &Tensor) -> Tensor {
        self.norm.forward(x)
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// The token embeddings alone (the first step of [`CausalLm::begin`]).
    pub fn embed(&self, input_ids: &Tensor) -> Tensor {
        self.embed.forward(input_ids)
    }

    /// Project hidden states to vocabulary logits (f32).
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        let out = match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => hidden.matmul(&self.embed.ws.tr()),
        };
        out.to_kind(Kind::Float)
    }

    /// The vocabulary projection's weight `[vocab, hidden]`: the LM head's, or the embedding
    /// when they are tied (no bias in either architecture).
    pub fn head_weight(&self) -> &Tensor {
        match &self.lm_head {
            Some(head) => &head.ws,
            None => &self.embed.ws,
        }
    }

    /// Logits for every new position.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        attention_mask: &Tensor,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        self.logits(&self.hidden(input_ids, position_ids, attention_mask, cache))
    }

    /// Logits of the last new position only, `[batch, vocab]` (generation).
    pub fn forward_last(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        attention_mask: &Tensor,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        let h = self.hidden(input_ids, position_ids, attention_mask, cache);
        let t = h.size()[1];
        self.logits(&h.narrow(1, t - 1, 1).squeeze_dim(1))
    }
}

/// Log-probabilities of each next token and the entropy of each predictive distribution, for
/// training. `logits` `[batch, t, vocab]` predict `targets` `[batch, t]` (already shifted).
pub fn token_logprobs_and_entropy(logits: &Tensor, targets: &Tensor) -> (Tensor, Tensor) {
    let logp = logits.log_softmax(-1, Kind::Float);
    let picked = logp.gather(-1, &targets.unsqueeze(-1), false).squeeze_dim(-1);
    let entropy = -(logp.exp() * &logp).sum_dim_intlist(-1, false, Kind::Float);
    (picked, entropy)
}
