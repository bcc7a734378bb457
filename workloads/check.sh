#!/usr/bin/env bash
# Runs every workload at one size (default S) in every built form and checks
# that each run exits 0 and that all forms print byte-identical stdout:
#   target/workloads/<name>.wasm              with `wasmtime run` (if installed)
#   target/workloads/native/x86_64/<name>     directly (on an x86-64 host)
#   target/workloads/native/{aarch64,riscv64}/<name>  under qemu-user
# Usage: workloads/check.sh [S|M|L]   (run workloads/build.sh first)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/target/workloads"
SIZE="${1:-S}"
WASMTIME="${WASMTIME:-wasmtime}"
ALL=(ep is cg mg matmul linpack dhrystone filework kmeans pca recurse interp dirty kv)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/data"

[[ -d $OUT ]] || { echo "check.sh: $OUT is missing: run workloads/build.sh first" >&2; exit 1; }
have_wasmtime=1
command -v "$WASMTIME" >/dev/null || { have_wasmtime=0; echo "check.sh: warning: $WASMTIME not found, skipping wasm runs" >&2; }

failures=0
for name in "${ALL[@]}"; do
    forms=()
    if [[ $have_wasmtime == 1 && -e $OUT/$name.wasm ]]; then
        forms+=("wasm")
    fi
    for arch in x86_64 aarch64 riscv64; do
        [[ -x $OUT/native/$arch/$name ]] && forms+=("$arch")
    done
    ref="" line="$name:"
    for form in "${forms[@]}"; do
        case $form in
            wasm) cmd=("$WASMTIME" run --dir "$work/data::/data" "$OUT/$name.wasm" "$SIZE") ;;
            "$(uname -m)") cmd=("$OUT/native/$form/$name" "$SIZE" "$work/data") ;;
            *) cmd=("qemu-$form" "$OUT/native/$form/$name" "$SIZE" "$work/data") ;;
        esac
        status=0
        "${cmd[@]}" >"$work/$name.$form.out" 2>"$work/$name.$form.err" || status=$?
        if [[ $status != 0 ]]; then
            line+=" $form=EXIT$status"
            failures=$((failures + 1))
            sed 's/^/    /' "$work/$name.$form.err" >&2
            continue
        fi
        if [[ -z $ref ]]; then
            ref="$work/$name.$form.out"
            line+=" $(tail -n 1 "$ref") [$form"
        elif cmp -s "$ref" "$work/$name.$form.out"; then
            line+=" $form"
        else
            line+=" $form=DIFFERS"
            failures=$((failures + 1))
        fi
    done
    if [[ ${#forms[@]} == 0 ]]; then line+=" skipped (nothing to run)"; elif [[ -n $ref ]]; then line+="]"; fi
    echo "$line"
done
if [[ $failures != 0 ]]; then
    echo "check.sh: $failures run(s) failed or differed" >&2
    exit 1
fi
