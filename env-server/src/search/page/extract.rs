//! HTML (or plain text) to what the model reads: the body decoded as UTF-8, the kind sniffed when
//! the server gave no content type, the title and main text from readability (dom_smoothie) with
//! a visible-text fallback, whitespace tidied, and a title made from the URL when the page has
//! none.

use url::Url;

use super::Page;
use super::fetch::{Fetched, Kind};
use crate::search::SearchError;

/// Elements readability may walk; bigger documents go straight to the plain-text fallback.
const MAX_ELEMENTS: usize = 200_000;

/// The page a fetch gave: its text extracted (HTML) or tidied (plain text). CPU work: the caller
/// runs it on the blocking pool.
pub(super) fn page_of(fetched: Fetched) -> Result<Page, SearchError> {
    let Fetched { url, kind, body, truncated } = fetched;
    let body = decode(&body, truncated);
    let kind = match kind {
        Kind::Sniff if looks_like_html(&body) => Kind::Html,
        Kind::Sniff if looks_binary(&body) => {
            return Err(SearchError::Unusable("content type unknown (binary data)".into()));
        }
        Kind::Sniff => Kind::Plain,
        k => k,
    };
    let (title, text) = match kind {
        Kind::Html => extract_text(&body, &url),
        _ => (String::new(), tidy(&body)),
    };
    let title = if title.is_empty() { title_from_url(&url) } else { title };
    Ok(Page { url, title, text, truncated })
}

/// UTF-8, lossily; a character cut by the byte cap is dropped rather than replaced.
fn decode(bytes: &[u8], truncated: bool) -> String {
    let bytes = match std::str::from_utf8(bytes) {
        Err(e) if truncated && e.error_len().is_none() => &bytes[..e.valid_up_to()],
        _ => bytes,
    };
    String::from_utf8_lossy(bytes).into_owned()
}

fn looks_like_html(body: &str) -> bool {
    let head: String = body.trim_start_matches(['\u{feff}', ' ', '\t', '\r', '\n']).chars().take(1024).collect();
    let head = head.to_ascii_lowercase();
    head.starts_with("<!doctype html")
        || head.starts_with("<html")
        || ["<html", "<head", "<body", "<title", "<meta ", "<p>", "<div"].iter().any(|tag| head.contains(tag))
}

/// Binary data decoded lossily: NUL bytes or many replacement characters.
fn looks_binary(body: &str) -> bool {
    let sample: Vec<char> = body.chars().take(4096).collect();
    let odd = sample.iter().filter(|&&c| c == '\u{fffd}' || (c.is_control() && !c.is_whitespace())).count();
    body.starts_with("%PDF") || sample.contains(&'\0') || odd * 20 > sample.len().max(1)
}

/// The title of a page that has none: its last path segment, or the URL.
fn title_from_url(url: &str) -> String {
    Url::parse(url)
        .ok()
        .and_then(|u| u.path_segments().and_then(|mut s| s.rfind(|seg| !seg.is_empty()).map(str::to_string)))
        .unwrap_or_else(|| url.to_string())
}

/// Readable text of an HTML page: `(title, text)`. The title and main text come from
/// readability; when it finds no article, the visible body text (no script, style or noscript).
/// Whitespace is collapsed, paragraphs are kept as line breaks.
pub fn extract_text(html: &str, url: &str) -> (String, String) {
    let config = dom_smoothie::Config {
        text_mode: dom_smoothie::TextMode::Formatted,
        max_elements_to_parse: MAX_ELEMENTS,
        disable_json_ld: true,
        ..dom_smoothie::Config::default()
    };
    let doc_url = Url::parse(url).ok().filter(|u| matches!(u.scheme(), "http" | "https")).map(|_| url);
    let article = dom_smoothie::Readability::new(html, doc_url, Some(config)).ok().and_then(|mut r| r.parse().ok());
    let (mut title, mut text) = match article {
        Some(a) => (tidy(&a.title), tidy(&a.text_content)),
        None => (String::new(), String::new()),
    };
    if text.is_empty() || title.is_empty() {
        let (fallback_title, fallback_text) = visible_text(html);
        if title.is_empty() {
            title = fallback_title;
        }
        if text.is_empty() {
            text = fallback_text;
        }
    }
    (title, text)
}

/// The `<title>` and the visible text of the body, without readability's judgement.
fn visible_text(html: &str) -> (String, String) {
    let doc = dom_smoothie::Readability::from(html).doc;
    let title = tidy(&doc.select("title").first().text());
    doc.select("script, style, noscript, template, head").remove();
    let body = doc.select("body");
    let text = if body.exists() { body.formatted_text() } else { doc.formatted_text() };
    (title, tidy(&text))
}

/// Collapse runs of whitespace inside lines, trim lines and drop empty ones.
fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut words = line.split_whitespace().peekable();
        if words.peek().is_none() {
            continue;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        for (i, word) in words.enumerate() {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(word);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::testkit::{Canned, ScriptedServer};

    #[test]
    fn extract_text_falls_back_to_visible_body_text() {
        let html = "<html><head><title>Tiny</title><style>p{x:SECRETSTYLE}</style></head><body>\
                    <script>SECRETSCRIPT</script><noscript>SECRETNOSCRIPT</noscript>\
                    <div>Hello   there</div><div>second\n\n   line</div></body></html>";
        let (title, text) = extract_text(html, "http://example.com/tiny");
        assert_eq!(title, "Tiny");
        assert!(text.contains("Hello there"), "{text}");
        assert!(text.contains("second"), "{text}");
        for secret in ["SECRETSTYLE", "SECRETSCRIPT", "SECRETNOSCRIPT"] {
            assert!(!text.contains(secret), "{secret} leaked: {text}");
        }
        let (_, visible) = visible_text(html);
        assert!(visible.contains("Hello there") && visible.contains('\n'), "{visible:?}");
        assert!(!visible.contains("SECRET"), "{visible}");
    }

    #[tokio::test]
    async fn plain_text_page() {
        let server = ScriptedServer::start(|_| {
            Canned::status(200, "First line.\n\n  Second   line.\n").header("content-type", "text/plain; charset=utf-8")
        })
        .await
        .unwrap();
        let page = fetcher(cfg(true)).fetch(&format!("{}/docs/notes.txt", server.url())).await.unwrap();
        assert_eq!(page.title, "notes.txt");
        assert_eq!(page.text, "First line.\nSecond line.");
    }

    #[tokio::test]
    async fn missing_content_type_is_sniffed() {
        let server = ScriptedServer::start(|r| {
            if r.target == "/html" {
                Canned::status(200, "<html><head><title>Sniffed</title></head><body><p>Body text.</p></body></html>")
            } else {
                Canned::status(200, vec![0x25, 0x50, 0x44, 0x46, 0, 1, 2, 0xff, 0xfe])
            }
        })
        .await
        .unwrap();
        let f = fetcher(cfg(true));
        let page = f.fetch(&format!("{}/html", server.url())).await.unwrap();
        assert_eq!(page.title, "Sniffed");
        assert!(page.text.contains("Body text."), "{}", page.text);
        let err = f.fetch(&format!("{}/bin", server.url())).await.unwrap_err();
        assert!(matches!(err, SearchError::Unusable(_)), "{err:?}");
    }

    #[test]
    fn truncated_utf8_is_not_replaced() {
        let bytes = "ab€".as_bytes();
        assert_eq!(decode(&bytes[..3], true), "ab");
        assert_eq!(decode(&bytes[..3], false), "ab\u{fffd}");
    }
}
