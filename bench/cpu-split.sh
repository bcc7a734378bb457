#!/usr/bin/env bash
# How cells of different CPU weights share one core, and how fast the
# node's control API answers while they spin, for each way a node applies
# CPU weights (docs/node-api.md, "CPU").
#
# For each mechanism asked for: a node pinned to CPU 0 (taskset), two
# CPU-bound cells (dhrystone L) with weights 100 and 400 plus two more of
# weight 100, so the core is contended; after a warm-up, the CPU time each
# cell's thread used in WINDOW seconds, and the latency of GET /v1/node
# asked every 100 ms meanwhile. With weights alone the expected shares
# are 100:400:100:100 of what the cells get, 1/7, 4/7, 1/7, 1/7.
#
# Writes bench/results/cpu/<date>-<label>.{csv,md}.
#
# usage: bench/cpu-split.sh LABEL [MECHANISM...]   (default: auto nice)
# env:   ROAM (default target/debug/roam), WINDOW seconds (default 10)
# needs: taskset, curl; the workloads (workloads/build.sh); root or a
#        delegated cgroup for the cgroup mechanisms.
set -euo pipefail
cd "$(dirname "$0")/.."
label=${1:?usage: bench/cpu-split.sh LABEL [MECHANISM...]}
shift
if [ $# -eq 0 ]; then mechanisms=(auto nice); else mechanisms=("$@"); fi
roam=${ROAM:-target/debug/roam}
window=${WINDOW:-10}
wl=target/workloads/dhrystone.wasm
[ -x "$roam" ] || { echo "no $roam: cargo build -p roam-cli, or set ROAM" >&2; exit 1; }
[ -f "$wl" ] || { echo "no $wl: run workloads/build.sh" >&2; exit 1; }
out=bench/results/cpu
mkdir -p "$out"
date=$(date -u +%Y-%m-%d)
csv="$out/$date-$label.csv"
md="$out/$date-$label.md"
hz=$(getconf CLK_TCK)
tmp=$(mktemp -d)
node_pid=
cleanup() {
  [ -n "$node_pid" ] && kill "$node_pid" 2>/dev/null && wait "$node_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# CPU ticks (user + system) of thread $2 of process $1.
ticks() {
  local s
  s=$(cat "/proc/$1/task/$2/stat")
  s=${s##*) }
  # shellcheck disable=SC2086
  set -- $s
  echo $(( ${12} + ${13} ))
}

# The thread of process $1 running cell $2 (named cell-ID, cut to 15 bytes).
cell_tid() {
  local want t
  want=$(printf 'cell-%s' "$2" | cut -c1-15)
  for t in /proc/"$1"/task/*; do
    if [ "$(cat "$t/comm" 2>/dev/null)" = "$want" ]; then
      basename "$t"
      return
    fi
  done
}

echo "mechanism,cell,weight,cpu_s,share_of_cells,expected_share,api_p50_ms,api_p99_ms,api_max_ms" > "$csv"
for mech in "${mechanisms[@]}"; do
  name="cpu-bench-$$"
  log="$tmp/node-$mech.log"
  ROAM_LOG=info taskset -c 0 "$roam" node --listen 127.0.0.1:0 --migrate-listen 127.0.0.1:0 \
    --name "$name" --state-dir "$tmp/state-$mech" --cell-cpu-control "$mech" 2> "$log" &
  node_pid=$!
  addr=
  for _ in $(seq 1 600); do
    addr=$(grep -o 'control http://[0-9.:]*' "$log" | head -1 | sed 's/control http:\/\///') || true
    [ -n "$addr" ] && break
    sleep 0.1
  done
  [ -n "$addr" ] || { cat "$log" >&2; exit 1; }
  got=$(curl -s "http://$addr/v1/node" | sed 's/.*"mechanism":"\([a-z0-9-]*\)".*/\1/')
  ids=(); weights=(100 400 100 100)
  for w in "${weights[@]}"; do
    ids+=("$("$roam" launch --node "$addr" --cpu-weight "$w" "$wl" -- L)")
  done
  sleep 3
  tids=(); before=()
  for id in "${ids[@]}"; do
    t=$(cell_tid "$node_pid" "$id"); tids+=("$t"); before+=("$(ticks "$node_pid" "$t")")
  done
  lat="$tmp/lat-$mech"
  : > "$lat"
  end=$(( $(date +%s) + window ))
  while [ "$(date +%s)" -lt "$end" ]; do
    curl -s -o /dev/null -w '%{time_total}\n' "http://$addr/v1/node" >> "$lat"
    sleep 0.1
  done
  used=(); total=0
  for i in "${!ids[@]}"; do
    u=$(( $(ticks "$node_pid" "${tids[$i]}") - ${before[$i]} )); used+=("$u"); total=$(( total + u ))
  done
  read -r p50 p99 max < <(sort -n "$lat" | awk '{v[NR]=$1} END {
    i50=int((NR+1)*0.5); i99=int(NR*0.99+0.999); if (i99>NR) i99=NR;
    printf "%.1f %.1f %.1f\n", v[i50]*1000, v[i99]*1000, v[NR]*1000 }')
  wsum=0; for w in "${weights[@]}"; do wsum=$(( wsum + w )); done
  for i in "${!ids[@]}"; do
    awk -v m="$got" -v c="${ids[$i]}" -v w="${weights[$i]}" -v u="${used[$i]}" -v t="$total" \
      -v hz="$hz" -v ws="$wsum" -v a="$p50" -v b="$p99" -v x="$max" \
      'BEGIN { printf "%s,%s,%d,%.2f,%.3f,%.3f,%s,%s,%s\n", m, c, w, u/hz, (t ? u/t : 0), w/ws, a, b, x }' >> "$csv"
  done
  kill "$node_pid"; wait "$node_pid" 2>/dev/null || true; node_pid=
  # The node removes its groups when it stops; a killed cell's thread is
  # gone with it, so remove whatever is left.
  for g in /sys/fs/cgroup/cpu/roam-"$name" /sys/fs/cgroup/roam-"$name"; do
    [ -d "$g" ] && { rmdir "$g"/cell-* 2>/dev/null || true; rmdir "$g" 2>/dev/null || true; }
  done
done

{
  echo "# cpu: $label"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- machine: $(nproc) cores, $(uname -srm)"
  echo "- commit: $(git describe --always --dirty 2>/dev/null || echo unknown)"
  echo "- command: bench/cpu-split.sh $label ${mechanisms[*]} (ROAM=$roam WINDOW=$window)"
  echo "- headline: CPU share of the weight-400 cell among four CPU-bound cells on one core (expected 0.571), and GET /v1/node latency while they spin, per mechanism"
  echo
  echo "| mechanism | cell | weight | CPU s | share | expected | API p50 ms | API p99 ms | API max ms |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  tail -n +2 "$csv" | awk -F, '{ r = "|"; for (i = 1; i <= NF; i++) r = r " " $i " |"; print r }'
  echo
  echo "Notes: the node runs pinned to CPU 0 with the four cells; each cell's CPU"
  echo "time is its thread's user + system time over the ${window} s window. Shares"
  echo "are of the cells' total; the node's own threads are idle but for the API"
  echo "calls. One run per mechanism on a shared machine: read the shares, not the"
  echo "last digit."
  echo
  echo "With a cgroup, all cells of the node together weigh 25 against 100 for"
  echo "each nice-0 thread in the node's own group. Here that group is the root of"
  echo "the v1 hierarchy, shared with every other process of the machine, so the"
  echo "cells' total CPU time in the window is far below what the nice rows show:"
  echo "other processes' threads each outweigh all cells together. A node in a"
  echo "cgroup of its own (a systemd service) shares that group only with itself."
} > "$md"
echo "wrote $csv and $md"
