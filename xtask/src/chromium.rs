//! Headless Chromium for the browser tests (grove-view's `tests/it/browser.rs`, and grove-tests'
//! `view.rs` on a real run, both through `grove_view::browser_check`): makes sure a Chromium is
//! installed, from Debian's `chromium` package when it is missing, and names it to the tests
//! through `GROVE_CHROMIUM`. The tests start and stop their own browsers.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Result, bail};

const NAMES: [&str; 4] = ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"];

/// The path of a Chromium (or Chrome) binary, installing Debian's package when none is on PATH.
pub fn ensure() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("GROVE_CHROMIUM").map(PathBuf::from) {
        if path.is_file() {
            return Ok(path);
        }
        bail!("GROVE_CHROMIUM points at {}, which is not a file", path.display());
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
    println!("chromium not found; installing the Debian package");
    if !apt(&["install", "-y", "-q", "chromium"]) {
        // A fresh machine may not have package lists yet.
        let _ = apt(&["update", "-q"]);
        let _ = apt(&["install", "-y", "-q", "chromium"]);
    }
    match on_path() {
        Some(found) => Ok(found),
        None => bail!(
            "headless Chromium is needed by grove-view's browser test and could not be installed; install \
             the `chromium` package, or point GROVE_CHROMIUM at a Chromium or Chrome binary"
        ),
    }
}

fn on_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    NAMES.iter().find_map(|name| std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file()))
}
