#!/usr/bin/env bash
# libfabric's fi_pingpong (libfabric-bin) over the provider emp across two
# namespaces of a scripts/netns/bed.sh bed whose cluster is up: the server
# in the first namespace, the client in the second, each on its own
# namespace's NIC (EMP_DEVICE: node i's socket in the cluster file's
# directory of host i, the bed's i-th namespace). fi_pingpong
# trades the two EMP addresses over its own TCP socket across the bridge;
# the messages then cross the bed's link between the two NICs, with the
# bed's loss and delay. `-e rdm`, in msg and tagged mode, `-c` (every
# message's data checked), every size (`-S all`: 1 B to 6 MiB).
#
#   fi-pingpong.sh --bed D --config F
#
# One TAP line per mode ("ok - …" / "not ok - …", a SKIP without
# fi_pingpong or the provider); exits non-zero when one failed. Leaves the
# bed and the cluster as they were. Needs root and `make build`.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${EMP_BIN_DIR:-$root/target/release}"
bed="" config=""
while [ $# -gt 0 ]; do
    case "$1" in
    --bed) bed="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    *)
        sed -n '11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
        exit 2
        ;;
    esac
done
die() {
    echo "fi-pingpong: $*" >&2
    exit 1
}
[ -n "$bed" ] && [ -n "$config" ] || die "--bed and --config are both needed"
[ -f "$bed/hosts" ] || die "$bed/hosts missing: not a bed (scripts/netns/bed.sh up --dir)"
[ -f "$config" ] || die "$config: no such cluster file"
[ "$(id -u)" -eq 0 ] || die "needs root (ip netns exec)"
if ! command -v fi_pingpong >/dev/null || [ ! -e "$bin/lib/libemp-fi.so" ]; then
    echo "ok - fi_pingpong over the provider emp # SKIP no fi_pingpong (libfabric-bin) or no $bin/lib/libemp-fi.so"
    exit 0
fi
config="$(cd "$(dirname "$config")" && pwd)/$(basename "$config")"
mapfile -t lines < <(awk '!/^#/ && NF >= 2 { print $1, $2 }' "$bed/hosts")
[ "${#lines[@]}" -ge 2 ] || die "$bed/hosts names fewer than 2 namespaces"
read -r server_addr server_ns <<<"${lines[0]}"
read -r _ client_ns <<<"${lines[1]}"

dir="$(mktemp -d /tmp/emp-fi-pingpong.XXXXXX)"
server_pid=""
cleanup() {
    local rc=$?
    if [ -n "$server_pid" ]; then
        kill -- -"$server_pid" 2>/dev/null
        wait "$server_pid" 2>/dev/null
    fi
    rm -rf "$dir"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# nic_of NS ID: the socket of node ID, whose daemon runs on host NS: in
# the directory the cluster file gives that host.
nic_of() {
    local d
    d=$(awk -v want="name = \"$1\"" '$0 == want { found = 1 } found && /^dir = / { print; exit }' "$config" |
        sed 's/^dir = "\(.*\)"$/\1/')
    [ -n "$d" ] || die "$config names no host $1 with a dir"
    echo "$d/nic$2.sock"
}
server_nic=$(nic_of "$server_ns" 0) || exit 1
client_nic=$(nic_of "$client_ns" 1) || exit 1
[ -S "$server_nic" ] && [ -S "$client_nic" ] || die "no NIC socket at $server_nic or $client_nic: is the cluster up?"
ns_env=(env -u EMP_CLUSTER -u FI_PROVIDER FI_PROVIDER_PATH="$bin/lib")

passed=0
failed=0
# A control port of our own: other runs on this machine use the default.
port=$((20000 + $$ % 20000))
for mode in msg tagged; do
    t0=$SECONDS
    args=(fi_pingpong -p emp -e rdm -m "$mode" -c -S all -I 10)
    # In a process group of its own, so an interrupted run can end it.
    setsid ip netns exec "$server_ns" "${ns_env[@]}" EMP_DEVICE="$server_nic" timeout 300 "${args[@]}" -B "$port" \
        >"$dir/server.out" 2>&1 &
    server_pid=$!
    # The client needs the server listening: retry while it is not yet.
    for _ in $(seq 100); do
        ip netns exec "$client_ns" "${ns_env[@]}" EMP_DEVICE="$client_nic" timeout 300 "${args[@]}" -P "$port" \
            "$server_addr" >"$dir/client.out" 2>&1
        client_rc=$?
        grep -q "Connection refused" "$dir/client.out" || break
        sleep 0.1
    done
    wait "$server_pid"
    server_rc=$?
    server_pid=""
    # One line per size, 1 B to 6 MiB, each with all 10 transfers done.
    sizes=0
    for size in "1 " "64 " "1k " "64k " "1m " "6m "; do
        grep -q "^$size.*=10" "$dir/client.out" && sizes=$((sizes + 1))
    done
    what="fi_pingpong -e rdm -m $mode -c -S all over emp, $server_ns -> $client_ns"
    if [ "$server_rc" -eq 0 ] && [ "$client_rc" -eq 0 ] && [ "$sizes" -eq 6 ]; then
        passed=$((passed + 1))
        echo "ok - $what ($((SECONDS - t0)) s)"
        grep -E "^(bytes|1 |1m |6m )" "$dir/client.out" | sed 's/^/#   /'
    else
        failed=$((failed + 1))
        echo "not ok - $what: server exit $server_rc, client exit $client_rc, $sizes/6 sizes ($((SECONDS - t0)) s)"
        sed 's/^/#   server: /' "$dir/server.out" | tail -n 20
        sed 's/^/#   client: /' "$dir/client.out" | tail -n 20
    fi
    port=$((port + 1))
done
echo "fi-pingpong: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
