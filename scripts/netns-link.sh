#!/usr/bin/env bash
# A rate-limited link between two network namespaces, shaped by the kernel
# (tc tbf on both ends of a veth pair). See docs/network-emulation.md.
#
# Usage (as root):
#   scripts/netns-link.sh up RATE [RATE_BACK]   create or reshape the link
#   scripts/netns-link.sh down                  remove it (no-op if absent)
#   scripts/netns-link.sh status                show namespaces, addresses, qdiscs
#   scripts/netns-link.sh measure [SECONDS]     send for SECONDS (default 3) from
#                                               A to B and print the throughput
#
# RATE is "<integer><unit>" with unit bit, kbit, mbit or gbit (decimal
# prefixes, as tc), or "unlimited". RATE applies from A to B, RATE_BACK
# (default: RATE) from B to A. Every step is idempotent: "up" may be run
# again with another rate, "down" on a machine without the link.
#
# Namespace A is "roam-a" with 10.77.0.1 on roam-a0, B is "roam-b" with
# 10.77.0.2 on roam-b0. Run the two ends with
#   ip netns exec roam-b <server listening on 10.77.0.2>
#   ip netns exec roam-a <client connecting to 10.77.0.2>
# There is no netem on the machines this was written for, so there is no
# delay here: put roam-link's user-space proxy in front for latency.
set -euo pipefail

NS_A=roam-a NS_B=roam-b
DEV_A=roam-a0 DEV_B=roam-b0
ADDR_A=10.77.0.1 ADDR_B=10.77.0.2 PREFIX=24
# Queueing limit of the tbf qdisc, as time at the configured rate.
LATENCY=50ms
PORT=5201

die() { echo "netns-link.sh: error: $*" >&2; exit 1; }
usage() { sed -n '5,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# to_bits RATE: prints the rate in bit/s, "0" for unlimited.
to_bits() {
    local rate=${1,,} num unit
    [[ $rate == unlimited ]] && { echo 0; return; }
    [[ $rate =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] ||
        die "bad rate '$1': expected <integer><unit> with unit bit, kbit, mbit or gbit (e.g. 10mbit), or 'unlimited'"
    num=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]}
    [[ ${#num} -le 12 ]] || die "rate '$1' is too large"
    case $unit in
        bit) echo $((10#$num)) ;;
        kbit) echo $((10#$num * 1000)) ;;
        mbit) echo $((10#$num * 1000000)) ;;
        gbit) echo $((10#$num * 1000000000)) ;;
    esac
}

# burst_bytes BITS: 5 ms of traffic, at least two full-size frames (the
# same default as roam-link's token bucket).
burst_bytes() {
    local b=$(($1 / 8 / 200))
    ((b < 3028)) && b=3028
    echo "$b"
}

# shape NS DEV BITS: tbf on DEV's egress, or no qdisc for unlimited.
shape() {
    local ns=$1 dev=$2 bits=$3
    if [[ $bits == 0 ]]; then
        tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
        echo "$ns/$dev: unlimited"
    else
        tc -n "$ns" qdisc replace dev "$dev" root tbf \
            rate "${bits}bit" burst "$(burst_bytes "$bits")" latency "$LATENCY"
        echo "$ns/$dev: $(tc -n "$ns" qdisc show dev "$dev" | head -n 1)"
    fi
}

ns_exists() { ip netns list | awk '{print $1}' | grep -qx "$1"; }

up() {
    local fwd back
    fwd=$(to_bits "$1")
    back=$(to_bits "${2:-$1}")
    [[ $(id -u) == 0 ]] || die "must run as root (network namespaces and tc)"
    command -v tc >/dev/null || die "tc not found (Debian package iproute2)"
    for ns in "$NS_A" "$NS_B"; do ns_exists "$ns" || ip netns add "$ns"; done
    if ! ip -n "$NS_A" link show "$DEV_A" >/dev/null 2>&1; then
        # A half-created pair (peer left in B) would make "add" fail.
        ip -n "$NS_B" link del "$DEV_B" 2>/dev/null || true
        ip link add "$DEV_A" netns "$NS_A" type veth peer name "$DEV_B" netns "$NS_B"
    fi
    ip -n "$NS_A" addr replace "$ADDR_A/$PREFIX" dev "$DEV_A"
    ip -n "$NS_B" addr replace "$ADDR_B/$PREFIX" dev "$DEV_B"
    for pair in "$NS_A $DEV_A" "$NS_B $DEV_B"; do
        set -- $pair
        ip -n "$1" link set lo up
        ip -n "$1" link set "$2" up
    done
    shape "$NS_A" "$DEV_A" "$fwd"
    shape "$NS_B" "$DEV_B" "$back"
    echo "link up: $NS_A ($ADDR_A) <-> $NS_B ($ADDR_B)"
}

down() {
    [[ $(id -u) == 0 ]] || die "must run as root"
    # Deleting a namespace destroys its end of the veth pair, and with it
    # the peer.
    for ns in "$NS_A" "$NS_B"; do
        if ns_exists "$ns"; then ip netns del "$ns" && echo "removed $ns"; fi
    done
}

status() {
    for pair in "$NS_A $DEV_A" "$NS_B $DEV_B"; do
        set -- $pair
        if ! ns_exists "$1"; then echo "$1: absent"; continue; fi
        ip -n "$1" -brief addr show dev "$2" 2>/dev/null || echo "$1: no $2"
        tc -n "$1" qdisc show dev "$2" 2>/dev/null || true
    done
}

# measure SECONDS: a TCP bulk transfer from A to B with python3 sockets;
# B prints bytes over the time from the first to the last byte. Both ends
# have timeouts, so a broken link ends the measurement instead of hanging.
measure() {
    local secs=${1:-3}
    [[ $secs =~ ^[0-9]+$ && $secs -ge 1 && $secs -le 600 ]] || die "SECONDS must be 1..600"
    ns_exists "$NS_A" && ns_exists "$NS_B" || die "the link is not up (run: $0 up RATE)"
    command -v python3 >/dev/null || die "python3 not found"
    local prog='
import socket, sys, time
mode, host, port, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
if mode == "recv":
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port)); srv.listen(1); srv.settimeout(10)
    conn, _ = srv.accept(); conn.settimeout(secs + 30)
    total, first, last = 0, None, None
    while True:
        data = conn.recv(1 << 16)
        if not data: break
        last = time.monotonic()
        first = first or last
        total += len(data)
    took = max(last - first, 1e-9) if first else 0
    rate = total * 8 / took / 1e6 if took else 0
    print(f"{total} bytes in {took:.2f} s: {rate:.2f} Mbit/s of TCP payload")
else:
    time.sleep(0.3)
    conn = socket.create_connection((host, port), timeout=10)
    buf, end = bytes(1 << 16), time.monotonic() + secs
    while time.monotonic() < end: conn.sendall(buf)
    conn.close()
'
    ip netns exec "$NS_B" timeout $((secs + 60)) python3 -c "$prog" recv "$ADDR_B" "$PORT" "$secs" &
    local receiver=$!
    ip netns exec "$NS_A" timeout $((secs + 60)) python3 -c "$prog" send "$ADDR_B" "$PORT" "$secs"
    wait "$receiver"
}

case ${1:-} in
    up) [[ $# -ge 2 && $# -le 3 ]] || usage; up "$2" "${3:-}" ;;
    down) [[ $# -eq 1 ]] || usage; down ;;
    status) [[ $# -eq 1 ]] || usage; status ;;
    measure) [[ $# -le 2 ]] || usage; measure "${2:-3}" ;;
    *) usage ;;
esac
