//! Build script of grove-tests: the libtorch rpath (grove-rpath), since these tests link the
//! trainer (and tch).

fn main() {
    grove_rpath::emit();
}
