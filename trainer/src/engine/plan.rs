//! `trainer plan`: the device memory one training step needs, per component, from a model's shape
//! and the run's shapes (the paper's by default: 512 prompts, 6 leaves each, 4,096-token rows),
//! and whether it fits a card. Arithmetic only: nothing is allocated, so it answers for a 7B model
//! on a laptop. The figures are estimates of what Grove's engine holds (weights, the frozen
//! reference, the optimiser's state as `optim.rs` keeps it, the decode batch's KV cache during
//! rollouts, and one micro-batch's activations and logits chunk during the update); allocator
//! slack, CUDA context and fragmentation come on top, which is why a fit asks for headroom.

use crate::engine::model::ModelConfig;
use crate::engine::optim::OptimState;

/// Qwen2.5 shapes from their model cards' `config.json` (hidden, layers, heads, kv heads,
/// intermediate, vocabulary, tied embeddings), for planning without the weights at hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    #[value(name = "qwen2.5-0.5b")]
    Qwen25_0_5b,
    #[value(name = "qwen2.5-1.5b")]
    Qwen25_1_5b,
    #[value(name = "qwen2.5-3b")]
    Qwen25_3b,
    #[value(name = "qwen2.5-7b")]
    Qwen25_7b,
}

impl Shape {
    pub fn config(self) -> ModelConfig {
        let (h, layers, heads, kv, inter, vocab, tied) = match self {
            Shape::Qwen25_0_5b => (896, 24, 14, 2, 4864, 151_936, true),
            Shape::Qwen25_1_5b => (1536, 28, 12, 2, 8960, 151_936, true),
            Shape::Qwen25_3b => (2048, 36, 16, 2, 11_008, 151_936, true),
            Shape::Qwen25_7b => (3584, 28, 28, 4, 18_944, 152_064, false),
        };
        let json = format!(
            r#"{{"model_type": "qwen2", "vocab_size": {vocab}, "hidden_size": {h}, "intermediate_size": {inter},
            "num_hidden_layers": {layers}, "num_attention_heads": {heads}, "num_key_value_heads": {kv},
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": {tied}}}"#
        );
        ModelConfig::from_json(&json).expect("the built-in shapes are valid configs")
    }
}

/// What a step is made of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shapes {
    /// Bytes per weight: 2 (bf16, CUDA) or 4 (f32).
    pub weight_bytes: f64,
    /// Rows decoded at once during rollouts (each with a KV cache up to `context` tokens).
    pub gen_rows: usize,
    /// Tokens per row (prompt, responses and observations).
    pub context: usize,
    /// Rows per training micro-batch.
    pub micro_batch: usize,
    /// Scored positions projected to the vocabulary at once (`TrainPass::chunk`); 0: the full
    /// logits of the micro-batch at once.
    pub logits_chunk: usize,
    /// Keep only each layer's input and recompute the layer in backward.
    pub checkpoint: bool,
    /// A frozen reference model for the KL term (`kl_coef > 0`).
    pub reference: bool,
    pub optim_state: OptimState,
}

/// When a component is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// For the whole run.
    Resident,
    /// While rollouts decode.
    Rollout,
    /// While a micro-batch trains.
    Training,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Component {
    pub name: &'static str,
    pub phase: Phase,
    pub bytes: f64,
    pub note: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub params: u64,
    pub components: Vec<Component>,
}

impl Plan {
    fn sum(&self, phase: Phase) -> f64 {
        self.components.iter().filter(|c| c.phase == phase).map(|c| c.bytes).sum()
    }

    /// The larger of the two phases, each on top of what is resident.
    pub fn peak_bytes(&self) -> f64 {
        self.sum(Phase::Resident) + self.sum(Phase::Rollout).max(self.sum(Phase::Training))
    }

    /// Whether the peak fits `card_bytes` with `headroom` (a fraction of the card) left over.
    pub fn fits(&self, card_bytes: f64, headroom: f64) -> bool {
        self.peak_bytes() <= card_bytes * (1.0 - headroom)
    }

    /// The plan as a table with the verdict for a card of `card_gib`.
    pub fn render(&self, card_gib: f64, headroom: f64) -> String {
        let gib = |b: f64| b / (1u64 << 30) as f64;
        let mut out = format!("{:<34} {:>9} {:>10}  note\n", "component", "phase", "GiB");
        for c in &self.components {
            let phase = match c.phase {
                Phase::Resident => "resident",
                Phase::Rollout => "rollout",
                Phase::Training => "training",
            };
            out += &format!("{:<34} {:>9} {:>10.2}  {}\n", c.name, phase, gib(c.bytes), c.note);
        }
        let (resident, rollout, training) =
            (self.sum(Phase::Resident), self.sum(Phase::Rollout), self.sum(Phase::Training));
        out += &format!(
            "{} parameters; resident {:.2} GiB; rollout peak {:.2} GiB; training peak {:.2} GiB\n",
            self.params,
            gib(resident),
            gib(resident + rollout),
            gib(resident + training)
        );
        let verdict = if self.fits(card_gib * (1u64 << 30) as f64, headroom) { "fits" } else { "does not fit" };
        out += &format!(
            "peak {:.2} GiB: {verdict} a {card_gib} GiB card with {:.0}% of it kept free\n",
            gib(self.peak_bytes()),
            headroom * 100.0
        );
        out
    }
}

/// Parameters of a decoder of `cfg`'s shape (the embedding, and the head unless tied).
pub fn param_count(cfg: &ModelConfig) -> u64 {
    let (h, i, v) = (cfg.hidden_size as u64, cfg.intermediate_size as u64, cfg.vocab_size as u64);
    let (q, kv) = ((cfg.num_attention_heads * cfg.head_dim) as u64, (cfg.num_key_value_heads * cfg.head_dim) as u64);
    let bias = if cfg.attention_bias { q + 2 * kv } else { 0 };
    let layer = h * q + 2 * h * kv + q * h + bias + 3 * h * i + 2 * h;
    let head = if cfg.tie_word_embeddings { 0 } else { v * h };
    v * h + cfg.num_hidden_layers as u64 * layer + h + head
}

/// The memory plan of one step of `cfg` at `s`.
pub fn plan(cfg: &ModelConfig, s: &Shapes) -> Plan {
    let p = param_count(cfg);
    let pf = p as f64;
    let wb = s.weight_bytes;
    let low = wb < 4.0;
    let mut c = Vec::new();
    let mut add = |name, phase, bytes: f64, note: String| c.push(Component { name, phase, bytes, note });
    add("policy weights", Phase::Resident, pf * wb, format!("{wb} B/param"));
    if s.reference {
        add("reference weights (KL)", Phase::Resident, pf * wb, "frozen copy; none at kl_coef = 0".into());
    }
    add("gradients", Phase::Resident, pf * wb, "the parameters' kind".into());
    if low {
        add("f32 gradient accumulator", Phase::Resident, pf * 4.0, "micro-batches summed in f32".into());
    }
    if low && s.optim_state == OptimState::F32Master {
        add("f32 master weights", Phase::Resident, pf * 4.0, "optim_state f32-master".into());
    }
    let moment = if s.optim_state == OptimState::Compact { 2.0 } else { 4.0 };
    add("AdamW moments", Phase::Resident, pf * 2.0 * moment, format!("{moment} B each, m and v"));

    let (h, i, v) = (cfg.hidden_size as f64, cfg.intermediate_size as f64, cfg.vocab_size as f64);
    let (heads, kv) = (cfg.num_attention_heads as f64, cfg.num_key_value_heads as f64);
    let (hd, layers) = (cfg.head_dim as f64, cfg.num_hidden_layers as f64);
    let kv_token = layers * 2.0 * kv * hd * wb;
    let rows = s.gen_rows as f64;
    add(
        "KV cache",
        Phase::Rollout,
        rows * s.context as f64 * kv_token,
        format!(
            "{} rows x {} tokens x {:.0} KiB/token (shared tree prefixes are stored once: less)",
            s.gen_rows,
            s.context,
            kv_token / 1024.0
        ),
    );
    add("decode logits", Phase::Rollout, rows * v * 4.0 * 2.0, "f32 logits and sampling buffers of one step".into());

    let n = (s.micro_batch * s.context) as f64;
    // Per token and layer, what backward keeps: the two norms' inputs and outputs and the
    // residual (5 H), q, k, v and the attention output (2 q + 2 kv), gate, up, their product and
    // the activation (4 I).
    let per_layer = 5.0 * h + 2.0 * heads * hd + 2.0 * kv * hd + 4.0 * i;
    let (act, act_note) = if s.checkpoint {
        (n * (layers * h + per_layer) * wb, "each layer's input, and one layer recomputed at a time")
    } else {
        (n * layers * per_layer * wb, "every layer's activations (no checkpointing)")
    };
    add("activations", Phase::Training, act, format!("{} x {} tokens: {act_note}", s.micro_batch, s.context));
    add("scored hidden states", Phase::Training, n * h * wb * 3.0, "selected, detached and their gradient".into());
    // Logits (weight kind), their f32 log-softmax, probabilities for the entropy, and the grad.
    let positions = if s.logits_chunk == 0 { n } else { (s.logits_chunk as f64).min(n) };
    add(
        "logits",
        Phase::Training,
        positions * v * (wb + 12.0),
        if s.logits_chunk == 0 {
            "the whole micro-batch at once".into()
        } else {
            format!("a chunk of {} positions", s.logits_chunk)
        },
    );
    Plan { params: p, components: c }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paper(optim_state: OptimState, checkpoint: bool) -> Shapes {
        Shapes {
            weight_bytes: 2.0,
            gen_rows: 64,
            context: 4096,
            micro_batch: 2,
            logits_chunk: 512,
            checkpoint,
            reference: true,
            optim_state,
        }
    }

    #[test]
    fn parameter_counts_are_the_model_cards() {
        assert_eq!(param_count(&Shape::Qwen25_0_5b.config()), 494_032_768);
        assert_eq!(param_count(&Shape::Qwen25_1_5b.config()), 1_543_714_304);
        assert_eq!(param_count(&Shape::Qwen25_3b.config()), 3_085_938_688);
        assert_eq!(param_count(&Shape::Qwen25_7b.config()), 7_615_616_512);
    }

    #[test]
    fn the_optimiser_state_and_checkpointing_change_the_plan_as_they_should() {
        let cfg = Shape::Qwen25_3b.config();
        let sr = plan(&cfg, &paper(OptimState::StochasticRounding, true));
        let master = plan(&cfg, &paper(OptimState::F32Master, true));
        let compact = plan(&cfg, &paper(OptimState::Compact, true));
        let p = sr.params as f64;
        let resident = |pl: &Plan| pl.sum(Phase::Resident) - p * 2.0; // without the reference
        assert_eq!((resident(&master) / p, resident(&sr) / p, resident(&compact) / p), (20.0, 16.0, 12.0));
        let full = plan(&cfg, &paper(OptimState::StochasticRounding, false));
        assert!(full.sum(Phase::Training) > 5.0 * sr.sum(Phase::Training), "checkpointing saves most activations");
        // 3B at 16 B/param plus a bf16 reference: about 52 GiB before any activation.
        assert!((sr.sum(Phase::Resident) / (1u64 << 30) as f64 - 51.7).abs() < 0.5);
        assert!(sr.fits(80.0 * (1u64 << 30) as f64, 0.1));
        assert!(
            !plan(&Shape::Qwen25_7b.config(), &paper(OptimState::StochasticRounding, true))
                .fits(80.0 * (1u64 << 30) as f64, 0.1)
        );
        let text = sr.render(80.0, 0.1);
        assert!(text.contains("fits a 80 GiB card") && text.contains("KV cache"), "{text}");
    }
}
