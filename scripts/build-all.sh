#!/usr/bin/env bash
# Build roam for the host (x86-64) and for aarch64 and riscv64 (run under
# qemu-user), plus the workload suite and the real-program suite. Used by
# scripts/test.sh; scripts/demo.sh builds only what it runs (x86-64,
# aarch64 and two workloads).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p roam-cli
for t in aarch64-unknown-linux-gnu riscv64gc-unknown-linux-gnu; do
  cargo build --release --locked -p roam-cli --target "$t"
done
workloads/build.sh
