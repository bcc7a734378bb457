#!/usr/bin/env bash
# The cluster demo: `roam up` starts a planner and three local nodes (the
# third is aarch64 under qemu-user). A cell is launched through the planner,
# moved by node name to the aarch64 node, drained off it, and then its node
# is killed with SIGKILL: the planner restores it on a live node from its
# last kept checkpoint, and it finishes with the same output as an
# uninterrupted run.
#
# Usage: scripts/demo-cluster.sh [SECONDS]   (how long the workload runs)
set -euo pipefail
cd "$(dirname "$0")/.."

T=${CARGO_TARGET_DIR:-target}
ROAM="$T/release/roam"
SECS=${1:-40}
WASM=target/workloads/dirty.wasm
ARGS=(8 1 "$SECS")
PORT=${ROAM_DEMO_PORT:-17600}
WORK=$(mktemp -d)
UP=
cleanup() {
  if [ -n "$UP" ]; then kill -INT "$UP" 2>/dev/null || true; wait "$UP" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# Wait up to $1 seconds for the command in $2... to succeed (it is run
# again each time: give a function, not an expanded test).
wait_until() {
  local limit=$1; shift
  for _ in $(seq $((limit * 5))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  echo "gave up after ${limit} s waiting for: $*" >&2
  return 1
}
field() { # field CELL KEY: one field of the cell's record
  "$ROAM" cells --json | python3 -c "import json,sys; c=[c for c in json.load(sys.stdin) if c['id']=='$1'][0]; v=c$2; print(v if v is not None else '')"
}

echo "== 1. roam up: a planner (embedded store) and three nodes"
"$ROAM" up --nodes 3 --dir "$WORK/up" --port "$PORT" --checkpoint-interval 2 \
  --aarch64-roam "$T/aarch64-unknown-linux-gnu/release/roam" >"$WORK/up.out" 2>&1 &
UP=$!
wait_until 180 grep -q "roam is up" "$WORK/up.out" || { cat "$WORK/up.out"; exit 1; }
cat "$WORK/up.out"
export ROAM_PLANNER=http://127.0.0.1:$PORT
"$ROAM" nodes

echo
echo "== 2. the uninterrupted reference run"
"$ROAM" run "$WASM" -- "${ARGS[@]}" >"$WORK/reference.txt"
tail -1 "$WORK/reference.txt"

echo
echo "== 3. launched through the planner"
CELL=$("$ROAM" launch "$WASM" -- "${ARGS[@]}")
"$ROAM" cells

echo
echo "== 4. moved by name to the aarch64 node, while it runs"
"$ROAM" migrate "$CELL" --to node-3 --mode pre-copy

echo
echo "== 5. node-3 drained: the cell moves to whichever node the policy picks"
"$ROAM" drain node-3
"$ROAM" cells

echo
OWNER=$(field "$CELL" "['owner']")
echo "== 6. $OWNER killed with SIGKILL once the cell has a kept checkpoint"
has_kept() { [ -n "$(field "$CELL" "['kept']")" ]; }
wait_until 180 has_kept
GEN=$(field "$CELL" "['generation']")
pkill -KILL -f -- "node --name $OWNER " || { echo "no process for $OWNER" >&2; exit 1; }
restored() { [ "$(field "$CELL" "['generation']")" != "$GEN" ]; }
wait_until 180 restored
echo "restored on $(field "$CELL" "['owner']") from its kept checkpoint"
"$ROAM" nodes
"$ROAM" cells

echo
echo "== 7. it finishes with the uninterrupted run's output"
# The planner learns the exit from its owner's heartbeats.
exited() { [ "$(field "$CELL" "['state']['state']")" = exited ]; }
wait_until $((SECS * 4 + 60)) exited
"$ROAM" cells
"$ROAM" logs "$CELL" >"$WORK/cell.txt"
if cmp -s "$WORK/reference.txt" "$WORK/cell.txt"; then
  echo "OK: $(tail -1 "$WORK/cell.txt"), as uninterrupted, after a move across ISAs, a drain and a killed node"
else
  echo "MISMATCH"; diff "$WORK/reference.txt" "$WORK/cell.txt" | head >&2; exit 1
fi
