//! Programs the tests need from Debian's packages: `redis-server` (the shared web-cache tests)
//! and headless Chromium (the browser tests of `trainer view`: grove-view's `tests/it/browser.rs`
//! and grove-tests' `view.rs`, through `grove_view::browser_check`). Each is found through its
//! environment variable, then on PATH, and installed with apt-get when missing; its path is
//! passed to the tests in the same variable. The tests start and stop their own processes.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Result, bail};

/// A program the tests run, and where it comes from.
#[derive(Debug)]
pub struct Program {
    /// The variable that names it to the tests (and overrides the search).
    pub env: &'static str,
    /// The names it may have on PATH, in order of preference.
    pub names: &'static [&'static str],
    pub package: &'static str,
    /// Who needs it, for the error message.
    pub needed_by: &'static str,
}

pub const REDIS_SERVER: Program = Program {
    env: "GROVE_REDIS_SERVER",
    names: &["redis-server"],
    package: "redis-server",
    needed_by: "the shared-cache tests",
};

pub const CHROMIUM: Program = Program {
    env: "GROVE_CHROMIUM",
    names: &["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"],
    package: "chromium",
    needed_by: "the browser tests of `trainer view`",
};

/// The program's path, installing its Debian package when it is not on PATH.
pub fn ensure(p: &Program) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(p.env).map(PathBuf::from) {
        if path.is_file() {
            return Ok(path);
        }
        bail!("{} points at {}, which is not a file", p.env, path.display());
    }
    if let Some(found) = on_path(p) {
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
    println!("{} not found; installing the Debian package `{}`", p.names[0], p.package);
    if !apt(&["install", "-y", "-q", p.package]) {
        // A fresh machine may not have package lists yet.
        let _ = apt(&["update", "-q"]);
        let _ = apt(&["install", "-y", "-q", p.package]);
    }
    match on_path(p) {
        Some(found) => Ok(found),
        None => bail!(
            "{} is needed by {} and could not be installed; install the `{}` package, or point {} at the program",
            p.names[0],
            p.needed_by,
            p.package,
            p.env
        ),
    }
}

fn on_path(p: &Program) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    p.names.iter().find_map(|name| std::env::split_paths(&path).map(|d| d.join(name)).find(|f| f.is_file()))
}
