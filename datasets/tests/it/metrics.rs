//! Table-driven checks of `docs/tree-grpo-spec.md` §4: normalisation, EM, F1, answer extraction,
//! the format state machine, and every row of the EM and F1 reward tables.

use grove_datasets::Metric;
use grove_datasets::metrics::*;

fn golds(g: &[&str]) -> Vec<String> {
    g.iter().map(|s| s.to_string()).collect()
}

#[test]
fn normalisation() {
    let cases = [
        ("The Eiffel Tower", "eiffel tower"),
        ("  a  cat,  AN apple; the end. ", "cat apple end"),
        ("theater", "theater"),      // articles only as whole words
        ("Anne's cat", "annes cat"), // punctuation removed before articles
        ("U.S.A.", "usa"),
        ("rock-and-roll", "rockandroll"), // hyphens are punctuation, not spaces
        ("1,000,000", "1000000"),
        ("Café  Müller", "café müller"),
        ("the’s", "’s"), // a non-ASCII mark is not punctuation but breaks a word
        ("a", ""),
        ("\tTHE\nAnswer\u{1f}x ", "answer x"),
        ("(a) b_c", "bc"),
    ];
    for (input, expected) in cases {
        assert_eq!(normalize_answer(input), expected, "{input:?}");
    }
}

#[test]
fn exact_match_table() {
    let cases: [(&str, &[&str], f64); 7] = [
        ("Paris", &["paris"], 1.0),
        ("the Paris", &["Paris."], 1.0),
        ("Paris, France", &["Paris"], 0.0),
        ("Ada Kerrigan", &["A. Kerrigan", "Ada Kerrigan"], 1.0),
        ("", &["x"], 0.0),
        ("", &[""], 1.0),
        ("1788", &["1788"], 1.0),
    ];
    for (pred, g, want) in cases {
        assert_eq!(exact_match(pred, &golds(g)), want, "{pred:?} vs {g:?}");
    }
}

#[test]
fn f1_table() {
    let cases: [(&str, &[&str], f64); 10] = [
        ("Paris", &["Paris"], 1.0),
        ("Paris France", &["Paris"], 2.0 * 0.5 * 1.0 / 1.5),
        ("the big red dog", &["red dog"], 2.0 * (2.0 / 3.0) * 1.0 / (2.0 / 3.0 + 1.0)),
        ("dog dog", &["dog"], 2.0 * 0.5 * 1.0 / 1.5), // multiset overlap counts once
        ("cat", &["dog"], 0.0),
        ("yes", &["no"], 0.0),
        ("yes", &["yes"], 1.0),
        ("yes it is", &["yes"], 0.0), // yes/no/noanswer rule: differing strings score 0
        ("noanswer", &["something"], 0.0),
        ("green white", &["white", "green and white"], 0.8), // max over golds: p=1, r=2/3
    ];
    for (pred, g, want) in cases {
        let got = f1_score(pred, &golds(g));
        assert!((got - want).abs() < 1e-12, "{pred:?} vs {g:?}: {got} != {want}");
    }
}

#[test]
fn answer_extraction() {
    let prompt = "Answer ... for example <answer> Beijing </answer>. Question: x?\n";
    // Whole sequence: needs two matches, the first being the prompt's example.
    assert_eq!(extract_answer(prompt), None);
    assert_eq!(extract_answer(&format!("{prompt}<answer> Paris </answer>")).as_deref(), Some("Paris"));
    assert_eq!(extract_answer(&format!("{prompt}<answer>a</answer> <answer>\n b \n</answer>")).as_deref(), Some("b"));
    // Unclosed answers do not count.
    assert_eq!(extract_answer(&format!("{prompt}<answer> Paris")), None);
    // Response only: one match suffices.
    assert_eq!(extract_answer_from_response("<think>x</think><answer> Rome </answer>").as_deref(), Some("Rome"));
    assert_eq!(extract_answer_from_response("<answer></answer>").as_deref(), Some(""));
    assert_eq!(extract_answer_from_response("no tags"), None);
    // Lazy and non-overlapping: `<answer>a<answer>b</answer>` is one match with inner `a<answer>b`.
    assert_eq!(extract_answer_from_response("<answer>a<answer>b</answer>").as_deref(), Some("a<answer>b"));
}

const INFO: &str = "\n\n<information>Doc 1(Title: \"X\") Paris is big.\n</information>\n\n";

#[test]
fn format_state_machine() {
    let valid = [
        "<think>t</think><answer>a</answer>".to_string(),
        format!("<think>t</think>\n<search> q </search>{INFO}<think>u</think> <answer> a </answer>"),
        format!(
            "<think>t</think><search>q</search>{INFO}<think>u</think><search>r</search>{INFO}<think>v</think><answer>a</answer>"
        ),
        "  <think>\n</think>  <answer>a</answer>  ".to_string(),
    ];
    let invalid = [
        ("no think", "<answer>a</answer>".to_string()),
        ("text before think", "hi <think>t</think><answer>a</answer>".to_string()),
        ("text between", "<think>t</think> so <answer>a</answer>".to_string()),
        ("text after answer", "<think>t</think><answer>a</answer> done".to_string()),
        ("no answer", format!("<think>t</think><search>q</search>{INFO}")),
        ("unbalanced", "<think>t</think><answer>a</answer></think>".to_string()),
        ("truncated information", "<think>t</think><search>q</search>\n\n<information>Doc 1".to_string()),
        ("search without information", "<think>t</think><search>q</search><think>u</think><answer>a</answer>".to_string()),
        (
            "corrective message",
            "<think>t</think>oops\nMy previous action is invalid. Let me try again.\n<think>u</think><answer>a</answer>".to_string(),
        ),
        ("two answers", "<think>t</think><answer>a</answer><think>u</think><answer>b</answer>".to_string()),
        ("empty", String::new()),
    ];
    for v in &valid {
        assert!(is_valid_response(v), "should be valid: {v:?}");
        assert!(is_valid_sequence(&format!(
            "<|im_start|>user\n<answer> Beijing </answer><|im_end|>\n<|im_start|>assistant\n{v}"
        )));
    }
    for (why, v) in &invalid {
        assert!(!is_valid_response(v), "should be invalid ({why}): {v:?}");
    }
    // Without the ChatML assistant marker the whole sequence is invalid (Llama-3 templates).
    assert!(!is_valid_sequence(&format!("<|start_header_id|>assistant<|end_header_id|>\n\n{}", valid[0])));
}

/// Every row of the EM table of spec §4.4 with s = 0.2, f = 0.1, r = 0; plus r > 0 and validation.
#[test]
fn em_reward_table() {
    let g = golds(&["Paris"]);
    let ok = "<think>t</think><answer> Paris </answer>";
    let wrong = "<think>t</think><answer> Rome </answer>";
    let bad_ok = "<answer> Paris </answer>";
    let bad_wrong = "<answer> Rome </answer>";
    let unclosed = format!("<think>t</think><search>q</search>{INFO}<think>u</think><answer>");
    let full = |resp: &str| {
        format!("<|im_start|>user\nfor example <answer> Beijing </answer><|im_end|>\n<|im_start|>assistant\n{resp}")
    };
    let rows: [(&str, String, f64, Option<&str>, bool); 6] = [
        ("no answer, invalid", "<think>t</think> I give up".into(), 0.0, None, false),
        ("no answer, invalid (unclosed answer)", unclosed, 0.0, None, false),
        ("correct, valid", ok.into(), 1.0, Some("Paris"), true),
        ("correct, invalid", bad_ok.into(), 0.8, Some("Paris"), false),
        ("wrong, valid", wrong.into(), 0.2, Some("Rome"), true),
        ("wrong, invalid", bad_wrong.into(), 0.1, Some("Rome"), false),
    ];
    for (why, resp, want, answer, valid) in &rows {
        for scored in [Scored::Response(resp), Scored::FullSequence(&full(resp))] {
            let r = compute_reward(scored, &g, Metric::Em, RewardConfig::TRAINING);
            assert!((r.score - want).abs() < 1e-12, "{why}: {} != {want} ({scored:?})", r.score);
            assert_eq!(r.answer.as_deref(), *answer, "{why}");
            assert_eq!(r.format_valid, *valid, "{why}");
        }
    }
    // "No answer, valid format": a valid trajectory always ends in an answer, so this row is only
    // reached in full-sequence mode when the prompt carries no example answer (one match < two).
    let prompt_only_answer =
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>t</think><answer> Paris </answer>";
    let r = compute_reward(Scored::FullSequence(prompt_only_answer), &g, Metric::Em, RewardConfig::TRAINING);
    assert_eq!((r.answer.clone(), r.format_valid), (None, true));
    assert!((r.score - 0.2).abs() < 1e-12, "no answer, valid: {}", r.score);
    // With a retrieval score, s + r when the gold answer was retrieved.
    let cfg = RewardConfig { retrieval_score: 0.3, ..RewardConfig::TRAINING };
    let retrieved = format!("<think>t</think><search>q</search>{INFO}<think>u</think><answer> Rome </answer>");
    let r = compute_reward(Scored::Response(&retrieved), &g, Metric::Em, cfg);
    assert!(r.retrieval_correct);
    assert!((r.score - 0.5).abs() < 1e-12, "{}", r.score);
    // Validation: pure EM.
    for (resp, want) in [(ok, 1.0), (bad_ok, 1.0), (wrong, 0.0), (bad_wrong, 0.0)] {
        let r = compute_reward(Scored::Response(resp), &g, Metric::Em, RewardConfig::VALIDATION);
        assert_eq!(r.score, want, "{resp}");
    }
}

/// Every row of the F1 table of spec §4.4.
#[test]
fn f1_reward_table() {
    let g = golds(&["green and white"]);
    let half = 0.5; // "green" vs "green and white": p = 1, r = 1/3
    let rows: [(&str, &str, f64); 6] = [
        ("no answer, invalid", "<think>t</think> nothing", 0.0),
        ("F>0, valid, exact", "<think>t</think><answer>green and white</answer>", 1.0),
        ("F>0, valid, partial", "<think>t</think><answer>green</answer>", half),
        ("F>0, invalid", "<answer>green</answer>", half - 0.2),
        ("F=0, valid", "<think>t</think><answer>red</answer>", 0.2),
        ("F=0, invalid (f unused)", "<answer>red</answer>", 0.0),
    ];
    for (why, resp, want) in rows {
        let r = compute_reward(Scored::Response(resp), &g, Metric::F1, RewardConfig::TRAINING);
        assert!((r.score - want).abs() < 1e-12, "{why}: {} != {want}", r.score);
    }
    // Correct but malformed with low F1 goes negative, as in the reference.
    let r = compute_reward(
        Scored::Response("<answer>green b c d e f g h i j k l</answer>"),
        &golds(&["green"]),
        Metric::F1,
        RewardConfig::TRAINING,
    );
    assert!(r.score < 0.0, "{}", r.score);
    // No answer, valid format (full-sequence mode, the only answer is the prompt's).
    let seq = "<|im_start|>assistant\n<think>t</think><answer>x</answer>";
    let r = compute_reward(Scored::FullSequence(seq), &g, Metric::F1, RewardConfig::TRAINING);
    assert!(r.answer.is_none() && r.format_valid && (r.score - 0.2).abs() < 1e-12);
    // Validation: pure F1.
    let r = compute_reward(Scored::Response("<answer>green</answer>"), &g, Metric::F1, RewardConfig::VALIDATION);
    assert!((r.score - half).abs() < 1e-12);
}

#[test]
fn source_routing() {
    for s in [
        "nq",
        "triviaqa",
        "popqa",
        "web_questions",
        "hotpotqa",
        "2wikimultihopqa",
        "musique",
        "bamboogle",
        "strategyqa",
    ] {
        assert_eq!(grove_datasets::metric_for_source(s), Metric::Em, "{s}");
    }
    for s in ["simpleqa", "gaia", "webwalkerqa", "NQ", ""] {
        assert_eq!(grove_datasets::metric_for_source(s), Metric::F1, "{s}");
    }
}
