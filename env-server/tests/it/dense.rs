//! Dense and hybrid retrieval through the `env-server` binary, as a user runs it: `env-server
//! index --dense` encodes a corpus into a FAISS flat index (resuming an interrupted run), and
//! `env-server serve --backend dense|hybrid --index FILE --model DIR --corpus FILE` answers
//! Search-R1 `/retrieve` requests from it. The encoder is the real all-MiniLM-L6-v2 of
//! `cargo xtask assets`. Compiled only with the `dense` feature (its `mod` line in main.rs).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use grove_env_server::testkit::{ServerProcess, spawn_ready};
use serde_json::{Value, json};

const PASSAGES: &[(&str, &str)] = &[
    (
        "On the Origin of Species",
        "On the Origin of Species is a work of scientific literature by Charles Darwin, published in 1859, which is considered to be the foundation of evolutionary biology.",
    ),
    (
        "Mount Everest",
        "Mount Everest is Earth's highest mountain above sea level, located in the Mahalangur Himal sub-range of the Himalayas on the border between Nepal and China.",
    ),
    (
        "Photosynthesis",
        "Photosynthesis is a process used by plants and other organisms to convert light energy into chemical energy that is stored in sugars.",
    ),
    (
        "Great Fire of London",
        "The Great Fire of London was a major conflagration that swept through the central parts of London from 2 to 6 September 1666.",
    ),
    (
        "Violin",
        "The violin is a wooden chordophone, the smallest and highest-pitched instrument in the violin family in regular use.",
    ),
    (
        "Python (programming language)",
        "Python is a high-level, general-purpose programming language whose design philosophy emphasizes code readability.",
    ),
    (
        "Amazon River",
        "The Amazon River in South America is the largest river by discharge volume of water in the world.",
    ),
    (
        "Marie Curie",
        "Marie Curie was a Polish and naturalised-French physicist and chemist who conducted pioneering research on radioactivity.",
    ),
    (
        "Tea",
        "Tea is an aromatic beverage prepared by pouring hot or boiling water over cured or fresh leaves of Camellia sinensis.",
    ),
    (
        "Saturn",
        "Saturn is the sixth planet from the Sun and the second largest in the Solar System, known for its prominent ring system.",
    ),
    (
        "Chess",
        "Chess is a board game for two players, played on a square board of 64 squares arranged in an eight-by-eight grid.",
    ),
    (
        "Volcano",
        "A volcano is a rupture in the crust of a planetary-mass object that allows hot lava, volcanic ash and gases to escape.",
    ),
];

fn model_dir() -> PathBuf {
    let dir = grove_datasets::assets::minilm_dir();
    assert!(dir.join("model.safetensors").exists(), "{} is missing: run `cargo xtask assets`", dir.display());
    dir
}

fn write_corpus(path: &Path, passages: &[(&str, &str)]) {
    let mut text = String::new();
    for (i, (title, body)) in passages.iter().enumerate() {
        text.push_str(&json!({"id": i.to_string(), "contents": format!("\"{title}\"\n{body}")}).to_string());
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

fn env_server() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_env-server"));
    cmd.env("RUST_LOG", "warn");
    cmd
}

fn index(corpus: &Path, out: &Path) -> std::process::Output {
    env_server()
        .args(["index", "--dense", "--device", "cpu", "--batch-size", "4", "--model"])
        .arg(model_dir())
        .arg("--out")
        .arg(out)
        .arg(corpus)
        .output()
        .unwrap()
}

async fn serve(backend: &str, corpus: &Path, index: &Path) -> ServerProcess {
    serve_with(backend, corpus, index, &[]).await
}

async fn serve_with(backend: &str, corpus: &Path, index: &Path, extra: &[&str]) -> ServerProcess {
    grove_http::install_tls_provider();
    let mut cmd = env_server();
    cmd.args(["serve", "--backend", backend])
        .args(extra)
        .arg("--index")
        .arg(index)
        .arg("--model")
        .arg(model_dir())
        .arg("--corpus")
        .arg(corpus)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    spawn_ready(cmd, Duration::from_secs(60)).await.unwrap_or_else(|e| panic!("env-server did not start: {e}"))
}

async fn retrieve(server: &ServerProcess, queries: &[&str], topk: usize) -> Vec<Vec<(String, f64)>> {
    let body = json!({"queries": queries, "topk": topk, "return_scores": true});
    let r = reqwest::Client::new().post(server.http("/retrieve")).json(&body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.unwrap();
    v["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|list| {
            list.as_array()
                .unwrap()
                .iter()
                .map(|hit| {
                    let contents = hit["document"]["contents"].as_str().unwrap();
                    assert!(contents.starts_with('"'), "Search-R1 contents: {contents}");
                    (hit["document"]["id"].as_str().unwrap().to_string(), hit["score"].as_f64().unwrap())
                })
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dense_and_hybrid_answer_retrieve_from_an_index_built_by_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    write_corpus(&corpus, PASSAGES);
    let path = dir.path().join("corpus.flat.index");
    let out = index(&corpus, &path);
    assert!(out.status.success(), "index: {}", String::from_utf8_lossy(&out.stderr));
    let flat = grove_dense::FlatIndex::open(&path).unwrap();
    assert_eq!((flat.len(), flat.dim(), flat.metric()), (PASSAGES.len(), 384, grove_dense::Metric::InnerProduct));

    // Resuming: a partial file holding the first 5 rows (and a torn sixth) is completed into
    // the same index as the uninterrupted run.
    let full = std::fs::read(&path).unwrap();
    let resumed = dir.path().join("resumed.index");
    let partial = dir.path().join("resumed.index.partial");
    std::fs::write(&partial, &full[..45 + 5 * 384 * 4 + 100]).unwrap();
    let out = index(&corpus, &resumed);
    assert!(out.status.success(), "resume: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("5 passages already encoded"));
    let again = grove_dense::FlatIndex::open(&resumed).unwrap();
    assert_eq!(again.len(), flat.len());
    for row in 0..flat.len() {
        let d: f32 = again.vector(row).iter().zip(flat.vector(row)).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(d < 1e-5, "row {row} differs by {d}");
    }

    // Dense: paraphrases with few shared words find their passage.
    let server = serve("dense", &corpus, &path).await;
    let queries = [
        "who wrote the book about evolution by natural selection",
        "the tallest peak in the world",
        "how do plants turn sunlight into food",
    ];
    let results = retrieve(&server, &queries, 3).await;
    assert_eq!(results.len(), 3);
    assert_eq!(results[0][0].0, "0");
    assert_eq!(results[1][0].0, "1");
    assert_eq!(results[2][0].0, "2");
    for list in &results {
        assert_eq!(list.len(), 3);
        assert!(list.windows(2).all(|w| w[0].1 >= w[1].1), "scores best first: {list:?}");
        assert!(list[0].1 <= 1.0 + 1e-5, "cosine scores of normalised vectors");
    }
    drop(server);

    // The approximate index: `index --hnsw` keeps the flat file (no second encoding) and writes
    // the graph beside it; `--search hnsw` serves from it with the same answers here.
    let out = env_server()
        .args(["index", "--dense", "--hnsw", "--device", "cpu", "--model"])
        .arg(model_dir())
        .arg("--out")
        .arg(&path)
        .arg(&corpus)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.contains("exists; remove it"), "{stderr}");
    assert!(dir.path().join("corpus.flat.index.usearch").exists());
    let server = serve_with("dense", &corpus, &path, &["--search", "hnsw"]).await;
    let approx = retrieve(&server, &queries, 3).await;
    for (a, e) in approx.iter().zip(&results) {
        assert_eq!(a[0].0, e[0].0);
        assert!((a[0].1 - e[0].1).abs() < 1e-4, "HNSW scores on the exact scale: {a:?} vs {e:?}");
    }
    drop(server);

    // Hybrid: fused scores are reciprocal ranks; a query that both retrievers rank first scores
    // 2 / (60 + 1).
    let server = serve("hybrid", &corpus, &path).await;
    let results = retrieve(&server, &["Marie Curie radioactivity research"], 3).await;
    assert_eq!(results[0][0].0, "7");
    assert!((results[0][0].1 - 2.0 / 61.0).abs() < 1e-6, "{results:?}");
    drop(server);
}

#[test]
fn a_corpus_that_does_not_match_the_index_is_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    write_corpus(&corpus, &PASSAGES[..4]);
    let path = dir.path().join("small.index");
    assert!(index(&corpus, &path).status.success());
    let other = dir.path().join("other.jsonl");
    write_corpus(&other, &PASSAGES[..5]);
    let out = env_server()
        .args(["serve", "--backend", "dense", "--bind", "127.0.0.1:0", "--index"])
        .arg(&path)
        .arg("--model")
        .arg(model_dir())
        .arg("--corpus")
        .arg(&other)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("do not match") && err.contains("4 vectors") && err.contains("5 passages"), "{err}");
    // No model: a clear error too.
    let out = env_server()
        .args(["serve", "--backend", "dense", "--bind", "127.0.0.1:0", "--index"])
        .arg(&path)
        .arg("--corpus")
        .arg(&corpus)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("model folder"));
}

#[test]
fn dense_settings_in_the_toml() {
    use grove_env_server::config::{BackendKind, DenseDevice, DensePooling, ServerConfig};
    let c = ServerConfig::from_toml(
        "backend = \"hybrid\"\ncorpus = \"wiki.jsonl\"\n[dense]\nindex = \"e5_Flat.index\"\nmodel = \"e5-base-v2\"\n\
         query_prefix = \"query: \"\npooling = \"mean\"\ndevice = \"cpu\"\nrrf_k = 30.0\n",
    )
    .unwrap();
    assert_eq!(c.backend, BackendKind::Hybrid);
    assert_eq!(c.dense.query_prefix.as_deref(), Some("query: "));
    assert_eq!((c.dense.pooling, c.dense.device, c.dense.rrf_k), (Some(DensePooling::Mean), DenseDevice::Cpu, 30.0));
    let err = ServerConfig::from_toml("[dense]\npooling = \"max\"\n").unwrap_err();
    assert!(err.to_string().contains("max"), "{err}");
    let err = ServerConfig::from_toml("[dense]\nmodle = \"x\"\n").unwrap_err();
    assert!(err.to_string().contains("modle"), "{err}");
}
