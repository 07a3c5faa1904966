//! Small helpers: running commands, hashing, atomic directory installs.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

pub fn banner(name: &str) {
    eprintln!("\n==> {name}");
}

/// Run a command in `dir`, inheriting stdout/stderr; fail on a non-zero exit.
pub fn run(dir: &Path, program: &str, args: &[&str]) -> Result<()> {
    run_cmd(Command::new(program).args(args).current_dir(dir))
}

pub fn run_cmd(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd.status().with_context(|| format!("cannot start {shown}"))?;
    if !status.success() {
        bail!("{shown} exited with {status}");
    }
    Ok(())
}

pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).with_context(|| format!("read {}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:x}", h.finalize()))
}

pub fn sha256_bytes(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// A fresh staging directory next to `dest`, removed first if a crashed run left one.
pub fn staging_dir(dest: &Path) -> Result<PathBuf> {
    let name = dest.file_name().context("destination has no name")?.to_string_lossy();
    let staging = dest.with_file_name(format!("{name}.partial"));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).with_context(|| format!("remove {}", staging.display()))?;
    }
    std::fs::create_dir_all(&staging).with_context(|| format!("create {}", staging.display()))?;
    Ok(staging)
}

/// Move a completed staging directory into place (replacing an invalid old one).
pub fn commit_dir(staging: &Path, dest: &Path) -> Result<()> {
    if dest.exists() {
        std::fs::remove_dir_all(dest).with_context(|| format!("remove {}", dest.display()))?;
    }
    std::fs::rename(staging, dest).with_context(|| format!("rename {} -> {}", staging.display(), dest.display()))
}

/// `pip download --no-deps` of one exact requirement into `dir`; returns the wheel's path.
/// pip checks the index's published hash, and skips the download when the file is there.
pub fn pip_download(dir: &Path, name: &str, version: &str, extra: &[&str]) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let prefix = format!("{}-{}", name.replace('-', "_"), version.trim_end_matches(".*"));
    if let Some(found) = find_wheel(dir, &prefix)? {
        if zip_is_readable(&found) {
            return Ok(found);
        }
        std::fs::remove_file(&found)?;
    }
    let spec = format!("{name}=={version}");
    let mut cmd = Command::new(python_for_pip());
    cmd.args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d"])
        .arg(dir)
        .args(extra)
        .arg(&spec);
    run_cmd(&mut cmd).with_context(|| format!("pip could not download {spec}"))?;
    let found = find_wheel(dir, &prefix)?
        .with_context(|| format!("pip reported success but no {prefix}*.whl in {}", dir.display()))?;
    if !zip_is_readable(&found) {
        std::fs::remove_file(&found)?;
        bail!("{} is not a readable wheel (truncated download?); removed it, run again", found.display());
    }
    Ok(found)
}

fn find_wheel(dir: &Path, prefix: &str) -> Result<Option<PathBuf>> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with(prefix) && name.ends_with(".whl") {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

fn zip_is_readable(path: &Path) -> bool {
    std::fs::File::open(path).ok().and_then(|f| zip::ZipArchive::new(f).ok()).is_some()
}

/// The interpreter used to run pip: `$GROVE_PYTHON`, else `python3`.
pub fn python_for_pip() -> String {
    std::env::var("GROVE_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Read one member of a zip (wheel) into memory.
pub fn zip_member(archive: &Path, member: &str) -> Result<Vec<u8>> {
    let f = std::fs::File::open(archive).with_context(|| format!("open {}", archive.display()))?;
    let mut z = zip::ZipArchive::new(f).with_context(|| format!("{} is not a zip", archive.display()))?;
    let mut entry = z.by_name(member).with_context(|| format!("{member} not in {}", archive.display()))?;
    let mut out = Vec::with_capacity(entry.size() as usize);
    entry.read_to_end(&mut out)?;
    Ok(out)
}

/// The target folder cargo builds into for this checkout (as `cargo metadata` says: it honours
/// `CARGO_TARGET_DIR` and cargo's configuration), the one place xtask looks it up.
pub fn target_dir(root: &Path) -> Result<PathBuf> {
    let out = Command::new("cargo")
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(root)
        .output()
        .context("cargo metadata")?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("cargo metadata output")?;
    Ok(PathBuf::from(v["target_directory"].as_str().context("no target_directory")?))
}
