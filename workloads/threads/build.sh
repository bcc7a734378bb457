#!/usr/bin/env bash
# Builds the multi-threaded workloads (workloads/threads/README.md) for the
# Rust target wasm32-wasip1-threads:
#   target/workloads/threads/<name>.wasm    shared env.memory, wasi.thread-spawn
# Usage: workloads/threads/build.sh [name...]   (default: all). Runs from any
# directory. An output identical to the fresh build is left alone.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SRC="$ROOT/workloads/threads"
OUT="$ROOT/target/workloads/threads"
CARGO_OUT="$ROOT/target/workloads-threads-cargo"
TARGET=wasm32-wasip1-threads
PROGRAMS=(threads-sum threads-rayon threads-omp)

die() { echo "threads/build.sh: error: $*" >&2; exit 1; }

want=()
if [[ $# -eq 0 ]]; then
    want=("${PROGRAMS[@]}")
else
    for name in "$@"; do
        [[ " ${PROGRAMS[*]} " == *" $name "* ]] || die "unknown workload '$name' (known: ${PROGRAMS[*]})"
        want+=("$name")
    done
fi

command -v cargo >/dev/null || die "cargo not found: install Rust with rustup (https://rustup.rs)"
# rustc, like cargo below, runs here so that rust-toolchain.toml picks the toolchain.
cd "$SRC"
sysroot="$(rustc --print sysroot)"
[[ -d $sysroot/lib/rustlib/$TARGET ]] ||
    die "the Rust target $TARGET is not installed: run 'rustup target add $TARGET'"

pkgs=()
for name in "${want[@]}"; do pkgs+=(-p "$name"); done
CARGO_TARGET_DIR="$CARGO_OUT" cargo build --quiet --release --target "$TARGET" --locked "${pkgs[@]}"
mkdir -p "$OUT"
for name in "${want[@]}"; do
    built="$CARGO_OUT/$TARGET/release/$name.wasm"
    if [[ -e $OUT/$name.wasm ]] && cmp -s "$built" "$OUT/$name.wasm"; then
        echo "up to date  target/workloads/threads/$name.wasm"
    else
        cp "$built" "$OUT/$name.wasm"
        echo "built       target/workloads/threads/$name.wasm"
    fi
done
