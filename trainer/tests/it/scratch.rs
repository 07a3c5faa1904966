//! A small policy from scratch: a BPE tokenizer trained on the synthetic world and a few-million
//! parameter Qwen2 model, saved as an HF folder that the model, tokenizer and chat code load.

use grove_datasets::synthetic::{World, WorldConfig};
use grove_trainer::engine::generate::{Engine, SamplingParams};
use grove_trainer::engine::model::load_model;
use grove_trainer::engine::scratch::{SmallModel, init_model, train_bpe};
use grove_trainer::engine::tokenizer::{ChatMessage, Tokenizer};

#[test]
fn tokenizer_and_model_from_scratch() {
    let world = World::generate(&WorldConfig::default());
    let mut texts: Vec<String> = world.passages.iter().map(|p| p.contents()).collect();
    texts.extend((1..=3).flat_map(|h| world.questions(h, 50, 0)).map(|q| q.example.question));
    let dir = tempfile::tempdir().unwrap();
    let vocab = train_bpe(&texts, 2048, dir.path()).unwrap();
    assert!((1000..=2048).contains(&vocab), "vocab {vocab}");
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    // Special tokens are single ids 0, 1, 2; text round-trips.
    assert_eq!(tok.encode("<|im_start|>user\n").unwrap()[0], 1);
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(2));
    let q = &world.questions(2, 1, 9)[0].example.question;
    let ids = tok.encode(q).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), *q);
    assert!(ids.len() < q.len() / 2, "BPE compresses the world's text: {} tokens for {} bytes", ids.len(), q.len());
    let prompt = tok.apply_chat_template(&[ChatMessage::new("user", q.clone())], true).unwrap();
    assert_eq!(prompt, format!("<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"));

    let params = init_model(dir.path(), vocab, SmallModel::default(), 0).unwrap();
    assert!((1_000_000..5_000_000).contains(&params), "{params} parameters");
    let (_vs, lm) = load_model(dir.path(), tch::Device::Cpu, tch::Kind::Float).unwrap();
    let mut engine = Engine::new(&lm);
    let seq = engine.add(tok.encode(&prompt).unwrap(), 1).unwrap();
    let out =
        engine.generate(&[seq], &SamplingParams { max_new_tokens: 8, ..SamplingParams::default() }, &tok).unwrap();
    assert!(!out[0].tokens.is_empty());
}
