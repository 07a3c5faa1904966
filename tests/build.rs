// The same libtorch rpath as the trainer's binaries: these tests link the trainer (and tch).
include!("../trainer/build.rs");
