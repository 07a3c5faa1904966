//! FAISS files both ways, against Python faiss-cpu in the test venv (`cargo xtask test` installs
//! it; elsewhere set `GROVE_PYTHON` to a Python with `faiss-cpu` and `numpy`):
//! - indexes written by `faiss.write_index` (IndexFlatIP, IndexFlatL2, IndexIDMap, fp16
//!   IndexScalarQuantizer) are read in place and searched exactly, and the answers equal faiss's
//!   own on the same queries;
//! - an index written by Grove's `FlatWriter` (f32 or f16) is read by `faiss.read_index`, and
//!   faiss's answers on it equal Grove's; Grove's f16 file is byte for byte faiss's.

use std::path::{Path, PathBuf};
use std::process::Command;

use grove_dense::{FlatIndex, FlatWriter, Metric, Neighbour, Storage, search};
use serde_json::Value;

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("GROVE_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let venv = grove_datasets::assets::cache_dir().join("venv/bin/python");
    assert!(
        venv.exists(),
        "no Python with faiss-cpu: run `cargo xtask test` once (it makes {}), or set GROVE_PYTHON",
        venv.display()
    );
    venv
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/faiss_reference.py")
}

fn run_python(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(python()).arg(script()).args(args).output().expect("run python");
    assert!(out.status.success(), "faiss_reference.py failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path).unwrap().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

/// Grove's answers equal faiss's: the same labels in the same order, except that rows whose
/// scores tie within float rounding may swap; scores agree to 1e-4 (relative).
fn assert_same(ours: &[Vec<Neighbour>], labels: &Value, distances: &Value, id: impl Fn(usize) -> i64, what: &str) {
    let labels = labels.as_array().unwrap();
    let distances = distances.as_array().unwrap();
    assert_eq!(ours.len(), labels.len(), "{what}: query count");
    for (q, (mine, (lab, dist))) in ours.iter().zip(labels.iter().zip(distances)).enumerate() {
        let lab: Vec<i64> = lab.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect();
        let dist: Vec<f64> = dist.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(mine.len(), lab.len(), "{what} query {q}: result count");
        for (i, n) in mine.iter().enumerate() {
            let tol = 1e-4 * dist[i].abs().max(1.0);
            assert!(
                (f64::from(n.score) - dist[i]).abs() < tol,
                "{what} query {q} rank {i}: {} vs {}",
                n.score,
                dist[i]
            );
            if id(n.row) != lab[i] {
                // Only a tie may reorder.
                let j = lab.iter().position(|&l| l == id(n.row));
                assert!(
                    j.is_some_and(|j| (dist[j] - dist[i]).abs() < tol),
                    "{what} query {q} rank {i}: row id {} vs faiss {}",
                    id(n.row),
                    lab[i]
                );
            }
        }
    }
}

#[test]
fn indexes_written_by_faiss_are_read_in_place_and_searched_like_faiss() {
    let dir = tempfile::tempdir().unwrap();
    run_python(&["write".as_ref(), dir.path().as_os_str()]);
    let answers: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("answers.json")).unwrap()).unwrap();
    let queries = read_f32(&dir.path().join("queries.f32"));
    let vectors = read_f32(&dir.path().join("vectors.f32"));
    let k = answers["k"].as_u64().unwrap() as usize;
    for (name, metric, storage) in [
        ("flat_ip", Metric::InnerProduct, Storage::F32),
        ("flat_l2", Metric::L2, Storage::F32),
        ("idmap_ip", Metric::InnerProduct, Storage::F32),
        ("sq_fp16_ip", Metric::InnerProduct, Storage::F16),
        ("sq_fp16_l2", Metric::L2, Storage::F16),
    ] {
        let index = FlatIndex::open(&dir.path().join(format!("{name}.index"))).unwrap();
        assert_eq!((index.dim(), index.len(), index.metric(), index.storage()), (48, 3000, metric, storage), "{name}");
        let last = &vectors[2999 * 48..];
        match storage {
            Storage::F32 => assert_eq!(index.vector(2999), last, "{name}: last row"),
            Storage::F16 => {
                let halves: Vec<f32> =
                    last.iter().map(|&x| half::f16::from_bits(grove_dense::encode_f16(x)).to_f32()).collect();
                assert_eq!(index.vector(2999), halves, "{name}: last row, rounded to half");
            }
        }
        for threads in [1, 3] {
            let ours = search(&index, &queries, k, threads);
            let a = &answers[name];
            assert_same(
                &ours,
                &a["labels"],
                &a["distances"],
                |row| index.id(row),
                &format!("{name}, {threads} threads"),
            );
        }
        if name == "idmap_ip" {
            assert_eq!(index.id(0), 1000);
            assert_eq!(index.id(2999), 1000 + 7 * 2999);
        }
    }
    // More results asked than rows: all rows, best first.
    let small = FlatIndex::open(&dir.path().join("flat_ip.index")).unwrap();
    let all = search(&small, &queries[..48], 5000, 2);
    assert_eq!(all[0].len(), 3000);
    assert!(all[0].windows(2).all(|w| w[0].score >= w[1].score));
}

#[test]
fn indexes_written_by_grove_are_read_by_faiss() {
    let dir = tempfile::tempdir().unwrap();
    let (d, n) = (24, 700);
    // Deterministic values without a random crate: a simple LCG in [-1, 1).
    let mut state = 12345u64;
    let mut next = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let vectors: Vec<f32> = (0..n * d).map(|_| next()).collect();
    let queries: Vec<f32> = (0..5 * d).map(|_| next()).collect();
    let qpath = dir.path().join("queries.f32");
    std::fs::write(&qpath, queries.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    for (metric, storage) in [
        (Metric::InnerProduct, Storage::F32),
        (Metric::L2, Storage::F32),
        (Metric::InnerProduct, Storage::F16),
        (Metric::L2, Storage::F16),
    ] {
        let path = dir.path().join(format!("{metric:?}-{storage}.index"));
        let mut w = FlatWriter::create_or_resume_as(&path, d, metric, storage).unwrap();
        // In two appends, as an index build writes batch by batch.
        w.append(&vectors[..300 * d]).unwrap();
        w.append(&vectors[300 * d..]).unwrap();
        w.finish().unwrap();
        let out = run_python(&["search".as_ref(), path.as_os_str(), qpath.as_os_str(), "8".as_ref()]);
        let faiss: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(faiss["d"], d);
        assert_eq!(faiss["ntotal"], n);
        assert_eq!(faiss["metric"], if metric == Metric::L2 { 1 } else { 0 });
        let index = FlatIndex::open(&path).unwrap();
        let ours = search(&index, &queries, 8, 1);
        assert_same(&ours, &faiss["labels"], &faiss["distances"], |row| row as i64, &format!("{metric:?} {storage}"));
    }
}

#[test]
fn grove_writes_the_same_bytes_as_faiss() {
    let dir = tempfile::tempdir().unwrap();
    run_python(&["write".as_ref(), dir.path().as_os_str()]);
    let vectors = read_f32(&dir.path().join("vectors.f32"));
    for (name, metric, storage) in [
        ("flat_ip", Metric::InnerProduct, Storage::F32),
        ("flat_l2", Metric::L2, Storage::F32),
        ("sq_fp16_ip", Metric::InnerProduct, Storage::F16),
        ("sq_fp16_l2", Metric::L2, Storage::F16),
    ] {
        let path = dir.path().join(format!("grove-{name}.index"));
        let mut w = FlatWriter::create_or_resume_as(&path, 48, metric, storage).unwrap();
        w.append(&vectors).unwrap();
        w.finish().unwrap();
        let ours = std::fs::read(&path).unwrap();
        let theirs = std::fs::read(dir.path().join(format!("{name}.index"))).unwrap();
        assert_eq!(ours.len(), theirs.len(), "{name}: file length");
        let first = ours.iter().zip(&theirs).position(|(a, b)| a != b);
        assert_eq!(first, None, "{name}: first differing byte");
    }
}
