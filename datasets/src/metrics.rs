//! Answer metrics and the training reward of Search-R1 / Tree-GRPO (`docs/tree-grpo-spec.md` §4),
//! ported from the reference behaviour: SQuAD-style normalisation, EM, F1 with the yes/no/noanswer
//! rule, answer extraction, the format-validity state machine and the EM and F1 reward tables.

use std::collections::HashMap;

use crate::types::Metric;

/// Python's `string.punctuation`.
const PUNCTUATION: &str = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";

/// Python's `str.split()` whitespace: Unicode White_Space plus the four ASCII separators.
fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `\w` for str patterns.
fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// lowercase -> drop ASCII punctuation -> articles (`a`, `an`, `the` as whole words) become a
/// space -> collapse whitespace and trim.
pub fn normalize_answer(s: &str) -> String {
    let lowered: String = s.to_lowercase().chars().filter(|c| !PUNCTUATION.contains(*c)).collect();
    // `\b(a|an|the)\b`: an article is a whole maximal run of word characters.
    let mut no_articles = String::with_capacity(lowered.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if matches!(run.as_str(), "a" | "an" | "the") {
            out.push(' ');
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in lowered.chars() {
        if is_word(c) {
            run.push(c);
        } else {
            flush(&mut run, &mut no_articles);
            no_articles.push(c);
        }
    }
    flush(&mut run, &mut no_articles);
    no_articles.split(is_py_space).filter(|w| !w.is_empty()).collect::<Vec<_>>().join(" ")
}

/// 1.0 when the normalised prediction equals some normalised gold answer.
pub fn exact_match(prediction: &str, golds: &[String]) -> f64 {
    let p = normalize_answer(prediction);
    if golds.iter().any(|g| normalize_answer(g) == p) { 1.0 } else { 0.0 }
}

/// Token F1 against one gold answer, with the yes/no/noanswer rule.
fn f1_single(p: &str, g: &str) -> f64 {
    const SPECIAL: [&str; 3] = ["yes", "no", "noanswer"];
    if (SPECIAL.contains(&p) || SPECIAL.contains(&g)) && p != g {
        return 0.0;
    }
    let pred: Vec<&str> = p.split(is_py_space).filter(|w| !w.is_empty()).collect();
    let gold: Vec<&str> = g.split(is_py_space).filter(|w| !w.is_empty()).collect();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for w in &gold {
        *counts.entry(w).or_default() += 1;
    }
    let mut same = 0usize;
    for w in &pred {
        if let Some(c) = counts.get_mut(w).filter(|c| **c > 0) {
            *c -= 1;
            same += 1;
        }
    }
    if same == 0 {
        return 0.0;
    }
    let precision = same as f64 / pred.len() as f64;
    let recall = same as f64 / gold.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

/// The best token-level F1 over the gold answers.
pub fn f1_score(prediction: &str, golds: &[String]) -> f64 {
    let p = normalize_answer(prediction);
    golds.iter().map(|g| f1_single(&p, &normalize_answer(g))).fold(0.0, f64::max)
}

/// Inner texts of every non-overlapping `<open>...</close>` pair, left to right (lazy match,
/// newlines allowed), not stripped.
fn tagged_blocks<'a>(text: &'a str, open: &str, close: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(close) else { break };
        out.push(&after[..end]);
        rest = &after[end + close.len()..];
    }
    out
}

/// The answer of a *whole sequence* (prompt + response), as the reference extracts it: the last
/// `<answer>` block, but only when there are at least two, since the prompt's own example
/// (`<answer> Beijing </answer>`) is the first.
pub fn extract_answer(full_sequence: &str) -> Option<String> {
    extract_answer_min(full_sequence, 2)
}

/// The answer of a *response alone* (no prompt): the last `<answer>` block, if any.
pub fn extract_answer_from_response(response: &str) -> Option<String> {
    extract_answer_min(response, 1)
}

fn extract_answer_min(text: &str, min_matches: usize) -> Option<String> {
    let blocks = tagged_blocks(text, "<answer>", "</answer>");
    if blocks.len() < min_matches {
        return None;
    }
    blocks.last().map(|b| b.trim_matches(is_py_space).to_string())
}

/// The marker the reference format check looks for (Qwen's ChatML assistant turn).
pub const ASSISTANT_MARKER: &str = "<|im_start|>assistant";

const TAGS: [&str; 8] =
    ["<think>", "</think>", "<search>", "</search>", "<information>", "</information>", "<answer>", "</answer>"];

/// The format check on a whole decoded sequence: find the first `<|im_start|>assistant` (then
/// optional whitespace) and check what follows with [`is_valid_response`]. Without the marker the
/// format is invalid (so non-ChatML templates always fail it, spec §9.14).
pub fn is_valid_sequence(full_sequence: &str) -> bool {
    match full_sequence.find(ASSISTANT_MARKER) {
        Some(pos) => is_valid_response(&full_sequence[pos + ASSISTANT_MARKER.len()..]),
        None => false,
    }
}

/// The format state machine on the assistant's side of a conversation: balanced tags, every
/// turn `<think>…</think>` then `<search>…</search><information>…</information>` or
/// `<answer>…</answer>`, no text outside tags, and ending in an answer.
pub fn is_valid_response(content: &str) -> bool {
    for tag in ["think", "search", "information", "answer"] {
        let open = content.matches(&format!("<{tag}>")).count();
        let close = content.matches(&format!("</{tag}>")).count();
        if open != close {
            return false;
        }
    }
    #[derive(Clone, Copy, PartialEq)]
    enum S {
        Start,
        InThink,
        AfterThink,
        InSearch,
        AfterSearch,
        InInformation,
        Information,
        InAnswer,
        End,
    }
    let mut state = S::Start;
    for part in split_on_tags(content) {
        if part.chars().all(is_py_space) {
            continue;
        }
        if TAGS.contains(&part) {
            state = match (part, state) {
                ("<think>", S::Start | S::Information) => S::InThink,
                ("</think>", S::InThink) => S::AfterThink,
                ("<search>", S::AfterThink) => S::InSearch,
                ("</search>", S::InSearch) => S::AfterSearch,
                ("<information>", S::AfterSearch) => S::InInformation,
                ("</information>", S::InInformation) => S::Information,
                ("<answer>", S::AfterThink) => S::InAnswer,
                ("</answer>", S::InAnswer) => S::End,
                _ => return false,
            };
        } else if !matches!(state, S::InThink | S::InSearch | S::InInformation | S::InAnswer) {
            return false;
        }
    }
    state == S::End
}

/// `re.split` on the eight tags with the tags kept as their own parts.
fn split_on_tags(content: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut last = 0;
    let mut i = 0;
    while i < content.len() {
        let tag =
            (content.as_bytes()[i] == b'<').then(|| TAGS.iter().find(|t| content[i..].starts_with(**t))).flatten();
        if let Some(tag) = tag {
            parts.push(&content[last..i]);
            parts.push(&content[i..i + tag.len()]);
            i += tag.len();
            last = i;
        } else {
            i += 1;
        }
    }
    parts.push(&content[last..]);
    parts
}

/// Some normalised gold answer occurs inside some normalised `<information>` block.
pub fn retrieval_correct(text: &str, golds: &[String]) -> bool {
    let blocks: Vec<String> =
        tagged_blocks(text, "<information>", "</information>").iter().map(|b| normalize_answer(b)).collect();
    golds.iter().map(|g| normalize_answer(g)).any(|g| blocks.iter().any(|b| b.contains(&g)))
}

/// The three format scores of the reward tables (spec §4.4).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RewardConfig {
    /// `s`: paid for a well-formed trajectory without a correct answer.
    pub structure_format_score: f64,
    /// `f`: paid for a wrong answer in a malformed trajectory (EM only).
    pub final_format_score: f64,
    /// `r`: added to `s` when the gold answer was retrieved.
    pub retrieval_score: f64,
}

impl RewardConfig {
    /// The training scores of every Tree-GRPO script: s = 0.2, f = 0.1, r = 0.
    pub const TRAINING: RewardConfig =
        RewardConfig { structure_format_score: 0.2, final_format_score: 0.1, retrieval_score: 0.0 };
    /// Validation: s = f = r = 0, i.e. pure EM / pure F1.
    pub const VALIDATION: RewardConfig =
        RewardConfig { structure_format_score: 0.0, final_format_score: 0.0, retrieval_score: 0.0 };
}

impl Default for RewardConfig {
    fn default() -> Self {
        Self::TRAINING
    }
}

/// What the reward was computed from.
#[derive(Debug, Clone, PartialEq)]
pub struct RewardBreakdown {
    pub score: f64,
    pub answer: Option<String>,
    /// Pure EM or F1 of `answer` (0 without one).
    pub metric_value: f64,
    pub format_valid: bool,
    pub retrieval_correct: bool,
}

/// Which text is scored.
#[derive(Debug, Clone, Copy)]
pub enum Scored<'a> {
    /// Prompt + response decoded with special tokens kept, as the reference scores it.
    FullSequence(&'a str),
    /// The assistant's side only (what follows the assistant marker), as the env-server holds it.
    Response(&'a str),
}

/// The training reward of one trajectory: the EM table or the F1 table of spec §4.4.
pub fn compute_reward(text: Scored<'_>, golds: &[String], metric: Metric, cfg: RewardConfig) -> RewardBreakdown {
    let (format_valid, answer, body) = match text {
        Scored::FullSequence(s) => (is_valid_sequence(s), extract_answer(s), s),
        Scored::Response(s) => (is_valid_response(s), extract_answer_from_response(s), s),
    };
    let retrieved = format_valid && retrieval_correct(body, golds);
    let s = cfg.structure_format_score;
    let structure = if retrieved { s + cfg.retrieval_score } else { s };
    let (score, metric_value) = match (&answer, metric) {
        (None, _) => (if format_valid { structure } else { 0.0 }, 0.0),
        (Some(a), Metric::Em) => {
            let em = exact_match(a, golds);
            let score = match (em > 0.0, format_valid) {
                (true, true) => 1.0,
                (true, false) => 1.0 - s,
                (false, true) => structure,
                (false, false) => cfg.final_format_score,
            };
            (score, em)
        }
        (Some(a), Metric::F1) => {
            let f1 = f1_score(a, golds);
            let score = match (f1 > 0.0, format_valid) {
                (true, true) => f1,
                (true, false) => f1 - s,
                (false, true) => structure,
                (false, false) => 0.0,
            };
            (score, f1)
        }
    };
    RewardBreakdown { score, answer, metric_value, format_valid, retrieval_correct: retrieved }
}
