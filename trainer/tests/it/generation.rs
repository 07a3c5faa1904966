//! The generation engine on the golden tiny models: greedy ids equal transformers', batching and
//! forking change nothing, seeded sampling is reproducible, stop strings / EOS / length end a
//! sequence and leave it ready to continue.

use std::collections::HashMap;
use std::path::PathBuf;

use grove_trainer::engine::generate::{Engine, Finish, SamplingParams};
use grove_trainer::engine::model::load_model;
use grove_trainer::engine::tokenizer::Tokenizer;
use tch::{Device, Kind, Tensor};

pub(crate) fn golden(model: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden").join(model)
}

/// A word-level tokenizer over the tiny models' 256 ids: token i is `t<i>`.
pub(crate) fn word_tokenizer(eos: Option<&str>) -> Tokenizer {
    let vocab: HashMap<String, u32> = (0..256u32).map(|i| (format!("t{i}"), i)).collect();
    let model = tokenizers::models::wordlevel::WordLevel::builder()
        .vocab(vocab.into_iter().collect())
        .unk_token("t0".into())
        .build()
        .unwrap();
    let mut inner = tokenizers::Tokenizer::new(model);
    inner.with_pre_tokenizer(Some(tokenizers::pre_tokenizers::whitespace::WhitespaceSplit));
    Tokenizer::from_parts(inner, eos.map(str::to_owned), None)
}

fn golden_prompt_and_output(model: &str) -> (Vec<u32>, Vec<u32>) {
    let cases: HashMap<String, Tensor> =
        Tensor::read_safetensors(golden(model).join("cases.safetensors")).unwrap().into_iter().collect();
    let v = |k: &str| Vec::<i64>::try_from(cases[k].view([-1])).unwrap().into_iter().map(|x| x as u32).collect();
    (v("greedy.prompt_ids"), v("greedy.output_ids"))
}

pub(crate) fn model(name: &str) -> (tch::nn::VarStore, grove_trainer::engine::model::CausalLm) {
    load_model(&golden(name), Device::Cpu, Kind::Float).unwrap()
}

#[test]
fn engine_greedy_matches_transformers_and_batching_changes_nothing() {
    let tok = word_tokenizer(None);
    for name in ["qwen2-tiny", "llama3-tiny"] {
        let (_vs, lm) = model(name);
        let (prompt, want) = golden_prompt_and_output(name);
        let mut engine = Engine::new(&lm);
        let alone = engine.add(prompt.clone(), 1).unwrap();
        let out = engine.generate(&[alone], &SamplingParams::greedy(16), &tok).unwrap();
        assert_eq!(out[0].tokens, want, "{name}");
        assert_eq!(out[0].finish, Finish::Length);
        // In a batch with a longer and a shorter sequence (left padding inside the batch).
        let a = engine.add(prompt.clone(), 2).unwrap();
        let b = engine.add(vec![5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], 3).unwrap();
        let c = engine.add(vec![42], 4).unwrap();
        let batch = engine.generate(&[b, a, c], &SamplingParams::greedy(16), &tok).unwrap();
        assert_eq!(batch[1].tokens, want, "{name}: batched");
        let b_alone = engine.add(vec![5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], 5).unwrap();
        let c_alone = engine.add(vec![42], 6).unwrap();
        assert_eq!(engine.generate(&[b_alone], &SamplingParams::greedy(16), &tok).unwrap()[0].tokens, batch[0].tokens);
        assert_eq!(engine.generate(&[c_alone], &SamplingParams::greedy(16), &tok).unwrap()[0].tokens, batch[2].tokens);
        // Continuing a sequence continues the greedy path.
        let more = engine.generate(&[alone], &SamplingParams::greedy(4), &tok).unwrap();
        let full = engine.add(prompt.clone(), 7).unwrap();
        let long = engine.generate(&[full], &SamplingParams::greedy(20), &tok).unwrap();
        assert_eq!(long[0].tokens[16..], more[0].tokens[..]);
    }
}

#[test]
fn forked_sequences_continue_like_fresh_ones_without_reencoding() {
    let tok = word_tokenizer(None);
    let (_vs, lm) = model("llama3-tiny");
    let (prompt, _) = golden_prompt_and_output("llama3-tiny");
    let mut engine = Engine::new(&lm);
    let root = engine.add(prompt.clone(), 11).unwrap();
    let first = engine.generate(&[root], &SamplingParams::greedy(5), &tok).unwrap();
    let before = engine.stats;
    let kids = engine.fork(root, 3).unwrap();
    engine.extend(kids[0], &[7, 8, 9]).unwrap();
    engine.extend(kids[1], &[40]).unwrap();
    let forked = engine.generate(&kids, &SamplingParams::greedy(8), &tok).unwrap();
    // Only the observation tokens and the parent's last token were encoded for the children.
    let prefill = engine.stats.prefill_tokens - before.prefill_tokens;
    assert!(prefill <= 3 + 1 + 1, "children re-encoded {prefill} tokens");
    // The same token lists encoded from scratch give the same continuations.
    for (kid, extra) in kids.iter().zip([vec![7u32, 8, 9], vec![40], vec![]]) {
        let mut tokens = prompt.clone();
        tokens.extend(&first[0].tokens);
        tokens.extend(extra);
        assert_eq!(engine.tokens(*kid).unwrap().len(), tokens.len() + 8);
        let fresh = engine.add(tokens, 99).unwrap();
        let again = engine.generate(&[fresh], &SamplingParams::greedy(8), &tok).unwrap();
        let mine = forked.iter().find(|g| g.seq == *kid).unwrap();
        assert_eq!(mine.tokens, again[0].tokens);
    }
    // The parent is untouched by its children.
    assert_eq!(engine.tokens(root).unwrap().len(), prompt.len() + 5);
}

#[test]
fn seeded_sampling_is_reproducible_and_independent_of_the_batch() {
    let tok = word_tokenizer(None);
    let (_vs, lm) = model("qwen2-tiny");
    let params = SamplingParams { stop: vec![], max_new_tokens: 24, ..SamplingParams::default() };
    let mut engine = Engine::new(&lm);
    let a = engine.add(vec![1, 2, 3], 1234).unwrap();
    let alone = engine.generate(&[a], &params, &tok).unwrap()[0].tokens.clone();
    let a2 = engine.add(vec![1, 2, 3], 1234).unwrap();
    let other = engine.add(vec![9, 9, 9, 9, 9, 9], 77).unwrap();
    let batched = engine.generate(&[other, a2], &params, &tok).unwrap();
    assert_eq!(batched[1].tokens, alone);
    let a3 = engine.add(vec![1, 2, 3], 4321).unwrap();
    assert_ne!(engine.generate(&[a3], &params, &tok).unwrap()[0].tokens, alone, "another seed, another sample");
    // top-k 1 is greedy.
    let g = engine.add(vec![1, 2, 3], 5).unwrap();
    let k1 = SamplingParams { top_k: 1, ..params.clone() };
    let greedy = engine.add(vec![1, 2, 3], 6).unwrap();
    assert_eq!(
        engine.generate(&[g], &k1, &tok).unwrap()[0].tokens,
        engine.generate(&[greedy], &SamplingParams::greedy(24), &tok).unwrap()[0].tokens
    );
}

#[test]
fn stop_strings_eos_and_length() {
    let (_vs, lm) = model("qwen2-tiny");
    let (prompt, want) = golden_prompt_and_output("qwen2-tiny");
    // Stop string: the decoded text of the second greedy token.
    let tok = word_tokenizer(None);
    let mut engine = Engine::new(&lm);
    let s = engine.add(prompt.clone(), 1).unwrap();
    let params = SamplingParams { stop: vec![format!("t{}", want[1])], ..SamplingParams::greedy(16) };
    let g = engine.generate(&[s], &params, &tok).unwrap().remove(0);
    assert_eq!((g.finish, g.tokens.clone()), (Finish::Stop, want[..2].to_vec()));
    assert_eq!(g.text, format!("t{} t{}", want[0], want[1]));
    // It continues where it stopped, on the greedy path.
    let g2 = engine.generate(&[s], &SamplingParams::greedy(3), &tok).unwrap().remove(0);
    assert_eq!(g2.tokens, want[2..5]);
    // EOS: the second greedy token is the end; it is not kept.
    let tok = word_tokenizer(Some(&format!("t{}", want[1])));
    let e = engine.add(prompt.clone(), 2).unwrap();
    let g = engine.generate(&[e], &SamplingParams::greedy(16), &tok).unwrap().remove(0);
    assert_eq!((g.finish, g.tokens), (Finish::Eos, want[..1].to_vec()));
    assert_eq!(engine.tokens(e).unwrap().len(), prompt.len() + 1);
    let again = engine.generate(&[e], &SamplingParams::greedy(16), &tok).unwrap().remove(0);
    assert_eq!((again.finish, again.tokens.len()), (Finish::Eos, 0));
    // Length.
    let l = engine.add(prompt, 3).unwrap();
    let g = engine.generate(&[l], &SamplingParams::greedy(3), &word_tokenizer(None)).unwrap().remove(0);
    assert_eq!((g.finish, g.tokens), (Finish::Length, want[..3].to_vec()));
    // Tokens outside the vocabulary are refused.
    assert!(engine.add(vec![300], 1).is_err());
}

/// Bytes of keys and values one position takes in `lm` (f32).
fn kv_bytes_per_token(lm: &grove_trainer::engine::model::CausalLm) -> u64 {
    let c = &lm.config;
    (c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * 4) as u64
}

/// The engine before the rewrite is kept as the benchmark's baseline; both decode the same
/// greedy tokens for a batch of prompts of mixed lengths, forked and extended sequences included.
#[cfg(feature = "bench-baseline")]
#[test]
fn the_engine_and_the_legacy_engine_decode_the_same_greedy_tokens() {
    use grove_trainer::engine::generate::legacy::LegacyEngine;
    let tok = word_tokenizer(None);
    for name in ["qwen2-tiny", "llama3-tiny"] {
        let (_vs, lm) = model(name);
        let (prompt, _) = golden_prompt_and_output(name);
        let prompts = [prompt.clone(), vec![5, 6, 7, 8, 9, 10, 11], vec![42], prompt[..3].to_vec(), vec![3; 20]];
        let mut new = Engine::new(&lm);
        let mut old = LegacyEngine::new(&lm);
        let a: Vec<_> = prompts.iter().map(|p| new.add(p.clone(), 1).unwrap()).collect();
        let b: Vec<_> = prompts.iter().map(|p| old.add(p.clone(), 1).unwrap()).collect();
        let params = SamplingParams::greedy(12);
        let x = new.generate(&a, &params, &tok).unwrap();
        let y = old.generate(&b, &params, &tok).unwrap();
        for (g, h) in x.iter().zip(&y) {
            assert_eq!(g.tokens, h.tokens, "{name}");
        }
        // Fork two of them, extend one child, and continue all in one batch.
        let (ka, kb) = (new.fork(a[1], 2).unwrap(), old.fork(b[1], 2).unwrap());
        new.extend(ka[0], &[7, 7, 7]).unwrap();
        old.extend(kb[0], &[7, 7, 7]).unwrap();
        let x = new.generate(&[ka[0], ka[1], a[2], a[4]], &params, &tok).unwrap();
        let y = old.generate(&[kb[0], kb[1], b[2], b[4]], &params, &tok).unwrap();
        for (g, h) in x.iter().zip(&y) {
            assert_eq!(g.tokens, h.tokens, "{name}: forked");
        }
    }
}

/// Forks and snapshots share their ancestors' keys and values: what the engine holds grows with
/// the positions encoded, not with sequences x context.
#[test]
fn forks_share_keys_and_values() {
    let tok = word_tokenizer(None);
    let (_vs, lm) = model("qwen2-tiny");
    let per_token = kv_bytes_per_token(&lm);
    let mut engine = Engine::new(&lm);
    let root = engine.add((1..=40).collect(), 3).unwrap();
    engine.generate(&[root], &SamplingParams::greedy(10), &tok).unwrap();
    // The root holds its 49 positions (all but its last token).
    assert_eq!(engine.kv_bytes(), 49 * per_token);
    // Ten snapshots of it add nothing.
    let snaps = engine.fork(root, 10).unwrap();
    assert_eq!(engine.kv_bytes(), 49 * per_token);
    // Four of them continue by 5 tokens each: 4 x 5 new positions, the 49 shared.
    engine.generate(&snaps[..4], &SamplingParams::greedy(5), &tok).unwrap();
    assert_eq!(engine.kv_bytes(), (49 + 4 * 5) * per_token);
    // Copies of the whole prefix per sequence would hold 11 x 49 + 4 x 54.
    assert!(engine.kv_bytes() < (11 * 49 + 4 * 54) * per_token / 5);
    // Dropping the sequences frees what only they held.
    for s in &snaps {
        engine.remove(*s);
    }
    assert_eq!(engine.kv_bytes(), 49 * per_token);
}

/// `n` prompts of mixed lengths (left padding inside the batch) for the transfer tests.
fn mixed_prompts(n: usize) -> Vec<Vec<u32>> {
    (0..n).map(|i| (0..(1 + i % 7)).map(|j| ((i * 31 + j * 7) % 250) as u32 + 1).collect()).collect()
}

/// A decode step makes one host<->device transfer (the tokens, log-probs and flags of every row
/// in one copy), at batch 1 and 64, greedy and top-p, with and without lookahead; a compaction
/// adds its one index upload.
#[test]
fn a_decode_step_makes_one_transfer() {
    use grove_trainer::engine::device::transfers;
    let tok = word_tokenizer(None);
    let (_vs, lm) = model("qwen2-tiny");
    let top_p = SamplingParams { stop: vec![], max_new_tokens: 12, ..SamplingParams::default() };
    for batch in [1usize, 64] {
        for params in [SamplingParams::greedy(12), top_p.clone()] {
            for lookahead in [false, true] {
                let mut engine = Engine::new(&lm);
                engine.lookahead = lookahead;
                // Fewer candidates than the vocabulary: the top-p path that skips the sort.
                engine.nucleus_candidates = 64;
                let seqs: Vec<_> = mixed_prompts(batch)
                    .into_iter()
                    .enumerate()
                    .map(|(i, p)| engine.add(p, i as u64).unwrap())
                    .collect();
                let before = transfers::count();
                let out = engine.generate(&seqs, &params, &tok).unwrap();
                let made = transfers::count() - before;
                let s = engine.stats;
                let what = format!("batch {batch}, T {}, lookahead {lookahead}", params.temperature);
                assert!(out.iter().all(|g| g.tokens.len() == 12), "{what}");
                assert_eq!(s.decode_steps, 12, "{what}");
                assert_eq!(s.compactions, 0, "{what}");
                assert_eq!(s.step_transfers, s.decode_steps, "{what}: one transfer per step");
                // The call's set-up: mask, ids, positions, lengths, and the uniforms when sampling.
                let setup = if params.temperature > 0.0 { 5 } else { 4 };
                assert_eq!(made, s.decode_steps + setup, "{what}");
            }
        }
    }
    // Rows that stop early leave the batch: one index upload per compaction, no more.
    let (prompt, want) = golden_prompt_and_output("qwen2-tiny");
    let stop = SamplingParams { stop: vec![format!("t{}", want[1])], ..SamplingParams::greedy(12) };
    let mut engine = Engine::new(&lm);
    let mut seqs: Vec<_> = (0..48).map(|i| engine.add(prompt.clone(), i).unwrap()).collect();
    seqs.extend(mixed_prompts(16).into_iter().map(|p| engine.add(p, 0).unwrap()));
    engine.generate(&seqs, &stop, &tok).unwrap();
    let s = engine.stats;
    assert!(s.compactions >= 1, "48 of 64 rows stop after 2 tokens");
    assert_eq!(s.step_transfers, s.decode_steps + s.compactions);
}

/// Launching the next step before reading this one changes no output: tokens, ends, log-probs
/// (to rounding), and what each sequence samples next (its random stream is advanced by the draws it used).
#[test]
fn lookahead_changes_no_output() {
    let tok = word_tokenizer(Some("t7"));
    let (_vs, lm) = model("llama3-tiny");
    let run = |lookahead: bool, params: &SamplingParams| {
        let mut engine = Engine::new(&lm);
        engine.lookahead = lookahead;
        let seqs: Vec<_> =
            mixed_prompts(12).into_iter().enumerate().map(|(i, p)| engine.add(p, 40 + i as u64).unwrap()).collect();
        let first = engine.generate(&seqs, params, &tok).unwrap();
        let second = engine.generate(&seqs, params, &tok).unwrap();
        (first, second)
    };
    let stops = vec!["t3".to_string(), "t11 t".to_string()];
    for params in [
        SamplingParams { stop: stops.clone(), max_new_tokens: 20, ..SamplingParams::default() },
        SamplingParams { stop: stops, ..SamplingParams::greedy(20) },
    ] {
        let (a, b) = (run(false, &params), run(true, &params));
        // The same tokens and ends; log-probs equal up to rounding (the batch a step runs in
        // differs by when finished rows leave it, which may change the last bits of a sum).
        for (x, y) in a.0.iter().chain(&a.1).zip(b.0.iter().chain(&b.1)) {
            assert_eq!((&x.tokens, x.finish, &x.text), (&y.tokens, y.finish, &y.text), "T {}", params.temperature);
            for (p, q) in x.logprobs.iter().zip(&y.logprobs) {
                assert!((p - q).abs() < 1e-4, "{p} vs {q}");
            }
        }
        let ends: std::collections::HashSet<_> =
            a.0.iter().map(|g| (format!("{:?}", g.finish), g.tokens.len())).collect();
        assert!(ends.len() > 1, "rows end at different steps: {ends:?}");
    }
}

/// A sequence's random stream continues across calls: 4 tokens and then 6 are the 10 one call
/// draws (rows that finish early do not consume the uniforms drawn for them up front).
#[test]
fn a_call_split_in_two_samples_what_one_call_samples() {
    let tok = word_tokenizer(None);
    let (_vs, lm) = model("qwen2-tiny");
    let params = |n| SamplingParams { stop: vec![], max_new_tokens: n, ..SamplingParams::default() };
    let mut engine = Engine::new(&lm);
    let whole = engine.add(vec![4, 5, 6], 99).unwrap();
    let split = engine.add(vec![4, 5, 6], 99).unwrap();
    let one = engine.generate(&[whole], &params(10), &tok).unwrap().remove(0);
    let mut two = engine.generate(&[split], &params(4), &tok).unwrap().remove(0).tokens;
    two.extend(engine.generate(&[split], &params(6), &tok).unwrap().remove(0).tokens);
    assert_eq!(one.tokens, two);
}

/// Top-p draws from the top `nucleus_candidates` tokens: exactly the full sort's draw when the
/// nucleus fits in them; drawn from them renormalised, and counted, when it does not.
#[test]
fn top_p_draws_from_the_candidate_set() {
    let tok = word_tokenizer(None);
    let (_vs, lm) = model("qwen2-tiny");
    let draw = |candidates: usize, top_p: f64| {
        let mut engine = Engine::new(&lm);
        engine.nucleus_candidates = candidates;
        let params = SamplingParams { stop: vec![], max_new_tokens: 16, top_p, ..SamplingParams::default() };
        let seqs: Vec<_> = mixed_prompts(8).into_iter().map(|p| engine.add(p, 5).unwrap()).collect();
        let out: Vec<Vec<u32>> = engine.generate(&seqs, &params, &tok).unwrap().into_iter().map(|g| g.tokens).collect();
        (out, engine.stats.truncated_nuclei)
    };
    // The tiny model's distributions are flat: half the mass needs many of its 256 tokens.
    let (sorted, none) = draw(0, 0.5);
    assert_eq!(none, 0);
    assert_eq!(draw(255, 0.5), (sorted, 0), "the nucleus fits in 255 candidates");
    // One candidate: the nucleus is cut to the most probable token, every time.
    let (one, cut) = draw(1, 0.95);
    assert_eq!(cut, 8 * 16);
    let mut engine = Engine::new(&lm);
    let seqs: Vec<_> = mixed_prompts(8).into_iter().map(|p| engine.add(p, 5).unwrap()).collect();
    let greedy: Vec<Vec<u32>> =
        engine.generate(&seqs, &SamplingParams::greedy(16), &tok).unwrap().into_iter().map(|g| g.tokens).collect();
    assert_eq!(one, greedy);
}
