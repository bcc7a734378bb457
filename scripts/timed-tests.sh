#!/usr/bin/env bash
# Run `cargo test ARGS...` and end with the slowest tests and how long each
# took, so that CI shows where its time goes.
#
#   scripts/timed-tests.sh --workspace --release --locked
#   SLOWEST=50 scripts/timed-tests.sh -p roam-wire
#
# Arguments after a `--` go to the test binaries, as with `cargo test`.
#
# How the times are measured: libtest prints each test's duration
# (`test name ... ok <1.234s>`) when given `-Z unstable-options
# --report-time`. Those options are unstable, and libtest accepts them on
# a stable toolchain only if RUSTC_BOOTSTRAP is set when the test binary
# runs. It is set here for the test processes only (through a runner that
# wraps each test binary), never for rustc: setting it for the build would
# change the compiler's fingerprint and rebuild every crate. Doc tests run
# without the options, so they are not timed.
#
# The whole output of `cargo test` is shown as it comes; the summary is
# printed after it, failures included, and the script exits with cargo's
# status.
set -euo pipefail
cd "$(dirname "$0")/.."

top="${SLOWEST:-20}"

# Run as the runner of a test binary: time it, whatever the arguments.
if [[ "${1:-}" == "--runner" ]]; then
    shift
    export RUSTC_BOOTSTRAP=1
    exec "$@" -Z unstable-options --report-time
fi

host="$(rustc -vV | sed -n 's/^host: //p')"
runner_var="CARGO_TARGET_$(echo "$host" | tr 'a-z-' 'A-Z_')_RUNNER"
if [[ -n "${!runner_var:-}" ]]; then
    echo "timed-tests: $runner_var is already set; not timing the tests" >&2
    exec cargo test "$@"
fi
export "$runner_var=$PWD/scripts/timed-tests.sh --runner"

log="$(mktemp)"
trap 'rm -f "$log" "$log.top"' EXIT

status=0
cargo test "$@" 2>&1 | tee "$log" || status=$?

# `Running ... (target/.../deps/NAME-HASH)` names the binary of the lines
# that follow; each timed result becomes `SECONDS<TAB>NAME: TEST`.
awk '
    /^ *Running / {
        bin = $NF
        gsub(/[()]/, "", bin)
        sub(/.*\//, "", bin)
        sub(/-[0-9a-f]+$/, "", bin)
    }
    match($0, /^test .* \.\.\. [A-Za-z]+ <[0-9.]+s>/) {
        line = substr($0, RSTART, RLENGTH)
        name = line
        sub(/^test /, "", name)
        sub(/ \.\.\. .*/, "", name)
        secs = line
        sub(/.*</, "", secs)
        sub(/s>$/, "", secs)
        result = line
        sub(/.* \.\.\. /, "", result)
        sub(/ <.*/, "", result)
        mark = (result == "ok") ? "" : " (" result ")"
        printf "%s\t%s: %s%s\n", secs, bin, name, mark
    }
' "$log" | sort -t "$(printf '\t')" -k1,1 -rn | head -n "$top" >"$log.top" || true

echo
if [[ -s "$log.top" ]]; then
    echo "== the $(wc -l <"$log.top") slowest tests"
    awk -F '\t' '{
        s = $1 + 0
        if (s >= 3600) t = sprintf("%d h %02d min", s / 3600, (s % 3600) / 60)
        else if (s >= 60) t = sprintf("%d min %02d s", s / 60, s % 60)
        else if (s >= 1) t = sprintf("%.1f s", s)
        else if (s >= 0.001) t = sprintf("%d ms", s * 1000)
        else t = "<1 ms"
        printf "%12s  %s\n", t, $2
    }' "$log.top"
else
    echo "== no test times were reported"
fi
rm -f "$log.top"
exit "$status"
