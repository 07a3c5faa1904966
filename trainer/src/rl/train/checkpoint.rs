//! Checkpoints in a run folder: an HF model folder (weights, config, tokenizer files) plus the
//! optimiser's moments, written through the run folder's staging and commit (atomic), and
//! restored exactly.

use std::path::{Path, PathBuf};

use grove_rundir::{RunDir, TrainState};
use tch::{Kind, nn};

use crate::engine::model::save_model;
use crate::engine::optim::AdamW;

#[derive(Debug, thiserror::Error)]
#[error("checkpoint {path}: {message}")]
pub struct CheckpointError {
    pub path: String,
    pub message: String,
}

fn err(path: &Path, e: &dyn std::fmt::Display) -> CheckpointError {
    CheckpointError { path: path.display().to_string(), message: e.to_string() }
}

/// Write `checkpoint-<state.next_step>` into `run` and point `latest` at it.
pub fn save(
    run: &RunDir,
    vs: &nn::VarStore,
    config_json: &str,
    tokenizer_files: &[PathBuf],
    opt: &AdamW,
    state: &TrainState,
) -> Result<PathBuf, CheckpointError> {
    let staged = run.stage_checkpoint(state.next_step).map_err(|e| err(run.path(), &e))?;
    let tmp = staged.path.clone();
    save_model(vs, config_json, &tmp, Kind::Float, tokenizer_files).map_err(|e| err(&tmp, &e))?;
    opt.save(&tmp.join("optimizer.safetensors")).map_err(|e| err(&tmp, &e))?;
    run.commit_checkpoint(staged, state).map_err(|e| err(run.path(), &e))
}

/// Restore weights into `vs` and moments into `opt` from a checkpoint folder; its state.
pub fn load(path: &Path, vs: &nn::VarStore, opt: &mut AdamW) -> Result<TrainState, CheckpointError> {
    let tensors = tch::Tensor::read_safetensors(path.join("model.safetensors")).map_err(|e| err(path, &e))?;
    let mut vars = vs.variables();
    tch::no_grad(|| -> Result<(), CheckpointError> {
        for (name, t) in tensors {
            if let Some(v) = vars.get_mut(&name) {
                v.f_copy_(&t.to_kind(v.kind())).map_err(|e| err(path, &e))?;
            }
        }
        Ok(())
    })?;
    opt.load(&path.join("optimizer.safetensors")).map_err(|e| err(path, &e))?;
    RunDir::checkpoint_state(path).map_err(|e| err(path, &e))
}
