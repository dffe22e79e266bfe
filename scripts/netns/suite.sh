#!/usr/bin/env bash
# The namespace suites (part of `make test`, as `make netns-test`): every
# TAP suite across 4 network namespaces, one NIC and one rank in each, over
# each wire, with 1 % loss and 100 µs delay on every link (scripts/netns/
# bed.sh; on a kernel without sch_netem only the loss is applied, and the
# suite says so); tap-rbcast (the reliable broadcast over the wire's
# multicast); `emp info` over the bed; tap-p2p, tap-coll and a C job
# started by Open MPI's mpirun across the same namespaces and NICs
# (scripts/netns/mpirun-suite.sh; skipped with --no-mpirun, or said "not
# ok" when mpirun is missing); libfabric's fi_pingpong over the provider
# emp between two of the namespaces, msg and tagged, every size, data
# checked (scripts/netns/fi-pingpong.sh). Then the faults across hosts
# (scripts/netns/faults.sh). Then the wire authenticated (`[cluster] auth`):
# the first wire with auth = "mac" (tap-p2p, tap-coll, tap-atomics, and
# tap-p2p again while the key is rotated under it: every daemon ends on the
# new key, no frame refused), the second with auth = "aead" (tap-p2p);
# skipped with --no-auth.
# Prints one TAP line per step with its wall time and a final
# "N passed, N failed" line; always removes the bed.
#
#   suite.sh [--name P] [--subnet 198.18.K] [--wires "udp packet"] [--no-faults] [--no-mpirun] [--no-auth]
#
# Needs root and `make build` (target/release, firmware-blobs/emp-fw.bin).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
bin="$root/target/release"

name=empsuite
subnet=198.18.201
# The wires to run (EMP_NETNS_WIRES or --wires).
wires="${EMP_NETNS_WIRES:-udp packet}"
faults=1
mpi=1
auth=1
while [ $# -gt 0 ]; do
    case "$1" in
    --name) name="$2"; shift 2 ;;
    --subnet) subnet="$2"; shift 2 ;;
    --wires) wires="$2"; shift 2 ;;
    --no-faults) faults=0; shift ;;
    --no-mpirun) mpi=0; shift ;;
    --no-auth) auth=0; shift ;;
    *) sed -n '19,20p' "$0" >&2; exit 2 ;;
    esac
done

t_start=$SECONDS
passed=0
failed=0
bed=$(mktemp -d "/tmp/emp-netns-$name.XXXXXX")
log="$bed/step.log"
config=""

teardown() {
    if [ -n "$config" ]; then
        "$bin/emp" cluster down --config "$config" >/dev/null 2>&1 || true
    fi
    # check_gang's pid namespaces (their init's death ends everything in them).
    [ -f "$bed/pidns-holders" ] && xargs -r kill -9 <"$bed/pidns-holders" 2>/dev/null
    scripts/netns/bed.sh down --dir "$bed/bed" >/dev/null || echo "# bed teardown failed: see above" >&2
    rm -rf "$bed"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

pass() {
    passed=$((passed + 1))
    echo "ok - $1"
}
fail() {
    failed=$((failed + 1))
    echo "not ok - $1"
    [ ! -s "$log" ] || sed 's/^/#   /' "$log" | tail -n 60
}

# step NAME CMD…: runs CMD; passes when it exits 0.
step() {
    local what="$1" t0=$SECONDS
    shift
    if "$@" >"$log" 2>&1; then pass "$what ($((SECONDS - t0)) s)"; else fail "$what ($((SECONDS - t0)) s)"; fi
}

# tap NAME CMD…: runs a TAP program; passes when it exits 0 and every test
# of its plan printed "ok".
tap() {
    local what="$1" t0=$SECONDS rc plan oks
    shift
    "$@" >"$log" 2>&1
    rc=$?
    plan=$(sed -n 's/^1\.\.\([0-9][0-9]*\)$/\1/p' "$log" | head -n 1)
    oks=$(grep -c '^ok ' "$log")
    if [ "$rc" -eq 0 ] && [ -n "$plan" ] && [ "$oks" -eq "$plan" ] && ! grep -q '^not ok' "$log"; then
        pass "$what: $oks/$plan ($((SECONDS - t0)) s)"
    else
        fail "$what: exit $rc, ${oks}/${plan:-?} ok ($((SECONDS - t0)) s)"
    fi
}

# counted WHAT CMD…: runs a script that prints its own TAP lines and counts
# them; its other lines become comments. A script that exits non-zero
# without a "not ok" line of its own fails as WHAT.
counted() {
    local what="$1" line status="" bad=0
    shift
    while IFS= read -r line; do
        case "$line" in
        "ok "*) passed=$((passed + 1)); echo "$line" ;;
        "not ok "*) failed=$((failed + 1)); bad=1; echo "$line" ;;
        "counted-exit "*) status="${line#counted-exit }" ;;
        "#"*) echo "$line" ;;
        *) echo "# $line" ;;
        esac
    done < <("$@" 2>&1; echo "counted-exit $?")
    if [ "$status" != 0 ] && [ "$bad" -eq 0 ]; then
        failed=$((failed + 1))
        echo "not ok - $what: exit ${status:-?} before any test failed"
    fi
}

# check_info F: `emp info --config F` succeeds and shows every node of F
# running with its link up, and every daemon's wire counters.
check_info() {
    local nodes out
    nodes=$(grep -c '^\[\[node\]\]' "$1")
    out=$("$bin/emp" info --config "$1") || { echo "$out"; return 1; }
    echo "$out"
    [ "$(grep -cE '^[0-9]+ +Running .* up mtu [0-9]+ mac ' <<<"$out")" -eq "$nodes" ] || {
        echo "# not every one of the $nodes nodes is Running with its link up"
        return 1
    }
    [ "$(grep -cE '^wire of emp-nicd pid .* sent=[0-9]+ received=' <<<"$out")" -eq "$nodes" ] || {
        echo "# not every daemon reported its wire counters"
        return 1
    }
}

# check_gang F: on F's NICs given one port slot each, two jobs of tap-p2p
# × 4 ranks (one per namespace) take turns under `emp gang --config`, each
# node's ranks started and switched by an `emp gang-agent` in its
# namespace: both suites pass, with at least 4 switches. Before the
# daemons are up it is refused naming the node; a scheduler killed
# mid-run leaves no rank behind (its agents kill theirs).
# Each host also gets a pid namespace of its own, as a machine has: its
# daemon, agent and ranks see only each other's pids, and the scheduler
# here sees none of theirs, so a scheduler that used a pid an agent knows
# would signal the wrong process.
check_gang() {
    local rc
    gang_in_pid_namespaces "$1"
    rc=$?
    # Whatever happened: no daemon of the gang file, no pid namespace left.
    "$bin/emp" cluster down --config "$bed/bed/gang.toml" >/dev/null 2>&1
    [ -f "$bed/pidns-holders" ] && xargs -r kill -9 <"$bed/pidns-holders" 2>/dev/null
    rm -f "$bed/pidns-holders"
    return "$rc"
}

gang_in_pid_namespaces() {
    local gconf="$bed/bed/gang.toml" out rc sw pid left stopped i holder init
    sed '/^\[cluster\]$/a ports = 1' "$1" >"$gconf"
    for i in 0 1 2 3; do
        ip netns exec "$name-$i" unshare --pid --mount-proc --kill-child sleep 100000 &
        holder=$!
        disown "$holder" # killed by check_gang or teardown: no job report
        echo "$holder" >>"$bed/pidns-holders"
        init=""
        for _ in $(seq 50); do
            init=$(pgrep -P "$holder" sleep) && break
            sleep 0.1
        done
        [ -n "$init" ] || { echo "# no pid namespace for host $name-$i"; return 1; }
        sed -i "s|^launch = \[\"ip\", \"netns\", \"exec\", \"$name-$i\"\]$|launch = [\"nsenter\", \"-t\", \"$init\", \"-p\", \"-m\", \"-n\"]|" "$gconf"
    done
    [ "$(grep -c '^launch = \["nsenter"' "$gconf")" -eq 4 ] || { echo "# launch lines not rewritten:"; cat "$gconf"; return 1; }
    out=$("$bin/emp" gang --config "$gconf" --dir "$bed/gang" --job "4 $bin/tap-p2p" --job "4 $bin/tap-p2p" 2>&1)
    rc=$?
    grep -q 'node 0:' <<<"$out" && [ "$rc" -ne 0 ] || { echo "# with no daemon up: rc $rc, $out"; return 1; }
    echo "# no daemon up: refused ($(head -n 1 <<<"$out"))"
    "$bin/emp" cluster up --config "$gconf" || return 1
    local ours apart=0
    ours=$(readlink /proc/self/ns/pid)
    for pid in $(pgrep -x emp-nicd); do
        [ "$(readlink "/proc/$pid/ns/pid")" != "$ours" ] && apart=$((apart + 1))
    done
    [ "$apart" -ge 4 ] || { echo "# only $apart daemons in pid namespaces of their own"; return 1; }
    echo "# $apart daemons, each in its host's pid namespace"
    EMP_TAP_BIG_MB=4 "$bin/emp" gang --config "$gconf" --dir "$bed/gang" --slice-ms 20 \
        --job "4 $bin/tap-p2p" --job "4 $bin/tap-p2p" >/dev/null 2>&1 &
    pid=$!
    # Killed once a job is switched out (a rank stopped): a stopped rank
    # never goes on by itself, so only its agent can end it.
    stopped=0
    for _ in $(seq 200); do
        stopped=$(pgrep -f "^$bin/tap-p2p" | xargs -r ps -o stat= -p 2>/dev/null | grep -c '^T')
        [ "$stopped" -gt 0 ] && break
        sleep 0.05
    done
    kill -9 "$pid"
    wait "$pid" 2>/dev/null
    [ "$stopped" -gt 0 ] || { echo "# no rank was ever seen switched out"; return 1; }
    for _ in $(seq 50); do
        left=$(pgrep -f "^$bin/tap-p2p" | wc -l)
        [ "$left" -eq 0 ] && break
        sleep 0.1
    done
    [ "$left" -eq 0 ] || { echo "# $left ranks left after the scheduler was killed"; pkill -9 -f "^$bin/tap-p2p"; return 1; }
    echo "# scheduler killed with $stopped ranks switched out: its agents killed every rank"
    sleep 1
    out=$(EMP_TAP_BIG_MB=4 "$bin/emp" gang --config "$gconf" --dir "$bed/gang" --slice-ms 20 --stable-ms 500 \
        --timeout 300 --job "4 $bin/tap-p2p" --job "4 $bin/tap-p2p" 2>&1)
    rc=$?
    "$bin/emp" cluster down --config "$gconf"
    grep -E '^emp gang|passed|^not ok' <<<"$out"
    [ "$rc" -eq 0 ] || return 1
    [ "$(grep -c '# 10 passed, 0 failed' <<<"$out")" -eq 2 ] || { echo "# not both jobs' suites passed"; return 1; }
    sw=$(sed -n 's/^emp gang: [0-9]* jobs, \([0-9]*\) switches.*/\1/p' <<<"$out")
    [ "${sw:-0}" -ge 4 ] || { echo "# only ${sw:-0} switches: the jobs did not take turns"; return 1; }
}

finish() {
    echo "# netns suite: $((SECONDS - t_start)) s"
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit
}

if [ "$(id -u)" -ne 0 ]; then
    echo "not ok - the namespace suite needs root (network namespaces, bridge, tc)"
    failed=1
    finish
fi
for b in emp emp-nicd tap-p2p tap-robust tap-coll tap-coll-host tap-atomics tap-fault tap-rbcast; do
    if [ ! -x "$bin/$b" ]; then
        echo "not ok - $bin/$b is missing: run make build"
        failed=1
        finish
    fi
done

if ! scripts/netns/bed.sh up --name "$name" --hosts 4 --dir "$bed/bed" --subnet "$subnet" \
    --loss 1% --delay 100us >"$log" 2>&1; then
    fail "bed of 4 namespaces"
    finish
fi
sed 's/^/# /' "$log"

# Each suite with 4 ranks, one per namespace; TAP from rank 0 (rank 1 for
# tap-robust garbage). The timeout bounds a hang; the programs' own per-call
# timeouts end a lost-frame stall long before it.
# tap-rbcast: the reliable broadcast over the wire's own multicast (IP
# multicast on udp, Ethernet multicast on packet), with the bed's loss.
suites=("tap-p2p" "tap-robust garbage" "tap-coll" "tap-coll-host" "tap-atomics" "tap-rbcast")
for wire in $wires; do
    config="$bed/bed/cluster-$wire.toml"
    if ! "$bin/emp" cluster up --config "$config" >"$log" 2>&1; then
        fail "cluster up over $wire (4 namespaces)"
        config=""
        continue
    fi
    pass "cluster up over $wire (4 namespaces): $(tail -n 1 "$log")"
    for s in "${suites[@]}"; do
        read -ra words <<<"$s"
        tap "$s over $wire, 4 ranks in 4 namespaces" \
            "$bin/emp" run --config "$config" -n 4 --timeout 300 -- "$bin/${words[0]}" "${words[@]:1}"
    done
    step "emp info over $wire: 4 NICs running, their links and wire counters" \
        check_info "$config"
    if [ "$mpi" -eq 1 ]; then
        # One TAP line per job; a script that fails before its jobs says so.
        counted "mpirun across 4 namespaces over $wire" \
            scripts/netns/mpirun-suite.sh --bed "$bed/bed" --config "$config"
    fi
    counted "fi_pingpong across namespaces over $wire" \
        scripts/netns/fi-pingpong.sh --bed "$bed/bed" --config "$config"
    if [ "$faults" -eq 1 ]; then
        counted "faults over $wire" scripts/netns/faults.sh --config "$config" --name "$name"
    fi
    step "cluster down over $wire" "$bin/emp" cluster down --config "$config"
    if [ "$wire" = udp ]; then
        step "emp gang across 4 namespaces over $wire: two jobs x 4 ranks (tap-p2p) on one-slot NICs" \
            check_gang "$config"
    fi
    config=""
done

# check_auth F KEY: every daemon of F sends with key KEY and refused nothing.
check_auth() {
    local out daemons
    out=$("$bin/emp" info --config "$1") || { echo "$out"; return 1; }
    echo "$out"
    daemons=$(grep -c '^wire of emp-nicd pid' <<<"$out")
    [ "$(grep -cE "auth=[a-z]+ key=$2 .* bad_tag=0 unknown_key=0 replayed=0" <<<"$out")" -eq "$daemons" ] || {
        echo "# not every one of the $daemons daemons sends with key $2 having refused nothing"
        return 1
    }
}

# rotated_p2p F: tap-p2p across the namespaces, the key rotated under it.
rotated_p2p() {
    "$bin/emp" run --config "$1" -n 4 --timeout 300 -- "$bin/tap-p2p" &
    local job=$! rc
    sleep 0.5
    "$bin/emp" wire keygen --out "$bed/wire.key" --next && "$bin/emp" wire rekey --config "$1" || rc=1
    wait "$job" || rc=1
    return "${rc:-0}"
}

if [ "$auth" -eq 1 ]; then
    read -ra ws <<<"$wires"
    "$bin/emp" wire keygen --out "$bed/wire.key" >"$log" 2>&1 || fail "wire keygen"
    for i in 0 1; do
        wire=${ws[$i]:-}
        [ -n "$wire" ] || continue
        mode=mac
        [ "$i" -eq 0 ] || mode=aead
        config="$bed/bed/cluster-$wire-$mode.toml"
        sed "s|^\[cluster\]\$|[cluster]\nauth = \"$mode\"\nauth_key = \"$bed/wire.key\"|" \
            "$bed/bed/cluster-$wire.toml" >"$config"
        if ! "$bin/emp" cluster up --config "$config" >"$log" 2>&1; then
            fail "cluster up over $wire with auth $mode"
            config=""
            continue
        fi
        pass "cluster up over $wire with auth $mode: $(tail -n 1 "$log")"
        auth_suites=("tap-p2p")
        [ "$i" -ne 0 ] || auth_suites+=("tap-coll" "tap-atomics")
        for s in "${auth_suites[@]}"; do
            tap "$s over $wire with auth $mode, 4 ranks in 4 namespaces" \
                "$bin/emp" run --config "$config" -n 4 --timeout 300 -- "$bin/$s"
        done
        if [ "$i" -eq 0 ]; then
            key=$(sed -n 's/^id = //p' "$bed/wire.key")
            tap "tap-p2p over $wire with auth $mode, the key rotated under it" rotated_p2p "$config"
            step "emp info over $wire: every daemon on key $((key + 1)), nothing refused" \
                check_auth "$config" "$((key + 1))"
        else
            step "emp info over $wire with auth $mode: nothing refused" \
                check_auth "$config" "$(sed -n 's/^id = //p' "$bed/wire.key")"
        fi
        step "cluster down over $wire with auth $mode" "$bin/emp" cluster down --config "$config"
        config=""
    done
fi
finish
