//! Build script of grove-env-server: with the `dense` feature only, an rpath to libtorch's
//! libraries (grove-rpath); a default build does not link libtorch.

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if std::env::var_os("CARGO_FEATURE_DENSE").is_some() {
        grove_rpath::emit();
    }
}
