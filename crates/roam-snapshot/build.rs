//! Declares the `fuzzing` cfg (set by cargo-fuzz) so the compiler accepts it.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(fuzzing)");
}
