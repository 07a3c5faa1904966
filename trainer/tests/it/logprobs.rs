//! Token log-probs in micro-batches equal transformers', with and without autograd.

use std::collections::HashMap;
use std::path::PathBuf;

use grove_trainer::engine::logprobs::{ScoreOptions, Span, score_sequences, score_spans};
use grove_trainer::engine::model::load_model;
use tch::{Device, Kind, Tensor};

#[test]
fn logprobs_match_transformers_at_any_micro_batch() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/qwen2-tiny");
    let (vs, lm) = load_model(&dir, Device::Cpu, Kind::Float).unwrap();
    let cases: HashMap<String, Tensor> =
        Tensor::read_safetensors(dir.join("cases.safetensors")).unwrap().into_iter().collect();
    let ids = &cases["batch.input_ids"];
    let mask = &cases["batch.attention_mask"];
    let want = &cases["batch.token_logprobs"];
    // The rows without their left padding.
    let mut seqs = Vec::new();
    let mut pads = Vec::new();
    for r in 0..2 {
        let row: Vec<i64> = Vec::try_from(ids.get(r)).unwrap();
        let m: Vec<i64> = Vec::try_from(mask.get(r)).unwrap();
        let pad = m.iter().take_while(|x| **x == 0).count();
        pads.push(pad);
        seqs.push(row[pad..].iter().map(|x| *x as u32).collect::<Vec<u32>>());
    }
    // Plus a short one, so that right padding inside a micro-batch is exercised.
    seqs.push(vec![3, 4]);
    for micro in [1, 2, 3] {
        let scored = score_sequences(&lm, &seqs, ScoreOptions { micro_batch: micro, ..Default::default() });
        assert_eq!(scored.len(), 3);
        for r in 0..2 {
            let n = seqs[r].len() as i64 - 1;
            let expected = want.get(r as i64).narrow(0, pads[r] as i64, n);
            let err = (&scored[r].logprobs - expected).abs().max().double_value(&[]);
            assert!(err < 1e-4, "row {r}, micro-batch {micro}: {err}");
            assert!(!scored[r].logprobs.requires_grad());
        }
        assert_eq!(scored[2].logprobs.size(), [1]);
    }
    // With grad: the loss reaches the parameters.
    let scored =
        score_sequences(&lm, &seqs[..1], ScoreOptions { micro_batch: 1, with_grad: true, ..Default::default() });
    let loss: Tensor = -scored[0].logprobs.mean(Kind::Float) - scored[0].entropy.mean(Kind::Float) * 0.01;
    loss.backward();
    let grads: f64 = vs.trainable_variables().iter().map(|v| v.grad().abs().sum(Kind::Float).double_value(&[])).sum();
    assert!(grads > 0.0);
}

/// Responses scored after their prompts equal the same positions of the whole sequence, and at a
/// sampling temperature the log-probs and entropies are those of logits / T.
#[test]
fn response_spans_at_a_temperature() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/qwen2-tiny");
    let (_vs, lm) = load_model(&dir, Device::Cpu, Kind::Float).unwrap();
    let seq: Vec<u32> = vec![5, 17, 99, 3, 42, 8, 61, 7];
    let (prompt, response) = seq.split_at(3);
    let t = 0.7;
    let spans = [Span::new(prompt, response), Span::new(&seq[..1], &seq[1..])];
    let scored = score_spans(&lm, &spans, ScoreOptions { micro_batch: 2, temperature: t, with_grad: false });
    assert_eq!(scored[0].logprobs.size(), [5]);
    let tail = scored[1].logprobs.narrow(0, 2, 5);
    assert!((&scored[0].logprobs - &tail).abs().max().double_value(&[]) < 1e-5, "a span is its sequence's tail");
    // By hand: logits of the whole sequence, divided by T.
    let ids = Tensor::from_slice(&seq.iter().map(|x| i64::from(*x)).collect::<Vec<_>>()).view([1, -1]);
    let pos = Tensor::arange(seq.len() as i64, (Kind::Int64, Device::Cpu)).view([1, -1]);
    let mask = Tensor::ones([1, seq.len() as i64], (Kind::Int64, Device::Cpu));
    let logits = tch::no_grad(|| lm.forward(&ids, &pos, &mask, None)).get(0);
    let logp = (logits / t).log_softmax(-1, Kind::Float);
    for (i, &tok) in response.iter().enumerate() {
        let want = logp.get(2 + i as i64).double_value(&[i64::from(tok)]);
        let got = scored[0].logprobs.double_value(&[i as i64]);
        assert!((want - got).abs() < 1e-5, "token {i}: {got} vs {want}");
        let p = logp.get(2 + i as i64).exp();
        let h = -(&p * logp.get(2 + i as i64)).sum(Kind::Float).double_value(&[]);
        assert!((h - scored[0].entropy.double_value(&[i as i64])).abs() < 1e-4, "entropy {i}");
    }
    // A mask scores only the selected tokens (observations are context, never scored).
    let mask = [1u8, 0, 1, 0, 1];
    let masked = score_spans(
        &lm,
        &[Span::masked(prompt, response, &mask)],
        ScoreOptions { temperature: t, ..Default::default() },
    );
    for (i, m) in mask.iter().enumerate() {
        let (got, full) = (masked[0].logprobs.double_value(&[i as i64]), scored[0].logprobs.double_value(&[i as i64]));
        if *m == 1 {
            assert!((got - full).abs() < 1e-5, "token {i}");
        } else {
            assert_eq!(got, 0.0, "token {i} is not scored");
        }
    }
    // At T = 1 the values differ: the temperature is really applied.
    let plain = score_spans(&lm, &spans[..1], ScoreOptions::default());
    assert!((&plain[0].logprobs - &scored[0].logprobs).abs().max().double_value(&[]) > 1e-3);
}

/// In bf16 the head's gradient is summed over chunks of positions in f32 and reaches the
/// parameter once: with 192 chunks of 2 positions it is within 1.5e-3 (relative norm) of the
/// one-chunk gradient. Summed in bf16 chunk by chunk, as before, it was 3.5e-3 away here.
#[test]
fn the_bf16_head_gradient_does_not_drift_with_the_chunking() {
    use grove_trainer::engine::logprobs::{TrainPass, backward_spans};
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/qwen2-tiny");
    let prompt: Vec<u32> = vec![5, 9, 2];
    let responses: Vec<Vec<u32>> =
        (0..8).map(|r| (0..48).map(|t| 1 + ((r * 37 + t * 11) % 250) as u32).collect()).collect();
    let grad = |chunk: usize| {
        let (_vs, lm) = load_model(&dir, Device::Cpu, Kind::BFloat16).unwrap();
        let spans: Vec<Span<'_>> = responses.iter().map(|r| Span::new(&prompt, r)).collect();
        let pass = TrainPass { temperature: 1.0, chunk, checkpoint: false };
        backward_spans(&lm, &spans, pass, &mut |lp, _ent, _range| -lp.sum(Kind::Float));
        lm.head_weight().grad().to_kind(Kind::Float)
    };
    let (one, many) = (grad(10_000), grad(2));
    let gap = (&many - &one).norm().double_value(&[]) / one.norm().double_value(&[]);
    assert!(gap < 1.5e-3, "chunks of 2 positions: {gap:.2e} from the one-chunk gradient");
}
