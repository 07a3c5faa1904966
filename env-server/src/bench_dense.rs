//! `env-server bench-dense` (the `dense` feature): dense retrieval against Python faiss-cpu on the
//! same files and queries, in one run, and retrieval quality on real questions.
//!
//! 1. Speed: a synthetic flat index of `--vectors` random unit vectors is written once (by
//!    Grove's writer, in FAISS's format) and searched by both Grove and faiss (`faiss.read_index`,
//!    `IndexFlat::search`) with the same queries, all at once as one tick's batch and one query
//!    alone: queries/s, time from start to the first answer, resident memory, and how many of
//!    faiss's top-10 Grove returns (recall@10 against faiss's exact search).
//!    The same vectors stored as f16 (faiss's fp16 scalar quantizer) are searched the same way,
//!    with the recall@10 of their exact search against the f32 index's.
//! 2. Quality: the FanOutQA dev sub-questions whose evidence page is in the mini-Wikipedia corpus
//!    (`cargo xtask assets`), searched by BM25, dense (all-MiniLM-L6-v2) and hybrid: recall@3 of
//!    the evidence passage, and the encoding speed of the corpus; unless `--no-speed`, the speed
//!    figures of part 1 again on this real index with the encoded sub-questions as queries.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use grove_dense::{FlatIndex, FlatWriter, Metric};
use grove_env_server::config::{DenseConfig, DenseDevice};
use grove_env_server::search::SearchBackend;
use grove_env_server::search::dense::{DenseBackend, HybridBackend, default_index_path, load_encoder};

use crate::bench::{Row, row};

#[derive(clap::Args, Debug)]
pub struct BenchDenseArgs {
    /// Vectors in the synthetic flat index.
    #[arg(long, default_value_t = 1_000_000)]
    vectors: usize,
    /// Their dimension (384 for MiniLM / BGE-small, 768 for e5-base).
    #[arg(long, default_value_t = 384)]
    dim: usize,
    /// Queries of the batched search (one tick's worth).
    #[arg(long, default_value_t = 256)]
    queries: usize,
    /// Timed repeats of each search; the best is reported.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Threads for both searches (0 = every core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Python with faiss-cpu and numpy (default: the test venv of `cargo xtask test`).
    #[arg(long)]
    python: Option<PathBuf>,
    /// Where the synthetic index is kept between runs (default: the system temp dir).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Skip the quality part (FanOutQA over mini-Wikipedia).
    #[arg(long)]
    no_quality: bool,
    /// Skip the speed part.
    #[arg(long)]
    no_speed: bool,
    /// Skip the approximate (HNSW) rows of the synthetic index (the mini-Wikipedia index's small
    /// graph is always measured). The graph is built the first time (minutes per 100k vectors on
    /// two cores) and kept beside the index afterwards.
    #[arg(long)]
    no_hnsw: bool,
    /// Encoder for the quality part (default: all-MiniLM-L6-v2 from `cargo xtask assets`).
    #[arg(long)]
    model: Option<PathBuf>,
}

/// Resident memory of this process from `/proc/self/status`: (total, anonymous, file-backed), KiB.
fn rss_kib() -> (u64, u64, u64) {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("RssAnon:"), field("RssFile:"))
}

/// SplitMix64: deterministic vectors without a random crate.
struct SplitMix(u64);

impl SplitMix {
    fn next_f32(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    fn unit_rows(&mut self, rows: usize, dim: usize) -> Vec<f32> {
        let mut v: Vec<f32> = (0..rows * dim).map(|_| self.next_f32()).collect();
        normalise(&mut v, dim);
        v
    }

    /// Unit vectors around `centers` (a topic each, as real embeddings cluster): center plus
    /// noise of norm about `spread`, normalised. Uniform random vectors in hundreds of dimensions
    /// are all nearly equidistant, which no embedding model produces and which makes graph
    /// indexes look worse (and build slower) than they are on real data.
    fn clustered_rows(&mut self, rows: usize, dim: usize, centers: &[f32], spread: f32) -> Vec<f32> {
        let k = centers.len() / dim;
        let scale = spread / (dim as f32 / 3.0).sqrt();
        let mut v = Vec::with_capacity(rows * dim);
        for _ in 0..rows {
            let c = ((self.next_f32() + 1.0) * 0.5 * k as f32) as usize % k;
            for j in 0..dim {
                v.push(centers[c * dim + j] + scale * self.next_f32());
            }
        }
        normalise(&mut v, dim);
        v
    }
}

fn normalise(v: &mut [f32], dim: usize) {
    for r in v.chunks_exact_mut(dim) {
        let n = r.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
        r.iter_mut().for_each(|x| *x /= n);
    }
}

/// Topics of the synthetic index, and how far a vector strays from its topic.
const CENTERS: usize = 1000;
const SPREAD: f32 = 0.8;

fn default_python() -> PathBuf {
    grove_datasets::assets::cache_dir().join("venv/bin/python")
}

/// The faiss side of the speed part, run by the Python of the test venv.
const FAISS_SCRIPT: &str = r#"
import json, sys, time
t_start = time.perf_counter()
import faiss, numpy as np
path, qpath, k, reps, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
if threads > 0:
    faiss.omp_set_num_threads(threads)
t0 = time.perf_counter()
index = faiss.read_index(path)
t1 = time.perf_counter()
xq = np.fromfile(qpath, dtype="<f4").reshape(-1, index.d)
D, I = index.search(xq[:1], k)
t2 = time.perf_counter()
best_one = best_batch = float("inf")
for _ in range(reps):
    a = time.perf_counter(); index.search(xq[:1], k); best_one = min(best_one, time.perf_counter() - a)
for _ in range(reps):
    a = time.perf_counter(); D, I = index.search(xq, k); best_batch = min(best_batch, time.perf_counter() - a)
rss = {}
for line in open("/proc/self/status"):
    for key in ("VmRSS", "RssAnon", "RssFile"):
        if line.startswith(key + ":"):
            rss[key] = int(line.split()[1])
print(json.dumps({"read_s": t1 - t0, "first_answer_s": t2 - t0, "import_s": t0 - t_start, "one_s": best_one,
                  "batch_s": best_batch, "labels": I.tolist(), "rss_kib": rss, "threads": faiss.omp_get_max_threads(),
                  "version": faiss.__version__}))
"#;

fn speed(args: &BenchDenseArgs, rows: &mut Vec<Row>) -> Result<()> {
    let work = args.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&work)?;
    let path = work.join(format!("grove-bench-flat-clustered-{}x{}.index", args.vectors, args.dim));
    let centers = SplitMix(1).unit_rows(CENTERS, args.dim);
    let ready = FlatIndex::open(&path).is_ok_and(|i| i.len() == args.vectors && i.dim() == args.dim);
    if !ready {
        eprintln!("writing {} ({} x {} unit vectors around {CENTERS} topics)", path.display(), args.vectors, args.dim);
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(grove_dense::approx::default_path(&path));
        let mut w = FlatWriter::create_or_resume(&path, args.dim, Metric::InnerProduct)?;
        let mut rng = SplitMix(7 + w.rows() as u64);
        while w.rows() < args.vectors {
            let n = (args.vectors - w.rows()).min(65_536);
            w.append(&rng.clustered_rows(n, args.dim, &centers, SPREAD))?;
        }
        w.finish()?;
    }
    let queries = SplitMix(20261205).clustered_rows(args.queries, args.dim, &centers, SPREAD);
    let gb = (args.vectors * args.dim * 4) as f64 / 1e9;
    let what = format!("{} x {} flat IP ({gb:.2} GB, {CENTERS} topics)", args.vectors, args.dim);
    let exact = measure(args, &Target { label: "", path: &path, queries: &queries, what, hnsw: !args.no_hnsw }, rows)?;

    // The same vectors stored as f16 (faiss's `IndexScalarQuantizer` fp16): speed, and how many
    // of the f32 index's exact top-10 its exact search returns.
    let half = work.join(format!("grove-bench-fp16-clustered-{}x{}.index", args.vectors, args.dim));
    if !FlatIndex::open(&half).is_ok_and(|i| i.len() == args.vectors && i.dim() == args.dim) {
        eprintln!("writing {} (the same vectors in f16)", half.display());
        let _ = std::fs::remove_file(&half);
        let flat = FlatIndex::open(&path)?;
        let mut w = FlatWriter::create_or_resume_as(&half, args.dim, Metric::InnerProduct, grove_dense::Storage::F16)?;
        let mut block = vec![0f32; 65_536 * args.dim];
        while w.rows() < args.vectors {
            let n = (args.vectors - w.rows()).min(65_536);
            flat.decode_rows(w.rows(), &mut block[..n * args.dim]);
            w.append(&block[..n * args.dim])?;
        }
        w.finish()?;
    }
    let what = format!("the same vectors as f16 ({:.2} GB), faiss IndexScalarQuantizer fp16", gb / 2.0);
    let f16 = measure(args, &Target { label: " (f16)", path: &half, queries: &queries, what, hnsw: false }, rows)?;
    rows.push(row(
        "recall@10 of the f16 index's exact search against the f32 index's",
        format!("{:.4}", overlap(&exact, &f16)),
        "",
        "rounding every component to half precision",
    ));
    Ok(())
}

/// The share of `truth`'s results that `found` returns, over all queries.
fn overlap(truth: &[Vec<grove_dense::Neighbour>], found: &[Vec<grove_dense::Neighbour>]) -> f64 {
    let (mut hits, mut total) = (0usize, 0usize);
    for (e, a) in truth.iter().zip(found) {
        total += e.len();
        hits += a.iter().filter(|n| e.iter().any(|x| x.row == n.row)).count();
    }
    hits as f64 / total.max(1) as f64
}

/// One index file and its queries, for [`measure`].
struct Target<'a> {
    /// Appended to the figures' names (`""`, `" (f16)"`, `", mini-Wikipedia"`).
    label: &'a str,
    path: &'a std::path::Path,
    /// Row-major, the index's dimension.
    queries: &'a [f32],
    /// What the index is, for the notes.
    what: String,
    /// Also build (once, beside the file) and search an HNSW graph.
    hnsw: bool,
}

/// Grove's exact search (and HNSW) on `t`'s file against faiss's on the same file and queries:
/// queries/s batched and alone, recall, time to the first answer, resident memory. Returns
/// Grove's exact top-10 of every query.
fn measure(args: &BenchDenseArgs, t: &Target<'_>, rows: &mut Vec<Row>) -> Result<Vec<Vec<grove_dense::Neighbour>>> {
    let (path, queries, label) = (t.path, t.queries, t.label);
    let work = args.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let dim = FlatIndex::open(path)?.dim();
    let nq = queries.len() / dim;
    let qpath = work.join(format!("grove-bench-queries-{}x{dim}.f32", nq));
    std::fs::write(&qpath, queries.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())?;
    let k = 10;
    // Grove: open (map), first answer, then the timed searches.
    let (rss0, anon0, _) = rss_kib();
    let t0 = Instant::now();
    let index = FlatIndex::open(path)?;
    let opened = t0.elapsed().as_secs_f64();
    let first = grove_dense::search(&index, &queries[..dim], k, args.threads);
    let first_answer = t0.elapsed().as_secs_f64();
    drop(first);
    let mut best_one = f64::INFINITY;
    let mut best_batch = f64::INFINITY;
    let mut ours = Vec::new();
    for _ in 0..args.repeats.max(1) {
        let a = Instant::now();
        let _ = grove_dense::search(&index, &queries[..dim], k, args.threads);
        best_one = best_one.min(a.elapsed().as_secs_f64());
    }
    for _ in 0..args.repeats.max(1) {
        let a = Instant::now();
        ours = grove_dense::search(&index, queries, k, args.threads);
        best_batch = best_batch.min(a.elapsed().as_secs_f64());
    }
    let (rss1, anon1, file1) = rss_kib();

    // The approximate index over the same vectors: build once (kept beside the flat file), then
    // the same searches, and how many of the exact top-10 it returns.
    let graph = grove_dense::approx::default_path(path);
    let hnsw = t.hnsw;
    let built_in = if graph.exists() || !hnsw {
        None
    } else {
        eprintln!("building the HNSW graph of {} vectors", index.len());
        let t = Instant::now();
        let mut g =
            grove_dense::ApproxIndex::build(&index, grove_dense::HnswParams::default(), args.threads, &|done| {
                if done % 100_000 == 0 {
                    eprintln!("  {done} inserted");
                }
            })?;
        g.save(&graph)?;
        Some(t.elapsed().as_secs_f64())
    };
    let mut approx_one = f64::INFINITY;
    let mut approx_batch = f64::INFINITY;
    let mut approx_found = Vec::new();
    let approx = if hnsw { Some(grove_dense::ApproxIndex::open(&graph, &index, 0)?) } else { None };
    for approx in approx.iter().flat_map(|a| std::iter::repeat_n(a, args.repeats.max(1))) {
        let a = Instant::now();
        approx.search(&queries[..dim], k)?;
        approx_one = approx_one.min(a.elapsed().as_secs_f64());
    }
    for approx in approx.iter().flat_map(|a| std::iter::repeat_n(a, args.repeats.max(1))) {
        let a = Instant::now();
        approx_found = approx.search_parallel(queries, k, args.threads)?;
        approx_batch = approx_batch.min(a.elapsed().as_secs_f64());
    }

    // faiss on the same file and queries.
    let python = args.python.clone().unwrap_or_else(default_python);
    let out = Command::new(&python)
        .args(["-c", FAISS_SCRIPT])
        .arg(path)
        .arg(&qpath)
        .args([k.to_string(), args.repeats.max(1).to_string(), args.threads.to_string()])
        .output()
        .with_context(|| format!("run {} (a Python with faiss-cpu: --python)", python.display()))?;
    if !out.status.success() {
        bail!("faiss side failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let f: serde_json::Value = serde_json::from_slice(&out.stdout).context("faiss side output")?;
    let num = |k: &str| f[k].as_f64().unwrap_or(f64::NAN);
    let labels = f["labels"].as_array().cloned().unwrap_or_default();
    let (mut hits, mut total) = (0usize, 0usize);
    for (mine, theirs) in ours.iter().zip(&labels) {
        let theirs: HashSet<i64> = theirs.as_array().into_iter().flatten().filter_map(|v| v.as_i64()).collect();
        total += theirs.len();
        hits += mine.iter().filter(|n| theirs.contains(&(n.row as i64))).count();
    }
    let recall = hits as f64 / total.max(1) as f64;
    let faiss_threads = f["threads"].as_u64().unwrap_or(0);
    let what = format!("{}, top-{k}", t.what);
    let vectors = index.len();
    rows.push(row(
        format!("dense exact search, batch, Grove{label}"),
        format!("{:.1}", nq as f64 / best_batch),
        "queries/s",
        format!("{what}; {nq} queries in one call"),
    ));
    rows.push(row(
        format!("dense exact search, batch, faiss-cpu (baseline){label}"),
        format!("{:.1}", nq as f64 / num("batch_s")),
        "queries/s",
        format!("faiss {}, {faiss_threads} threads", f["version"].as_str().unwrap_or("?")),
    ));
    rows.push(row(
        format!("**Grove vs faiss, batched queries/s{label}**"),
        format!("{:.2}x", num("batch_s") / best_batch),
        "ratio",
        "same file, same queries",
    ));
    rows.push(row(
        format!("dense exact search, one query, Grove / faiss{label}"),
        format!("{:.1} / {:.1}", best_one * 1e3, num("one_s") * 1e3),
        "ms",
        "",
    ));
    let p = grove_dense::HnswParams::default();
    if hnsw {
        rows.push(row(
            format!("dense HNSW search, batch, Grove{label}"),
            format!("{:.1}", nq as f64 / approx_batch),
            "queries/s",
            format!(
                "usearch HNSW, M {} efConstruction {} efSearch {}",
                p.connectivity, p.expansion_add, p.expansion_search
            ),
        ));
        rows.push(row(
            format!("**HNSW vs exact, batched queries/s{label}**"),
            format!("{:.1}x", best_batch / approx_batch),
            "ratio",
            "",
        ));
        rows.push(row(format!("dense HNSW search, one query{label}"), format!("{:.2}", approx_one * 1e3), "ms", ""));
        rows.push(row(
            format!("recall@10 of HNSW against the exact top-10{label}"),
            format!("{:.4}", overlap(&ours, &approx_found)),
            "",
            match built_in {
                Some(s) => format!("graph built in {s:.0} s ({:.0} vectors/s)", vectors as f64 / s),
                None => "graph reused from an earlier run".to_string(),
            },
        ));
    }
    rows.push(row(
        format!("recall@10 of Grove against faiss's exact top-10{label}"),
        format!("{recall:.4}"),
        "",
        "1.0 = the same neighbours",
    ));
    rows.push(row(
        format!("start to first answer, Grove (mmap) / faiss.read_index{label}"),
        format!("{:.3} / {:.3}", first_answer, num("first_answer_s")),
        "s",
        format!(
            "Grove opens in {:.4} s; faiss reads in {:.3} s (file in the page cache; Python import excluded)",
            opened,
            num("read_s")
        ),
    ));
    rows.push(row(
        format!("**faiss vs Grove, time to first answer{label}**"),
        format!("{:.1}x", num("first_answer_s") / first_answer),
        "ratio",
        "",
    ));
    let frss = &f["rss_kib"];
    rows.push(row(
        format!("resident memory after the searches, Grove{label}"),
        format!(
            "{:.0} MiB ({:.0} anonymous + {:.0} mapped file)",
            rss1 as f64 / 1024.0,
            anon1 as f64 / 1024.0,
            file1 as f64 / 1024.0
        ),
        "",
        format!(
            "anonymous before opening: {:.0} MiB of {:.0}; mapped pages are shared page cache, not copies",
            anon0 as f64 / 1024.0,
            rss0 as f64 / 1024.0
        ),
    ));
    rows.push(row(
        format!("resident memory after the searches, faiss{label}"),
        format!(
            "{:.0} MiB ({:.0} anonymous)",
            frss["VmRSS"].as_f64().unwrap_or(0.0) / 1024.0,
            frss["RssAnon"].as_f64().unwrap_or(0.0) / 1024.0
        ),
        "",
        "read_index copies the vectors into the process",
    ));
    Ok(ours)
}

/// Recall@3 of the evidence passage for the FanOutQA sub-questions whose page is in the corpus.
async fn quality(args: &BenchDenseArgs, rows: &mut Vec<Row>) -> Result<()> {
    let corpus = grove_datasets::assets::wiki_summaries_corpus();
    let questions = grove_datasets::assets::fanoutqa_dev();
    let model = args.model.clone().unwrap_or_else(grove_datasets::assets::minilm_dir);
    for p in [&corpus, &questions, &model] {
        if !p.exists() {
            bail!("{} is missing: run `cargo xtask assets`", p.display());
        }
    }
    // Titles of the corpus rows, to find the evidence passage by its page title.
    let mut titles = Vec::new();
    for passage in grove_datasets::loaders::stream_wiki18(&corpus)? {
        let p = passage?;
        titles.push((p.id, p.title));
    }
    let mut qs: Vec<(String, String)> = Vec::new();
    for line in std::fs::read_to_string(&questions)?.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)?;
        if v.pointer("/metadata/in_corpus").and_then(|b| b.as_bool()) == Some(true) {
            let q = v["question"].as_str().unwrap_or_default().to_string();
            let t = v.pointer("/metadata/evidence_title").and_then(|t| t.as_str()).unwrap_or_default().to_string();
            qs.push((q, t));
        }
    }
    let config = DenseConfig { model: Some(model.clone()), device: DenseDevice::Cpu, ..DenseConfig::default() };
    let index_path = default_index_path(&corpus, &model, grove_dense::Storage::F32);
    if !FlatIndex::open(&index_path).is_ok_and(|i| i.len() == titles.len()) {
        let encoder = load_encoder(&config)?;
        let t = Instant::now();
        let n = crate::write_dense_index(
            &encoder,
            &corpus,
            &index_path,
            Metric::InnerProduct,
            grove_dense::Storage::F32,
            64,
        )?;
        let secs = t.elapsed().as_secs_f64();
        rows.push(row(
            "encode mini-Wikipedia (all-MiniLM-L6-v2, CPU)",
            format!("{:.1}", n as f64 / secs),
            "passages/s",
            format!("{n} passages in {secs:.1} s"),
        ));
    }
    if !args.no_speed {
        // Search speed on a real index: the FanOutQA sub-questions, encoded, against the corpus.
        let encoder = load_encoder(&config)?;
        let texts: Vec<&str> = qs.iter().map(|(q, _)| q.as_str()).collect();
        let vectors = encoder.encode(&texts, grove_dense::TextKind::Query)?;
        let what = format!(
            "mini-Wikipedia, {} x {} flat IP (all-MiniLM-L6-v2), the FanOutQA sub-questions as queries",
            titles.len(),
            encoder.dim()
        );
        // A graph of ten thousand vectors builds in seconds: measured even with `--no-hnsw`, which
        // is for the million-vector index.
        let target = Target { label: ", mini-Wikipedia", path: &index_path, queries: &vectors, what, hnsw: true };
        measure(args, &target, rows)?;
    }
    let config = DenseConfig { index: Some(index_path), ..config };
    let dense = DenseBackend::open(&config, &corpus)?;
    let corpus2 = corpus.clone();
    let bm25 = tokio::task::spawn_blocking(move || crate::open_local_index(&corpus2, None)).await??;
    let hybrid = HybridBackend::new(bm25.clone(), dense.clone(), config.hybrid_depth, config.rrf_k);
    let backends: [(&str, Arc<dyn SearchBackend>); 3] =
        [("BM25", Arc::new(bm25)), ("dense", Arc::new(dense)), ("hybrid (RRF, k = 60)", Arc::new(hybrid))];
    let queries: Vec<String> = qs.iter().map(|(q, _)| q.clone()).collect();
    for (name, backend) in backends {
        let t = Instant::now();
        let lists = backend.search(queries.clone(), 3).await?;
        let secs = t.elapsed().as_secs_f64();
        let found = lists
            .iter()
            .zip(&qs)
            .filter(|(hits, (_, title))| hits.iter().any(|h| h.title_and_text().0 == title.as_str()))
            .count();
        rows.push(row(
            format!("FanOutQA dev recall@3 of the evidence passage, {name}"),
            format!("{:.3}", found as f64 / qs.len().max(1) as f64),
            "",
            format!(
                "{found} of {} sub-questions whose page is in mini-Wikipedia ({} passages); {:.2} s for all",
                qs.len(),
                titles.len(),
                secs
            ),
        ));
    }
    Ok(())
}

pub async fn run_bench_dense(args: BenchDenseArgs) -> Result<()> {
    let mut rows = Vec::new();
    if !args.no_quality {
        quality(&args, &mut rows).await?;
    }
    if !args.no_speed {
        speed(&args, &mut rows)?;
    }
    println!("| figure | value | unit | baseline / note |");
    println!("|---|---:|---|---|");
    for r in &rows {
        println!("| {} | {} | {} | {} |", r.figure, r.value, r.unit, r.note);
    }
    Ok(())
}
