//! The loaders read files written by the tools users have (pyarrow, Python's json), and report
//! bad rows with their file and line.

use std::path::PathBuf;

use grove_datasets::loaders::{load_qa_jsonl, load_searchr1_parquet, load_wiki18, write_qa_jsonl, write_wiki18};
use grove_datasets::{DatasetError, Metric, OnBadRow};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures").join(name)
}

#[test]
fn flashrag_jsonl_fixture() {
    let loaded = load_qa_jsonl(&fixture("flashrag-sample.jsonl"), "nq", Some("train"), OnBadRow::Fail).unwrap();
    assert_eq!(loaded.items.len(), 6);
    assert!(loaded.bad_rows.is_empty());
    let first = &loaded.items[0];
    assert_eq!(first.id, "train_0");
    assert_eq!(first.question, "who designed the harbor bridge in port elmsworth?");
    assert_eq!(first.golden_answers, ["Ada Kerrigan", "A. Kerrigan"]);
    assert_eq!(first.data_source, "nq");
    assert_eq!(first.split.as_deref(), Some("train"));
    assert_eq!(first.metric(), Metric::Em);
    assert_eq!(loaded.items[5].golden_answers, ["green and white", "green & white"]);
}

#[test]
fn searchr1_parquet_fixture() {
    let loaded = load_searchr1_parquet(&fixture("searchr1-sample.parquet"), OnBadRow::Fail).unwrap();
    assert_eq!(loaded.items.len(), 6);
    let ids: Vec<_> = loaded.items.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["train_0", "train_1", "train_2", "train_3", "test_4", "test_5"]);
    let sources: Vec<_> = loaded.items.iter().map(|e| e.data_source.as_str()).collect();
    assert_eq!(sources, ["nq", "nq", "hotpotqa", "hotpotqa", "bamboogle", "triviaqa"]);
    let e = &loaded.items[3];
    assert_eq!(e.golden_answers, ["Lark Canal", "the Lark Canal"]);
    assert_eq!(e.question, "Which is older, the Lark Canal or the Elmsworth harbor bridge?");
    let prompt = e.metadata["prompt"].as_str().unwrap();
    assert!(prompt.ends_with("Question: Which is older, the Lark Canal or the Elmsworth harbor bridge?\n"), "{prompt}");
    assert!(prompt.contains("<answer> Beijing </answer>"));
    assert!(e.split.is_some());
    assert!(e.metadata["index"].is_i64());
}

#[test]
fn wiki18_fixture() {
    let loaded = load_wiki18(&fixture("wiki18-sample.jsonl"), OnBadRow::Fail).unwrap();
    assert_eq!(loaded.items.len(), 6);
    let p = &loaded.items[0];
    assert_eq!(p.id, "0");
    assert_eq!(p.title, "Elmsworth Harbor Bridge");
    assert!(p.text.starts_with("The Elmsworth Harbor Bridge is a steel arch bridge"));
    // The title line keeps its quotes in wiki-18 contents.
    assert!(p.contents().starts_with("\"Elmsworth Harbor Bridge\"\nThe Elmsworth"));
}

#[test]
fn write_then_read_is_identity() {
    let dir = tempfile::tempdir().unwrap();
    let qa = load_qa_jsonl(&fixture("flashrag-sample.jsonl"), "nq", None, OnBadRow::Fail).unwrap().items;
    let path = dir.path().join("qa.jsonl");
    write_qa_jsonl(&path, &qa).unwrap();
    assert_eq!(load_qa_jsonl(&path, "other", None, OnBadRow::Fail).unwrap().items, qa);

    let corpus = load_wiki18(&fixture("wiki18-sample.jsonl"), OnBadRow::Fail).unwrap().items;
    let path = dir.path().join("corpus.jsonl");
    write_wiki18(&path, &corpus).unwrap();
    assert_eq!(load_wiki18(&path, OnBadRow::Fail).unwrap().items, corpus);
    // Byte-identical to the file Python wrote, apart from JSON spacing.
    let ours: Vec<serde_json::Value> =
        std::fs::read_to_string(&path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let theirs: Vec<serde_json::Value> = std::fs::read_to_string(fixture("wiki18-sample.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(ours, theirs);
}

#[test]
fn bad_rows_name_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    std::fs::write(
        &path,
        concat!(
            "{\"id\": \"a\", \"question\": \"q?\", \"golden_answers\": [\"x\"]}\n",
            "\n",
            "{\"id\": \"b\", \"question\": \"q?\"}\n",
            "not json\n",
            "{\"id\": \"c\", \"question\": \"q?\", \"golden_answers\": [1, {\"x\": 2}]}\n",
            "{\"id\": \"d\", \"question\": \"q?\", \"golden_answers\": \"bare string\"}\n",
        ),
    )
    .unwrap();
    let err = load_qa_jsonl(&path, "nq", None, OnBadRow::Fail).unwrap_err();
    let DatasetError::Row(row) = &err else { panic!("{err}") };
    assert_eq!(row.line, 3);
    assert!(err.to_string().contains("bad.jsonl:3: missing field `golden_answers`"), "{err}");

    let loaded = load_qa_jsonl(&path, "nq", None, OnBadRow::Skip).unwrap();
    assert_eq!(loaded.items.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["a", "d"]);
    assert_eq!(loaded.items[1].golden_answers, ["bare string"]);
    assert_eq!(loaded.bad_rows.iter().map(|r| r.line).collect::<Vec<_>>(), [3, 4, 5]);
    assert!(loaded.bad_rows[1].message.starts_with("invalid JSON"));

    let corpus = dir.path().join("corpus.jsonl");
    std::fs::write(&corpus, "{\"id\": \"1\", \"contents\": \"\\\"T\\\"\\nx\"}\n{\"id\": 2}\n").unwrap();
    let err = load_wiki18(&corpus, OnBadRow::Fail).unwrap_err();
    assert!(err.to_string().contains("corpus.jsonl:2: missing field `contents`"), "{err}");
}

#[test]
fn unreadable_files_are_typed_errors() {
    let missing = PathBuf::from("/nonexistent/grove/file.jsonl");
    assert!(matches!(load_wiki18(&missing, OnBadRow::Fail), Err(DatasetError::Io { .. })));
    let dir = tempfile::tempdir().unwrap();
    let not_parquet = dir.path().join("x.parquet");
    std::fs::write(&not_parquet, b"PAR1 but not really").unwrap();
    let err = load_searchr1_parquet(&not_parquet, OnBadRow::Fail).unwrap_err();
    assert!(matches!(err, DatasetError::Format { .. }), "{err}");
    // A parquet file with the wrong columns reports the row.
    let flash = fixture("flashrag-sample.jsonl");
    assert!(load_searchr1_parquet(&flash, OnBadRow::Fail).is_err());
}

#[test]
fn parquet_rows_missing_columns_are_reported_by_row() {
    use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("partial.parquet");
    let schema = parse_message_type(
        "message m { required binary data_source (UTF8); required binary id (UTF8); required int64 n; }",
    )
    .unwrap();
    let mut w =
        SerializedFileWriter::new(std::fs::File::create(&path).unwrap(), Arc::new(schema), Default::default()).unwrap();
    let mut group = w.next_row_group().unwrap();
    for strings in [["nq", "nq"], ["a", "b"]] {
        let mut column = group.next_column().unwrap().unwrap();
        let values = strings.map(ByteArray::from);
        column.typed::<ByteArrayType>().write_batch(&values, None, None).unwrap();
        column.close().unwrap();
    }
    let mut column = group.next_column().unwrap().unwrap();
    column.typed::<Int64Type>().write_batch(&[1, 2], None, None).unwrap();
    column.close().unwrap();
    group.close().unwrap();
    w.close().unwrap();
    let err = load_searchr1_parquet(&path, OnBadRow::Fail).unwrap_err();
    assert!(err.to_string().contains("partial.parquet:1: missing field `reward_model.ground_truth`"), "{err}");
    let skipped = load_searchr1_parquet(&path, OnBadRow::Skip).unwrap();
    assert!(skipped.items.is_empty());
    assert_eq!(skipped.bad_rows.iter().map(|r| r.line).collect::<Vec<_>>(), [1, 2]);
}

/// Found by the `qa_loaders` fuzz target: one byte of the fixture's footer changed from a thrift
/// "bool true" field header (0x11) to a "byte" one (0x13) made parquet 57.3 panic (an unwrap in
/// its thrift decoder) instead of returning an error. A corrupt file is a typed error.
#[test]
fn corrupt_parquet_footer_is_an_error_not_a_panic() {
    let mut bytes = std::fs::read(fixture("searchr1-sample.parquet")).unwrap();
    assert_eq!(bytes[5890], 0x11, "the fixture changed; find the statistics bool field again");
    bytes[5890] = 0x13;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("corrupt.parquet");
    std::fs::write(&path, &bytes).unwrap();
    for on_bad in [OnBadRow::Fail, OnBadRow::Skip] {
        let err = load_searchr1_parquet(&path, on_bad).unwrap_err();
        assert!(matches!(err, DatasetError::Format { .. }), "{err}");
        assert!(err.to_string().contains("corrupt.parquet"), "{err}");
    }
}

/// Found by the `qa_loaders` fuzz target (a 10-minute run): a mutated Search-R1 file whose footer
/// gives a schema group a negative `num_children`, which parquet 57.3 turns into
/// `Vec::with_capacity(n as usize)` and a "capacity overflow" panic. The loader's `catch_unwind`
/// must turn it into a typed error like any other corrupt footer.
#[test]
fn negative_num_children_in_a_parquet_schema_is_an_error_not_a_panic() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/parquet-negative-num-children.parquet");
    for on_bad in [OnBadRow::Fail, OnBadRow::Skip] {
        let err = load_searchr1_parquet(&path, on_bad).unwrap_err();
        assert!(matches!(err, DatasetError::Format { .. }), "{err}");
        assert!(err.to_string().contains("capacity overflow"), "{err}");
    }
}

/// Found by the `qa_loaders` fuzz target: a mutated Search-R1 file whose footer declares a list
/// of about 10^10 schema elements. parquet 57.3 reserves memory for it up front (174 GB) and the
/// allocation failure aborts the process, past any `catch_unwind`; the loader's own check of the
/// footer's Thrift framing must refuse it first.
#[test]
fn a_footer_list_longer_than_the_file_is_refused_before_parquet_allocates() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/parquet-huge-footer-list.parquet");
    for on_bad in [OnBadRow::Fail, OnBadRow::Skip] {
        let err = load_searchr1_parquet(&path, on_bad).unwrap_err();
        assert!(matches!(err, DatasetError::Format { .. }), "{err}");
        assert!(err.to_string().contains("corrupt footer metadata"), "{err}");
        assert!(err.to_string().contains("items declared, at most"), "{err}");
    }
}

/// The footer check accepts what pyarrow and the parquet crate write.
#[test]
fn the_footer_check_accepts_real_files() {
    let loaded = load_searchr1_parquet(&fixture("searchr1-sample.parquet"), OnBadRow::Fail).unwrap();
    assert!(!loaded.items.is_empty());
}
