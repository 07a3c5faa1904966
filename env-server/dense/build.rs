//! Build script of grove-dense: an rpath to libtorch's libraries (grove-rpath), which the
//! encoder runs on.

fn main() {
    grove_rpath::emit();
}
