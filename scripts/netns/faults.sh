#!/usr/bin/env bash
# Faults across hosts on a namespace bed whose cluster is up (run by
# scripts/netns/suite.sh for each wire; tests/src/bin/tap-fault.rs is the
# job): ranks 0 and 1 on nodes 0 and 1 (namespaces P-0 and P-1).
#   1. link flap: P-1's bridge port goes down for 1 s mid-stream; every
#      message arrives, by retransmission, and one stalled >= 0.7 s (proof
#      the fault hit the transfer);
#   2. link cut: down for 8 s (past the ~3 s retry budget: rto 0.5 ms
#      doubling to 50 ms, 64 retries); the send fails with
#      RetryLimitExceeded; once the link is back a new message arrives;
#   3. daemon restart: P-1's emp-nicd is stopped and started again
#      mid-stream; the peer's send fails cleanly, then a new job (tap-p2p,
#      every node) passes.
# One TAP line per fault ("ok - …" / "not ok - …"), the job's output as
# comments. Leaves every link up and every daemon running.
#
#   faults.sh --config D/cluster-WIRE.toml --name P
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="$root/target/release"
config="" name=""
while [ $# -gt 0 ]; do
    case "$1" in
    --config) config="$2"; shift 2 ;;
    --name) name="$2"; shift 2 ;;
    *) echo "usage: faults.sh --config FILE --name P" >&2; exit 2 ;;
    esac
done
[ -n "$config" ] && [ -n "$name" ] || { echo "usage: faults.sh --config FILE --name P" >&2; exit 2; }
wire=$(sed -n 's/^wire = "\(.*\)"/\1/p' "$config")
out=$(mktemp /tmp/emp-faults.XXXXXX)
port="$name-h1"
trap 'ip link set "$port" up 2>/dev/null; rm -f "$out"' EXIT

# Starts `tap-fault MODE` (2 ranks) in the background; returns once rank 0
# streams (or fails if it does not within 30 s).
job_pid=""
start_job() {
    EMP_FAULT_SECS="$2" EMP_FAULT_MIN_STALL_MS=700 "$bin/emp" run --config "$config" -n 2 --timeout 180 -- "$bin/tap-fault" "$1" >"$out" 2>&1 &
    job_pid=$!
    local i
    for ((i = 0; i < 300; i++)); do
        grep -q '^# streaming' "$out" && return 0
        kill -0 "$job_pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# verdict WHAT: waits for the job; "ok" when it exited 0 and every test of
# its plan passed.
verdict() {
    local what="$1" rc plan oks
    wait "$job_pid"
    rc=$?
    plan=$(sed -n 's/^1\.\.\([0-9][0-9]*\)$/\1/p' "$out" | head -n 1)
    oks=$(grep -c '^ok ' "$out")
    if [ "$rc" -eq 0 ] && [ -n "$plan" ] && [ "$oks" -eq "$plan" ] && ! grep -q '^not ok' "$out"; then
        echo "ok - $what over $wire ($((SECONDS - t0)) s)"
        grep -E '^(ok|#)' "$out" | sed 's/^/#   /'
    else
        echo "not ok - $what over $wire: exit $rc, $oks/${plan:-?} ok ($((SECONDS - t0)) s)"
        sed 's/^/#   /' "$out" | tail -n 40
    fi
}

t0=$SECONDS
if start_job flap 6; then
    sleep 1
    ip link set "$port" down && sleep 1 && ip link set "$port" up
fi
verdict "link flap mid-stream (1 s down): every message arrives by retransmission"

t0=$SECONDS
if start_job cut 30; then
    sleep 1
    ip link set "$port" down && sleep 8 && ip link set "$port" up
fi
verdict "link down 8 s mid-stream: the send fails with RetryLimitExceeded; a new message after it is back"

t0=$SECONDS
# The bed puts node 1 on host P-1.
host1="$name-1"
launch=(ip netns exec "$host1")
if start_job restart 30; then
    sleep 1
    "${launch[@]}" "$bin/emp" cluster down --config "$config" --host "$host1" >>"$out" 2>&1
    sleep 1
    "${launch[@]}" "$bin/emp" cluster up --config "$config" --host "$host1" >>"$out" 2>&1
fi
verdict "emp-nicd on $host1 restarted mid-stream: the peer's send fails cleanly"

t0=$SECONDS
if "$bin/emp" cluster status --config "$config" >"$out" 2>&1 &&
    "$bin/emp" run --config "$config" -n 4 --timeout 300 -- "$bin/tap-p2p" >>"$out" 2>&1 &&
    ! grep -q '^not ok' "$out"; then
    echo "ok - after the restart, a new job (tap-p2p, 4 ranks) passes over $wire ($((SECONDS - t0)) s)"
else
    echo "not ok - after the restart, a new job (tap-p2p, 4 ranks) over $wire ($((SECONDS - t0)) s)"
    sed 's/^/#   /' "$out" | tail -n 40
fi
