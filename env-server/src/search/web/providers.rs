//! The providers' API shapes: how each provider's search request is built (endpoint parameters,
//! JSON body, where the key goes) and how its reply is normalised to [`WebResult`]s (where the
//! result list and each entry's URL, snippet and date live; HTML tags and entities in titles and
//! snippets cleaned).

use reqwest::header::HeaderValue;
use serde_json::{Value, json};

use super::{Provider, SearchError, WebConfig, WebResult};

/// Where a provider puts its result list and the fields of one entry.
struct Shape {
    list: &'static str,
    url: &'static str,
    snippet: &'static str,
    dates: &'static [&'static str],
}

/// Normalise one provider reply (the JSON body of a 200) to results ranked 1..n in provider order.
pub fn parse_response(provider: Provider, body: &Value) -> Result<Vec<WebResult>, SearchError> {
    let bad = |m: String| SearchError::BadReply(format!("{}: {m}", provider.name()));
    let obj = body.as_object().ok_or_else(|| bad("the reply is not a JSON object".into()))?;
    let error_text = ["error", "message"].iter().find_map(|k| obj.get(*k).and_then(Value::as_str));
    let (shape, list) = match provider {
        Provider::Serper => {
            let shape = Shape { list: "organic", url: "link", snippet: "snippet", dates: &["date"] };
            (shape, obj.get("organic"))
        }
        Provider::Serpapi => {
            let list = obj.get("organic_results");
            if list.is_none()
                && let Some(message) = obj.get("error").and_then(Value::as_str)
            {
                // SerpAPI answers a query without results with a 200 and this error.
                if message.contains("hasn't returned any results") {
                    return Ok(Vec::new());
                }
                return Err(bad(format!("error: {message}")));
            }
            let shape = Shape { list: "organic_results", url: "link", snippet: "snippet", dates: &["date"] };
            (shape, list)
        }
        Provider::Brave => {
            // Brave leaves out the `web` section when there are no web results.
            let list = match obj.get("web") {
                None | Some(Value::Null) => None,
                Some(Value::Object(web)) => web.get("results"),
                Some(_) => return Err(bad("`web` is not an object".into())),
            };
            let shape = Shape { list: "web.results", url: "url", snippet: "description", dates: &["page_age", "age"] };
            (shape, list)
        }
        Provider::Tavily | Provider::Searxng => {
            let dates: &'static [&'static str] =
                if provider == Provider::Tavily { &["published_date"] } else { &["publishedDate"] };
            let list = obj.get("results");
            if list.is_none() {
                let why = error_text.map_or_else(|| "no `results` list".to_string(), |m| format!("error: {m}"));
                return Err(bad(why));
            }
            (Shape { list: "results", url: "url", snippet: "content", dates }, list)
        }
    };
    let entries = match list {
        None | Some(Value::Null) => {
            // Serper without `organic` and without an error: no results.
            if provider == Provider::Serper
                && let Some(m) = error_text
            {
                return Err(bad(format!("error: {m}")));
            }
            return Ok(Vec::new());
        }
        Some(Value::Array(entries)) => entries,
        Some(_) => return Err(bad(format!("`{}` is not a list", shape.list))),
    };
    let text = |entry: &Value, key: &str| entry.get(key).and_then(Value::as_str).map(clean_text);
    let mut out = Vec::new();
    for entry in entries {
        let Some(url) = entry.get(shape.url).and_then(Value::as_str).map(str::trim).filter(|u| !u.is_empty()) else {
            continue;
        };
        let published = shape
            .dates
            .iter()
            .filter_map(|k| entry.get(*k).and_then(Value::as_str))
            .map(str::trim)
            .find(|d| !d.is_empty())
            .map(str::to_string);
        out.push(WebResult {
            rank: out.len() as u32 + 1,
            title: text(entry, "title").unwrap_or_default(),
            url: url.to_string(),
            snippet: text(entry, shape.snippet).unwrap_or_default(),
            published,
        });
    }
    Ok(out)
}

/// The provider's request for `query`: `key` (when there is one) goes where the provider wants
/// it, in a header marked sensitive or in the query string.
pub(super) fn request(
    http: &reqwest::Client,
    endpoint: &url::Url,
    cfg: &WebConfig,
    key: Option<&str>,
    query: &str,
) -> reqwest::RequestBuilder {
    let given = key;
    let key = key.unwrap_or("");
    let mut url = endpoint.clone();
    match cfg.provider {
        Provider::Serper => {
            let mut body = json!({ "q": query, "num": cfg.results });
            if let Some(gl) = &cfg.country {
                body["gl"] = json!(gl);
            }
            if let Some(hl) = &cfg.language {
                body["hl"] = json!(hl);
            }
            http.post(url).header("X-API-KEY", secret_header(key)).json(&body)
        }
        Provider::Serpapi => {
            {
                let mut q = url.query_pairs_mut();
                q.append_pair("engine", "google").append_pair("q", query).append_pair("api_key", key);
                q.append_pair("num", &cfg.results.to_string());
                if let Some(hl) = &cfg.language {
                    q.append_pair("hl", hl);
                }
                if let Some(gl) = &cfg.country {
                    q.append_pair("gl", gl);
                }
            }
            http.get(url)
        }
        Provider::Brave => {
            {
                let mut q = url.query_pairs_mut();
                q.append_pair("q", query).append_pair("count", &cfg.results.min(20).to_string());
                if let Some(country) = &cfg.country {
                    q.append_pair("country", country);
                }
                if let Some(lang) = &cfg.language {
                    q.append_pair("search_lang", lang);
                }
            }
            http.get(url)
                .header("X-Subscription-Token", secret_header(key))
                .header(reqwest::header::ACCEPT, "application/json")
        }
        Provider::Tavily => {
            let body = json!({ "query": query, "max_results": cfg.results, "search_depth": "basic" });
            http.post(url).header(reqwest::header::AUTHORIZATION, secret_header(&format!("Bearer {key}"))).json(&body)
        }
        Provider::Searxng => {
            {
                let mut q = url.query_pairs_mut();
                q.append_pair("q", query).append_pair("format", "json");
                if let Some(lang) = &cfg.language {
                    q.append_pair("language", lang);
                }
                q.append_pair("pageno", "1");
            }
            let req = http.get(url).header(reqwest::header::ACCEPT, "application/json");
            // A SearxNG behind an authenticating proxy may want a bearer token.
            match given {
                Some(_) => req.header(reqwest::header::AUTHORIZATION, secret_header(&format!("Bearer {key}"))),
                None => req,
            }
        }
    }
}

/// A header value holding (part of) the key, marked sensitive.
fn secret_header(value: &str) -> HeaderValue {
    let mut v = HeaderValue::from_str(value).unwrap_or_else(|_| HeaderValue::from_static(""));
    v.set_sensitive(true);
    v
}

/// Strip simple HTML tags, decode the common entities, collapse whitespace and trim.
fn clean_text(s: &str) -> String {
    let decoded = decode_entities(&strip_tags(s));
    decoded.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Remove `<tag …>` and `</tag>`; a `<` that does not open a tag (`a < b`) is kept.
fn strip_tags(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('<') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let name = after.strip_prefix('/').unwrap_or(after);
        let opens_tag = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic());
        match after.find('>') {
            Some(j) if opens_tag && !after[..j].contains('<') => rest = &after[j + 1..],
            _ => {
                out.push('<');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Decode `&amp;`-style named entities and numeric character references; unknown ones are kept.
fn decode_entities(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let decoded = after.find(';').filter(|&j| j <= 10).and_then(|j| {
            let name = &after[..j];
            let c = match name {
                "amp" => Some('&'),
                "lt" => Some('<'),
                "gt" => Some('>'),
                "quot" => Some('"'),
                "apos" => Some('\''),
                "nbsp" => Some(' '),
                _ => {
                    let num = name.strip_prefix('#')?;
                    let code = match num.strip_prefix(['x', 'X']) {
                        Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                        None => num.parse().ok()?,
                    };
                    char::from_u32(code)
                }
            };
            c.map(|c| (c, j))
        });
        match decoded {
            Some((c, j)) => {
                out.push(c);
                rest = &after[j + 1..];
            }
            None => {
                out.push('&');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::super::WebSearch;
    use super::super::test_support::*;
    use super::*;
    use crate::search::{RenderFormat, SearchBackend, Usage};
    use crate::testkit::Canned;

    #[tokio::test]
    async fn serper_request_and_normalisation() {
        let body = json!({
            "searchParameters": {"q": "rust language", "gl": "us", "hl": "en", "num": 10, "type": "search", "engine": "google"},
            "knowledgeGraph": {"title": "Rust", "type": "Programming language", "description": "A language."},
            "answerBox": {"title": "Rust", "answer": "2015", "link": "https://example.org/answer"},
            "organic": [
                {"title": "Rust <b>Programming</b> Language", "link": "https://www.rust-lang.org/", "snippet": "A language empowering <b>everyone</b>.", "position": 1,
                 "sitelinks": [{"title": "Install", "link": "https://www.rust-lang.org/tools/install"}]},
                {"title": "No link here", "snippet": "skipped", "position": 2},
                {"title": "Rust (programming language) - Wikipedia", "link": "https://en.wikipedia.org/wiki/Rust_(programming_language)", "snippet": "Rust is a general-purpose &amp; multi-paradigm language.", "date": "Jan 3, 2025", "position": 3},
                {"title": "Bare", "link": "https://bare.example/", "position": 4}
            ],
            "peopleAlsoAsk": [{"question": "Is Rust hard?", "snippet": "…", "title": "Q", "link": "https://q.example/"}],
            "relatedSearches": [{"query": "rust vs go"}],
            "credits": 1
        });
        let server = serve(Canned::json(&body)).await;
        let web = WebSearch::new(config(Provider::Serper, format!("{}/search", server.url()))).unwrap();
        let results = web.search_one("rust language").await.unwrap();

        let r = only_request(&server);
        assert_eq!(r.method, "POST");
        assert_eq!(path(&r), "/search");
        assert_eq!(r.header("x-api-key"), Some(KEY));
        assert_eq!(r.json(), json!({"q": "rust language", "num": 10, "gl": "us", "hl": "en"}));

        assert_eq!(results.len(), 3);
        assert_eq!(results.iter().map(|r| r.rank).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(results[0].title, "Rust Programming Language");
        assert_eq!(results[0].url, "https://www.rust-lang.org/");
        assert_eq!(results[0].snippet, "A language empowering everyone.");
        assert_eq!(results[0].published, None);
        assert_eq!(results[1].snippet, "Rust is a general-purpose & multi-paradigm language.");
        assert_eq!(results[1].published.as_deref(), Some("Jan 3, 2025"));
        assert_eq!(results[2].snippet, "");
        let usage = web.usage();
        assert_eq!(usage[0].0, "serper");
        assert_eq!(usage[0].1, Usage { calls: 1, ..Usage::default() });
    }

    #[tokio::test]
    async fn serpapi_request_and_normalisation() {
        let body = json!({
            "search_metadata": {"id": "abc", "status": "Success", "json_endpoint": "https://serpapi.com/searches/abc.json",
                                "created_at": "2025-01-01 00:00:00 UTC", "processed_at": "2025-01-01 00:00:00 UTC", "total_time_taken": 1.2},
            "search_parameters": {"engine": "google", "q": "who wrote hamlet", "google_domain": "google.com", "hl": "en", "gl": "us", "device": "desktop"},
            "search_information": {"total_results": 123, "time_taken_displayed": 0.3, "query_displayed": "who wrote hamlet"},
            "answer_box": {"type": "organic_result", "answer": "William Shakespeare"},
            "organic_results": [
                {"position": 1, "title": "Hamlet - Wikipedia", "link": "https://en.wikipedia.org/wiki/Hamlet", "displayed_link": "en.wikipedia.org › wiki › Hamlet",
                 "snippet": "The Tragedy of Hamlet is a tragedy written by <em>William Shakespeare</em>.", "source": "Wikipedia"},
                {"position": 2, "title": "Hamlet | Folger", "link": "https://www.folger.edu/hamlet", "snippet": "Read Hamlet.", "date": "Mar 2, 2024"},
                {"position": 3, "title": "Ad without link", "snippet": "none"}
            ],
            "related_questions": [{"question": "Who wrote Hamlet?", "snippet": "Shakespeare", "title": "t", "link": "https://x.example/"}],
            "related_searches": [{"query": "hamlet summary"}],
            "pagination": {"current": 1}, "serpapi_pagination": {"current": 1}
        });
        let server = serve(Canned::json(&body)).await;
        let mut cfg = config(Provider::Serpapi, format!("{}/search.json", server.url()));
        cfg.results = 7;
        cfg.country = Some("gb".into());
        let web = WebSearch::new(cfg).unwrap();
        let results = web.search_one("who wrote hamlet").await.unwrap();

        let r = only_request(&server);
        assert_eq!(r.method, "GET");
        assert_eq!(path(&r), "/search.json");
        assert_eq!(r.query_param("engine").as_deref(), Some("google"));
        assert_eq!(r.query_param("q").as_deref(), Some("who wrote hamlet"));
        assert_eq!(r.query_param("api_key").as_deref(), Some(KEY));
        assert_eq!(r.query_param("num").as_deref(), Some("7"));
        assert_eq!(r.query_param("hl").as_deref(), Some("en"));
        assert_eq!(r.query_param("gl").as_deref(), Some("gb"));

        assert_eq!(results.len(), 2);
        assert_eq!(results[0].rank, 1);
        assert_eq!(results[0].title, "Hamlet - Wikipedia");
        assert_eq!(results[0].snippet, "The Tragedy of Hamlet is a tragedy written by William Shakespeare.");
        assert_eq!(results[1].rank, 2);
        assert_eq!(results[1].url, "https://www.folger.edu/hamlet");
        assert_eq!(results[1].published.as_deref(), Some("Mar 2, 2024"));
    }

    #[tokio::test]
    async fn serpapi_error_bodies() {
        let none = json!({"search_metadata": {"status": "Success"}, "search_parameters": {"q": "zzqx"},
                          "error": "Google hasn't returned any results for this query."});
        assert_eq!(parse_response(Provider::Serpapi, &none).unwrap(), Vec::new());
        let other = json!({"error": "Your account has run out of searches."});
        match parse_response(Provider::Serpapi, &other) {
            Err(SearchError::BadReply(m)) => assert!(m.contains("run out of searches"), "{m}"),
            r => panic!("{r:?}"),
        }
        // The live path gives the same outcome.
        let server = serve(Canned::json(&none)).await;
        let web = WebSearch::new(config(Provider::Serpapi, format!("{}/search.json", server.url()))).unwrap();
        assert_eq!(web.search_one("zzqx").await.unwrap(), Vec::new());
    }

    #[tokio::test]
    async fn brave_request_and_normalisation() {
        let body = json!({
            "type": "search",
            "query": {"original": "tokio runtime", "show_strict_warning": false, "is_navigational": false, "spellcheck_off": true},
            "mixed": {"type": "mixed", "main": [{"type": "web", "index": 0, "all": false}]},
            "web": {"type": "search", "family_friendly": true, "results": [
                {"title": "<strong>Tokio</strong> - An asynchronous Rust runtime", "url": "https://tokio.rs/",
                 "description": "<strong>Tokio</strong> is an event-driven, non-blocking I/O platform. It&#x27;s fast.",
                 "page_age": "2024-11-02T10:00:00", "age": "November 2, 2024", "language": "en", "family_friendly": true,
                 "extra_snippets": ["more"], "meta_url": {"scheme": "https", "netloc": "tokio.rs", "hostname": "tokio.rs", "favicon": "https://imgs.search.brave.com/x", "path": ""}},
                {"title": "No url", "description": "skipped"},
                {"title": "tokio - Rust", "url": "https://docs.rs/tokio", "description": "A runtime for writing <strong>reliable</strong>\n network applications", "age": "3 days ago"}
            ]},
            "videos": {"type": "videos", "results": []}
        });
        let server = serve(Canned::json(&body)).await;
        let mut cfg = config(Provider::Brave, format!("{}/res/v1/web/search", server.url()));
        cfg.results = 50;
        let web = WebSearch::new(cfg).unwrap();
        let results = web.search_one("tokio runtime").await.unwrap();

        let r = only_request(&server);
        assert_eq!(r.method, "GET");
        assert_eq!(path(&r), "/res/v1/web/search");
        assert_eq!(r.query_param("q").as_deref(), Some("tokio runtime"));
        assert_eq!(r.query_param("count").as_deref(), Some("20"));
        assert_eq!(r.query_param("country").as_deref(), Some("us"));
        assert_eq!(r.query_param("search_lang").as_deref(), Some("en"));
        assert_eq!(r.header("x-subscription-token"), Some(KEY));
        assert_eq!(r.header("accept"), Some("application/json"));
        assert!(!r.target.contains(KEY));

        assert_eq!(results.len(), 2);
        assert_eq!(results[0].rank, 1);
        assert_eq!(results[0].title, "Tokio - An asynchronous Rust runtime");
        assert_eq!(results[0].snippet, "Tokio is an event-driven, non-blocking I/O platform. It's fast.");
        assert_eq!(results[0].published.as_deref(), Some("2024-11-02T10:00:00"));
        assert_eq!(results[1].rank, 2);
        assert_eq!(results[1].url, "https://docs.rs/tokio");
        assert_eq!(results[1].snippet, "A runtime for writing reliable network applications");
        assert_eq!(results[1].published.as_deref(), Some("3 days ago"));

        // No `web` section: no results.
        assert_eq!(parse_response(Provider::Brave, &json!({"type": "search", "query": {}})).unwrap(), Vec::new());
    }

    #[tokio::test]
    async fn tavily_request_and_normalisation() {
        let body = json!({
            "query": "capital of australia",
            "follow_up_questions": null,
            "answer": null,
            "images": [],
            "results": [
                {"title": "Canberra - Wikipedia", "url": "https://en.wikipedia.org/wiki/Canberra", "content": "Canberra is the capital city of Australia.",
                 "score": 0.98, "raw_content": null},
                {"title": "Missing url", "content": "skipped", "score": 0.5},
                {"title": "Canberra news", "url": "https://news.example/canberra", "content": "  News  about <b>Canberra</b> ", "score": 0.7,
                 "published_date": "Mon, 06 Jan 2025 10:00:00 GMT"}
            ],
            "response_time": 1.23,
            "request_id": "123e4567"
        });
        let server = serve(Canned::json(&body)).await;
        let mut cfg = config(Provider::Tavily, format!("{}/search", server.url()));
        cfg.results = 5;
        let web = WebSearch::new(cfg).unwrap();
        let results = web.search_one("capital of australia").await.unwrap();

        let r = only_request(&server);
        assert_eq!(r.method, "POST");
        assert_eq!(path(&r), "/search");
        assert_eq!(r.header("authorization"), Some(format!("Bearer {KEY}").as_str()));
        assert_eq!(r.json(), json!({"query": "capital of australia", "max_results": 5, "search_depth": "basic"}));

        assert_eq!(results.len(), 2);
        assert_eq!(results[0].title, "Canberra - Wikipedia");
        assert_eq!(results[0].snippet, "Canberra is the capital city of Australia.");
        assert_eq!(results[0].published, None);
        assert_eq!(results[1].rank, 2);
        assert_eq!(results[1].snippet, "News about Canberra");
        assert_eq!(results[1].published.as_deref(), Some("Mon, 06 Jan 2025 10:00:00 GMT"));
    }

    #[tokio::test]
    async fn searxng_request_and_normalisation() {
        let body = json!({
            "query": "ocaml",
            "results": [
                {"url": "https://ocaml.org/", "title": "OCaml", "content": "An industrial-strength <span class=\"highlight\">functional</span> language",
                 "engine": "brave", "engines": ["brave", "duckduckgo"], "positions": [1, 3], "score": 2.5, "category": "general",
                 "template": "default.html", "parsed_url": ["https", "ocaml.org", "/", "", "", ""], "thumbnail": "", "img_src": "",
                 "publishedDate": null, "priority": ""},
                {"url": "", "title": "Empty url", "content": "skipped"},
                {"url": "https://en.wikipedia.org/wiki/OCaml", "title": "OCaml - Wikipedia", "engine": "wikipedia", "engines": ["wikipedia"],
                 "positions": [2], "score": 1.0, "category": "general", "publishedDate": "2024-05-01T00:00:00"},
                {"url": "https://third.example/", "title": "Third", "content": "over the cap"}
            ],
            "answers": [], "corrections": [], "infoboxes": [], "suggestions": ["ocaml tutorial"],
            "unresponsive_engines": [["google", "timeout"]]
        });
        let server = serve(Canned::json(&body)).await;
        let mut cfg = config(Provider::Searxng, format!("{}/search", server.url()));
        cfg.api_key = None;
        cfg.results = 2;
        let web = WebSearch::new(cfg).unwrap();
        let results = web.search_one("ocaml").await.unwrap();

        let r = only_request(&server);
        assert_eq!(r.method, "GET");
        assert_eq!(path(&r), "/search");
        assert_eq!(r.query_param("q").as_deref(), Some("ocaml"));
        assert_eq!(r.query_param("format").as_deref(), Some("json"));
        assert_eq!(r.query_param("language").as_deref(), Some("en"));
        assert_eq!(r.query_param("pageno").as_deref(), Some("1"));

        assert_eq!(results.len(), 2, "capped at `results`");
        assert_eq!(results[0].snippet, "An industrial-strength functional language");
        assert_eq!(results[0].published, None);
        assert_eq!(results[1].rank, 2);
        assert_eq!(results[1].title, "OCaml - Wikipedia");
        assert_eq!(results[1].snippet, "");
        assert_eq!(results[1].published.as_deref(), Some("2024-05-01T00:00:00"));

        // Through the trait: hits in the Search-R1 shape, rendered as pages.
        let hits = web.search_each(vec!["ocaml".into()], 3).await;
        let hits = hits.into_iter().next().unwrap().unwrap();
        assert_eq!(hits[0].id, "https://ocaml.org/");
        assert_eq!(hits[0].url.as_deref(), Some("https://ocaml.org/"));
        assert_eq!(hits[0].contents, "\"OCaml\"\nAn industrial-strength functional language");
        assert_eq!(hits[0].title_and_text(), ("OCaml", "An industrial-strength functional language"));
        assert_eq!(web.render(), RenderFormat::Pages);
        assert_eq!(web.name(), "searxng");
    }

    #[test]
    fn wrong_shapes_are_bad_replies() {
        for (provider, body) in [
            (Provider::Serper, json!(["not", "an", "object"])),
            (Provider::Serper, json!({"organic": "nope"})),
            (Provider::Brave, json!({"web": {"results": {}}})),
            (Provider::Tavily, json!({"query": "x"})),
            (Provider::Searxng, json!({"query": "x", "results": 3})),
        ] {
            assert!(matches!(parse_response(provider, &body), Err(SearchError::BadReply(_))), "{provider:?} {body}");
        }
    }

    #[test]
    fn text_cleaning() {
        assert_eq!(
            clean_text("  <strong>Rust</strong> &amp; <em class=\"x\">C</em>: a < b, c > d &bogus; "),
            "Rust & C: a < b, c > d &bogus;"
        );
        assert_eq!(clean_text("It&#39;s &#x27;quoted&#x27;\n\tand &lt;b&gt; stays"), "It's 'quoted' and <b> stays");
        assert_eq!(clean_text("x <br/> y</p>"), "x y");
    }
}
