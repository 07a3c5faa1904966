//! The synthetic world is deterministic and its k-hop questions need k passages.

use grove_datasets::metrics::normalize_answer;
use grove_datasets::synthetic::{World, WorldConfig};

#[test]
fn same_seed_same_world_other_seed_other_world() {
    let a = World::generate(&WorldConfig::default());
    let b = World::generate(&WorldConfig::default());
    assert_eq!(a, b);
    assert_eq!(a.questions(2, 20, 7), b.questions(2, 20, 7));
    let c = World::generate(&WorldConfig { seed: 1, ..WorldConfig::default() });
    assert_ne!(a.passages, c.passages);
    assert_ne!(a.questions(2, 20, 7), a.questions(2, 20, 8));
}

#[test]
fn passages_have_wiki18_shape_and_unique_titles() {
    let w = World::generate(&WorldConfig::default());
    let cfg = &w.config;
    let n = cfg.countries + cfg.cities + cfg.people + cfg.universities + cfg.structures;
    assert_eq!(w.passages.len(), n);
    let titles: std::collections::HashSet<_> = w.passages.iter().map(|p| p.title.to_lowercase()).collect();
    assert_eq!(titles.len(), n);
    for p in &w.passages {
        assert!(p.contents().starts_with(&format!("\"{}\"\n{}", p.title, p.title)), "{}", p.contents());
        let words = p.text.split_whitespace().count();
        assert!((10..120).contains(&words), "{words} words: {}", p.text);
    }
}

#[test]
fn k_hop_questions_need_exactly_their_chain() {
    let w = World::generate(&WorldConfig::default());
    for hops in 1..=3 {
        let qs = w.questions(hops, 40, 3);
        assert_eq!(qs.len(), 40, "{hops}-hop");
        for q in &qs {
            assert_eq!(q.hops, hops);
            assert_eq!(q.chain.len(), hops);
            assert_eq!(q.example.data_source, format!("synthetic_{hops}hop"));
            let answer = normalize_answer(&q.example.golden_answers[0]);
            assert_eq!(answer, normalize_answer(&w.entities[q.answer].name));
            // The last passage of the chain states the answer ...
            let last = &w.passages[*q.chain.last().unwrap()];
            assert!(normalize_answer(&last.text).contains(&answer), "{:?} not in {}", answer, last.text);
            // ... each passage names the next entity of the chain ...
            for pair in q.chain.windows(2) {
                let next = normalize_answer(&w.entities[pair[1]].name);
                assert!(normalize_answer(&w.passages[pair[0]].text).contains(&next));
            }
            // ... and neither the question nor an earlier passage gives the answer away.
            assert!(!normalize_answer(&q.example.question).contains(&answer));
            for &e in &q.chain[..hops - 1] {
                assert!(!normalize_answer(&w.passages[e].text).contains(&answer), "hop skippable: {q:?}");
            }
            // The question names the first entity, so the first search is well defined.
            assert!(q.example.question.contains(&w.entities[q.chain[0]].name));
        }
        let distinct: std::collections::HashSet<_> = qs.iter().map(|q| &q.example.question).collect();
        assert_eq!(distinct.len(), qs.len());
    }
    assert!(w.questions(0, 5, 1).is_empty());
    assert!(w.questions(4, 5, 1).is_empty());
}

#[test]
fn scaled_worlds_grow() {
    let w = World::generate(&WorldConfig::scaled(5, 10));
    assert_eq!(w.passages.len(), 10 * World::generate(&WorldConfig::default()).passages.len());
    assert_eq!(w.questions(3, 500, 1).len(), 500);
}

#[test]
fn split_questions_are_disjoint_and_labelled() {
    let world = World::generate(&WorldConfig::default());
    for hops in [2, 3] {
        let (train, test) = world.split_questions(hops, 40, 10, 9);
        assert_eq!((train.len(), test.len()), (40, 10));
        let held: std::collections::HashSet<&str> = test.iter().map(|q| q.example.question.as_str()).collect();
        assert!(train.iter().all(|q| !held.contains(q.example.question.as_str())));
        assert!(test.iter().all(|q| q.example.split.as_deref() == Some("test") && q.example.id.contains("-test-")));
        assert!(train.iter().all(|q| q.example.split.as_deref() == Some("train") && q.hops == hops));
        // The same seed splits the same way.
        assert_eq!(world.split_questions(hops, 40, 10, 9).1, test);
    }
}
