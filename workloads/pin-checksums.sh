#!/usr/bin/env bash
# Pins the size-S checksum of every workload from its native host build
# (gcc -O2 -ffp-contract=off for C, cargo --release for Rust) into
# workloads/checksums-S.txt. The tests require the wasm runs under roam, and
# the native builds themselves, to print exactly these, so a bug that changed
# a migrated run and its reference alike is still caught.
# Usage: workloads/pin-checksums.sh [--check]   (run workloads/build.sh first)
#   --check  compare with the committed file instead of writing it
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NATIVE="$ROOT/target/workloads/native/$(uname -m)"
FILE="$ROOT/workloads/checksums-S.txt"
ALL=(ep is cg mg matmul linpack dhrystone filework kmeans pca recurse interp dirty kv)

die() { echo "pin-checksums.sh: error: $*" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
{
    echo "# Size-S checksums of the workloads, printed by their native host builds"
    echo "# (workloads/pin-checksums.sh). Every wasm run must print the same."
    for name in "${ALL[@]}"; do
        bin="$NATIVE/$name"
        [[ -x $bin ]] || die "$bin is missing: run workloads/build.sh (it needs gcc and cargo)"
        mkdir -p "$work/data"
        status=0
        "$bin" S "$work/data" >"$work/out" 2>"$work/err" || status=$?
        if [[ $status != 0 ]] || grep -q "VERIFICATION FAILED" "$work/err"; then
            cat "$work/err" >&2
            die "$name: the native run failed (exit $status)"
        fi
        sum="$(sed -n 's/^checksum: \([0-9a-f]\{16\}\)$/\1/p' "$work/out" | tail -n 1)"
        [[ -n $sum ]] || die "$name: the native run printed no checksum line"
        echo "$name $sum"
        rm -rf "$work/data"
    done
} >"$work/pinned"

if [[ ${1:-} == --check ]]; then
    if diff -u "$FILE" "$work/pinned"; then
        echo "pin-checksums.sh: $FILE matches the native builds"
    else
        die "the native builds no longer print the pinned checksums (diff above)"
    fi
else
    mv "$work/pinned" "$FILE"
    echo "pin-checksums.sh: wrote $FILE"
fi
