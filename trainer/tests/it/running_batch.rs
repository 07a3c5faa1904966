//! Continuous batching ([`Engine::admit`] / [`Engine::step`]) on the golden tiny models: what a
//! sequence generates does not depend on when it joined the running batch or with whom (greedy
//! and seeded sampling, stop strings, EOS, length, forks and observations), a step makes one
//! transfer, a running sequence is not touched, and the batch reuses its free slots.

use std::collections::HashMap;

use grove_trainer::engine::generate::{Engine, EngineError, Generation, SamplingParams, SeqId};
use grove_trainer::engine::model::CausalLm;
use grove_trainer::engine::tokenizer::Tokenizer;

use super::generation::{model, word_tokenizer};

/// `n` prompts of mixed lengths.
fn prompts(n: usize) -> Vec<Vec<u32>> {
    (0..n).map(|i| (0..(1 + (i * 5) % 11)).map(|j| ((i * 37 + j * 11) % 250) as u32 + 1).collect()).collect()
}

/// Run `prompts` through the running batch, admitting prompt i at step `joins[i]`, each a second
/// turn after an observation (`[9, 8]`) once its first ends; returns every generation by
/// (prompt, turn), and the engine's stats.
fn run_continuous(
    lm: &CausalLm,
    tok: &Tokenizer,
    params: &SamplingParams,
    prompts: &[Vec<u32>],
    joins: &[usize],
) -> (HashMap<(usize, usize), Generation>, grove_trainer::engine::generate::EngineStats) {
    let mut engine = Engine::new(lm);
    let seqs: Vec<SeqId> =
        prompts.iter().enumerate().map(|(i, p)| engine.add(p.clone(), 100 + i as u64).unwrap()).collect();
    let mut out = HashMap::new();
    let mut turn: HashMap<SeqId, usize> = HashMap::new();
    let mut step = 0;
    while out.len() < 2 * prompts.len() {
        for (i, &s) in seqs.iter().enumerate() {
            if joins[i] == step {
                engine.admit(s).unwrap();
                turn.insert(s, 0);
            }
        }
        for g in engine.step(params, tok).unwrap() {
            let i = seqs.iter().position(|&s| s == g.seq).unwrap();
            let t = turn[&g.seq];
            out.insert((i, t), g);
            if t == 0 {
                engine.extend(seqs[i], &[9, 8]).unwrap();
                engine.admit(seqs[i]).unwrap();
                turn.insert(seqs[i], 1);
            }
        }
        step += 1;
        assert!(step < 10_000, "the running batch never drained");
    }
    assert_eq!(engine.running_rows(), 0);
    (out, engine.stats)
}

/// The same through `generate`, each prompt alone.
fn run_alone(
    lm: &CausalLm,
    tok: &Tokenizer,
    params: &SamplingParams,
    prompts: &[Vec<u32>],
) -> HashMap<(usize, usize), Generation> {
    let mut engine = Engine::new(lm);
    let mut out = HashMap::new();
    for (i, p) in prompts.iter().enumerate() {
        let s = engine.add(p.clone(), 100 + i as u64).unwrap();
        out.insert((i, 0), engine.generate(&[s], params, tok).unwrap().remove(0));
        engine.extend(s, &[9, 8]).unwrap();
        out.insert((i, 1), engine.generate(&[s], params, tok).unwrap().remove(0));
    }
    out
}

#[test]
fn joining_late_changes_nothing_a_sequence_generates() {
    for (name, eos) in [("qwen2-tiny", None), ("llama3-tiny", Some("t7"))] {
        let (_vs, lm) = model(name);
        let tok = word_tokenizer(eos);
        let stops = vec!["t3".to_string(), "t11 t".to_string()];
        let all = prompts(24);
        // Joining at steps 0..: some together, some alone, some after others finished.
        let joins: Vec<usize> = (0..all.len()).map(|i| [0, 0, 0, 3, 5, 5, 9, 20, 31, 60][i % 10] + i / 10).collect();
        for params in [
            SamplingParams { stop: stops.clone(), ..SamplingParams::greedy(18) },
            SamplingParams { stop: stops.clone(), max_new_tokens: 18, ..SamplingParams::default() },
            SamplingParams {
                stop: vec![],
                top_k: 20,
                temperature: 0.7,
                max_new_tokens: 9,
                ..SamplingParams::default()
            },
        ] {
            let what = format!("{name}, T {}, top-k {}", params.temperature, params.top_k);
            let alone = run_alone(&lm, &tok, &params, &all);
            let (together, stats) = run_continuous(&lm, &tok, &params, &all, &joins);
            assert_eq!(together.len(), alone.len());
            let mut ends = std::collections::HashSet::new();
            for (k, a) in &alone {
                let b = &together[k];
                assert_eq!((&a.tokens, a.finish, &a.text), (&b.tokens, b.finish, &b.text), "{what}: {k:?}");
                for (p, q) in a.logprobs.iter().zip(&b.logprobs) {
                    assert!((p - q).abs() < 1e-4, "{what}: {p} vs {q}");
                }
                ends.insert((format!("{:?}", a.finish), a.tokens.len()));
            }
            if !params.stop.is_empty() {
                assert!(ends.len() > 2, "{what}: rows end at different steps: {ends:?}");
            }
            assert_eq!(stats.step_transfers, stats.decode_steps + stats.compactions, "{what}: one transfer per step");
            let tokens: usize = alone.values().map(|g| g.tokens.len()).sum();
            assert!(stats.generated_tokens >= tokens as u64, "{what}");
        }
    }
}

/// Forked children admitted together decode like the same children through `generate`, and a
/// running sequence cannot be extended, forked or generated for.
#[test]
fn forks_join_the_running_batch_and_running_sequences_are_refused() {
    let tok = word_tokenizer(None);
    let (_vs, lm) = model("qwen2-tiny");
    let params = SamplingParams { stop: vec![], max_new_tokens: 10, ..SamplingParams::default() };
    let mut a = Engine::new(&lm);
    let root = a.add(vec![1, 2, 3, 4], 5).unwrap();
    a.generate(&[root], &params, &tok).unwrap();
    let kids = a.fork(root, 3).unwrap();
    let want = a.generate(&kids, &params, &tok).unwrap();

    let mut b = Engine::new(&lm);
    let root = b.add(vec![1, 2, 3, 4], 5).unwrap();
    b.admit(root).unwrap();
    assert!(matches!(b.admit(root), Err(EngineError::Running(_))));
    assert!(matches!(b.extend(root, &[1]), Err(EngineError::Running(_))));
    assert!(matches!(b.fork(root, 1), Err(EngineError::Running(_))));
    assert!(matches!(b.generate(&[root], &params, &tok), Err(EngineError::Running(_))));
    let mut first = Vec::new();
    while first.is_empty() {
        first = b.step(&params, &tok).unwrap();
    }
    let kids = b.fork(root, 3).unwrap();
    // Another sequence decodes while the children wait, then they join it.
    let other = b.add(vec![200, 201], 9).unwrap();
    b.admit(other).unwrap();
    b.step(&params, &tok).unwrap();
    b.step(&params, &tok).unwrap();
    for &k in &kids {
        b.admit(k).unwrap();
    }
    let mut got: HashMap<SeqId, Generation> = HashMap::new();
    while b.running_rows() > 0 {
        for g in b.step(&params, &tok).unwrap() {
            got.insert(g.seq, g);
        }
    }
    for (w, k) in want.iter().zip(&kids) {
        assert_eq!(w.tokens, got[k].tokens);
    }
    // Another sampling setting waits for the batch to drain.
    b.admit(other).unwrap();
    b.step(&params, &tok).unwrap();
    assert!(matches!(b.step(&SamplingParams::greedy(3), &tok), Err(EngineError::MixedSampling)));
}
