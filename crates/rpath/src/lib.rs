//! The libtorch rpath, for the build scripts of the crates that link libtorch (the trainer,
//! grove-dense, the env-server with `dense`, the cross-crate tests): their binaries and tests
//! then load libtorch's libraries without `LD_LIBRARY_PATH`.
//!
//! `LIBTORCH` comes from `.cargo/config.toml` (a link into the cache, set up by `cargo xtask
//! setup`) or the environment. The path is canonicalised, so the rpath names the libraries
//! themselves and survives moving the checkout. An rpath printed by a dependency's build script
//! does not reach the dependent's link, so each linking crate calls this itself.

use std::path::PathBuf;

/// Prints the cargo directives: rebuild when `LIBTORCH` or its `lib/` changes, and link with an
/// rpath to `$LIBTORCH/lib`. Without `LIBTORCH`, a warning saying how to set it up.
pub fn emit() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let Some(dir) = std::env::var_os("LIBTORCH") else {
        println!("cargo:warning=LIBTORCH is not set; run `cargo xtask setup`");
        return;
    };
    let lib = lib_dir(PathBuf::from(dir));
    println!("cargo:rerun-if-changed={}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
}

/// `$LIBTORCH/lib`, through the canonical path where it resolves (a link into the cache).
fn lib_dir(libtorch: PathBuf) -> PathBuf {
    std::fs::canonicalize(&libtorch).unwrap_or(libtorch).join("lib")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_link_resolves_to_the_folder_it_names() {
        let base = std::env::temp_dir().join(format!("grove-rpath-{}", std::process::id()));
        let real = base.join("libtorch-real");
        std::fs::create_dir_all(&real).unwrap();
        let link = base.join("libtorch");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(lib_dir(link), std::fs::canonicalize(&real).unwrap().join("lib"));
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_missing_folder_keeps_its_path() {
        let missing = PathBuf::from("/no/such/libtorch");
        assert_eq!(lib_dir(missing), PathBuf::from("/no/such/libtorch/lib"));
    }
}
