//! Build script of grove-env-server: with the `dense` feature only, an rpath to libtorch's
//! libraries (a default build does not link libtorch).
// With the `dense` feature the server links libtorch (through grove-dense): add an rpath to its
// libraries, as the trainer does, so the binary and its tests load them without
// `LD_LIBRARY_PATH`. LIBTORCH comes from `.cargo/config.toml` (set up by `cargo xtask setup`).

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if std::env::var_os("CARGO_FEATURE_DENSE").is_none() {
        return;
    }
    let Some(dir) = std::env::var_os("LIBTORCH") else {
        println!("cargo:warning=LIBTORCH is not set; run `cargo xtask setup`");
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let lib = std::fs::canonicalize(&dir).unwrap_or(dir).join("lib");
    println!("cargo:rerun-if-changed={}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
}
