//! Build script of grove-tests: the trainer's libtorch rpath, since these tests link the trainer
//! (and tch). A copy of trainer/build.rs rather than an `include!` of it: an included file may
//! not start with a module doc.
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
