#!/usr/bin/env bash
# Every cross-ISA migration of every workload at all three moments (first
# point, half-way, inside a blocking call). CI runs one moment per workload
# and direction (crates/roam-cli/tests/all/cross_isa.rs); this runs all of
# them, about three times as long. Run after scripts/build-all.sh.
# Usage: scripts/cross-full.sh [test-name-filter]
set -euo pipefail
cd "$(dirname "$0")/.."
export ROAM_CROSS=full
exec cargo test --release --locked -p roam-cli --test all -- "${1:-cross_isa::}"
