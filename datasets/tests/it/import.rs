//! The importers on small inputs of the real shapes, and (after `cargo xtask assets`) on the
//! real files.

use std::collections::HashMap;

use grove_datasets::assets;
use grove_datasets::import::{fanoutqa, wiki_summaries};
use grove_datasets::loaders::{load_qa_jsonl, load_wiki18};
use grove_datasets::{Metric, OnBadRow};

#[test]
fn wiki_summaries_shape() {
    let json = br#"{
        "Zebra": {"title": "Zebra", "extract": "Zebras are\nAfrican equines.", "description": "x", "topic": "y"},
        "Apple": {"title": "Apple", "extract": "An apple is a fruit.", "description": "", "topic": ""},
        "Empty": {"title": "Empty", "extract": "  "}
    }"#;
    let (passages, report) = wiki_summaries(json).unwrap();
    assert_eq!((report.read, report.written, report.skipped.len()), (3, 2, 1));
    assert_eq!(passages[0].title, "Apple");
    assert_eq!(passages[0].id, "wiki-0");
    assert_eq!(passages[1].contents(), "\"Zebra\"\nZebras are African equines.");
    assert!(wiki_summaries(b"[1, 2]").is_err());
}

#[test]
fn fanoutqa_shape() {
    let json = br#"[{"id": "q1", "question": "Top?", "answer": {"a": "b"}, "decomposition": [
        {"id": "s1", "question": "Who heads Acme?", "answer": "Jo Smith", "depends_on": [],
         "evidence": {"title": "Acme", "pageid": 1}, "decomposition": []},
        {"id": "s2", "question": "Which ones?", "answer": ["x", "y"], "depends_on": ["s1"],
         "evidence": {"title": "Acme"}, "decomposition": [
            {"id": "s3", "question": "Is it big?", "answer": true, "depends_on": [], "evidence": {"title": "Nowhere"}, "decomposition": []}
         ]},
        {"id": "s4", "question": "How tall?", "answer": 8848.86, "depends_on": [], "evidence": {"title": "Everest"}, "decomposition": []},
        {"id": "s5", "question": "Nothing?", "answer": null, "depends_on": [], "evidence": null, "decomposition": []}
    ]}]"#;
    let corpus: HashMap<String, String> = [
        ("Acme".to_string(), "Acme is led by Jo Smith.".to_string()),
        ("Everest".to_string(), "It is 8,848.86 m tall.".to_string()),
    ]
    .into();
    let (rows, report) = fanoutqa(json, &corpus).unwrap();
    assert_eq!(report.read, 5);
    assert_eq!(report.skipped.len(), 1, "{:?}", report.skipped);
    let ids: Vec<_> = rows.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["s1", "s2", "s3", "s4"]);
    let flag = |i: usize, k: &str| rows[i].metadata[k].as_bool().unwrap();
    assert!(flag(0, "in_corpus") && flag(0, "answer_in_passage") && flag(0, "leaf"));
    assert_eq!(rows[1].golden_answers, ["x, y"]);
    assert!(flag(1, "in_corpus") && !flag(1, "answer_in_passage") && !flag(1, "leaf"));
    assert_eq!(rows[2].golden_answers, ["yes"]);
    assert!(!flag(2, "in_corpus"));
    // "8848.86" normalises to "884886", as does "8,848.86".
    assert_eq!(rows[3].golden_answers, ["8848.86"]);
    assert!(flag(3, "answer_in_passage"));
    assert!(rows.iter().all(|r| r.metric == Some(Metric::Em) && r.data_source == "fanoutqa"));
    assert_eq!(rows[0].metadata["parent_question"], "Top?");
}

fn require(path: &std::path::Path) {
    assert!(path.exists(), "{} is missing: run `cargo xtask assets` (part of `cargo xtask test`)", path.display());
}

#[test]
fn real_wikipedia_summaries_corpus() {
    let path = assets::wiki_summaries_corpus();
    require(&path);
    let corpus = load_wiki18(&path, OnBadRow::Fail).unwrap().items;
    assert_eq!(corpus.len(), 10_033);
    let microsoft = corpus.iter().find(|p| p.title == "Microsoft").expect("Microsoft passage");
    assert!(microsoft.text.contains("Redmond, Washington"), "{}", microsoft.text);
    let words: usize = corpus.iter().map(|p| p.text.split_whitespace().count()).sum();
    let mean = words as f64 / corpus.len() as f64;
    assert!((60.0..130.0).contains(&mean), "mean passage length {mean} words");
    assert!(path.with_file_name("NOTICE").exists());
}

#[test]
fn real_fanoutqa_dev() {
    let path = assets::fanoutqa_dev();
    require(&path);
    let rows = load_qa_jsonl(&path, "fanoutqa", None, OnBadRow::Fail).unwrap().items;
    // 2,193 sub-questions; one ("What is the birthday of Tim Kingsbury?") has an empty answer.
    assert_eq!(rows.len(), 2_192);
    let count = |k: &str| rows.iter().filter(|r| r.metadata[k].as_bool() == Some(true)).count();
    assert_eq!(count("leaf"), 2_141);
    assert_eq!(count("in_corpus"), 558);
    // Scalar answers whose normalised text is inside the evidence passage (the doc's own join
    // counted 509 / 79 with a narrower notion of leaf; ours is every sub-question).
    assert_eq!(count("answer_in_passage"), 94);
    let ms = rows.iter().find(|r| r.question == "What is the headquarter of Microsoft?").unwrap();
    assert_eq!(ms.golden_answers, ["Redmond, Washington"]);
    assert_eq!(ms.metadata["answer_in_passage"], true);
    assert!(path.with_file_name("NOTICE").exists());
}
