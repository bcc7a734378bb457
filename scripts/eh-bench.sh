#!/usr/bin/env bash
# Measures `roam prepare --capture eh` (capture by Wasm exceptions) and its
# ablation `eh-points` against the default preparation and the unprepared
# module, all on bench/plain-wasmtime: roam's workloads at size M, plus every
# program of the real-program suite that has a bench size
# (docs/notes/2026-11-28-eh-prototype.md). Writes bench/results/eh/<date>-M.{md,csv}.
# Usage: scripts/eh-bench.sh [SUITE_TOML [REAL_DIR]]
#   SUITE_TOML  default workloads/real/suite.toml (skipped if absent)
#   REAL_DIR    where its modules and data are, default target/workloads/real
# Needs: workloads/build.sh run, and release builds of roam-cli, roam-bench and
# bench/plain-wasmtime in the same target directory.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SUITE="${1:-$ROOT/workloads/real/suite.toml}"
REAL="${2:-$ROOT/target/workloads/real}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
extra=()
if [[ -f $SUITE ]]; then
    # One --extra per program with a [program.bench] table:
    # NAME=PATH ARGS... --stdin=FILE --warm=TEST,ARGS
    while IFS= read -r line; do extra+=(--extra "$line"); done < <(python3 - "$SUITE" "$REAL" <<'PY'
import sys, tomllib
suite, real = sys.argv[1], sys.argv[2]
for p in tomllib.load(open(suite, "rb"))["program"]:
    if "bench" not in p:
        continue
    b, t = p["bench"], p.get("test", p["bench"])
    words = [f"{p['name']}={real}/{p['wasm']}", *b["args"]]
    if "stdin" in b:
        words.append(f"--stdin={real}/{b['stdin']}")
    if "dir" in b:
        words.append(f"--dir={real}::{b['dir']}")
    words.append("--warm=" + ",".join(t["args"]))
    print(" ".join(words))
PY
)
fi
exec nice "$TARGET/release/roam-bench" eh --size M --reps "${REPS:-3}" --extra-reps "${EXTRA_REPS:-1}" "${extra[@]}"
