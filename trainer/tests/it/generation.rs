//! The generation engine on the golden tiny models: greedy ids equal transformers', batching and
//! forking change nothing, seeded sampling is reproducible, stop strings / EOS / length end a
//! sequence and leave it ready to continue.

use std::collections::HashMap;
use std::path::PathBuf;

use grove_trainer::generate::{Engine, Finish, SamplingParams};
use grove_trainer::model::load_model;
use grove_trainer::tokenizer::Tokenizer;
use tch::{Device, Kind, Tensor};

fn golden(model: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden").join(model)
}

/// A word-level tokenizer over the tiny models' 256 ids: token i is `t<i>`.
fn word_tokenizer(eos: Option<&str>) -> Tokenizer {
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

fn model(name: &str) -> (tch::nn::VarStore, grove_trainer::model::CausalLm) {
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
fn kv_bytes_per_token(lm: &grove_trainer::model::CausalLm) -> u64 {
    let c = &lm.config;
    (c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * 4) as u64
}

/// The engine before the rewrite is kept as the benchmark's baseline; both decode the same
/// greedy tokens for a batch of prompts of mixed lengths, forked and extended sequences included.
#[test]
fn the_engine_and_the_legacy_engine_decode_the_same_greedy_tokens() {
    use grove_trainer::generate::legacy::LegacyEngine;
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
