//! `trainer train --config` and `trainer eval` as a user runs them: a tiny model folder, QA JSONL
//! files, an env-server on loopback; training writes metrics, evaluations and checkpoints, and
//! `--resume` continues from the latest checkpoint. `trainer eval --policy openai|direct-openai`
//! against a loopback server speaking `/v1/chat/completions`.

use std::io::{BufRead, Read, Write};
use std::process::Command;
use std::sync::{Arc, Mutex};

use crate::common::{tiny_model_folder, world_files};
use grove_env_server::config::ServerConfig;
use grove_env_server::testkit::LocalServer;

/// An env-server over `corpus` on loopback, on a runtime of its own; its `ws://` URL.
fn env_server(corpus: &std::path::Path) -> (LocalServer, String) {
    let server = LocalServer::start_blocking(corpus, ServerConfig::default()).unwrap();
    let url = server.url();
    (server, url)
}

#[test]
fn train_resume_and_eval_from_the_command_line() {
    let work = tempfile::tempdir().unwrap();
    let model = work.path().join("model");
    tiny_model_folder(&model);
    let (corpus, data) = world_files(work.path());

    let (_server, url) = env_server(&corpus);

    let out = work.path().join("run");
    let config = work.path().join("train.toml");
    std::fs::write(
        &config,
        format!(
            "model = {model:?}\nenv = {url:?}\ntrain_data = {data:?}\neval_data = {data:?}\nout_dir = {out:?}\n\
             steps = 2\nprompts_per_step = 1\nmethod = {{ kind = \"tree\", m = 2, n = 1, l = 1, k = 2 }}\n\
             max_turns = 1\nmax_new_tokens = 4\n\
             micro_batch = 4\nmini_batches = 1\neval_every = 1\neval_max_questions = 2\nsave_every = 1\n\
             lr = 0.001\nwarmup_ratio = 0.0\ndevice = \"cpu\"\n"
        ),
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_trainer");
    let status = Command::new(bin).args(["train", "--config"]).arg(&config).status().unwrap();
    assert!(status.success());
    let lines = |p: &std::path::Path| std::fs::read_to_string(p.join("metrics.jsonl")).unwrap().lines().count();
    assert_eq!(lines(&out), 2);
    assert!(out.join("checkpoint-2/model.safetensors").exists());
    assert!(out.join("checkpoint-2/tokenizer.json").exists());
    assert!(out.join("eval-1.json").exists() && out.join("eval-2.json").exists());
    let eval1: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("eval-1.json")).unwrap()).unwrap();
    assert_eq!(eval1["greedy"]["all"]["questions"], 2);
    // Two of the file's four questions: a seeded random sample that says so, not the first rows.
    assert_eq!(eval1["selection"], serde_json::json!({"kind": "sample", "questions": 2, "of": 4, "seed": 0}));
    assert_eq!(eval1["sampled"]["all"]["questions"], 2);
    for plot in ["reward.svg", "metric.svg", "kl.svg", "entropy.svg", "tool_calls.svg"] {
        let svg = std::fs::read_to_string(out.join(plot)).unwrap();
        assert_eq!(svg.matches("<circle").count(), 2, "{plot}: one point per step");
    }
    assert_eq!(std::fs::read_to_string(out.join("latest")).unwrap().trim(), "checkpoint-2");
    // Every step kept its trees (the default): one prompt, two trees, each kept leaf with its
    // advantage and the inter- and intra-tree parts that sum to it.
    let run = grove_trainer::rundir::RunDir::new(&out);
    assert_eq!(run.tree_steps().unwrap(), vec![0, 1]);
    let step0 = run.trees(0).unwrap();
    assert_eq!(step0.len(), 1);
    assert_eq!((step0[0].trees.len(), step0[0].estimator.as_str()), (2, "tree"));
    let mut kept = 0;
    for tree in &step0[0].trees {
        let root = &tree.nodes[0];
        assert!(root.parent.is_none() && root.kind.is_empty() && !root.children.is_empty());
        for n in &tree.nodes {
            for &c in &n.children {
                assert_eq!(tree.nodes[c].parent, Some(n.id));
            }
            if n.id > 0 {
                assert!(!n.kind.is_empty() && n.tokens > 0, "{n:?}");
            }
            // A branch point below the root: the env forked its episode and the engine kept a
            // snapshot there to expand from.
            if n.id > 0 && n.children.len() > 1 {
                assert!(n.snapshot.is_some() && n.episode.is_some(), "{n:?}");
            }
            if let Some(leaf) = n.leaf.as_ref().filter(|l| l.kept) {
                kept += 1;
                let (a, inter, intra) =
                    (leaf.advantage.unwrap(), leaf.advantage_inter.unwrap(), leaf.advantage_intra.unwrap());
                assert!((inter + intra - a).abs() < 1e-9, "{leaf:?}");
            }
        }
    }
    assert_eq!(kept, 4, "m 2 x k 2 kept leaves");

    let status =
        Command::new(bin).args(["train", "--resume", "--steps", "3", "--config"]).arg(&config).status().unwrap();
    assert!(status.success());
    assert_eq!(lines(&out), 3, "resumed at step 2 and ran one more");
    let last: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(out.join("metrics.jsonl")).unwrap().lines().last().unwrap())
            .unwrap();
    assert_eq!(last["step"], 2);

    let eval = Command::new(bin)
        .args([
            "eval",
            "--device",
            "cpu",
            "--max-questions",
            "2",
            "--max-turns",
            "1",
            "--max-new-tokens",
            "4",
            "--env",
            &url,
        ])
        .arg("--model")
        .arg(out.join("checkpoint-3"))
        .arg("--data")
        .arg(&data)
        .output()
        .unwrap();
    assert!(eval.status.success(), "{}", String::from_utf8_lossy(&eval.stderr));
    let said = String::from_utf8_lossy(&eval.stderr);
    assert!(said.contains("evaluating on a random sample of 2 of 4 questions (seed 0)"), "{said}");
    let table = String::from_utf8_lossy(&eval.stdout);
    assert!(table.contains("synthetic_2hop") && table.contains("all"), "{table}");
    // `trainer world` writes the same world (seed 0, scale 1) the server holds, and the scripted
    // warm-start agent plays its training questions into SFT trajectories.
    let world_dir = work.path().join("world");
    let written =
        Command::new(bin).args(["world", "--train", "3", "--test", "1", "--out"]).arg(&world_dir).output().unwrap();
    assert!(written.status.success(), "{}", String::from_utf8_lossy(&written.stderr));
    let corpus_written = grove_datasets::loaders::load_wiki18(&world_dir.join("corpus.jsonl"), Default::default());
    let world = grove_datasets::synthetic::World::generate(&grove_datasets::synthetic::WorldConfig::default());
    assert_eq!(corpus_written.unwrap().items, world.passages);
    let traj = work.path().join("warm.jsonl");
    let warm = Command::new(bin)
        .args(["warmstart", "--passes", "1", "--env", &url, "--world"])
        .arg(&world_dir)
        .arg("--out")
        .arg(&traj)
        .output()
        .unwrap();
    assert!(warm.status.success(), "{}", String::from_utf8_lossy(&warm.stderr));
    let played = grove_trainer::workflows::sft::load_trajectories(&traj).unwrap();
    assert_eq!(played.len(), 6, "3 training questions per hop count");
    assert!(played.iter().all(|t| t.prompt.starts_with("Search with <search> name </search>")));
    // Budget accounting from the command line.
    let budget = |flags: &[&str]| {
        Command::new(bin)
            .args(["budget", "--device", "cpu", "--prompts", "1", "--env", &url])
            .args(flags)
            .arg("--model")
            .arg(&model)
            .arg("--data")
            .arg(&data)
            .output()
            .unwrap()
    };
    let capped = ["--max-turns", "1", "--max-new-tokens", "4", "--schedule", "continuous", "--max-rows", "4"];
    let out = budget(&capped);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("tree (2,2,1)") && table.contains("chain n=4"), "{table}");
    // A row cap is the continuous schedule's: asked of the phased one, it is refused.
    let phased_cap = budget(&["--max-rows", "4"]);
    assert!(!phased_cap.status.success());
    assert!(String::from_utf8_lossy(&phased_cap.stderr).contains("--schedule continuous"));
    // A config with an unknown key, method or value is refused with what is accepted; so is a
    // method the paper does not have, from the file or the command line.
    for (text, says) in [
        ("modle = \"x\"\n", "unknown field `modle`"),
        ("method = { kind = \"Chain\", n = 4 }\n", "unknown variant `Chain`, expected `tree` or `chain`"),
        ("method = { kind = \"chain\", n = 4, k = 1 }\n", "unknown field `k`, expected `n`"),
        ("method = { kind = \"chain\", n = 4 }\nestimator = \"tree\"\n", "needs tree rollouts"),
        ("loss_agg = \"mean\"\n", "token-mean"),
        ("rollout_schedule = \"overlapped\"\n", "expected `phased` or `continuous`"),
        ("rollout_max_rows = 8\n", "only the continuous schedule caps its running chains"),
    ] {
        std::fs::write(&config, text).unwrap();
        let bad = Command::new(bin).args(["train", "--config"]).arg(&config).output().unwrap();
        assert!(!bad.status.success(), "{text}");
        let stderr = String::from_utf8_lossy(&bad.stderr);
        assert!(stderr.contains(says), "{text}: {stderr}");
    }
    std::fs::write(&config, "").unwrap();
    let bad = Command::new(bin)
        .args(["train", "--method", "chain:4", "--estimator", "tree", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("needs tree rollouts"));
    let bad = Command::new(bin).args(["train", "--method", "chain", "--config"]).arg(&config).output().unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr).contains("expected `tree:M,N,L,K`"));
}

/// `trainer train --config` with `method = { kind = "chain", n = 4 }`, the way a user runs chain
/// GRPO (here on the continuous schedule): with a policy that earns rewards, every prompt group's advantages sum to zero (GRPO
/// centres them). Under the tree estimator, which chain runs used to get, a chain is a one-leaf
/// tree and each group's sum would be the sum of its rewards.
#[test]
fn chain_grpo_from_the_command_line_centres_every_group() {
    use grove_trainer::workflows::warmstart::{WarmStart, warm_start};
    let work = tempfile::tempdir().unwrap();
    let spec = grove_trainer::support::world::WorldSpec { seed: 0, scale: 1, train_per_hops: 24, test_per_hops: 4 };
    let world = spec.write(&work.path().join("world")).unwrap();
    let (_server, url) = env_server(&world.corpus());
    let env = grove_trainer::rl::env::EnvClient::connect(&url, Default::default()).unwrap();
    let policy = warm_start(&env, &world, &work.path().join("warm"), &WarmStart::tiny()).unwrap().policy;
    let out = work.path().join("chain");
    let config = work.path().join("chain.toml");
    std::fs::write(
        &config,
        format!(
            "model = {policy:?}\nenv = {url:?}\ntrain_data = {train:?}\nprompt_template = {prompt:?}\n\
             data_source = \"synthetic\"\nout_dir = {out:?}\nsteps = 3\nprompts_per_step = 4\n\
             method = {{ kind = \"chain\", n = 4 }}\nmax_turns = 4\nmax_obs_tokens = 200\nmax_new_tokens = 48\n\
             topk = 1\nmicro_batch = 8\nmini_batches = 2\nlr = 1e-4\neval_every = 0\nsave_every = 0\n\
             save_rollouts = true\ndevice = \"cpu\"\nrollout_schedule = \"continuous\"\n",
            train = world.train(),
            prompt = world.prompt(),
        ),
    )
    .unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_trainer")).args(["train", "--config"]).arg(&config).output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("chain n=4 with estimator grpo"), "{stderr}");
    assert!(stderr.contains("continuous rollouts"), "{stderr}");
    let dir = grove_rundir::RunDir::new(&out);
    let mut unequal = 0;
    for step in 0..3 {
        let rows = dir.rollouts(step).unwrap();
        assert_eq!(rows.len(), 4 * 4);
        for prompt in 0..4 {
            let group: Vec<_> = rows.iter().filter(|r| r.prompt == prompt).collect();
            assert_eq!(group.len(), 4);
            let sum: f64 = group.iter().map(|r| r.advantage).sum();
            assert!(sum.abs() < 1e-6, "step {step} prompt {prompt}: advantages sum to {sum}: {group:?}");
            if group.iter().any(|r| r.reward != group[0].reward) {
                unequal += 1;
                assert!(group.iter().any(|r| r.advantage > 0.0) && group.iter().any(|r| r.advantage < 0.0));
            }
        }
    }
    assert!(unequal > 0, "no group with unequal rewards: the check compared nothing");
    assert_eq!(dir.metrics().unwrap().len(), 3);
}

#[test]
fn sft_learns_the_actions_and_masks_the_observations() {
    use grove_trainer::workflows::sft::{SftStep, Trajectory, evaluate_nll, load_trajectories, sft_epoch, tokenize};
    let work = tempfile::tempdir().unwrap();
    let model = work.path().join("model");
    tiny_model_folder(&model);
    let trajectories: Vec<Trajectory> = (0..4)
        .map(|i| Trajectory {
            prompt: format!("Question {i}: who designed bridge {i}?"),
            steps: vec![
                SftStep {
                    action: format!("<think>search it</think>\n<search> bridge {i} </search>"),
                    observation: format!(
                        "\n\n<information>Doc 1(Title: \"Bridge {i}\") designed by Ada {i}.\n</information>\n\n"
                    ),
                },
                SftStep {
                    action: format!("<think>found</think>\n<answer> Ada {i} </answer>"),
                    observation: String::new(),
                },
            ],
        })
        .collect();
    let data = work.path().join("sft.jsonl");
    let lines: Vec<String> = trajectories.iter().map(|t| serde_json::to_string(t).unwrap()).collect();
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();
    assert_eq!(load_trajectories(&data).unwrap(), trajectories);

    let tok = grove_trainer::engine::tokenizer::Tokenizer::from_dir(&model).unwrap();
    let rows: Vec<_> = trajectories.iter().map(|t| tokenize(&tok, t).unwrap()).collect();
    // Observation tokens carry mask 0, action tokens 1.
    let obs_len = tok.encode(&trajectories[0].steps[0].observation).unwrap().len();
    let act_len = tok.encode(&trajectories[0].steps[0].action).unwrap().len();
    assert_eq!(rows[0].loss_mask[..act_len], vec![1; act_len][..]);
    assert_eq!(rows[0].loss_mask[act_len..act_len + obs_len], vec![0; obs_len][..]);

    let (vs, lm) = grove_trainer::engine::model::load_model(&model, tch::Device::Cpu, tch::Kind::Float).unwrap();
    let mut opt = grove_trainer::engine::optim::AdamW::new(&vs, Default::default());
    let before = evaluate_nll(&lm, &rows, 4);
    for _ in 0..30 {
        sft_epoch(&lm, &mut opt, &rows, (4, 1e-2, 0), &mut |_| {});
    }
    let after = evaluate_nll(&lm, &rows, 4);
    assert!(after < 0.5 * before, "action NLL {before} -> {after}");

    // The command writes a loadable model folder.
    let out = work.path().join("sft-out");
    let status = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .args(["sft", "--device", "cpu", "--epochs", "1", "--batch", "2", "--model"])
        .arg(&model)
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    assert!(grove_trainer::engine::model::load_model(&out, tch::Device::Cpu, tch::Kind::Float).is_ok());
    // A broken line is reported with its line number.
    std::fs::write(&data, format!("{}\n{{\"prompt\": 1}}\n", lines[0])).unwrap();
    assert!(load_trajectories(&data).unwrap_err().to_string().contains("sft.jsonl:2"));
}

/// What the loopback OpenAI-compatible server saw: each request's `Authorization` header and body.
type Seen = Arc<Mutex<Vec<(Option<String>, serde_json::Value)>>>;

/// A loopback `/v1/chat/completions` server that answers every question it knows at once and
/// right (`<answer> A `, the stop string stripped as vLLM does), one thread per connection.
fn fake_openai(answers: Vec<(String, String)>) -> (String, Seen) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen: Seen = Arc::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let (answers, log) = (answers.clone(), log.clone());
            std::thread::spawn(move || {
                let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
                let (mut path, mut auth, mut len, mut line) = (String::new(), None, 0usize, String::new());
                loop {
                    line.clear();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let l = line.trim_end();
                    if l.is_empty() {
                        break;
                    }
                    if path.is_empty() {
                        path = l.split_whitespace().nth(1).unwrap_or_default().to_string();
                    } else if let Some((k, v)) = l.split_once(':') {
                        match k.to_ascii_lowercase().as_str() {
                            "content-length" => len = v.trim().parse().unwrap_or(0),
                            "authorization" => auth = Some(v.trim().to_string()),
                            _ => {}
                        }
                    }
                }
                let mut body = vec![0; len];
                if reader.read_exact(&mut body).is_err() {
                    return;
                }
                let req: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let prompt = req["messages"][0]["content"].as_str().unwrap_or_default().to_string();
                let answer = answers.iter().find(|(q, _)| prompt.contains(q.as_str())).map_or("?", |(_, a)| a.as_str());
                let (status, text) = if path == "/v1/chat/completions" {
                    let choice = serde_json::json!({"index": 0, "finish_reason": "stop",
                        "message": {"role": "assistant", "content": format!("<answer> {answer} ")}});
                    (
                        200,
                        serde_json::json!({"id": "c1", "object": "chat.completion", "model": req["model"],
                        "choices": [choice], "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}}),
                    )
                } else {
                    (404, serde_json::json!({"error": {"message": format!("no route {path}")}}))
                };
                log.lock().unwrap().push((auth, req));
                let text = text.to_string();
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                    text.len()
                );
            });
        }
    });
    (url, seen)
}

#[test]
fn eval_against_an_openai_compatible_server_from_the_command_line() {
    const KEY: &str = "sk-grove-cli-test-5b1f0e";
    let work = tempfile::tempdir().unwrap();
    let (corpus, data) = world_files(work.path());
    let (_server, env) = env_server(&corpus);
    let questions =
        grove_datasets::loaders::load_qa_jsonl(&data, "qa", None, grove_datasets::OnBadRow::Fail).unwrap().items;
    let answers: Vec<_> = questions.iter().map(|q| (q.question.clone(), q.golden_answers[0].clone())).collect();
    let (base_url, seen) = fake_openai(answers);
    let bin = env!("CARGO_BIN_EXE_trainer");

    for (policy, max_turns) in [("direct-openai", "1"), ("openai", "3")] {
        seen.lock().unwrap().clear();
        let report = work.path().join(format!("{policy}.json"));
        let out = Command::new(bin)
            .args(["eval", "--policy", policy, "--model-name", "oracle", "--base-url", &base_url, "--env", &env])
            .args(["--max-turns", max_turns, "--max-new-tokens", "32", "--concurrency", "2", "--retries", "0"])
            .args(["--timeout-s", "20", "--data"])
            .arg(&data)
            .arg("--json")
            .arg(&report)
            .env("OPENAI_API_KEY", KEY)
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{policy}: {stderr}");
        assert!(!stdout.contains(KEY) && !stderr.contains(KEY), "{policy}: the API key was printed");
        assert!(stdout.contains("synthetic_2hop"), "{policy}: {stdout}");
        let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert_eq!(report["all"]["questions"], questions.len(), "{policy}: {report}");
        assert_eq!(report["all"]["score"], 1.0, "{policy}: {report}");
        assert_eq!(report["all"]["tool_calls_per_question"], 0.0, "{policy}: {report}");
        // One call per question, with the flags' values and the key as a bearer token.
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), questions.len(), "{policy}");
        for (auth, req) in seen.iter() {
            assert_eq!(auth.as_deref(), Some(format!("Bearer {KEY}").as_str()), "{policy}");
            assert_eq!(req["model"], "oracle", "{policy}");
            assert_eq!(req["max_tokens"], 32, "{policy}");
            assert_eq!(req["temperature"], 0.0, "{policy}: greedy unless --sampled");
            let prompt = req["messages"][0]["content"].as_str().unwrap();
            assert_eq!(prompt.contains("without searching"), policy == "direct-openai", "{policy}: {prompt}");
        }
    }

    // An openai policy needs a served model's name; the error says so.
    let out = Command::new(bin)
        .args(["eval", "--policy", "openai", "--base-url", &base_url, "--env", &env, "--data"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--policy openai / direct-openai needs --model NAME"), "{stderr}");
}

/// `trainer eval --policy openai` against a model server that accepts and never answers, its
/// output not a terminal: a sign of life comes within 5 s of the start, not after the first
/// answer (a log file used to stay empty for a minute).
#[test]
fn an_openai_eval_says_it_started_within_five_seconds() {
    let work = tempfile::tempdir().unwrap();
    let (corpus, data) = world_files(work.path());
    let (_server, env) = env_server(&corpus);
    // A model server that accepts connections and never replies.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base_url = format!("http://{}", hung.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in hung.incoming().flatten() {
            held.push(conn);
        }
    });
    let started = std::time::Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .args(["eval", "--policy", "openai", "--model-name", "m", "--base-url", &base_url, "--env", &env])
        .args(["--retries", "0", "--timeout-s", "60", "--data"])
        .arg(&data)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let found = loop {
        let left = std::time::Duration::from_secs(5).saturating_sub(started.elapsed());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("trainer eval: started") => break true,
            Ok(line) => seen.push(line),
            Err(_) => break false,
        }
    };
    let still_running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(found, "no progress line within 5 s; stderr so far: {seen:?}");
    assert!(still_running, "the eval was still waiting on the model when its first line came");
}

/// `trainer plan` from the command line: the paper's shapes for Qwen2.5-3B fit an 80 GiB card at
/// the default 16 bytes per parameter, 7B does not, the old 20-byte layout shows its extra master
/// copy, a model folder is read for its shape, and bad settings are refused.
#[test]
fn plan_says_what_a_step_holds_and_whether_it_fits() {
    let bin = env!("CARGO_BIN_EXE_trainer");
    let run = |args: &[&str]| {
        let out = Command::new(bin).arg("plan").args(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, text) = run(&["--shape", "qwen2.5-3b"]);
    assert!(ok && text.contains("3085938688 parameters") && text.contains(": fits a 80 GiB card"), "{text}");
    assert!(text.contains("3072 rows") && !text.contains("f32 master"), "{text}");
    let (ok, text) = run(&["--shape", "qwen2.5-7b"]);
    assert!(ok && text.contains("does not fit a 80 GiB card"), "{text}");
    let (ok, text) = run(&["--shape", "qwen2.5-3b", "--optim-state", "f32-master"]);
    assert!(ok && text.contains("f32 master weights"), "{text}");
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/qwen2-tiny");
    let (ok, text) = run(&["--model", golden.to_str().unwrap(), "--precision", "f32"]);
    assert!(ok && text.contains("parameters;"), "{text}");
    for bad in [
        vec!["--shape", "qwen2.5-3b", "--headroom", "1.5"],
        vec!["--shape", "qwen2.5-9b"],
        vec![],
        vec!["--shape", "qwen2.5-3b", "--model", "x"],
        vec!["--shape", "qwen2.5-3b", "--optim-state", "8bit"],
    ] {
        let (ok, text) = run(&bad);
        assert!(!ok, "{bad:?} was accepted: {text}");
    }
}
