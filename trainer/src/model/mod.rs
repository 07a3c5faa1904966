//! One decoder-only transformer covering Qwen2 / Qwen2.5 (q/k/v biases), Llama 3.x (RoPE
//! scaling) and SmolLM2: RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU. Pure tensor
//! code: the only I/O is loading and saving weights (`weights.rs`).
//!
//! Shapes: `input_ids` and `position_ids` are `[batch, new]`; `attention_mask` is
//! `[batch, past + new]` with 1 for real tokens (left padding is expressed by zeros and position
//! ids); logits come back as `[batch, new, vocab]` in f32.

mod config;
mod weights;

use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

pub use config::{ConfigError, Family, Llama3Scaling, ModelConfig};
pub use weights::{WeightsError, load_model, save_model};

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
        let no_bias = nn::LinearConfig { bias: false, ..Default::default() };
        Self {
            gate: nn::linear(vs / "gate_proj", cfg.hidden_size, cfg.intermediate_size, no_bias),
            up: nn::linear(vs / "up_proj", cfg.hidden_size, cfg.intermediate_size, no_bias),
            down: nn::linear(vs / "down_proj", cfg.intermediate_size, cfg.hidden_size, no_bias),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        self.down.forward(&(self.gate.forward(x).silu() * self.up.forward(x)))
    }
}

/// Keys and values of earlier positions, per layer: `[batch, kv_heads, past, head_dim]`.
#[derive(Debug, Default)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
}

impl KvCache {
    pub fn new(layers: usize) -> Self {
        Self { layers: (0..layers).map(|_| None).collect() }
    }

    /// Positions held.
    pub fn len(&self) -> i64 {
        self.layers.first().and_then(|l| l.as_ref()).map_or(0, |(k, _)| k.size()[2])
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows `rows` of the cache (e.g. `[0, 0, 0]` forks row 0 three times). Tensors are copied
    /// on index_select; the originals are untouched.
    pub fn select_rows(&self, rows: &Tensor) -> KvCache {
        KvCache {
            layers: self
                .layers
                .iter()
                .map(|l| l.as_ref().map(|(k, v)| (k.index_select(0, rows), v.index_select(0, rows))))
                .collect(),
        }
    }

    /// Concatenate caches of equal length along the batch dimension.
    pub fn cat(caches: &[&KvCache]) -> Option<KvCache> {
        let first = caches.first()?;
        let layers = (0..first.layers.len())
            .map(|i| {
                let ks: Option<Vec<&Tensor>> = caches.iter().map(|c| c.layers[i].as_ref().map(|(k, _)| k)).collect();
                let vs: Option<Vec<&Tensor>> = caches.iter().map(|c| c.layers[i].as_ref().map(|(_, v)| v)).collect();
                Some((Tensor::cat(&ks?, 0), Tensor::cat(&vs?, 0)))
            })
            .collect();
        Some(KvCache { layers })
    }

    /// Prepend zero positions so the cache holds `to` positions (for left-padded batches).
    pub fn left_pad(&self, to: i64) -> KvCache {
        let pad = |t: &Tensor| {
            let mut size = t.size();
            let missing = to - size[2];
            if missing <= 0 {
                return t.shallow_clone();
            }
            size[2] = missing;
            Tensor::cat(&[&Tensor::zeros(size, (t.kind(), t.device())), t], 2)
        };
        KvCache { layers: self.layers.iter().map(|l| l.as_ref().map(|(k, v)| (pad(k), pad(v)))).collect() }
    }

    /// Positions `start..start + len`, copied (so the larger tensor they came from can be freed).
    pub fn narrow_positions(&self, start: i64, len: i64) -> KvCache {
        let cut = |t: &Tensor| t.narrow(2, start, len).contiguous();
        KvCache { layers: self.layers.iter().map(|l| l.as_ref().map(|(k, v)| (cut(k), cut(v)))).collect() }
    }

    /// A shallow handle to the same tensors (no copy): what a forked sequence starts from.
    pub fn share(&self) -> KvCache {
        KvCache {
            layers: self
                .layers
                .iter()
                .map(|l| l.as_ref().map(|(k, v)| (k.shallow_clone(), v.shallow_clone())))
                .collect(),
        }
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
        let qkv = nn::LinearConfig { bias: cfg.attention_bias, ..Default::default() };
        let no_bias = nn::LinearConfig { bias: false, ..Default::default() };
        let (h, kvh, d) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
        Self {
            q: nn::linear(vs / "q_proj", cfg.hidden_size, h * d, qkv),
            k: nn::linear(vs / "k_proj", cfg.hidden_size, kvh * d, qkv),
            v: nn::linear(vs / "v_proj", cfg.hidden_size, kvh * d, qkv),
            o: nn::linear(vs / "o_proj", h * d, cfg.hidden_size, no_bias),
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
        cache: Option<&mut Option<(Tensor, Tensor)>>,
    ) -> Tensor {
        let (b, t) = (x.size()[0], x.size()[1]);
        let q = self.q.forward(x).view([b, t, self.heads, self.head_dim]).transpose(1, 2);
        let k = self.k.forward(x).view([b, t, self.kv_heads, self.head_dim]).transpose(1, 2);
        let v = self.v.forward(x).view([b, t, self.kv_heads, self.head_dim]).transpose(1, 2);
        let q = apply_rope(&q, cos, sin);
        let mut k = apply_rope(&k, cos, sin);
        let mut v = v;
        if let Some(slot) = cache {
            if let Some((pk, pv)) = slot.as_ref() {
                k = Tensor::cat(&[pk, &k], 2);
                v = Tensor::cat(&[pv, &v], 2);
            }
            *slot = Some((k.shallow_clone(), v.shallow_clone()));
        }
        // Grouped-query attention: each KV head serves `groups` consecutive query heads.
        let groups = self.heads / self.kv_heads;
        let (k, v) = if groups > 1 {
            (k.repeat_interleave_self_int(groups, 1, None), v.repeat_interleave_self_int(groups, 1, None))
        } else {
            (k, v)
        };
        // libtorch's fused attention: no [batch, heads, new, total] scores are kept for backward
        // when the mask is plain causal, which is what makes training fit and run fast.
        let out = match mask {
            AttnMask::Causal => {
                Tensor::scaled_dot_product_attention::<Tensor>(&q, &k, &v, None, 0.0, true, None, false)
            }
            AttnMask::Additive(m) => Tensor::scaled_dot_product_attention(&q, &k, &v, Some(m), 0.0, false, None, false),
        };
        let out = out.transpose(1, 2).contiguous().view([b, t, self.heads * self.head_dim]);
        self.o.forward(&out)
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
    /// Plain causal attention (fused kernel).
    Causal,
    /// Additive `[batch, 1, new, past + new]` mask.
    Additive(Tensor),
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
    pub fn new(vs: &nn::Path<'_>, config: ModelConfig) -> Self {
        let m = vs / "model";
        let embed = nn::embedding(&m / "embed_tokens", config.vocab_size, config.hidden_size, Default::default());
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
        let lm_head = (!config.tie_word_embeddings).then(|| {
            nn::linear(
                vs / "lm_head",
                config.hidden_size,
                config.vocab_size,
                nn::LinearConfig { bias: false, ..Default::default() },
            )
        });
        let inv: Vec<f32> = config.inv_freq().into_iter().map(|f| f as f32).collect();
        let inv_freq = Tensor::from_slice(&inv).to_device(vs.device());
        Self { config, embed, layers, norm, lm_head, inv_freq, device: vs.device() }
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
        let c = &self.config;
        let kind = self.embed.ws.kind();
        let z = || Tensor::zeros([1, c.num_key_value_heads, len, c.head_dim], (kind, self.device));
        KvCache { layers: self.layers.iter().map(|_| Some((z(), z()))).collect() }
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
            x = self.layer_forward(i, &x, &pass, slot);
        }
        self.final_norm(&x)
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
    pub fn layer_forward(
        &self,
        i: usize,
        x: &Tensor,
        pass: &Pass,
        cache: Option<&mut Option<(Tensor, Tensor)>>,
    ) -> Tensor {
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
