//! Faults, with real processes and SIGKILL: the trainer killed mid-step resumes to exactly the
//! weights of an uninterrupted run; an env-server killed mid-run makes the trainer stop with a
//! clear report of what was lost, and after the server is back `--resume` finishes the run, again
//! with the weights of the uninterrupted run.
//!
//! The env-server runs as a separate process: this test binary re-executed in server mode. The
//! binary has its own `main` (`harness = false`): with the two server variables set it serves,
//! otherwise it runs the scenario, so `cargo test` always runs it.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{tiny_model_folder, world_files};
use grove_env_server::config::ServerConfig;
use grove_env_server::search::LocalIndex;
use grove_env_server::{Backends, run};

const SERVE_CORPUS: &str = "GROVE_FAULTS_SERVE_CORPUS";
const SERVE_BIND: &str = "GROVE_FAULTS_SERVE_BIND";

fn main() {
    match (std::env::var(SERVE_CORPUS), std::env::var(SERVE_BIND)) {
        (Ok(corpus), Ok(bind)) => serve(&corpus, &bind),
        _ => {
            // `cargo test -- --list` and filters ask the harness; answer like one.
            let args: Vec<String> = std::env::args().collect();
            if args.iter().any(|a| a == "--list") {
                println!("kill_9_the_trainer_or_the_env_server_then_resume: test");
                return;
            }
            let filter = args.iter().skip(1).find(|a| !a.starts_with('-'));
            if filter.is_some_and(|f| !"kill_9_the_trainer_or_the_env_server_then_resume".contains(f.as_str())) {
                println!("running 0 tests");
                return;
            }
            println!("running 1 test");
            kill_9_the_trainer_or_the_env_server_then_resume();
            println!("test kill_9_the_trainer_or_the_env_server_then_resume ... ok");
        }
    }
}

/// Server mode: serve the corpus until killed.
fn serve(corpus: &str, bind: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let index_dir = PathBuf::from(format!("{corpus}.index-{}", std::process::id()));
    let index = LocalIndex::open_or_build(Path::new(&corpus), Some(&index_dir), &mut |_| {}).unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&bind).await.unwrap();
        run(listener, ServerConfig::default(), Backends::new("local", Arc::new(index)), std::future::pending()).await
    })
    .unwrap();
}

struct EnvProcess(Child);

impl EnvProcess {
    fn start(corpus: &Path, port: u16) -> EnvProcess {
        let child = Command::new(std::env::current_exe().unwrap())
            .arg("serve")
            .env(SERVE_CORPUS, corpus)
            .env(SERVE_BIND, format!("127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "env-server process did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        EnvProcess(child)
    }

    fn kill_9(mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for EnvProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const STEPS: u64 = 4;

fn write_config(path: &Path, model: &Path, data: &Path, out: &Path, port: u16) {
    std::fs::write(
        path,
        format!(
            "model = {model:?}\nenv = \"ws://127.0.0.1:{port}/\"\ntrain_data = {data:?}\nout_dir = {out:?}\n\
             steps = {STEPS}\nprompts_per_step = 2\nmethod = {{ kind = \"tree\", m = 2, n = 1, l = 1, k = 2 }}\n\
             max_turns = 2\nmax_new_tokens = 8\n\
             micro_batch = 4\nmini_batches = 2\neval_every = 0\nsave_every = 1\nlr = 0.001\nwarmup_ratio = 0.0\n\
             device = \"cpu\"\n"
        ),
    )
    .unwrap();
}

fn trainer(config: &Path, resume: bool) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainer"));
    cmd.arg("train").args(if resume { &["--resume"][..] } else { &[][..] }).arg("--config").arg(config);
    cmd.env("RUST_LOG", "warn");
    cmd
}

/// Wait until the run in `out` has written `checkpoint-<n>`, while `child` still runs.
fn wait_for_checkpoint(child: &mut Child, out: &Path, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let latest = std::fs::read_to_string(out.join("latest")).unwrap_or_default();
        if latest.trim() == format!("checkpoint-{n}") {
            return;
        }
        assert!(child.try_wait().unwrap().is_none(), "the trainer finished before checkpoint-{n} was seen");
        assert!(Instant::now() < deadline, "no checkpoint-{n} after 300 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn weights(out: &Path) -> Vec<u8> {
    std::fs::read(out.join(format!("checkpoint-{STEPS}/model.safetensors"))).unwrap()
}

/// `metrics.jsonl` holds each step once, in order.
fn metric_steps(out: &Path) -> Vec<u64> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_u64().unwrap())
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn kill_9_the_trainer_or_the_env_server_then_resume() {
    let work = tempfile::tempdir().unwrap();
    let model = work.path().join("model");
    tiny_model_folder(&model);
    let (corpus, data) = world_files(work.path());
    let port = free_port();
    let env = EnvProcess::start(&corpus, port);

    // The uninterrupted run.
    let reference = work.path().join("reference");
    let config = work.path().join("reference.toml");
    write_config(&config, &model, &data, &reference, port);
    assert!(trainer(&config, false).stderr(Stdio::null()).status().unwrap().success());
    assert_eq!(metric_steps(&reference), (0..STEPS).collect::<Vec<_>>());

    // The trainer killed with SIGKILL after checkpoint-2, during step 2; resumed.
    let out = work.path().join("trainer-killed");
    let config = work.path().join("trainer-killed.toml");
    write_config(&config, &model, &data, &out, port);
    let mut child = trainer(&config, false).stderr(Stdio::null()).spawn().unwrap();
    wait_for_checkpoint(&mut child, &out, 2);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!out.join(format!("checkpoint-{STEPS}")).exists(), "killed before the end");
    assert!(trainer(&config, true).stderr(Stdio::null()).status().unwrap().success());
    assert_eq!(metric_steps(&out), (0..STEPS).collect::<Vec<_>>(), "no step twice, none missing");
    assert!(weights(&out) == weights(&reference), "resumed weights differ from the uninterrupted run");

    // The env-server killed with SIGKILL after checkpoint-2: the trainer stops and says what was
    // lost; the server comes back on the same port; --resume finishes the run.
    let out = work.path().join("env-killed");
    let config = work.path().join("env-killed.toml");
    write_config(&config, &model, &data, &out, port);
    let mut child = trainer(&config, false).stderr(Stdio::piped()).spawn().unwrap();
    wait_for_checkpoint(&mut child, &out, 2);
    env.kill_9();
    let started = Instant::now();
    let report = child.wait_with_output().unwrap();
    assert!(!report.status.success(), "the trainer must fail when its env-server is gone");
    assert!(started.elapsed() < Duration::from_secs(120), "the trainer noticed within 2 minutes");
    let stderr = String::from_utf8_lossy(&report.stderr);
    assert!(stderr.contains(&format!("env-server ws://127.0.0.1:{port}/ was lost during step")), "{stderr}");
    assert!(stderr.contains("episodes are gone"), "{stderr}");
    assert!(stderr.contains("--resume"), "{stderr}");
    assert!(stderr.contains("checkpoint-2") || stderr.contains("checkpoint-3"), "{stderr}");
    let env = EnvProcess::start(&corpus, port);
    assert!(trainer(&config, true).stderr(Stdio::null()).status().unwrap().success());
    assert_eq!(metric_steps(&out), (0..STEPS).collect::<Vec<_>>());
    assert!(weights(&out) == weights(&reference), "resumed weights differ from the uninterrupted run");
    drop(env);
}
