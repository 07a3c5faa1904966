//! The Search-R1 tag grammar (`parse_text_with`) and structured tool calls (`parse_tool`) of
//! `grove_datasets::actions`, the pure module the env-server resolves actions with.
//!
//! Input: one flag byte, then the text (arbitrary bytes, read lossily as UTF-8).
#![no_main]

use grove_datasets::actions::{Parsed, parse_text_with, parse_tool};
use grove_protocol::{ActionKind, ToolCall};
use libfuzzer_sys::fuzz_target;

const TAGS: [(&str, &str, ActionKind); 3] = [
    ("<search>", "</search>", ActionKind::Search),
    ("<answer>", "</answer>", ActionKind::Answer),
    ("<open>", "</open>", ActionKind::Open),
];

/// The leftmost-match semantics of the regex `<search>(.*?)</search>|<answer>(.*?)</answer>`,
/// written the slow and obvious way.
fn oracle(text: &str, open: bool) -> Parsed {
    let tags = if open { &TAGS[..] } else { &TAGS[..2] };
    for (at, _) in text.char_indices() {
        for (o, c, kind) in tags {
            if let Some(rest) = text[at..].strip_prefix(o)
                && let Some(end) = rest.find(c)
            {
                return Parsed { kind: *kind, content: rest[..end].trim().to_string() };
            }
        }
    }
    Parsed { kind: ActionKind::Invalid, content: String::new() }
}

fn check_text(text: &str, open: bool) {
    let p = parse_text_with(text, open);
    assert_eq!(p.content, p.content.trim(), "content is not trimmed");
    match p.kind {
        ActionKind::Invalid => assert!(p.content.is_empty(), "invalid action with content"),
        ActionKind::Open => assert!(open, "<open> parsed where it is not offered"),
        _ => {}
    }
    assert!(text.contains(&p.content), "content {:?} is not in the input", p.content);
    assert_eq!(p, oracle(text, open), "differs from the regex semantics on {text:?}");
}

fn check_tool(text: &str, flags: u8, open: bool) {
    let name = ["search", "answer", "open", "x"][usize::from(flags >> 1 & 3)];
    let key = ["query", "answer", "url", "x"][usize::from(flags >> 3 & 3)];
    let value = if flags & 0x20 != 0 {
        serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_string()))
    } else {
        serde_json::Value::String(text.to_string())
    };
    // The argument as the tool receives it (a JSON string input arrives unescaped).
    let argument = value.as_str().map(str::to_owned);
    let call = ToolCall { name: name.into(), arguments: [(key.to_string(), value)].into_iter().collect() };
    let Ok((p, rendered)) = parse_tool(&call, open) else {
        return;
    };
    assert_ne!(p.kind, ActionKind::Invalid);
    assert!(open || p.kind != ActionKind::Open);
    assert_eq!(p.content, p.content.trim(), "content is not trimmed");
    if let Some(argument) = &argument {
        assert!(argument.contains(&p.content), "content {:?} is not in the argument {argument:?}", p.content);
    }
    // The transcript records the tag form; read back, it is the same action, unless the content
    // itself holds the closing tag.
    let close = TAGS.iter().find(|t| t.2 == p.kind).map(|t| t.1).unwrap();
    if !p.content.contains(close) {
        assert_eq!(parse_text_with(&rendered, open), p, "tag form {rendered:?} reads back differently");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let open = flags & 1 != 0;
    let text = String::from_utf8_lossy(rest);
    check_text(&text, open);
    check_text(&text, !open);
    check_tool(&text, flags, open);
});
