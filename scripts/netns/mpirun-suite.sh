#!/usr/bin/env bash
# mpirun across network namespaces: Open MPI's mpirun, in the root
# namespace, starts tap-p2p (and the C example job_ring) as ranks spread
# over the namespaces of a scripts/netns/bed.sh test bed, through the launch
# agent scripts/netns/mpirun-agent.sh. Every rank learns its rank, the job's
# size and its peers' endpoints from PMIx, and its NIC from the cluster file
# (EMP_CLUSTER) by its host, which is its namespace's hostname. See
# docs/launch.md.
#
#   scripts/netns/mpirun-suite.sh [--name P] [--hosts N] [--ranks-per-host R]
#                                 [--subnet 198.18.K] [--nics bed|root]
#
# The NICs:
#   bed:  one emp-nicd per namespace on the bed's addresses, from the bed's
#         cluster-udp.toml (`emp cluster up --config`: needs the cluster-file
#         support of `emp cluster up` and the udp wire on real addresses);
#   root: the daemons of a loopback udp chassis in the root namespace
#         (`emp cluster up --wire udp`); their sockets are files, reachable
#         from every network namespace, and a cluster file names namespace
#         P-i as the host of node i. This tests the launch (agent, PMIx, a
#         rank's NIC by its hostname) without the Ethernet path.
# Default: root. `bed` also needs the udp wire on the bed's real addresses
# in emp-nicd; it has not been run here yet.
#
# Needs root, iproute2, util-linux (unshare), openmpi-bin, and `make build`
# (target/release: emp, emp-nicd, tap-p2p, lib/libemp.so.1). Everything is
# removed on exit, also on failure.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${EMP_BIN_DIR:-$root/target/release}"
name="emp-mpi" hosts=4 per_host=1 subnet="198.18.60" nics=""
while [ $# -gt 0 ]; do
    case "$1" in
    --name) name="$2"; shift 2 ;;
    --hosts) hosts="$2"; shift 2 ;;
    --ranks-per-host) per_host="$2"; shift 2 ;;
    --subnet) subnet="$2"; shift 2 ;;
    --nics) nics="$2"; shift 2 ;;
    *)
        sed -n '10,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
        exit 2
        ;;
    esac
done

die() {
    echo "mpirun-suite: $*" >&2
    exit 1
}
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
command -v mpirun >/dev/null || die "mpirun not found: scripts/setup.sh installs openmpi-bin"
command -v unshare >/dev/null || die "unshare not found (util-linux)"
for f in emp emp-nicd tap-p2p lib/libemp.so.1; do
    [ -e "$bin/$f" ] || die "$bin/$f missing: run \`make build\`"
done
[[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 2 ] || die "--hosts must be 2 or more"
[[ "$per_host" =~ ^[0-9]+$ ]] && [ "$per_host" -ge 1 ] || die "--ranks-per-host must be 1 or more"
nics="${nics:-root}"
case "$nics" in bed | root) ;; *) die "--nics must be bed or root" ;; esac
if [ "$nics" = bed ] && ! "$bin/emp" cluster up --help 2>/dev/null | grep -q -- '--config'; then
    die "--nics bed: \`emp cluster up\` takes no --config in this build"
fi

dir="$(mktemp -d /tmp/emp-mpirun-suite.XXXXXX)"
chassis=""
cleanup() {
    local rc=$?
    set +e
    if [ -n "$chassis" ]; then
        "$bin/emp" cluster down "${chassis[@]}" >/dev/null 2>&1
    fi
    "$root/scripts/netns/bed.sh" down --dir "$dir/bed" >/dev/null
    rm -rf "$dir"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$root/scripts/netns/bed.sh" up --name "$name" --hosts "$hosts" --dir "$dir/bed" --subnet "$subnet"

if [ "$nics" = bed ]; then
    cluster="$dir/bed/cluster-udp.toml"
    chassis=(--config "$cluster")
    "$bin/emp" cluster up --config "$cluster"
else
    cluster="$dir/cluster-root.toml"
    chassis=(--dir "$dir/chassis")
    udp_base=$((40000 + $$ % 20000))
    "$bin/emp" cluster up -n "$hosts" --wire udp --udp-base "$udp_base" --dir "$dir/chassis"
    {
        echo "# Namespace $name-i is the host of node i, whose daemon runs in the"
        echo "# root namespace (loopback udp chassis in $dir/chassis)."
        echo "[cluster]"
        echo "wire = \"udp\""
        for ((i = 0; i < hosts; i++)); do
            printf '\n[[host]]\nname = "%s-%d"\ndir = "%s"\n' "$name" "$i" "$dir/chassis"
        done
        for ((i = 0; i < hosts; i++)); do
            printf '\n[[node]]\nid = %d\nhost = "%s-%d"\nudp = "127.0.0.1:%d"\n' "$i" "$name" "$i" $((udp_base + i))
        done
    } >"$cluster"
fi

# --host a:R,b:R,…: R slots on each namespace, by its address.
host_list=$(awk -v r="$per_host" '!/^#/ && NF >= 2 { printf "%s%s:%d", sep, $1, r; sep = "," }' "$dir/bed/hosts")
ranks=$((hosts * per_host))
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 EMP_NETNS_HOSTS="$dir/bed/hosts"
# mpirun's daemons reach it over the bridge (--mca oob_tcp_if_include); each
# is started by the agent, never by another daemon (no tree spawn); every
# "host" believes it owns all cores, so no binding.
mpi=(mpirun -n "$ranks" --host "$host_list" --bind-to none --timeout 300
    --mca plm_rsh_agent "$root/scripts/netns/mpirun-agent.sh" --mca plm_rsh_no_tree_spawn 1
    --mca oob_tcp_if_include "$subnet.0/24" -x EMP_CLUSTER="$cluster" -x PATH)

fail=0
echo "mpirun-suite: tap-p2p, $ranks ranks on $hosts namespaces (NICs: $nics)"
out="$dir/tap-p2p.out"
if "${mpi[@]}" "$bin/tap-p2p" >"$out" 2>&1 && grep -q "^# 10 passed, 0 failed" "$out"; then
    grep -E "^(ok|not ok|#)" "$out"
else
    cat "$out"
    echo "mpirun-suite: tap-p2p failed" >&2
    fail=1
fi

# The C job API: a token around the ring of ranks by learnt endpoints.
ring="$dir/job_ring"
${CC:-cc} -Wall -Wextra -Werror -O2 -I "$root/libemp/include" "$root/libemp/examples/c/job_ring.c" \
    -L "$bin/lib" -lemp -Wl,--disable-new-dtags -Wl,-rpath,"$bin/lib" -o "$ring"
echo "mpirun-suite: job_ring (C), $ranks ranks on $hosts namespaces"
out="$dir/job_ring.out"
if "${mpi[@]}" "$ring" >"$out" 2>&1 && [ "$(grep -c '^rank .* got "' "$out")" -eq "$ranks" ]; then
    sort "$out"
    # Rank 0's token went through every rank, and every rank ran on its own
    # namespace's NIC (node = rank / ranks-per-host for the bed's one NIC each).
    want=$(seq -s, 0 $((ranks - 1)))
    grep -q "^rank 0 of $ranks on node 0 port 0: got \"$want\"" "$out" || { echo "mpirun-suite: rank 0's token is not $want" >&2; fail=1; }
else
    cat "$out"
    echo "mpirun-suite: job_ring failed" >&2
    fail=1
fi

if [ "$fail" -eq 0 ]; then
    echo "mpirun-suite: 2 passed, 0 failed"
else
    echo "mpirun-suite: failed"
fi
exit "$fail"
