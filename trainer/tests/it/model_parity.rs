//! Parity with Hugging Face transformers on the golden tiny Qwen2 and Llama 3 models of
//! `../shared/golden`, under both config layouts: logits and token log-probs within tolerance
//! wherever the attention mask is 1, greedy ids equal; KV-cache decoding equals full re-encoding;
//! a forked cache continues exactly as re-encoding the full prefix.

use std::path::{Path, PathBuf};

use grove_trainer::engine::model::{CausalLm, load_model, save_model, token_logprobs_and_entropy};
use tch::{Device, Kind, Tensor, nn};

fn golden(model: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden").join(model)
}

/// A checkpoint folder with `config_file` as its config.json.
fn checkpoint(model: &str, config_file: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(golden(model).join(config_file), dir.path().join("config.json")).unwrap();
    std::fs::copy(golden(model).join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
    dir
}

fn cases(model: &str) -> std::collections::HashMap<String, Tensor> {
    Tensor::read_safetensors(golden(model).join("cases.safetensors")).unwrap().into_iter().collect()
}

fn load(dir: &Path) -> (nn::VarStore, CausalLm) {
    load_model(dir, Device::Cpu, Kind::Float).unwrap()
}

fn max_abs_where(a: &Tensor, b: &Tensor, mask: &Tensor) -> f64 {
    let diff = (a - b).abs() * mask.to_kind(Kind::Float);
    diff.max().double_value(&[])
}

fn check_batch(model: &str, lm: &CausalLm) {
    let c = cases(model);
    let (ids, mask, pos) = (&c["batch.input_ids"], &c["batch.attention_mask"], &c["batch.position_ids"]);
    let want = &c["batch.logits"];
    let got = tch::no_grad(|| lm.forward(ids, pos, mask, None));
    assert_eq!(got.size(), want.size());
    let scale = want.abs().max().double_value(&[]).max(1.0);
    let real = mask.unsqueeze(-1).expand_as(want);
    let err = max_abs_where(&got, want, &real);
    assert!(err < 1e-4 * scale, "{model}: logits differ by {err} (scale {scale})");
    // Token log-probs where both t and t+1 are real tokens.
    let t = ids.size()[1];
    let (lp, ent) = token_logprobs_and_entropy(&got.narrow(1, 0, t - 1), &ids.narrow(1, 1, t - 1));
    let both = mask.narrow(1, 0, t - 1) * mask.narrow(1, 1, t - 1);
    let err = max_abs_where(&lp, &c["batch.token_logprobs"], &both);
    assert!(err < 1e-4 * scale, "{model}: token log-probs differ by {err}");
    assert!(ent.min().double_value(&[]) >= 0.0);
    // Row 1 is left-padded: make sure that case is really exercised.
    assert!(mask.get(1).sum(Kind::Int64).int64_value(&[]) < t);
}

/// Greedy decoding with the KV cache, one token at a time.
fn greedy_cached(lm: &CausalLm, prompt: &Tensor, n: i64) -> Vec<i64> {
    tch::no_grad(|| {
        let mut cache = lm.new_cache();
        let len = prompt.size()[1];
        let mut mask = Tensor::ones([1, len], (Kind::Int64, Device::Cpu));
        let pos = Tensor::arange(len, (Kind::Int64, Device::Cpu)).unsqueeze(0);
        let mut logits = lm.forward_last(prompt, &pos, &mask, Some(&mut cache));
        let mut out = Vec::new();
        for i in 0..n {
            let next = logits.argmax(-1, false).int64_value(&[0]);
            out.push(next);
            mask = Tensor::ones([1, len + i + 1], (Kind::Int64, Device::Cpu));
            let ids = Tensor::from_slice(&[next]).view([1, 1]);
            let pos = Tensor::from_slice(&[len + i]).view([1, 1]);
            logits = lm.forward_last(&ids, &pos, &mask, Some(&mut cache));
        }
        out
    })
}

/// Greedy decoding by re-encoding the whole sequence at every step.
fn greedy_full(lm: &CausalLm, prompt: &Tensor, n: i64) -> Vec<i64> {
    tch::no_grad(|| {
        let mut seq: Vec<i64> = Vec::<i64>::try_from(prompt.view([-1])).unwrap();
        let mut out = Vec::new();
        for _ in 0..n {
            let len = seq.len() as i64;
            let ids = Tensor::from_slice(&seq).view([1, len]);
            let pos = Tensor::arange(len, (Kind::Int64, Device::Cpu)).unsqueeze(0);
            let mask = Tensor::ones([1, len], (Kind::Int64, Device::Cpu));
            let next = lm.forward_last(&ids, &pos, &mask, None).argmax(-1, false).int64_value(&[0]);
            out.push(next);
            seq.push(next);
        }
        out
    })
}

#[test]
fn parity_with_transformers_both_config_layouts() {
    for model in ["qwen2-tiny", "llama3-tiny"] {
        for config in ["config.json", "config.legacy.json"] {
            let dir = checkpoint(model, config);
            let (_vs, lm) = load(dir.path());
            check_batch(model, &lm);
            let c = cases(model);
            let want: Vec<i64> = Vec::<i64>::try_from(c["greedy.output_ids"].view([-1])).unwrap();
            let prompt = &c["greedy.prompt_ids"];
            assert_eq!(greedy_cached(&lm, prompt, 16), want, "{model} {config}: greedy with cache");
            assert_eq!(greedy_full(&lm, prompt, 16), want, "{model} {config}: greedy by re-encoding");
        }
    }
}

#[test]
fn a_forked_cache_continues_like_reencoding_the_prefix() {
    for model in ["qwen2-tiny", "llama3-tiny"] {
        let dir = checkpoint(model, "config.json");
        let (_vs, lm) = load(dir.path());
        tch::no_grad(|| {
            let prefix = [130i64, 192, 140, 168, 200];
            let p = prefix.len() as i64;
            let ids = Tensor::from_slice(&prefix).view([1, p]);
            let pos = Tensor::arange(p, (Kind::Int64, Device::Cpu)).unsqueeze(0);
            let mut cache = lm.new_cache();
            let _ = lm.forward(&ids, &pos, &Tensor::ones([1, p], (Kind::Int64, Device::Cpu)), Some(&mut cache));
            // Fork the one row into three and extend each with a different "observation".
            let mut forked = cache.select_rows(&Tensor::from_slice(&[0i64, 0, 0]));
            let ext = Tensor::from_slice(&[7i64, 8, 9, 40, 41, 42, 200, 1, 2]).view([3, 3]);
            let pos = Tensor::arange_start(p, p + 3, (Kind::Int64, Device::Cpu)).unsqueeze(0).repeat([3, 1]);
            let mask = Tensor::ones([3, p + 3], (Kind::Int64, Device::Cpu));
            let via_fork = lm.forward(&ext, &pos, &mask, Some(&mut forked));
            // The same rows, encoded from scratch.
            let full_ids = Tensor::cat(&[&ids.repeat([3, 1]), &ext], 1);
            let full_pos = Tensor::arange(p + 3, (Kind::Int64, Device::Cpu)).unsqueeze(0).repeat([3, 1]);
            let full = lm.forward(&full_ids, &full_pos, &mask, None).narrow(1, p, 3);
            let err = (&via_fork - &full).abs().max().double_value(&[]);
            assert!(err < 1e-4, "{model}: fork differs from re-encoding by {err}");
            // The parent cache is untouched and still continues as before.
            assert_eq!(cache.len(), p);
            assert_eq!(forked.len(), p + 3);
        });
    }
}

#[test]
fn save_then_load_round_trips() {
    for model in ["qwen2-tiny", "llama3-tiny"] {
        let dir = checkpoint(model, "config.legacy.json");
        let (vs, lm) = load(dir.path());
        let out = tempfile::tempdir().unwrap();
        let cfg = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
        save_model(&vs, &cfg, out.path(), Kind::Float, &[]).unwrap();
        let names: Vec<String> = Tensor::read_safetensors(out.path().join("model.safetensors"))
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        // The same tensor names as the HF file (tied models have no lm_head).
        let mut theirs: Vec<String> = Tensor::read_safetensors(golden(model).join("model.safetensors"))
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let mut ours = names;
        ours.sort();
        theirs.sort();
        assert_eq!(ours, theirs);
        let (_vs2, lm2) = load(out.path());
        let c = cases(model);
        let (ids, mask, pos) = (&c["batch.input_ids"], &c["batch.attention_mask"], &c["batch.position_ids"]);
        let a = tch::no_grad(|| lm.forward(ids, pos, mask, None));
        let b = tch::no_grad(|| lm2.forward(ids, pos, mask, None));
        assert_eq!((a - b).abs().max().double_value(&[]), 0.0);
    }
}

#[test]
fn missing_and_misshapen_tensors_are_named() {
    use grove_trainer::engine::model::WeightsError;
    let dir = checkpoint("llama3-tiny", "config.json");
    // Drop one tensor.
    let mut tensors = Tensor::read_safetensors(dir.path().join("model.safetensors")).unwrap();
    tensors.retain(|(n, _)| n != "model.layers.1.mlp.up_proj.weight");
    Tensor::write_safetensors(&tensors, dir.path().join("model.safetensors")).unwrap();
    match load_model(dir.path(), Device::Cpu, Kind::Float) {
        Err(WeightsError::Missing(name)) => assert_eq!(name, "model.layers.1.mlp.up_proj.weight"),
        other => panic!("{other:?}"),
    }
    // Wrong shape: a config that disagrees with the weights.
    let dir = checkpoint("llama3-tiny", "config.json");
    let cfg = std::fs::read_to_string(dir.path().join("config.json"))
        .unwrap()
        .replace("\"intermediate_size\": 160", "\"intermediate_size\": 128");
    std::fs::write(dir.path().join("config.json"), cfg).unwrap();
    match load_model(dir.path(), Device::Cpu, Kind::Float) {
        Err(WeightsError::Shape { name, found, expected }) => {
            assert!(name.contains("mlp"), "{name}");
            assert_ne!(found, expected);
        }
        other => panic!("{other:?}"),
    }
    // Unsupported architecture and broken JSON are config errors.
    std::fs::write(dir.path().join("config.json"), "{\"model_type\": \"mamba\"}").unwrap();
    assert!(matches!(load_model(dir.path(), Device::Cpu, Kind::Float), Err(WeightsError::Config(_))));
    std::fs::write(dir.path().join("config.json"), "{").unwrap();
    assert!(matches!(load_model(dir.path(), Device::Cpu, Kind::Float), Err(WeightsError::Config(_))));
}

#[test]
fn sharded_checkpoints_load_like_single_files() {
    let dir = checkpoint("llama3-tiny", "config.json");
    let tensors = Tensor::read_safetensors(dir.path().join("model.safetensors")).unwrap();
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let (a, b): (Vec<_>, Vec<_>) = tensors.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
    let mut map = serde_json::Map::new();
    for (file, part) in [("model-00001-of-00002.safetensors", a), ("model-00002-of-00002.safetensors", b)] {
        let part: Vec<(String, Tensor)> = part.into_iter().map(|(_, t)| t).collect();
        for (name, _) in &part {
            map.insert(name.clone(), file.into());
        }
        Tensor::write_safetensors(&part, dir.path().join(file)).unwrap();
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
    let (_vs, lm) = load(dir.path());
    check_batch("llama3-tiny", &lm);
    // A shard name that escapes the folder is refused.
    let evil = serde_json::json!({"weight_map": {"lm_head.weight": "../x.safetensors"}});
    std::fs::write(dir.path().join("model.safetensors.index.json"), evil.to_string()).unwrap();
    assert!(load_model(dir.path(), Device::Cpu, Kind::Float).is_err());
}

#[test]
fn bf16_weights_stay_close_to_f32() {
    let dir = checkpoint("qwen2-tiny", "config.json");
    let (_vs, lm) = load_model(dir.path(), Device::Cpu, Kind::BFloat16).unwrap();
    let c = cases("qwen2-tiny");
    let (ids, mask, pos) = (&c["batch.input_ids"], &c["batch.attention_mask"], &c["batch.position_ids"]);
    let got = tch::no_grad(|| lm.forward(ids, pos, mask, None));
    assert_eq!(got.kind(), Kind::Float, "logits come back in f32");
    let want = &c["batch.logits"];
    let scale = want.abs().max().double_value(&[]);
    let err = max_abs_where(&got, want, &mask.unsqueeze(-1).expand_as(want));
    assert!(err < 0.1 * scale, "bf16 error {err} at scale {scale}");
}

/// `trainer parity`, what `cargo xtask gpu-check` runs on CUDA: it passes on the golden folders
/// at f32 and at bf16's tolerance, and fails when the reference logits disagree.
#[test]
fn the_parity_command_passes_and_fails() {
    let bin = env!("CARGO_BIN_EXE_trainer");
    for model in ["qwen2-tiny", "llama3-tiny"] {
        for precision in ["f32", "bf16"] {
            let out = std::process::Command::new(bin)
                .args(["parity", "--json", "--device", "cpu", "--precision", precision, "--model"])
                .arg(golden(model))
                .output()
                .unwrap();
            assert!(out.status.success(), "{model} {precision}: {}", String::from_utf8_lossy(&out.stderr));
            let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(r["ok"], true, "{r}");
        }
    }
    let dir = checkpoint("qwen2-tiny", "config.json");
    let mut c: Vec<(String, Tensor)> =
        Tensor::read_safetensors(golden("qwen2-tiny").join("cases.safetensors")).unwrap().into_iter().collect();
    for (name, t) in &mut c {
        if name == "batch.logits" {
            *t = &*t + 0.5;
        }
    }
    Tensor::write_safetensors(&c, dir.path().join("cases.safetensors")).unwrap();
    let out = std::process::Command::new(bin)
        .args(["parity", "--device", "cpu", "--model"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("FAILED"));
}

/// libtorch names the attention kernel it picks for each kind of pass (the bench prints it); on
/// the CPU a known one, at every shape the engine and the trainer run.
#[test]
fn libtorch_names_the_attention_kernel_of_each_pass() {
    use grove_trainer::engine::model::SdpaKernel;
    let (_vs, lm) = load(&golden("qwen2-tiny"));
    for (batch, new, past, padded) in [(4, 64, 0, false), (8, 1, 40, false), (8, 1, 40, true), (8, 16, 40, true)] {
        let k = lm.sdpa_kernel(batch, new, past, padded);
        assert!(!matches!(k, SdpaKernel::Other(_)), "{batch} x {new} after {past}, padded {padded}: {k:?}");
    }
}
