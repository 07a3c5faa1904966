//! libtorch 2.11.0 for `tch` 0.24, from the PyPI `torch` wheel (`shared/notes/libtorch.md`).
//!
//! CPU (default): headers plus `libc10`, `libtorch_cpu`, `libtorch`, `libgomp`, and the two CUDA
//! runtime libraries `libtorch_cpu.so` lists as NEEDED; `libtorch_cuda.so` is left out so that
//! torch-sys does not link the CUDA stack. CUDA (`--cuda`): every library of the wheel and of its
//! `nvidia-*` dependencies.
//!
//! The cache directory appears only complete: files are extracted into `<name>.partial`, hashed
//! into `grove-manifest.txt`, and the directory is renamed into place last. A directory without a
//! manifest, or whose files do not match it, is treated as absent and rebuilt.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::util;

pub const TORCH_VERSION: &str = "2.11.0";
const MANIFEST: &str = "grove-manifest.txt";
const CPU_LIBS: [&str; 4] = ["libc10.so", "libtorch_cpu.so", "libtorch.so", "libgomp.so.1"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Cpu,
    Cuda,
}

impl Variant {
    pub fn from_cuda_flag(cuda: bool) -> Self {
        if cuda { Variant::Cuda } else { Variant::Cpu }
    }

    fn dir_name(self) -> String {
        match self {
            Variant::Cpu => format!("libtorch-{TORCH_VERSION}-cpu"),
            Variant::Cuda => format!("libtorch-{TORCH_VERSION}-cuda"),
        }
    }
}

/// Make sure the verified libtorch is in the cache and `<root>/.grove/libtorch` points at it.
pub fn ensure(root: &Path, variant: Variant) -> Result<PathBuf> {
    let cache = grove_datasets::assets::cache_dir();
    let dest = cache.join(variant.dir_name());
    match verify_quick(&dest) {
        Ok(()) => {}
        Err(why) => {
            if dest.exists() {
                eprintln!("libtorch cache at {} is not valid ({why:#}); rebuilding it", dest.display());
            }
            install(&cache, &dest, variant)?;
            verify_quick(&dest).context("freshly installed libtorch failed verification")?;
        }
    }
    link(root, &dest)?;
    Ok(dest)
}

fn install(cache: &Path, dest: &Path, variant: Variant) -> Result<()> {
    let downloads = cache.join("downloads");
    // The wheel's C++ headers and libraries do not depend on the Python version; pin one so the
    // cache key is the same on every machine.
    let pin = [
        "--only-binary=:all:",
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
        "--platform",
        "manylinux_2_28_x86_64",
    ];
    eprintln!("fetching torch=={TORCH_VERSION} (about 530 MB) into {}", downloads.display());
    let torch = util::pip_download(&downloads, "torch", TORCH_VERSION, &pin)?;
    let staging = util::staging_dir(dest)?;
    let mut files = extract_torch(&torch, &staging, variant)?;
    match variant {
        Variant::Cpu => {
            for (name, version, libs) in [
                ("nvidia-cuda-runtime", "13.0.*", &["libcudart.so.13"][..]),
                ("nvidia-cuda-cupti", "13.0.*", &["libcupti.so.13"][..]),
            ] {
                let wheel = util::pip_download(&downloads, name, version, &[])?;
                for lib in libs {
                    let bytes = util::zip_member(&wheel, &format!("nvidia/cu13/lib/{lib}"))?;
                    files.push(write_file(&staging, &format!("lib/{lib}"), &bytes)?);
                }
            }
        }
        Variant::Cuda => {
            // Every nvidia-* dependency of the wheel, at the versions torch pins.
            let deps = downloads.join("cuda-deps");
            std::fs::create_dir_all(&deps)?;
            let mut cmd = std::process::Command::new(util::python_for_pip());
            cmd.args(["-m", "pip", "download", "--disable-pip-version-check", "-d"])
                .arg(&deps)
                .args(pin)
                .arg(format!("torch=={TORCH_VERSION}"));
            util::run_cmd(&mut cmd).context("pip could not download torch's CUDA dependencies")?;
            for entry in std::fs::read_dir(&deps)? {
                let wheel = entry?.path();
                let name = wheel.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
                if name.starts_with("nvidia") && name.ends_with(".whl") {
                    files.extend(extract_matching(&wheel, &staging, |m| m.contains("/lib/") && m.contains(".so"))?);
                }
            }
        }
    }
    std::fs::write(staging.join("build-version"), format!("{TORCH_VERSION}+grove-{}\n", variant.dir_name()))?;
    write_manifest(&staging, &files)?;
    util::commit_dir(&staging, dest)?;
    eprintln!("libtorch installed at {}", dest.display());
    Ok(())
}

/// Extract `torch/include/**` and the libraries of `variant` from the torch wheel.
fn extract_torch(wheel: &Path, staging: &Path, variant: Variant) -> Result<Vec<String>> {
    let version = String::from_utf8(util::zip_member(wheel, "torch/version.py")?)?;
    let found = version
        .lines()
        .find_map(|l| l.strip_prefix("__version__ = '"))
        .and_then(|v| v.split(['+', '\'']).next())
        .context("torch/version.py has no __version__")?;
    if found != TORCH_VERSION {
        bail!("{} holds torch {found}, expected {TORCH_VERSION}", wheel.display());
    }
    extract_matching(wheel, staging, |m| match m.strip_prefix("torch/lib/") {
        Some(lib) => match variant {
            Variant::Cpu => CPU_LIBS.contains(&lib),
            Variant::Cuda => lib.contains(".so") && !lib.contains('/'),
        },
        None => m.starts_with("torch/include/") && !m.ends_with('/'),
    })
}

/// Extract the members selected by `keep`; `.../include/x` keeps its path below `include/`,
/// libraries go flat into `lib/`. Returns the written relative paths.
fn extract_matching(wheel: &Path, staging: &Path, keep: impl Fn(&str) -> bool) -> Result<Vec<String>> {
    let f = std::fs::File::open(wheel)?;
    let mut z = zip::ZipArchive::new(f).with_context(|| format!("{} is not a zip", wheel.display()))?;
    let mut written = Vec::new();
    let total = z.len();
    for i in 0..total {
        let mut entry = z.by_index(i)?;
        let name = entry.name().to_string();
        if !keep(&name) {
            continue;
        }
        let rel = if let Some(pos) = name.find("include/") {
            name[pos..].to_string()
        } else {
            format!("lib/{}", name.rsplit('/').next().unwrap_or(&name))
        };
        let out = staging.join(&rel);
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = std::fs::File::create(&out).with_context(|| format!("create {}", out.display()))?;
        std::io::copy(&mut entry, &mut file).with_context(|| format!("extract {name}"))?;
        written.push(rel);
        if written.len() % 2000 == 0 {
            eprintln!("  extracted {} files ({}/{total} entries scanned)", written.len(), i + 1);
        }
    }
    eprintln!("  extracted {} files from {}", written.len(), wheel.file_name().unwrap_or_default().to_string_lossy());
    Ok(written)
}

fn write_file(staging: &Path, rel: &str, bytes: &[u8]) -> Result<String> {
    let out = staging.join(rel);
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, bytes).with_context(|| format!("write {}", out.display()))?;
    Ok(rel.to_string())
}

/// `sha256 size path` for every file, written last (its presence marks a complete install).
fn write_manifest(staging: &Path, files: &[String]) -> Result<()> {
    eprintln!("  hashing {} files", files.len());
    let mut out = std::io::BufWriter::new(std::fs::File::create(staging.join(MANIFEST))?);
    for rel in files {
        let path = staging.join(rel);
        let size = std::fs::metadata(&path)?.len();
        writeln!(out, "{} {size} {rel}", util::sha256_file(&path)?)?;
    }
    out.into_inner()?.sync_all()?;
    Ok(())
}

fn manifest(dir: &Path) -> Result<Vec<(String, u64, String)>> {
    let text = std::fs::read_to_string(dir.join(MANIFEST)).context("no manifest (incomplete install)")?;
    text.lines()
        .map(|l| {
            let mut it = l.splitn(3, ' ');
            let (Some(h), Some(s), Some(p)) = (it.next(), it.next(), it.next()) else {
                bail!("bad manifest line {l:?}");
            };
            Ok((h.to_string(), s.parse()?, p.to_string()))
        })
        .collect()
}

/// Cheap check on every run: the manifest exists, every listed file has its size, the version
/// file names 2.11.0 and the CPU set has no `libtorch_cuda.so`.
fn verify_quick(dir: &Path) -> Result<()> {
    let version = std::fs::read_to_string(dir.join("build-version")).context("no build-version")?;
    if !version.starts_with(TORCH_VERSION) {
        bail!("build-version says {version:?}");
    }
    let entries = manifest(dir)?;
    if !entries.iter().any(|(_, _, p)| p == "lib/libtorch_cpu.so") {
        bail!("manifest lists no lib/libtorch_cpu.so");
    }
    for (_, size, rel) in &entries {
        let meta = std::fs::metadata(dir.join(rel)).with_context(|| format!("{rel} missing"))?;
        if meta.len() != *size {
            bail!("{rel} has {} bytes, manifest says {size}", meta.len());
        }
    }
    Ok(())
}

/// Re-hash every file against the manifest.
pub fn verify_full(dir: &Path) -> Result<()> {
    let entries = manifest(dir)?;
    for (hash, _, rel) in &entries {
        if util::sha256_file(&dir.join(rel))? != *hash {
            bail!("{rel} does not match its recorded sha256; run `cargo xtask setup` after deleting {}", dir.display());
        }
    }
    eprintln!("all {} files match the manifest", entries.len());
    Ok(())
}

/// `<root>/.grove/libtorch` -> the cache directory (what `.cargo/config.toml` points LIBTORCH at).
fn link(root: &Path, dest: &Path) -> Result<()> {
    let dir = root.join(".grove");
    std::fs::create_dir_all(&dir)?;
    let link = dir.join("libtorch");
    if std::fs::read_link(&link).is_ok_and(|t| t == dest) {
        return Ok(());
    }
    if link.symlink_metadata().is_ok() {
        std::fs::remove_file(&link).or_else(|_| std::fs::remove_dir_all(&link))?;
    }
    std::os::unix::fs::symlink(dest, &link).with_context(|| format!("symlink {}", link.display()))
}
