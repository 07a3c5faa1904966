//! The view server without a browser: the JSON API's shapes on a run folder and on an experiment
//! folder, typed errors (unknown step or run: 404; malformed requests: 400, 405, 431, 403), the
//! page and its assets with their content types, and a run that grows while it is served.

use std::io::Write;

use grove_rundir::{PromptTrees, RunDir};
use serde_json::Value;

use crate::fixture::{eval, metrics, step_trees, written_experiment, written_run};
use crate::server::{get, raw, serve};

#[tokio::test]
async fn the_run_api_lists_tree_steps_metrics_evaluations_and_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let run = written_run(dir.path());
    let s = serve(run.path()).await;
    let r = get(s.addr, "/api/run").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["kind"], "run");
    assert_eq!(v["run"], 0);
    assert_eq!(v["runs"].as_array().unwrap().len(), 1);
    assert_eq!(v["steps"], serde_json::json!([1, 2]));
    let m = v["metrics"].as_array().unwrap();
    assert_eq!(m.len(), 3);
    for field in ["step", "reward_mean", "metric_mean", "kl", "entropy", "clip_fraction", "tool_calls"] {
        assert!(m[2][field].is_number(), "metrics have {field}: {}", m[2]);
    }
    assert_eq!(m[2]["tool_calls"], 42);
    let e = v["evals"].as_array().unwrap();
    assert_eq!(e.iter().map(|p| p["step"].as_u64().unwrap()).collect::<Vec<_>>(), vec![0, 2]);
    assert_eq!(e[1]["greedy"]["synthetic_2hop"]["score"], 0.65);
    assert!(v["config"].as_str().unwrap().contains("steps = 3"));
    assert_eq!(v["warnings"], serde_json::json!([]));
    // `run=0` names the same run; another number is no run.
    assert_eq!(get(s.addr, "/api/run?run=0").await.json()["steps"], v["steps"]);
    let r = get(s.addr, "/api/run?run=3").await;
    assert_eq!(r.status, 404);
    assert!(r.json()["error"].as_str().unwrap().contains("no run 3"));
}

#[tokio::test]
async fn the_trees_api_returns_the_records_with_a_summary_per_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let run = written_run(dir.path());
    let s = serve(run.path()).await;
    let r = get(s.addr, "/api/trees?step=2").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["step"], 2);
    let prompts = v["prompts"].as_array().unwrap();
    let records = run.trees(2).unwrap();
    assert_eq!(prompts.len(), records.len());
    for (p, rec) in prompts.iter().zip(&records) {
        // The record as written, plus its summary.
        let back: PromptTrees = serde_json::from_value(p.clone()).unwrap();
        assert_eq!(&back, rec);
        let leaves = rec.trees.iter().flat_map(|t| &t.nodes).filter(|n| n.leaf.is_some()).count();
        let sum = &p["summary"];
        assert_eq!(sum["leaves"], leaves);
        assert_eq!(sum["trees"], 2);
        assert_eq!(sum["branch_points"], 6, "three per tree: the root and two forks");
        let hops = match rec.data_source.as_str() {
            "synthetic_2hop" => Value::from(2),
            "synthetic_3hop" => Value::from(3),
            _ => Value::Null,
        };
        assert_eq!(sum["hops"], hops, "{}", rec.data_source);
        assert!(sum["reward_max"].is_number() && sum["reward_mean"].is_number());
    }
    // Node fields the page reads.
    let node = &prompts[0]["trees"][0]["nodes"][1];
    for field in
        ["id", "parent", "depth", "children", "kind", "action", "content", "observation", "episode", "env_step"]
    {
        assert!(!node[field].is_null(), "node has {field}: {node}");
    }
    let leaf = &prompts[0]["trees"][0]["nodes"][3]["leaf"];
    for field in ["reward", "metric", "kept", "advantage", "advantage_inter", "advantage_intra"] {
        assert!(!leaf[field].is_null(), "leaf has {field}: {leaf}");
    }
}

#[tokio::test]
async fn unknown_steps_runs_and_routes_are_404_with_a_json_error() {
    let dir = tempfile::tempdir().unwrap();
    let run = written_run(dir.path());
    let s = serve(run.path()).await;
    for (target, says) in [
        ("/api/trees?step=99", "no trees recorded for step 99"),
        ("/api/trees?step=1&run=7", "no run 7"),
        ("/api/nothing", "no API route /api/nothing"),
        ("/api/experiment", "a run, not an experiment"),
    ] {
        let r = get(s.addr, target).await;
        assert_eq!(r.status, 404, "{target}: {}", r.text());
        let v = r.json();
        assert!(v["error"].as_str().unwrap().contains(says), "{target}: {v}");
        assert_eq!(v["status"], 404);
    }
    // Paths never reach the file system: traversal is just an unknown route.
    for target in ["/../Cargo.toml", "/%2e%2e/%2e%2e/etc/passwd", "/metrics.jsonl", "/config.toml", "/app.js/../../x"] {
        let r = get(s.addr, target).await;
        assert_eq!(r.status, 404, "{target}");
        assert_eq!(r.text(), "not found\n", "{target}");
    }
}

#[tokio::test]
async fn malformed_requests_are_typed_errors_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let run = written_run(dir.path());
    let s = serve(run.path()).await;
    let host = format!("Host: 127.0.0.1:{}", s.addr.port());
    let cases: Vec<(Vec<u8>, u16)> = vec![
        (b"GARBAGE\r\n\r\n".to_vec(), 400),
        (b"\x00\x01\x02\xff\xfe\r\n\r\n".to_vec(), 400),
        (format!("GET /api/trees?step=abc HTTP/1.1\r\n{host}\r\n\r\n").into_bytes(), 400),
        (format!("GET /api/trees?step=-1 HTTP/1.1\r\n{host}\r\n\r\n").into_bytes(), 400),
        (format!("GET /api/trees HTTP/1.1\r\n{host}\r\n\r\n").into_bytes(), 400),
        (format!("GET /api/run?run=x HTTP/1.1\r\n{host}\r\n\r\n").into_bytes(), 400),
        (format!("GET / HTTP/3\r\n{host}\r\n\r\n").into_bytes(), 400),
        (b"GET / HTTP/1.1\r\n\r\n".to_vec(), 400),
        (format!("GET / HTTP/1.1\r\n{host}\r\nContent-Length: 4\r\n\r\nbody").into_bytes(), 400),
        (format!("POST /api/run HTTP/1.1\r\n{host}\r\nContent-Length: 0\r\n\r\n").into_bytes(), 405),
        (format!("DELETE / HTTP/1.1\r\n{host}\r\n\r\n").into_bytes(), 405),
        (format!("GET / HTTP/1.1\r\n{host}\r\nX-Big: {}\r\n\r\n", "a".repeat(40_000)).into_bytes(), 431),
        (b"GET /api/run HTTP/1.1\r\nHost: attacker.example\r\n\r\n".to_vec(), 403),
    ];
    for (request, status) in cases {
        let r = raw(s.addr, &request).await;
        let shown = String::from_utf8_lossy(&request[..request.len().min(60)]).into_owned();
        assert_eq!(r.status, status, "{shown:?}: {}", r.text());
        let v = r.json();
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{shown:?}: {v}");
    }
    // A client that connects and leaves, or sends half a head and leaves, costs nothing.
    drop(tokio::net::TcpStream::connect(s.addr).await.unwrap());
    let mut half = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut half, b"GET /api/ru").await.unwrap();
    drop(half);
    let r = get(s.addr, "/api/run").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("allow"), None);
    // HTTP/1.0 without Host is fine; 405 says what is allowed.
    assert_eq!(raw(s.addr, b"GET /api/run HTTP/1.0\r\n\r\n").await.status, 200);
    let r = raw(s.addr, format!("PUT / HTTP/1.1\r\n{host}\r\n\r\n").as_bytes()).await;
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
    // A loopback name with any port is accepted.
    assert_eq!(raw(s.addr, b"GET /api/run HTTP/1.1\r\nHost: localhost\r\n\r\n").await.status, 200);
}

#[tokio::test]
async fn the_page_and_its_assets_are_served_with_their_types() {
    let dir = tempfile::tempdir().unwrap();
    let run = written_run(dir.path());
    let s = serve(run.path()).await;
    for (path, ty, needle) in [
        ("/", "text/html; charset=utf-8", "<script src=\"/app.js\""),
        ("/index.html", "text/html; charset=utf-8", "id=\"transcript\""),
        ("/app.js", "text/javascript; charset=utf-8", "/api/trees?step="),
        ("/style.css", "text/css; charset=utf-8", "#transcript"),
    ] {
        let r = get(s.addr, path).await;
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("content-type"), Some(ty), "{path}");
        assert!(r.text().contains(needle), "{path} contains {needle}");
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
        let csp = r.header("content-security-policy").unwrap();
        assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"), "{csp}");
        assert_eq!(r.header("cache-control"), Some("no-store"));
        // Offline: the page names no other server (the SVG namespace is a name, not a fetch).
        let text = r.text().replace("http://www.w3.org/2000/svg", "");
        assert!(!text.contains("http://") && !text.contains("https://") && !text.contains("//cdn"), "{path}");
    }
    let head = raw(s.addr, format!("HEAD / HTTP/1.1\r\nHost: localhost:{}\r\n\r\n", s.addr.port()).as_bytes()).await;
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    assert!(head.header("content-length").unwrap().parse::<usize>().unwrap() > 1000);
    assert!(s.url.starts_with("http://127.0.0.1:") && s.url.ends_with('/'), "{}", s.url);
}

#[tokio::test]
async fn new_steps_appear_while_serving_and_rewritten_steps_are_read_again() {
    let dir = tempfile::tempdir().unwrap();
    // The server starts on a folder the trainer has not written yet.
    let s = serve(dir.path()).await;
    let v = get(s.addr, "/api/run").await.json();
    assert_eq!(v["kind"], "run");
    assert_eq!(v["steps"], serde_json::json!([]));
    assert_eq!(v["metrics"], serde_json::json!([]));
    let run = written_run(dir.path());
    assert_eq!(get(s.addr, "/api/run").await.json()["steps"], serde_json::json!([1, 2]));
    // The trainer goes on: step 3's trees, metrics and an evaluation.
    run.write_trees(3, &step_trees(3)).unwrap();
    run.append_metrics(&metrics(3, 0.7)).unwrap();
    run.write_eval(&eval(3, 0.6)).unwrap();
    let v = get(s.addr, "/api/run").await.json();
    assert_eq!(v["steps"], serde_json::json!([1, 2, 3]));
    assert_eq!(v["metrics"].as_array().unwrap().len(), 4);
    assert_eq!(v["evals"].as_array().unwrap().len(), 3);
    let t = get(s.addr, "/api/trees?step=3").await.json();
    assert_eq!(t["prompts"][0]["step"], 3);
    // An interrupted run writes a step again: the new file is read, not the cached one.
    let mut fewer = step_trees(3);
    fewer.truncate(1);
    fewer[0].question = "A question written again".into();
    run.write_trees(3, &fewer).unwrap();
    let t = get(s.addr, "/api/trees?step=3").await.json();
    assert_eq!(t["prompts"].as_array().unwrap().len(), 1);
    assert_eq!(t["prompts"][0]["question"], "A question written again");
}

#[tokio::test]
async fn a_metrics_line_being_written_is_a_warning_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let run = written_run(dir.path());
    let s = serve(run.path()).await;
    assert_eq!(get(s.addr, "/api/run").await.json()["metrics"].as_array().unwrap().len(), 3);
    let mut f = std::fs::OpenOptions::new().append(true).open(run.metrics_path()).unwrap();
    f.write_all(b"{\"step\": 3, \"reward_me").unwrap();
    let r = get(s.addr, "/api/run").await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["metrics"].as_array().unwrap().len(), 3, "the last readable metrics");
    assert!(v["warnings"][0].as_str().unwrap().contains("metrics"), "{v}");
    // A trees file of another format version is an error for that step only.
    let mut p = step_trees(4);
    p[0].version = 99;
    run.write_trees(4, &p).unwrap();
    let r = get(s.addr, "/api/trees?step=4").await;
    assert_eq!(r.status, 500);
    assert!(r.json()["error"].as_str().unwrap().contains("version 99"));
    assert_eq!(get(s.addr, "/api/trees?step=1").await.status, 200);
}

#[tokio::test]
async fn an_experiment_folder_shows_its_arms_with_the_mean_and_band_over_seeds() {
    let dir = tempfile::tempdir().unwrap();
    written_experiment(dir.path());
    let s = serve(dir.path()).await;
    let v = get(s.addr, "/api/run").await.json();
    assert_eq!(v["kind"], "experiment");
    let labels: Vec<&str> = v["runs"].as_array().unwrap().iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        [
            "strong / chain-n-2 / seed-0",
            "strong / chain-n-2 / seed-1",
            "strong / sweep / lr-1e-4 / tree-1-2-1 / seed-1000",
            "strong / tree-1-2-1 / seed-0",
            "strong / tree-1-2-1 / seed-1",
        ]
    );
    assert_eq!(v["run"], 0, "the first run is shown by default");
    let ex = get(s.addr, "/api/experiment").await.json();
    assert_eq!(ex["kind"], "experiment");
    let regimes = ex["regimes"].as_array().unwrap();
    assert_eq!(regimes.len(), 1);
    assert_eq!(regimes[0]["name"], "strong");
    let groups = regimes[0]["groups"].as_array().unwrap();
    let names: Vec<&str> = groups.iter().map(|g| g["label"].as_str().unwrap()).collect();
    assert_eq!(names, ["chain-n-2", "sweep/lr-1e-4/tree-1-2-1", "tree-1-2-1"]);
    assert_eq!(groups[1]["sweep"], true);
    let tree = &groups[2];
    assert_eq!(tree["sweep"], false);
    assert_eq!(tree["runs"].as_array().unwrap().len(), 2);
    assert_eq!(tree["runs"][0]["seed"], "seed-0");
    assert_eq!(tree["runs"][0]["tree_steps"], 1);
    // Step 1's training reward over seeds 0 and 1: 0.41 and 0.51; mean 0.46, sd 0.0707, t 12.706.
    let p = &tree["series"]["reward_mean"][1];
    assert_eq!(p["step"], 1);
    assert_eq!(p["n"], 2);
    let (mean, lo, hi) = (p["mean"].as_f64().unwrap(), p["lo"].as_f64().unwrap(), p["hi"].as_f64().unwrap());
    assert!((mean - 0.46).abs() < 1e-9, "{p}");
    let half = 12.706 * (0.005f64).sqrt() / 2f64.sqrt();
    assert!((hi - mean - half).abs() < 1e-6 && (mean - lo - half).abs() < 1e-6, "{p}");
    for key in ["metric_mean", "kl", "entropy", "clip_fraction", "tool_calls", "em:all", "em:synthetic_2hop"] {
        assert!(!tree["series"][key].as_array().unwrap().is_empty(), "{key}");
    }
    assert_eq!(tree["series"]["em:all"][0]["step"], 3);
    // One seed: no band.
    assert!(groups[1]["series"]["reward_mean"][0]["lo"].is_null());
    // A seed run's trees, by its number.
    let id = v["runs"][3]["run"].as_u64().unwrap();
    let r = get(s.addr, &format!("/api/run?run={id}")).await.json();
    assert_eq!(r["label"], "strong / tree-1-2-1 / seed-0");
    assert_eq!(r["steps"], serde_json::json!([2]));
    let t = get(s.addr, &format!("/api/trees?step=2&run={id}")).await;
    assert_eq!(t.status, 200);
    assert_eq!(t.json()["prompts"].as_array().unwrap().len(), 4);
    // A new seed appears with a new number; the old numbers keep naming the same runs.
    RunDir::new(dir.path().join("strong/chain-n-2/seed-2")).append_metrics(&metrics(0, 0.3)).unwrap();
    let v2 = get(s.addr, "/api/run").await.json();
    let runs = v2["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6);
    let seed2 = runs.iter().find(|r| r["label"] == "strong / chain-n-2 / seed-2").unwrap();
    assert_eq!(seed2["run"], 5);
    assert_eq!(get(s.addr, &format!("/api/run?run={id}")).await.json()["label"], "strong / tree-1-2-1 / seed-0");
}
