#!/usr/bin/env bash
# Build roam for the host (x86-64) and for aarch64 and riscv64 (run under
# qemu-user), plus the workload suite and the real-program suite. Used by
# scripts/test.sh; scripts/demo.sh builds only what it runs (x86-64,
# aarch64 and two workloads).
set -euo pipefail
cd "$(dirname "$0")/.."
# The host build is the test build. `cargo test --workspace` unifies the
# features of every crate's dev-dependencies (wasm-smith's `arbitrary`
# reaches cranelift, and tokio gains features), so a separate
# `cargo build -p roam-cli` compiled wasmtime, cranelift and tokio a second
# time with other features (the test build of a cold CI run took 27 min,
# most of it recompiling those, on a machine shared with other builds).
# This builds target/release/roam and every test binary, once.
cargo test --release --locked --workspace --no-run
for t in aarch64-unknown-linux-gnu riscv64gc-unknown-linux-gnu; do
  cargo build --release --locked -p roam-cli --target "$t"
done
workloads/build.sh
