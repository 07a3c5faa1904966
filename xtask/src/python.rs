//! The Python environment for the cross-language checks: a venv in the cache with the pinned
//! packages below, recreated when the pins change.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::util;

/// Packages the Python tests need, pinned.
const REQUIREMENTS: &[&str] =
    &["msgpack==1.1.2", "pytest==8.4.2", "websockets==15.0.1", "numpy==2.4.6", "faiss-cpu==1.15.1"];

pub fn venv_dir() -> PathBuf {
    grove_datasets::assets::cache_dir().join("venv")
}

/// The venv's interpreter.
pub fn python(venv: &Path) -> PathBuf {
    venv.join("bin").join("python")
}

pub fn ensure_venv(venv: &Path) -> Result<()> {
    let wanted = REQUIREMENTS.join("\n") + "\n";
    ensure(venv, &wanted, &mut |pip| {
        pip.args(REQUIREMENTS);
    })
}

/// The venv of the verl integration tests (`clients/verl`): verl from the registry with the exact
/// package set its tests ran with (`clients/verl/requirements-test.txt`, a `pip freeze`; torch is
/// the registry's 2.11.0 build, which runs on the CPU). Several GB, so it lives in the cache.
pub fn verl_venv_dir() -> PathBuf {
    grove_datasets::assets::cache_dir().join("verl-venv")
}

/// Create or refresh the verl venv: every pinned package installed without resolving (the pins
/// are the whole closure).
pub fn ensure_verl_venv(root: &Path, venv: &Path) -> Result<()> {
    let pins = root.join("clients/verl/requirements-test.txt");
    let wanted = std::fs::read_to_string(&pins).with_context(|| format!("read {}", pins.display()))?;
    ensure(venv, &wanted, &mut |pip| {
        pip.args(["--no-deps", "-r"]).arg(&pins);
    })
}

/// A venv whose stamp file says it holds `wanted`; otherwise made anew, `install` adding what
/// `pip install` gets.
fn ensure(venv: &Path, wanted: &str, install: &mut dyn FnMut(&mut Command)) -> Result<()> {
    let stamp = venv.join("grove-requirements.txt");
    if python(venv).exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        return Ok(());
    }
    if venv.exists() {
        std::fs::remove_dir_all(venv).with_context(|| format!("remove stale venv {}", venv.display()))?;
    }
    let mut cmd = Command::new(util::python_for_pip());
    cmd.args(["-m", "venv"]).arg(venv);
    util::run_cmd(&mut cmd)
        .with_context(|| format!("cannot create the venv {} (is python3-venv installed?)", venv.display()))?;
    let mut pip = Command::new(python(venv));
    pip.args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"]);
    install(&mut pip);
    util::run_cmd(&mut pip).with_context(|| format!("pip install into {} failed", venv.display()))?;
    std::fs::write(&stamp, wanted)?;
    Ok(())
}

/// Run pytest on `paths` (relative to `root`) with extra environment variables.
pub fn pytest(venv: &Path, root: &Path, paths: &[&str], envs: &[(&str, &Path)]) -> Result<()> {
    let mut cmd = Command::new(python(venv));
    cmd.args(["-m", "pytest", "-q"]).args(paths).current_dir(root);
    for (key, value) in envs {
        cmd.env(key, value);
    }
    util::run_cmd(&mut cmd)
}

/// The env-server binary `cargo build` writes (debug profile).
pub fn env_server_binary(root: &Path) -> Result<PathBuf> {
    Ok(util::target_dir(root)?.join("debug").join(format!("env-server{}", std::env::consts::EXE_SUFFIX)))
}
