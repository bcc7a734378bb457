#!/usr/bin/env bash
# The main demo: a workload starts on x86-64, is checkpointed mid-run, resumes
# on arm64 (roam's aarch64 build under qemu-user) and finishes with the same
# checksum as an uninterrupted run; then a live migration between two nodes
# (scripts/demo-live.sh) and a cluster (scripts/demo-cluster.sh).
#
# Usage: scripts/demo.sh [WORKLOAD]   (default: kmeans)
set -euo pipefail
cd "$(dirname "$0")/.."

W=${1:-kmeans}

scripts/setup.sh
# Build only what the demo runs: roam for this machine (x86-64) and for
# aarch64 (run under qemu-user), and two workloads: $W and `dirty` (the
# cluster demo's). scripts/build-all.sh, which scripts/test.sh runs, also
# builds riscv64 and every workload, the real-program suite included.
# The aarch64 build waits until steps 1 and 2 have shown a checkpoint on
# this machine: on a fresh machine each build of roam takes minutes.
echo "== building roam for $(uname -m) and the workloads (a first build takes several minutes)"
cargo build --release --locked -p roam-cli
if [ "$W" = dirty ]; then workloads/build.sh dirty; else workloads/build.sh "$W" dirty; fi

T=${CARGO_TARGET_DIR:-target}
ROAM_X86="$T/release/roam"
ROAM_ARM=(qemu-aarch64 -L /usr/aarch64-linux-gnu "$T/aarch64-unknown-linux-gnu/release/roam")
WASM=target/workloads/$W.wasm
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

echo
echo "== 1. uninterrupted run on $(uname -m)"
"$ROAM_X86" run "$WASM" -- M | tee "$WORK/reference.txt"

echo
echo "== 2. the same run on x86-64, checkpointed after 0.5 s"
"$ROAM_X86" run --checkpoint-after 0.5 --snapshot "$WORK/$W.roam" "$WASM" -- M | tee "$WORK/part1.txt"
"$ROAM_X86" inspect "$WORK/$W.roam"

echo
echo "== building roam for aarch64 (run under qemu-user)"
cargo build --release --locked -p roam-cli --target aarch64-unknown-linux-gnu

echo
echo "== 3. resumed on aarch64 (qemu-aarch64)"
"${ROAM_ARM[@]}" restore "$WORK/$W.roam" | tee "$WORK/part2.txt"

echo
ref=$(grep '^checksum:' "$WORK/reference.txt")
got=$(cat "$WORK/part1.txt" "$WORK/part2.txt" | grep '^checksum:')
echo "uninterrupted: $ref"
echo "migrated:      $got"
if [ "$ref" = "$got" ] && cmp -s "$WORK/reference.txt" <(cat "$WORK/part1.txt" "$WORK/part2.txt"); then
  echo "OK: x86-64 -> aarch64 migration produced byte-identical output"
else
  echo "MISMATCH" >&2
  exit 1
fi

echo
echo "== 4. live migration between two nodes (x86-64 -> aarch64, pre-copy)"
scripts/demo-live.sh "$W" L pre-copy

echo
echo "== 5. a cluster: planner, three named nodes, a move, a drain and a killed node"
scripts/demo-cluster.sh
