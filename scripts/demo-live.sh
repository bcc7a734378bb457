#!/usr/bin/env bash
# Live cross-ISA migration between two nodes: an x86-64 node and an aarch64
# node (roam's aarch64 build under qemu-user). A workload is launched on the
# x86-64 node, moved while it runs with pre-copy, and finishes on aarch64 with
# the same output as an uninterrupted run.
#
# Usage: scripts/demo-live.sh [WORKLOAD [SIZE [MODE]]]   (default: kmeans L pre-copy)
#
# The program must still be running when the move ends: kmeans at size M
# now finishes in about 2 s on x86-64, less than a pre-copy to an emulated
# node takes, so the default is size L (about 15 s) and the move starts a
# few seconds in. The rest runs on aarch64 under qemu, several times slower.
set -euo pipefail
cd "$(dirname "$0")/.."

T=${CARGO_TARGET_DIR:-target}
ROAM_X86="$T/release/roam"
ROAM_ARM=(qemu-aarch64 -L /usr/aarch64-linux-gnu "$T/aarch64-unknown-linux-gnu/release/roam")
W=${1:-kmeans}
SIZE=${2:-L}
MODE=${3:-pre-copy}
WASM=target/workloads/$W.wasm
WORK=$(mktemp -d)
export ROAM_CACHE_DIR=${ROAM_CACHE_DIR:-$WORK/cache}
A=127.0.0.1:17700
B=127.0.0.1:17701
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

exited() { # exited NODE CELL: whether that cell has exited on that node
  "$ROAM_X86" cells --node "$1" --json | python3 -c \
    "import json,sys; sys.exit(0 if any(c['id'] == '$2' and c['state'] == 'exited' for c in json.load(sys.stdin)) else 1)"
}
wait_node() {
  for _ in $(seq 1 200); do
    "$ROAM_X86" cells --node "$1" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "node $1 did not come up" >&2
  exit 1
}

echo "== uninterrupted run on $(uname -m), for reference"
"$ROAM_X86" run "$WASM" -- "$SIZE" >"$WORK/reference.txt"
tail -n 1 "$WORK/reference.txt"

echo
echo "== starting node edge-x86 ($A) and node edge-arm ($B, aarch64 under qemu)"
"$ROAM_X86" node --listen $A --name edge-x86 --state-dir "$WORK/a" 2>"$WORK/a.log" &
pids+=($!)
"${ROAM_ARM[@]}" node --listen $B --name edge-arm --state-dir "$WORK/b" 2>"$WORK/b.log" &
pids+=($!)
wait_node $A
wait_node $B

# The receiving node compiles the module for its ISA the first time it sees
# it (seconds under qemu). Warm its cache with a short run first, so that the
# migration below does not race the end of the program.
echo
echo "== warming edge-arm's compile cache: a size-S run of the same module there"
WARM=$("$ROAM_X86" launch --node $B "$WASM" -- S)
for _ in $(seq 1 600); do
  if exited $B "$WARM"; then break; fi
  sleep 0.5
done

echo
echo "== roam launch --node $A $WASM -- $SIZE"
CELL=$("$ROAM_X86" launch --node $A "$WASM" -- "$SIZE")
echo "cell $CELL"
sleep 3
"$ROAM_X86" cells --node $A

echo
echo "== roam migrate $CELL --from $A --to $B --mode $MODE"
"$ROAM_X86" migrate "$CELL" --from $A --to $B --mode "$MODE"

echo
"$ROAM_X86" cells --node $B
echo "== waiting for the cell to finish on aarch64"
for _ in $(seq 1 1200); do
  if exited $B "$CELL"; then break; fi
  sleep 0.5
done
"$ROAM_X86" cells --node $B

"$ROAM_X86" logs "$CELL" --node $A >"$WORK/migrated.txt"
echo "uninterrupted: $(grep '^checksum:' "$WORK/reference.txt")"
echo "migrated:      $(grep '^checksum:' "$WORK/migrated.txt" || echo none)"
if cmp -s "$WORK/reference.txt" "$WORK/migrated.txt"; then
  echo "OK: live $MODE migration x86-64 -> aarch64 produced byte-identical output"
else
  echo "MISMATCH" >&2
  diff "$WORK/reference.txt" "$WORK/migrated.txt" | head >&2 || true
  exit 1
fi
