//! The real SmolLM2-135M-Instruct GGUF (fetched by `cargo xtask assets`) imports into an HF
//! folder that our model, tokenizer and chat template load, and answers a factual question.

use grove_datasets::assets;
use grove_trainer::engine::generate::{Engine, Finish, SamplingParams};
use grove_trainer::engine::import::import_gguf;
use grove_trainer::engine::model::load_model;
use grove_trainer::engine::tokenizer::{ChatMessage, Tokenizer};
use tch::{Device, Kind};

#[test]
fn smollm2_imports_and_knows_the_capital_of_france() {
    let gguf = assets::smollm2_gguf();
    assert!(gguf.exists(), "{} missing: run `cargo xtask assets`", gguf.display());
    let dir = tempfile::tempdir().unwrap();
    let summary = import_gguf(&gguf, dir.path()).unwrap();
    assert_eq!(summary.vocab, 49_152);
    assert!(summary.tied_embeddings);
    assert!((130_000_000..140_000_000).contains(&summary.parameters), "{}", summary.parameters);

    let (_vs, lm) = load_model(dir.path(), Device::Cpu, Kind::Float).unwrap();
    assert_eq!((lm.config.num_hidden_layers, lm.config.num_key_value_heads, lm.config.rope_theta), (30, 3, 100_000.0));
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(2));
    let prompt = tok.apply_chat_template(&[ChatMessage::new("user", "What is the capital of France?")], true).unwrap();
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt:?}");
    let ids = tok.encode(&prompt).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), prompt, "special tokens and text round-trip");
    let mut engine = Engine::new(&lm);
    let seq = engine.add(ids, 0).unwrap();
    let out = engine.generate(&[seq], &SamplingParams::greedy(24), &tok).unwrap().remove(0);
    assert!(out.text.contains("Paris"), "answer: {:?}", out.text);
    assert_eq!(out.finish, Finish::Eos, "the instruct model ends its turn: {:?}", out.text);
    eprintln!("SmolLM2 says: {}", out.text);
}

#[test]
fn cli_import_then_generate() {
    let gguf = assets::smollm2_gguf();
    assert!(gguf.exists(), "{} missing: run `cargo xtask assets`", gguf.display());
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_trainer");
    let status =
        std::process::Command::new(bin).arg("import-gguf").arg(&gguf).arg("--out").arg(dir.path()).status().unwrap();
    assert!(status.success());
    let out = std::process::Command::new(bin)
        .args([
            "generate",
            "--chat",
            "--max-new-tokens",
            "20",
            "--device",
            "cpu",
            "--prompt",
            "What is the capital of France?",
            "--model",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "The capital of France is Paris.");
    assert!(String::from_utf8_lossy(&out.stderr).contains("tokens/s"));
    // A missing model folder is an error message, not a panic.
    let bad = std::process::Command::new(bin)
        .args(["generate", "--prompt", "x", "--model", "/nonexistent"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("/nonexistent"));
}
