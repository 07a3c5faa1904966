//! Loading and saving Hugging Face checkpoints: `config.json` plus `model.safetensors`, or
//! sharded files listed by `model.safetensors.index.json`. Every parameter must be present with
//! its exact shape; a missing or misshapen tensor is an error naming it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use tch::{Device, Kind, Tensor, nn};

use super::{CausalLm, ConfigError, ModelConfig};

#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{}: {message}", path.display())]
    Index { path: PathBuf, message: String },
    #[error("safetensors: {0}")]
    Tensors(#[from] tch::TchError),
    #[error("checkpoint has no tensor `{0}`")]
    Missing(String),
    #[error("tensor `{name}` has shape {found:?}, the config implies {expected:?}")]
    Shape { name: String, found: Vec<i64>, expected: Vec<i64> },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WeightsError + '_ {
    move |source| WeightsError::Io { path: path.to_path_buf(), source }
}

/// The safetensors files of a checkpoint folder.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, WeightsError> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(io(&index))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| WeightsError::Index { path: index.clone(), message: e.to_string() })?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| WeightsError::Index { path: index.clone(), message: "no `weight_map` object".into() })?;
        let mut files: Vec<String> = map.values().filter_map(|f| f.as_str().map(str::to_owned)).collect();
        files.sort();
        files.dedup();
        // Shard names come from a file: keep them inside the checkpoint folder.
        if files.iter().any(|f| f.contains('/') || f.contains("..")) {
            return Err(WeightsError::Index { path: index, message: "shard names must be plain file names".into() });
        }
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    Err(WeightsError::Io {
        path: single,
        source: std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no model.safetensors or model.safetensors.index.json",
        ),
    })
}

/// Load a checkpoint folder onto `device` in `kind` (f32 on CPU, bf16 on CUDA usually).
pub fn load_model(dir: &Path, device: Device, kind: Kind) -> Result<(nn::VarStore, CausalLm), WeightsError> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(io(&config_path))?;
    let config = ModelConfig::from_json(&text)?;
    let mut vs = nn::VarStore::new(device);
    let model = CausalLm::new(&vs.root(), config);
    let mut pending: HashMap<String, Tensor> = vs.variables().into_iter().collect();
    for file in weight_files(dir)? {
        for (name, tensor) in Tensor::read_safetensors(&file)? {
            let Some(var) = pending.get_mut(&name) else { continue };
            let (found, expected) = (tensor.size(), var.size());
            if found != expected {
                return Err(WeightsError::Shape { name, found, expected });
            }
            tch::no_grad(|| var.f_copy_(&tensor.to_kind(var.kind())))?;
            pending.remove(&name);
        }
    }
    if let Some(name) = pending.keys().min() {
        return Err(WeightsError::Missing(name.clone()));
    }
    if kind != Kind::Float {
        vs.set_kind(kind);
    }
    Ok((vs, model))
}

/// Write `config.json` (the given text) and `model.safetensors` with every parameter under its
/// HF name, in `kind`, plus any extra files (tokenizer) copied alongside.
pub fn save_model(
    vs: &nn::VarStore,
    config_json: &str,
    dir: &Path,
    kind: Kind,
    extra_files: &[PathBuf],
) -> Result<(), WeightsError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let vars: BTreeMap<String, Tensor> = vs.variables().into_iter().collect();
    let tensors: Vec<(String, Tensor)> =
        vars.into_iter().map(|(n, t)| (n, t.to_kind(kind).to_device(Device::Cpu).contiguous())).collect();
    let tmp = dir.join("model.safetensors.tmp");
    Tensor::write_safetensors(&tensors, &tmp)?;
    std::fs::rename(&tmp, dir.join("model.safetensors")).map_err(io(dir))?;
    let cfg = dir.join("config.json");
    std::fs::write(&cfg, config_json).map_err(io(&cfg))?;
    for f in extra_files {
        if let Some(name) = f.file_name() {
            std::fs::copy(f, dir.join(name)).map_err(io(f))?;
        }
    }
    Ok(())
}
