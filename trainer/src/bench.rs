//! `trainer bench`: throughput of one model on this machine: generation at batch 1 and 8 with the
//! KV cache, prefill, and a training forward + backward.

use std::time::Instant;

use tch::{Kind, Tensor};

use crate::generate::{Engine, SamplingParams};
use crate::logprobs::score_sequences;
use crate::model::CausalLm;
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone)]
pub struct BenchReport {
    pub rows: Vec<(String, f64, String)>,
}

/// Random token ids in `[1, vocab)`, deterministic.
fn tokens(vocab: i64, n: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (1 + (x >> 33) % (vocab as u64 - 1)) as u32
        })
        .collect()
}

pub fn run(model: &CausalLm, tok: &Tokenizer, prompt_len: usize, new_tokens: usize) -> BenchReport {
    let vocab = model.config.vocab_size.min(tok.vocab_size() as i64);
    let mut rows = Vec::new();
    // Generation: a `prompt_len` prompt, `new_tokens` sampled tokens, no stop, no EOS.
    let mut no_eos = SamplingParams::greedy(new_tokens);
    no_eos.stop.clear();
    for batch in [1usize, 8] {
        let mut engine = Engine::new(model);
        let seqs: Vec<_> =
            (0..batch).map(|i| engine.add(tokens(vocab, prompt_len, i as u64), i as u64).unwrap_or(0)).collect();
        // Prefill outside the timed part: generation speed alone.
        let warm = SamplingParams { max_new_tokens: 1, ..no_eos.clone() };
        let _ = engine.generate(&seqs, &warm, tok);
        let before = engine.stats.generated_tokens;
        let t = Instant::now();
        let _ = engine.generate(&seqs, &no_eos, tok);
        let n = engine.stats.generated_tokens - before;
        rows.push((
            format!("generation tokens/s, batch {batch}"),
            n as f64 / t.elapsed().as_secs_f64(),
            format!("{new_tokens} new tokens, KV cache"),
        ));
    }
    // Prefill: one forward over a batch of prompts, no grad.
    let device = model.device();
    let (b, len) = (8i64, 256i64);
    let ids =
        Tensor::from_slice(&tokens(vocab, (b * len) as usize, 99).iter().map(|t| i64::from(*t)).collect::<Vec<_>>())
            .view([b, len])
            .to_device(device);
    let pos = Tensor::arange(len, (Kind::Int64, device)).unsqueeze(0).repeat([b, 1]);
    let mask = Tensor::ones([b, len], (Kind::Int64, device));
    let t = Instant::now();
    tch::no_grad(|| {
        let _ = model.hidden(&ids, &pos, &mask, None);
    });
    rows.push((
        "prefill tokens/s".into(),
        (b * len) as f64 / t.elapsed().as_secs_f64(),
        "batch 8 x 256, no grad".into(),
    ));
    // Training: forward + backward over 4 x 256 tokens.
    let seqs: Vec<Vec<u32>> = (0..4).map(|i| tokens(vocab, 256, 1000 + i)).collect();
    let t = Instant::now();
    let scored = score_sequences(model, &seqs, 4, true);
    let loss =
        Tensor::stack(&scored.iter().map(|s| s.logprobs.mean(Kind::Float)).collect::<Vec<_>>(), 0).mean(Kind::Float);
    (-loss).backward();
    rows.push((
        "training forward+backward tokens/s".into(),
        1024.0 / t.elapsed().as_secs_f64(),
        "batch 4 x 256".into(),
    ));
    BenchReport { rows }
}
