#!/usr/bin/env bash
# The whole differential matrix of `roam prepare` on the real-program suite:
# every program under every points policy and every switch, each run
# straight through and stopped at a random migration point and restored on
# x86-64 and on aarch64 (qemu-user). CI runs CoreMark only
# (crates/roam-cli/tests/all/real.rs, see its docs); this runs all of it,
# which takes hours on two cores. ROAM_DIFF=sample runs the sample instead
# (every program under the default, every other option on one program;
# about 15 minutes). Each test prints its seed: ROAM_DIFF_SEED=<n> repeats
# its choice of points.
# Usage: [ROAM_DIFF=sample] scripts/difftest.sh [test-name-filter]
#        (after scripts/build-all.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
export ROAM_DIFF="${ROAM_DIFF:-full}"
exec cargo test --release --locked -p roam-cli --test all -- --include-ignored --nocapture "${1:-real_}"
