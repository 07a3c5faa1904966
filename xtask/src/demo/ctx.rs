//! What the demo, the experiment and the bench share: the env-server child process, the built
//! binaries and the output folder (`Ctx`) with the steps they run in it (the world, the warm
//! start, evaluations), and the SmolLM2 folder.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::TRAIN_PER_HOPS;
use crate::util;

/// An env-server child process, killed on drop.
pub(crate) struct Server {
    child: Child,
    pub(crate) url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub(crate) fn start_server(bin: &Path, corpus: &Path, log: &Path) -> Result<Server> {
    let port = free_port()?;
    let bind = format!("127.0.0.1:{port}");
    let log_file = std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
    let child = Command::new(bin)
        .args(["serve", "--corpus"])
        .arg(corpus)
        .args(["--bind", &bind])
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .with_context(|| format!("start {}", bin.display()))?;
    let mut server = Server { child, url: format!("ws://{bind}/") };
    // Ready when the port accepts connections (the index is built before the listener opens).
    let deadline = Instant::now() + Duration::from_secs(300);
    while std::net::TcpStream::connect(&bind).is_err() {
        if let Some(status) = server.child.try_wait()? {
            bail!("env-server exited with {status}; see {}", log.display());
        }
        if Instant::now() > deadline {
            bail!("env-server did not listen on {bind} within 300 s; see {}", log.display());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(server)
}

/// SmolLM2-135M-Instruct as a Hugging Face folder, imported from the asset GGUF with `trainer`
/// the first time.
pub(crate) fn smollm2_hf(trainer: &Path) -> Result<PathBuf> {
    let hf = grove_datasets::assets::assets_dir().join("smollm2-135m-instruct-hf");
    if !hf.join("model.safetensors").exists() {
        util::banner("import SmolLM2-135M-Instruct from its GGUF");
        let gguf = grove_datasets::assets::smollm2_gguf();
        if !gguf.exists() {
            bail!("{} is missing; run `cargo xtask assets`", gguf.display());
        }
        util::run_cmd(Command::new(trainer).arg("import-gguf").arg(&gguf).arg("--out").arg(&hf))?;
    }
    Ok(hf)
}

/// The report `trainer eval --json` wrote.
pub(super) fn read_eval_json(path: &Path) -> Result<grove_rundir::EvalReport> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not an evaluation report", path.display()))
}

/// The built binaries and the output folder of a demo, an experiment or the bench's policy.
pub(crate) struct Ctx {
    pub(crate) out: PathBuf,
    pub(super) trainer: PathBuf,
    pub(super) env_server: PathBuf,
}

impl Ctx {
    /// A context on binaries already built.
    pub(crate) fn new(out: PathBuf, trainer: PathBuf, env_server: PathBuf) -> Result<Ctx> {
        std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
        Ok(Ctx { out, trainer, env_server })
    }

    /// Setup (libtorch, assets), build the binaries, create `out`.
    pub(crate) fn prepare(root: &Path, out: &Path, release: bool, bins: Option<&Path>) -> Result<Ctx> {
        let out = if out.is_absolute() { out.to_path_buf() } else { root.join(out) };
        util::banner("setup: libtorch and assets");
        crate::libtorch::ensure(root, crate::libtorch::Variant::Cpu)?;
        crate::assets::ensure_all(false)?;
        if let Some(bins) = bins {
            let bins = if bins.is_absolute() { bins.to_path_buf() } else { root.join(bins) };
            let (trainer, env_server) = (bins.join("trainer"), bins.join("env-server"));
            for bin in [&trainer, &env_server] {
                anyhow::ensure!(
                    bin.is_file(),
                    "--bins: no {} (copy target/release/trainer and env-server there)",
                    bin.display()
                );
            }
            util::banner(&format!("binaries: {} (not rebuilt)", bins.display()));
            return Ctx::new(out, trainer, env_server);
        }
        util::banner("build: trainer and env-server");
        let mut build = vec!["build", "-p", "grove-trainer", "-p", "grove-env-server", "--bins"];
        if release {
            build.push("--release");
        }
        util::run(root, "cargo", &build)?;
        let bins = util::target_dir(root)?.join(if release { "release" } else { "debug" });
        Ctx::new(out, bins.join("trainer"), bins.join("env-server"))
    }

    /// Run `trainer` in the output folder.
    pub(crate) fn trainer(&self, args: &[&str]) -> Result<()> {
        util::run_cmd(Command::new(&self.trainer).args(args).current_dir(&self.out))
    }

    /// Write the synthetic world (unless present) and serve its corpus.
    pub(crate) fn world_server(&self, test_questions: usize) -> Result<Server> {
        self.world_server_training(test_questions, TRAIN_PER_HOPS)
    }

    /// [`world_server`](Self::world_server) with the first `train` of the world's training
    /// questions per hop count (the world's questions are drawn as one pool, so the held-out
    /// questions and the first `train` training questions do not depend on `train`).
    pub(super) fn world_server_training(&self, test_questions: usize, train: usize) -> Result<Server> {
        if !self.out.join("world/world.toml").exists() {
            util::banner("synthetic world: corpus, training and held-out 2/3-hop questions");
            let (test, train) = (test_questions.to_string(), train.to_string());
            self.trainer(&["world", "--out", "world", "--train", &train, "--test", &test])?;
        }
        let server = start_server(
            &self.env_server,
            &self.out.join("world/corpus.jsonl"),
            &self.out.join("env-server-world.log"),
        )?;
        eprintln!("env-server on {} (BM25 over the world's corpus)", server.url);
        Ok(server)
    }

    /// Scripted trajectories through the env-server, a BPE tokenizer and small Qwen2 from
    /// scratch, SFT: writes `<out>/sft`.
    pub(crate) fn warm_start(&self, env: &str, passes: usize, epochs: usize) -> Result<()> {
        util::banner("warm start: scripted agent through the env-server, BPE tokenizer, small Qwen2, SFT");
        self.play(env, passes)?;
        self.init_small()?;
        self.sft_small("sft", epochs)
    }

    /// The scripted agent plays every training question `passes` times through the env-server:
    /// `<out>/warm.jsonl`.
    pub(crate) fn play(&self, env: &str, passes: usize) -> Result<()> {
        let passes = passes.to_string();
        self.trainer(&[
            "warmstart",
            "--env",
            env,
            "--world",
            "world",
            "--passes",
            &passes,
            "--topk",
            "1",
            "--early-answer",
            "0.3",
            "--vague-query",
            "0.1",
            "--out",
            "warm.jsonl",
        ])
    }

    /// A BPE tokenizer and a small Qwen2 with random weights: `<out>/init`.
    pub(crate) fn init_small(&self) -> Result<()> {
        self.trainer(&[
            "init-small",
            "--corpus",
            "world/corpus.jsonl",
            "--questions",
            "world/train.jsonl",
            "--prompt-template",
            "world/prompt.txt",
            "--out",
            "init",
            "--vocab",
            "2048",
        ])
    }

    /// SFT of `<out>/init` on `<out>/warm.jsonl` for `epochs`: `<out>/<name>`.
    pub(crate) fn sft_small(&self, name: &str, epochs: usize) -> Result<()> {
        self.sft_small_sample(name, epochs, None)
    }

    /// [`sft_small`](Self::sft_small) on a seeded sample of `trajectories` (seed 0) when given.
    pub(crate) fn sft_small_sample(&self, name: &str, epochs: usize, trajectories: Option<usize>) -> Result<()> {
        let epochs = epochs.to_string();
        let sample = trajectories.map(|t| t.to_string());
        let mut args = vec![
            "sft",
            "--model",
            "init",
            "--data",
            "warm.jsonl",
            "--out",
            name,
            "--epochs",
            &epochs,
            "--lr",
            "2e-3",
            "--batch",
            "4",
        ];
        if let Some(t) = &sample {
            args.extend(["--max-trajectories", t.as_str()]);
        }
        self.trainer(&args)
    }

    /// Greedy `trainer eval` of `model` on a seeded sample (seed 0) of `questions` questions of
    /// the world's question file `data`, played as the small policy plays (the world's prompt,
    /// 4 turns of 48 new tokens, top-1 search): writes `<out>/<json>`.
    /// Greedy evaluation of `model` on a seeded sample of `questions` of `data`, with libtorch on
    /// `threads` threads (the count is part of what makes the figure reproducible).
    pub(crate) fn eval_world(
        &self,
        threads: &str,
        model: &str,
        env: &str,
        data: &str,
        questions: usize,
        json: &str,
    ) -> Result<()> {
        let questions = questions.to_string();
        self.trainer(&[
            "--threads",
            threads,
            "eval",
            "--model",
            model,
            "--env",
            env,
            "--data",
            data,
            "--data-source",
            "synthetic",
            "--prompt-template",
            "world/prompt.txt",
            "--max-turns",
            "4",
            "--max-new-tokens",
            "48",
            "--topk",
            "1",
            "--max-questions",
            &questions,
            "--sample-seed",
            "0",
            "--json",
            json,
        ])
    }
}
