#!/usr/bin/env bash
# Fuzz every parser of untrusted bytes for a fixed time each and write the
# figures to docs/fuzz.md.
#
# Runs every [[bin]] of fuzz/Cargo.toml (so a new target is picked up without
# editing this script) with libFuzzer for FUZZ_SECONDS (default 60) each,
# one after the other, on one core. Corpora persist in fuzz/corpus/<target>
# (not committed); committed seeds in fuzz/seeds/<target> and seeds made
# from the build (workload modules, a real snapshot) are added when present.
# A crash leaves its input in fuzz/artifacts/<target>/ and makes the script
# exit 1 after every target has run.
#
# Usage: scripts/fuzz.sh [target...]      (default: every target)
# Environment:
#   FUZZ_SECONDS    time per target (default 60)
#   FUZZ_RSS_MB     memory limit per input (default 2048, libFuzzer's)
#   FUZZ_TOOLCHAIN  rustup toolchain with -Z flags (default nightly)
#   FUZZ_SANITIZER  address (default), leak, memory, thread or none (faster)
#   FUZZ_PROJECT    the cargo-fuzz project to build and run (default fuzz);
#                   corpora, seeds and artifacts stay under fuzz/
#   FUZZ_DOC        where to write the table (default docs/fuzz.md; "-" for
#                   none, e.g. when fuzzing a subset)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

SECONDS_EACH="${FUZZ_SECONDS:-60}"
RSS_MB="${FUZZ_RSS_MB:-2048}"
TOOLCHAIN="${FUZZ_TOOLCHAIN:-nightly}"
DOC="${FUZZ_DOC:-docs/fuzz.md}"
SANITIZER="${FUZZ_SANITIZER:-address}"
PROJECT="$(cd "${FUZZ_PROJECT:-fuzz}" && pwd)"

die() { echo "fuzz.sh: error: $*" >&2; exit 1; }

[[ $SECONDS_EACH =~ ^[1-9][0-9]*$ ]] || die "FUZZ_SECONDS must be a positive whole number of seconds, not '$SECONDS_EACH'"
rustup run "$TOOLCHAIN" rustc --version >/dev/null 2>&1 ||
    die "the $TOOLCHAIN toolchain is missing: rustup toolchain install $TOOLCHAIN"
cargo +"$TOOLCHAIN" fuzz --version >/dev/null 2>&1 ||
    die "cargo-fuzz is missing: cargo install cargo-fuzz --locked"

# Every target, in the order of fuzz/Cargo.toml.
mapfile -t ALL < <(sed -n '/^\[\[bin\]\]/,/^$/s/^name = "\(.*\)"$/\1/p' "$PROJECT/Cargo.toml")
[[ ${#ALL[@]} -gt 0 ]] || die "no [[bin]] targets found in fuzz/Cargo.toml"
if [[ $# -gt 0 ]]; then
    for t in "$@"; do
        [[ " ${ALL[*]} " == *" $t "* ]] || die "unknown target '$t' (known: ${ALL[*]})"
    done
    TARGETS=("$@")
else
    TARGETS=("${ALL[@]}")
fi

echo "== building ${#ALL[@]} fuzz targets (release, debug assertions, sanitizer: $SANITIZER)"
(cd "$PROJECT" && cargo +"$TOOLCHAIN" fuzz build --debug-assertions --sanitizer "$SANITIZER")
TRIPLE="$(rustc -vV | sed -n 's/^host: //p')"
BIN_DIR="$PROJECT/target/$TRIPLE/release"

# ---- seeds made from the build, when it exists ------------------------------
seed_from_build() {
    local t=$1 dir="fuzz/corpus/$1"
    mkdir -p "$dir"
    case $t in
        module_validate)
            for w in target/workloads/{is,recurse}.wasm; do
                [[ -e $w ]] && cp "$w" "$dir/seed-$(basename "$w")"
            done
            ;;
        snapshot_decode | snapshot_open)
            if [[ -x target/release/roam && -e target/workloads/is.wasm && ! -e $dir/seed-is.roam ]]; then
                local tmp
                tmp="$(mktemp -d)"
                if target/release/roam run --checkpoint-at-point 1 --snapshot "$tmp/s.roam" \
                    target/workloads/is.wasm -- S >/dev/null 2>&1 && [[ -e $tmp/s.roam ]]; then
                    cp "$tmp/s.roam" "$dir/seed-is.roam"
                fi
                rm -rf "$tmp"
            fi
            ;;
    esac
}

# ---- what each target parses (for a target not listed here: the first
# sentence of its module docs) ------------------------------------------------
describe() {
    case $1 in
        snapshot_decode) echo 'snapshot files (`peek_header`, `Snapshot::decode`)' ;;
        snapshot_open) echo 'snapshot files opened for a lazy restore (`Snapshot::open_file`, `PageFile::read_chunk`) against a full decode' ;;
        snapshot_roundtrip) echo 'snapshot encode, decode and restore of fuzzer-built state' ;;
        os_state_decode) echo 'the OS-layer section of a snapshot (`OsState::decode`)' ;;
        module_validate) echo 'modules given to `roam prepare` (validator, `roam` section, initial memory)' ;;
        batch_decode) echo 'page batches from a migration peer (`decode_batch`, `Decoder::apply`)' ;;
        wire_decode) echo 'migration protocol messages (`Msg::decode`)' ;;
        frame_read) echo 'the migration stream, cut into reads (`read_frame`, then `Msg::decode`)' ;;
        store_summary) echo 'the chunk-store summary in `Accept` (`StoreSummary::from_bytes`)' ;;
        file_tree) echo 'the file tree of a snapshot (postcard, then snapshot validation)' ;;
        gateway_frame) echo 'gateway–node frames (`Header::parse`, `ToGateway::decode`, `ToNode::decode`)' ;;
        api_json) echo 'control API request bodies (`LaunchRequest`, `MigrateRequest`) and rate strings' ;;
        *) sed -n 's|^//! \{0,1\}||p' "fuzz/fuzz_targets/$1.rs" | tr '\n' ' ' |
            sed 's/  */ /g; s/\([.!?]\) .*/\1/; s/|/\\|/g' ;;
    esac
}

LOG_DIR="fuzz/target/fuzz-logs"
mkdir -p "$LOG_DIR"
rows=()
crashed=0
for t in "${TARGETS[@]}"; do
    seed_from_build "$t"
    corpora=("fuzz/corpus/$t")
    [[ -d fuzz/seeds/$t ]] && corpora+=("fuzz/seeds/$t")
    mkdir -p "fuzz/artifacts/$t"
    before=$(find "fuzz/artifacts/$t" -type f | wc -l)
    log="$LOG_DIR/$t.log"
    echo "== $t: ${SECONDS_EACH}s"
    status=0
    "$BIN_DIR/$t" "${corpora[@]}" \
        -max_total_time="$SECONDS_EACH" -rss_limit_mb="$RSS_MB" -timeout=20 \
        -print_final_stats=1 -artifact_prefix="fuzz/artifacts/$t/" >"$log" 2>&1 || status=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | sed 's/cov: //')
    corpus=$(find "fuzz/corpus/$t" -type f | wc -l)
    after=$(find "fuzz/artifacts/$t" -type f | wc -l)
    crashes=$((after - before))
    if [[ $status != 0 && $crashes == 0 ]]; then crashes=1; fi
    if [[ $crashes != 0 ]]; then
        crashed=1
        echo "   CRASH (exit $status): see $log and fuzz/artifacts/$t/" >&2
        grep -m 5 -E 'panicked|ERROR: |SUMMARY' "$log" | sed 's/^/   /' >&2 || true
    fi
    echo "   executions ${execs:-?}, coverage ${cov:-?}, corpus $corpus, crashes $crashes"
    rows+=("| \`$t\` | $(describe "$t") | $SECONDS_EACH | ${execs:-?} | ${cov:-?} | $crashes | $(date -u +%F) |")
done

if [[ $DOC != - ]]; then
    cat >"$DOC" <<EOF
# Fuzzing

Every parser that reads bytes from outside (snapshot files, migration
peers, API clients, modules to prepare) has a libFuzzer target in \`fuzz/\`
(a cargo-fuzz project outside the main workspace, see \`fuzz/README.md\`).
\`scripts/fuzz.sh\` builds them all and runs each for a fixed time, one after
the other:

\`\`\`sh
cargo install cargo-fuzz --locked         # once; needs a nightly toolchain
scripts/fuzz.sh                           # every target, 60 s each
FUZZ_SECONDS=600 scripts/fuzz.sh wire_decode frame_read
\`\`\`

It picks up every \`[[bin]]\` in \`fuzz/Cargo.toml\`, so a new target needs no
change here. Targets are built with debug assertions and AddressSanitizer.
Corpora are kept in \`fuzz/corpus/<target>\` between runs; committed seeds in
\`fuzz/seeds/<target>\` and, when the build exists, two workload modules and a
real snapshot seed the module and snapshot targets. A crash leaves its input
in \`fuzz/artifacts/<target>/\`, its log in \`fuzz/target/fuzz-logs/<target>.log\`, and the
script exits 1; reproduce with \`cd fuzz && cargo +nightly fuzz run <target>
artifacts/<target>/<file>\`.

## Last run

$(uname -m), $(nproc) cores shared with other work, \`FUZZ_SECONDS=$SECONDS_EACH\`,
sanitizer: $SANITIZER.
Executions and coverage (libFuzzer's \`cov\`, edges reached) are libFuzzer's
final figures; crashes counts new crash, leak, timeout and out-of-memory inputs.

| target | what it parses | seconds | executions | coverage | crashes | date |
|--------|----------------|--------:|-----------:|---------:|--------:|------|
$(printf '%s\n' "${rows[@]}")
EOF
    echo "== wrote $DOC"
fi
exit "$crashed"
