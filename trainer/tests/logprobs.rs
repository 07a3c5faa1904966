//! Token log-probs in micro-batches equal transformers', with and without autograd.

use std::collections::HashMap;
use std::path::PathBuf;

use grove_trainer::logprobs::score_sequences;
use grove_trainer::model::load_model;
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
        let scored = score_sequences(&lm, &seqs, micro, false);
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
    let scored = score_sequences(&lm, &seqs[..1], 1, true);
    let loss: Tensor = -scored[0].logprobs.mean(Kind::Float) - scored[0].entropy.mean(Kind::Float) * 0.01;
    loss.backward();
    let grads: f64 = vs.trainable_variables().iter().map(|v| v.grad().abs().sum(Kind::Float).double_value(&[])).sum();
    assert!(grads > 0.0);
}
