#!/usr/bin/env bash
# Builds roam's workload suite (see docs/workloads.md):
#   target/workloads/<name>.wasm                 every workload, WASI preview 1
#   target/workloads/native/<arch>/<name>        native baselines of the C ones,
#                                                and host builds of the Rust ones
# Usage: workloads/build.sh [name...]   (default: all). Runs from any directory.
# Outputs that are newer than their sources are left alone.
# With no arguments it also builds the real-program suite at the end
# (workloads/real/build.sh: target/workloads/real/<name>.wasm) and the
# multi-threaded workloads (workloads/threads/build.sh:
# target/workloads/threads/<name>.wasm, wasm32-wasip1-threads).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/workloads"
OUT="$ROOT/target/workloads"
CARGO_OUT="$ROOT/target/workloads-cargo"
C_WORKLOADS=(ep is cg mg matmul linpack dhrystone filework dirty kv bigfiles interp)
RUST_WORKLOADS=(kmeans pca recurse)
# Service workloads (C): servers that run until stopped. Built like the C
# workloads, but no batch suite (check.sh, the node and cross-ISA tests) runs them.
SERVICE_WORKLOADS=(echo kvserver)
CLANG="${CLANG:-clang-16}"
WASM_CFLAGS=(--target=wasm32-wasi -O2 -Wall -Wextra -Wl,-z,stack-size=1048576)
NATIVE_CFLAGS=(-O2 -ffp-contract=off -Wall -Wextra)

die() { echo "build.sh: error: $*" >&2; exit 1; }
warn() { echo "build.sh: warning: $*" >&2; }

want_c=() want_rust=()
if [[ $# -eq 0 ]]; then
    want_c=("${C_WORKLOADS[@]}" "${SERVICE_WORKLOADS[@]}") want_rust=("${RUST_WORKLOADS[@]}")
else
    for name in "$@"; do
        if [[ " ${C_WORKLOADS[*]} ${SERVICE_WORKLOADS[*]} " == *" $name "* ]]; then want_c+=("$name")
        elif [[ " ${RUST_WORKLOADS[*]} " == *" $name "* ]]; then want_rust+=("$name")
        else die "unknown workload '$name' (known: ${C_WORKLOADS[*]} ${SERVICE_WORKLOADS[*]} ${RUST_WORKLOADS[*]})"; fi
    done
fi

# up_to_date OUTPUT INPUT... : true when OUTPUT exists and is newer than every input.
up_to_date() {
    local out=$1 in
    shift
    [[ -e $out ]] || return 1
    for in in "$@"; do [[ $out -nt $in ]] || return 1; done
}

mkdir -p "$OUT"

# ---- C workloads -> wasm ---------------------------------------------------
if [[ ${#want_c[@]} -gt 0 ]]; then
    command -v "$CLANG" >/dev/null ||
        die "$CLANG not found: install the Debian package clang-16 (apt-get install clang-16 lld-16)"
    probe="$(mktemp -d)"
    trap 'rm -rf "$probe"' EXIT
    echo '#include <stdio.h>
int main(void) { puts("ok"); return 0; }' >"$probe/probe.c"
    "$CLANG" "${WASM_CFLAGS[@]}" "$probe/probe.c" -o "$probe/probe.wasm" 2>"$probe/err" || {
        cat "$probe/err" >&2
        die "$CLANG cannot build for wasm32-wasi: install the Debian packages wasi-libc, lld-16 and libclang-rt-16-dev-wasm32"
    }
    for name in "${want_c[@]}"; do
        deps=("$SRC/c/$name.c" "$SRC/c/common.h" "$SRC/c/pace.h" "$SRC/build.sh")
        # A workload may keep parts in headers of its own, `<name>_*.h`.
        for h in "$SRC/c/${name}"_*.h; do [[ -e $h ]] && deps+=("$h"); done
        if up_to_date "$OUT/$name.wasm" "${deps[@]}"; then
            echo "up to date  target/workloads/$name.wasm"
        else
            "$CLANG" "${WASM_CFLAGS[@]}" -o "$OUT/$name.wasm" "$SRC/c/$name.c"
            echo "built       target/workloads/$name.wasm"
        fi
    done

    # ---- native baselines (benchmarks only) ---------------------------------
    host="$(uname -m)"
    for arch in x86_64 aarch64 riscv64; do
        if [[ $host == "$arch" ]]; then cc=gcc; static=()
        else cc="$arch-linux-gnu-gcc"; static=(-static); fi
        if ! command -v "$cc" >/dev/null; then
            warn "$cc not found, skipping native/$arch (Debian package gcc-${arch//_/-}-linux-gnu)"
            continue
        fi
        mkdir -p "$OUT/native/$arch"
        for name in "${want_c[@]}"; do
            out="$OUT/native/$arch/$name"
            ndeps=("$SRC/c/$name.c" "$SRC/c/common.h" "$SRC/c/pace.h" "$SRC/build.sh")
            for h in "$SRC/c/${name}"_*.h; do [[ -e $h ]] && ndeps+=("$h"); done
            if up_to_date "$out" "${ndeps[@]}"; then
                echo "up to date  target/workloads/native/$arch/$name"
            else
                "$cc" "${NATIVE_CFLAGS[@]}" "${static[@]}" -o "$out" "$SRC/c/$name.c" -lm
                echo "built       target/workloads/native/$arch/$name"
            fi
        done
    done
fi

# ---- Rust workloads -> wasm -------------------------------------------------
if [[ ${#want_rust[@]} -gt 0 ]]; then
    command -v cargo >/dev/null || die "cargo not found: install Rust with rustup (https://rustup.rs)"
    cd "$SRC/rust"
    sysroot="$(rustc --print sysroot)"
    [[ -d $sysroot/lib/rustlib/wasm32-wasip1 ]] ||
        die "the Rust target wasm32-wasip1 is not installed: run 'rustup target add wasm32-wasip1'"
    pkgs=()
    for name in "${want_rust[@]}"; do pkgs+=(-p "$name"); done
    CARGO_TARGET_DIR="$CARGO_OUT" cargo build --quiet --release --target wasm32-wasip1 "${pkgs[@]}"
    for name in "${want_rust[@]}"; do
        built="$CARGO_OUT/wasm32-wasip1/release/$name.wasm"
        if [[ -e $OUT/$name.wasm ]] && cmp -s "$built" "$OUT/$name.wasm"; then
            echo "up to date  target/workloads/$name.wasm"
        else
            cp "$built" "$OUT/$name.wasm"
            echo "built       target/workloads/$name.wasm"
        fi
    done

    # ---- native host builds (pinned checksums, workloads/pin-checksums.sh) --
    host="$(uname -m)"
    CARGO_TARGET_DIR="$CARGO_OUT" cargo build --quiet --release "${pkgs[@]}"
    mkdir -p "$OUT/native/$host"
    for name in "${want_rust[@]}"; do
        built="$CARGO_OUT/release/$name"
        if [[ -e $OUT/native/$host/$name ]] && cmp -s "$built" "$OUT/native/$host/$name"; then
            echo "up to date  target/workloads/native/$host/$name"
        else
            cp "$built" "$OUT/native/$host/$name"
            echo "built       target/workloads/native/$host/$name"
        fi
    done
fi

# ---- the real-program suite (third-party programs, workloads/real/) -------------
if [[ $# -eq 0 ]]; then
    "$SRC/real/build.sh"
fi

# ---- the multi-threaded workloads (wasm32-wasip1-threads, workloads/threads/) --
if [[ $# -eq 0 ]]; then
    "$SRC/threads/build.sh"
fi
