//! PROTOCOL.md cannot drift from the code: every byte-level example in it is a golden frame,
//! decodes with this crate's codec, re-encodes to the same bytes and is shown with its decoded
//! value; every error code is documented with its number.

use std::path::{Path, PathBuf};

use grove_protocol::{ErrorCode, decode_request, decode_response, encode};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// One `<!-- golden: NAME -->` example: the hex block right after it and the json block after that.
#[derive(Debug)]
struct Example {
    name: String,
    hex: String,
    json: String,
}

/// The body of the next fenced block opened with exactly "```lang" at or after line `from`,
/// and the index of the line after its closing fence. Only blank lines may come before it.
fn fenced_block(lines: &[&str], from: usize, lang: &str, context: &str) -> (String, usize) {
    let mut i = from;
    while i < lines.len() && lines[i].trim().is_empty() {
        i += 1;
    }
    let opening = format!("```{lang}");
    assert!(
        i < lines.len() && lines[i].trim() == opening,
        "{context}: expected a {opening} block at line {}, found {:?}",
        i + 1,
        lines.get(i)
    );
    let start = i + 1;
    let end = (start..lines.len())
        .find(|&j| lines[j].trim() == "```")
        .unwrap_or_else(|| panic!("{context}: unterminated {opening} block"));
    (lines[start..end].join("\n"), end + 1)
}

fn examples(doc: &str) -> Vec<Example> {
    let lines: Vec<&str> = doc.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.trim().strip_prefix("<!-- golden:") else { continue };
        let name = rest.strip_suffix("-->").unwrap_or_else(|| panic!("line {}: bad golden comment", i + 1)).trim();
        let (hex, next) = fenced_block(&lines, i + 1, "hex", name);
        let (json, _) = fenced_block(&lines, next, "json", name);
        out.push(Example { name: name.to_string(), hex, json });
    }
    out
}

fn strip_ws(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect::<String>().to_ascii_lowercase()
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    assert!(hex.len().is_multiple_of(2), "odd number of hex digits");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap_or_else(|e| panic!("bad hex at {i}: {e}")))
        .collect()
}

fn doc() -> String {
    read(&crate_dir().join("PROTOCOL.md"))
}

#[test]
fn every_hex_block_is_a_golden_example() {
    let doc = doc();
    let found = examples(&doc);
    let hex_blocks = doc.lines().filter(|l| l.trim() == "```hex").count();
    assert_eq!(found.len(), hex_blocks, "every ```hex block must follow a <!-- golden: NAME --> comment");
    // At least the frames the protocol cannot be understood without.
    for required in [
        "request_hello",
        "request_create_episodes",
        "request_step_text",
        "request_step_tool",
        "request_fork",
        "request_close",
        "response_welcome",
        "response_episodes_created",
        "response_stepped",
        "response_error",
    ] {
        assert!(found.iter().any(|e| e.name == required), "PROTOCOL.md has no example of {required}");
    }
}

#[test]
fn examples_are_golden_frames_that_round_trip() {
    let golden = crate_dir().join("tests").join("golden");
    let found = examples(&doc());
    assert!(!found.is_empty());
    for ex in &found {
        let name = &ex.name;
        let hex = strip_ws(&ex.hex);
        assert_eq!(
            hex,
            strip_ws(&read(&golden.join(format!("{name}.hex")))),
            "{name}: hex differs from the golden file"
        );
        let bytes = hex_bytes(&hex);
        let reencoded = if name.starts_with("request_") {
            let env = decode_request(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
            encode(&env).unwrap_or_else(|e| panic!("{name}: {e}"))
        } else if name.starts_with("response_") {
            let env = decode_response(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
            encode(&env).unwrap_or_else(|e| panic!("{name}: {e}"))
        } else {
            panic!("{name}: golden names start with request_ or response_");
        };
        assert_eq!(reencoded, bytes, "{name}: decoding and re-encoding changed the bytes");
        let shown: serde_json::Value =
            serde_json::from_str(&ex.json).unwrap_or_else(|e| panic!("{name}: json block does not parse: {e}"));
        let expected: serde_json::Value = serde_json::from_str(&read(&golden.join(format!("{name}.json"))))
            .unwrap_or_else(|e| panic!("{name}: golden json: {e}"));
        assert_eq!(shown, expected, "{name}: json block differs from the golden value");
    }
}

#[test]
fn every_error_code_is_documented_with_its_number() {
    let doc = doc();
    for code in ErrorCode::ALL {
        let row = format!("| `{}` | {} |", code.name(), code.number());
        assert!(doc.contains(&row), "PROTOCOL.md lacks the error table row starting {row:?}");
    }
}

#[test]
fn parser_rejects_a_broken_example() {
    let broken = "<!-- golden: request_ping -->\n```json\n{}\n```\n";
    let result = std::panic::catch_unwind(|| examples(broken));
    assert!(result.is_err(), "a golden comment without a hex block must be an error");
    let ok = "<!-- golden: x -->\n\n```hex\nab cd\n```\n\n```json\n1\n```\n";
    let found = examples(ok);
    assert_eq!((found[0].name.as_str(), strip_ws(&found[0].hex).as_str(), found[0].json.as_str()), ("x", "abcd", "1"));
}
