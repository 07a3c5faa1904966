//! Build script of grove-dense: an rpath to libtorch's libraries, which the encoder runs on.
// Adds an rpath to the libtorch libraries, so that test and run binaries load them without
// `LD_LIBRARY_PATH`. LIBTORCH comes from `.cargo/config.toml` (set up by `cargo xtask setup`)
// or the environment; the path is canonicalised so that it survives moving the checkout.

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let Some(dir) = std::env::var_os("LIBTORCH") else {
        println!("cargo:warning=LIBTORCH is not set; run `cargo xtask setup`");
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let lib = std::fs::canonicalize(&dir).unwrap_or(dir).join("lib");
    println!("cargo:rerun-if-changed={}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
}
