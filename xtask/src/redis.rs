//! A real `redis-server` for the tests that share the web cache through Redis. The tests start
//! and stop their own servers; this only makes sure the program is installed, from Debian's
//! packages when it is missing.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Result, bail};

/// The path of `redis-server`, installing the Debian package when it is not on PATH.
pub fn ensure() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("GROVE_REDIS_SERVER").map(PathBuf::from) {
        if path.exists() {
            return Ok(path);
        }
        bail!("GROVE_REDIS_SERVER points at {}, which does not exist", path.display());
    }
    if let Some(found) = on_path() {
        return Ok(found);
    }
    // As root, apt-get directly; otherwise through sudo without a password prompt.
    let root = Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0")).unwrap_or(false);
    let apt = |args: &[&str]| -> bool {
        let mut cmd = if root { Command::new("apt-get") } else { Command::new("sudo") };
        if !root {
            cmd.args(["-n", "apt-get"]);
        }
        cmd.env("DEBIAN_FRONTEND", "noninteractive").args(args).status().map(|s| s.success()).unwrap_or(false)
    };
    println!("redis-server not found; installing the Debian package");
    if !apt(&["install", "-y", "-q", "redis-server"]) {
        // A fresh machine may not have package lists yet.
        let _ = apt(&["update", "-q"]);
        let _ = apt(&["install", "-y", "-q", "redis-server"]);
    }
    match on_path() {
        Some(found) => Ok(found),
        None => bail!(
            "redis-server is needed by the shared-cache tests and could not be installed; install the \
             `redis-server` package, or point GROVE_REDIS_SERVER at the program"
        ),
    }
}

fn on_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("redis-server")).find(|p| p.is_file())
}
