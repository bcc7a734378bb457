#!/usr/bin/env bash
# Run every check and test roam has: formatting, clippy, unit tests, and the
# integration tests, including checkpoint on x86-64 / restore on aarch64 and
# riscv64 under qemu-user and the reverse, for every workload.
set -euo pipefail
cd "$(dirname "$0")/.."
# Behave like CI: a test whose tool (wasm-opt, clang-16, gcc, qemu-user,
# userfaultfd) is missing fails, naming it, instead of skipping.
export CI=true

scripts/setup.sh
echo "== format and lints"
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== builds (host, aarch64, riscv64) and workloads"
scripts/build-all.sh
echo "== fuzz targets compile"
cargo check --quiet --manifest-path fuzz/Cargo.toml
echo "== tests"
# `cargo test`, then the 20 slowest tests and their durations.
# --no-fail-fast: one failing test binary must not hide the failures of the
# binaries after it.
scripts/timed-tests.sh --workspace --release --locked --no-fail-fast
