//! Turning an agent's action into a tool call: the Search-R1 tag grammar for text, and the
//! structured form for third-party agents.

use grove_protocol::{ActionKind, ErrorCode, ErrorInfo, ToolCall};

/// A parsed action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub kind: ActionKind,
    /// Query or answer, stripped; empty for invalid actions.
    pub content: String,
}

/// The first (left-most) `<search>…</search>` or `<answer>…</answer>` (lazy, across newlines). An
/// opening tag without its closing tag is skipped, as a regex would. No match is an invalid
/// action.
pub fn parse_text(text: &str) -> Parsed {
    parse_text_with(text, false)
}

/// [`parse_text`], with `<open>…</open>` as a third tool where the environment offers it (web
/// tasks). Where it does not, `<open>` is plain text, as it is to Search-R1.
pub fn parse_text_with(text: &str, open: bool) -> Parsed {
    const TAGS: [(&str, &str, ActionKind); 3] = [
        ("<search>", "</search>", ActionKind::Search),
        ("<answer>", "</answer>", ActionKind::Answer),
        ("<open>", "</open>", ActionKind::Open),
    ];
    let tags = if open { &TAGS[..] } else { &TAGS[..2] };
    let mut from = 0;
    loop {
        let next = tags
            .iter()
            .filter_map(|(o, c, kind)| text[from..].find(o).map(|at| (from + at, *o, *c, *kind)))
            .min_by_key(|(at, ..)| *at);
        let Some((at, open_tag, close, kind)) = next else {
            return Parsed { kind: ActionKind::Invalid, content: String::new() };
        };
        let inner_start = at + open_tag.len();
        if let Some(end) = text[inner_start..].find(close) {
            return Parsed { kind, content: text[inner_start..inner_start + end].trim().to_string() };
        }
        from = at + 1;
    }
}

/// A structured tool call: `search {query}`, `answer {answer}`, or `open {url}` where the
/// environment offers it. Returns the parsed action and its rendering in tag form, which is what
/// the transcript records.
pub fn parse_tool(call: &ToolCall, open: bool) -> Result<(Parsed, String), ErrorInfo> {
    let arg = |name: &str| -> Result<String, ErrorInfo> {
        match call.arguments.get(name) {
            Some(serde_json::Value::String(s)) => Ok(s.trim().to_string()),
            Some(other) => Ok(other.to_string()),
            None => {
                Err(ErrorInfo::new(ErrorCode::InvalidAction, format!("tool `{}` needs argument `{name}`", call.name)))
            }
        }
    };
    let (kind, content) = match call.name.as_str() {
        "search" => (ActionKind::Search, arg("query")?),
        "answer" => (ActionKind::Answer, arg("answer")?),
        "open" if open => (ActionKind::Open, arg("url")?),
        other => {
            let offered = if open { "`search`, `open` and `answer`" } else { "`search` and `answer`" };
            return Err(ErrorInfo::new(
                ErrorCode::InvalidAction,
                format!("unknown tool `{other}` (this environment offers {offered})"),
            ));
        }
    };
    let tag = match kind {
        ActionKind::Search => "search",
        ActionKind::Open => "open",
        _ => "answer",
    };
    let text = format!("<{tag}> {content} </{tag}>");
    Ok((Parsed { kind, content }, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_grammar() {
        let cases = [
            ("<think>x</think><search> capital of France </search>", ActionKind::Search, "capital of France"),
            ("<answer>\n Paris\n</answer>", ActionKind::Answer, "Paris"),
            // The first match wins, whichever tag it is.
            ("<answer>A</answer><search>q</search>", ActionKind::Answer, "A"),
            ("<search>q</search><answer>A</answer>", ActionKind::Search, "q"),
            // An unclosed opening tag is skipped.
            ("<search> never closed <answer>A</answer>", ActionKind::Answer, "A"),
            ("<search>a <search>b</search>", ActionKind::Search, "a <search>b"),
            ("no tags at all", ActionKind::Invalid, ""),
            ("<Search>q</Search>", ActionKind::Invalid, ""),
            ("<search></search>", ActionKind::Search, ""),
            ("été <answer>ça</answer>", ActionKind::Answer, "ça"),
        ];
        for (text, kind, content) in cases {
            assert_eq!(parse_text(text), Parsed { kind, content: content.into() }, "{text:?}");
        }
    }

    #[test]
    fn tool_calls() {
        let call = |name: &str, k: &str, v: serde_json::Value| ToolCall {
            name: name.into(),
            arguments: [(k.to_string(), v)].into_iter().collect(),
        };
        let (p, text) = parse_tool(&call("search", "query", " rivers ".into()), false).unwrap();
        assert_eq!(
            (p.kind, p.content.as_str(), text.as_str()),
            (ActionKind::Search, "rivers", "<search> rivers </search>")
        );
        let (p, _) = parse_tool(&call("answer", "answer", 1788.into()), false).unwrap();
        assert_eq!(p.content, "1788");
        assert_eq!(parse_tool(&call("open", "url", "x".into()), false).unwrap_err().code, ErrorCode::InvalidAction);
        assert_eq!(parse_tool(&call("search", "q", "x".into()), false).unwrap_err().code, ErrorCode::InvalidAction);
        let (p, text) = parse_tool(&call("open", "url", " https://a.example/x ".into()), true).unwrap();
        assert_eq!(
            (p.kind, p.content.as_str(), text.as_str()),
            (ActionKind::Open, "https://a.example/x", "<open> https://a.example/x </open>")
        );
        assert_eq!(parse_tool(&call("open", "link", "x".into()), true).unwrap_err().code, ErrorCode::InvalidAction);
    }

    #[test]
    fn open_tag_only_where_offered() {
        let text = "<think>read it</think><open> https://en.wikipedia.org/wiki/Hamlet </open>";
        assert_eq!(parse_text(text).kind, ActionKind::Invalid);
        let p = parse_text_with(text, true);
        assert_eq!((p.kind, p.content.as_str()), (ActionKind::Open, "https://en.wikipedia.org/wiki/Hamlet"));
        // First tag wins across all three.
        assert_eq!(parse_text_with("<search>q</search><open>u</open>", true).kind, ActionKind::Search);
        assert_eq!(parse_text_with("<open>u</open><answer>a</answer>", true).kind, ActionKind::Open);
        assert_eq!(parse_text_with("<open> unclosed <answer>a</answer>", true).kind, ActionKind::Answer);
    }
}
