//! Build script of grove-trainer: an rpath to libtorch's libraries (grove-rpath), so that the
//! `trainer` binary and the tests load them without `LD_LIBRARY_PATH`.

fn main() {
    grove_rpath::emit();
}
