//! Data loaded by `grove-datasets` travels through `grove-protocol` unchanged: every loader's
//! examples become `TaskSpec`s that survive encoding, and a trainer-sized bulk create fits in one
//! frame of the default size.

use grove_datasets::loaders::{load_qa_jsonl, load_searchr1_parquet};
use grove_datasets::synthetic::{World, WorldConfig};
use grove_datasets::{OnBadRow, QaExample};
use grove_protocol::{CreateEpisodes, Envelope, EpisodeOptions, Request, TaskSpec, decode_request, encode};
use grove_tests::fixture;

fn task(e: &QaExample) -> TaskSpec {
    e.task_spec()
}

fn create(tasks: Vec<TaskSpec>) -> Envelope<Request> {
    Envelope::new(1, Request::CreateEpisodes(CreateEpisodes { tasks, options: EpisodeOptions::default() }))
}

#[test]
fn loaded_examples_survive_the_wire() {
    let mut examples = load_qa_jsonl(&fixture("flashrag-sample.jsonl"), "nq", None, OnBadRow::Fail).unwrap().items;
    examples.extend(load_searchr1_parquet(&fixture("searchr1-sample.parquet"), OnBadRow::Fail).unwrap().items);
    assert_eq!(examples.len(), 12);
    let env = create(examples.iter().map(task).collect());
    let back = decode_request(&encode(&env).unwrap()).unwrap();
    let Request::CreateEpisodes(c) = back.msg else { panic!("wrong variant") };
    for (e, t) in examples.iter().zip(&c.tasks) {
        assert_eq!((&t.question, &t.golden_answers, &t.data_source), (&e.question, &e.golden_answers, &e.data_source));
    }
    // triviaqa is an EM source; the parquet's sixth row says so after the trip.
    assert_eq!(c.tasks[11].data_source, "triviaqa");
    assert_eq!(c.tasks[11].metric, Some(grove_protocol::Metric::Em));
}

#[test]
fn a_512_prompt_bulk_create_fits_one_default_frame() {
    let world = World::generate(&WorldConfig::default());
    let tasks: Vec<TaskSpec> = world.questions(3, 512, 1).iter().map(|q| task(&q.example)).collect();
    assert_eq!(tasks.len(), 512);
    let bytes = encode(&create(tasks)).unwrap();
    assert!(bytes.len() < 1 << 20, "{} bytes", bytes.len());
}
