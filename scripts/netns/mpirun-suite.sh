#!/usr/bin/env bash
# mpirun across network namespaces: Open MPI's mpirun, in the root
# namespace, starts TAP programs (tap-p2p, tap-coll) and the C example
# job_ring as ranks spread over the namespaces of a scripts/netns/bed.sh
# test bed, through the launch agent scripts/netns/mpirun-agent.sh. Every
# rank learns its rank, the job's size and its peers' endpoints from PMIx,
# and its NIC from the cluster file (EMP_CLUSTER) by its host, which is its
# namespace's hostname. Then Open MPI's own MPI over EMP: fabric/test/
# mpi_emp.c and mpi_bench.c under `--mca pml cm --mca mtl ofi --mca
# mtl_ofi_provider_include emp` (the libfabric provider, docs/libfabric.md),
# the provider finding each rank's NIC the same way. See docs/launch.md.
#
#   mpirun-suite.sh [--name P] [--hosts N] [--ranks-per-host R] [--subnet 198.18.K]
#                   [--nics bed|root] [--wire udp|packet]
#   mpirun-suite.sh --bed D --config F
#
# The first form makes its own bed and NICs and removes them on exit:
#   bed:  (default) one emp-nicd per namespace on the bed's links, from the
#         bed's cluster-WIRE.toml (`emp cluster up --config`), over udp or
#         packet (--wire, default udp): the ranks' messages cross the bridge;
#   root: the daemons of a loopback udp chassis in the root namespace
#         (`emp cluster up --wire udp`); their sockets are files, reachable
#         from every namespace, and a cluster file names namespace P-i as
#         the host of node i. Tests the launch alone, without the Ethernet
#         path.
# The second form runs the jobs on a bed D that exists and whose cluster F
# (one of D's cluster files) is up, one rank per namespace, and leaves both
# as they were (scripts/netns/suite.sh uses it for each wire).
#
# One TAP line per job ("ok - …" / "not ok - …"), then "mpirun-suite: N
# passed, N failed"; exits non-zero when one failed. Needs root, iproute2,
# util-linux (unshare), openmpi-bin, a C compiler and `make build`
# (target/release: emp, emp-nicd, tap-p2p, tap-coll, lib/libemp.so.1).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${EMP_BIN_DIR:-$root/target/release}"
name="emp-mpi" hosts=4 per_host=1 subnet="198.18.60" nics="bed" wire="udp" given_bed="" given_config=""
while [ $# -gt 0 ]; do
    case "$1" in
    --name) name="$2"; shift 2 ;;
    --hosts) hosts="$2"; shift 2 ;;
    --ranks-per-host) per_host="$2"; shift 2 ;;
    --subnet) subnet="$2"; shift 2 ;;
    --nics) nics="$2"; shift 2 ;;
    --wire) wire="$2"; shift 2 ;;
    --bed) given_bed="$2"; shift 2 ;;
    --config) given_config="$2"; shift 2 ;;
    *)
        sed -n '10,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
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
for f in emp emp-nicd tap-p2p tap-coll lib/libemp.so.1; do
    [ -e "$bin/$f" ] || die "$bin/$f missing: run \`make build\`"
done
[[ "$per_host" =~ ^[0-9]+$ ]] && [ "$per_host" -ge 1 ] || die "--ranks-per-host must be 1 or more"
case "$nics" in bed | root) ;; *) die "--nics must be bed or root" ;; esac
case "$wire" in udp | packet) ;; *) die "--wire must be udp or packet" ;; esac
if [ -n "$given_bed$given_config" ]; then
    [ -n "$given_bed" ] && [ -n "$given_config" ] || die "--bed and --config go together"
    [ -f "$given_bed/hosts" ] || die "$given_bed/hosts missing: not a bed (scripts/netns/bed.sh up --dir)"
    [ -f "$given_config" ] || die "$given_config: no such cluster file"
fi

dir="$(mktemp -d /tmp/emp-mpirun-suite.XXXXXX)"
chassis=()
made_bed=""
cleanup() {
    local rc=$?
    set +e
    if [ ${#chassis[@]} -gt 0 ]; then
        "$bin/emp" cluster down "${chassis[@]}" >/dev/null 2>&1
    fi
    if [ -n "$made_bed" ]; then
        "$root/scripts/netns/bed.sh" down --dir "$made_bed" >/dev/null
    fi
    rm -rf "$dir"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ -n "$given_bed" ]; then
    bed="$given_bed"
    cluster="$(cd "$(dirname "$given_config")" && pwd)/$(basename "$given_config")"
    per_host=1
    nics="bed"
    wire=$(sed -n 's/^wire = "\(.*\)"/\1/p' "$cluster")
    "$bin/emp" cluster status --config "$cluster" >/dev/null || die "the cluster of $cluster is not up"
else
    [[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 2 ] || die "--hosts must be 2 or more"
    bed="$dir/bed"
    made_bed="$bed"
    "$root/scripts/netns/bed.sh" up --name "$name" --hosts "$hosts" --dir "$bed" --subnet "$subnet"
    if [ "$nics" = bed ]; then
        cluster="$bed/cluster-$wire.toml"
        chassis=(--config "$cluster")
        "$bin/emp" cluster up --config "$cluster"
    else
        wire="udp (loopback chassis)"
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
fi

# The namespaces, from the bed's hosts file (lines "<ipv4> <namespace>").
mapfile -t addrs < <(awk '!/^#/ && NF >= 2 { print $1 }' "$bed/hosts")
hosts=${#addrs[@]}
[ "$hosts" -ge 2 ] || die "$bed/hosts names fewer than 2 namespaces"
# mpirun's daemons reach it over the bridge: its /24.
net="${addrs[0]%.*}.0/24"
# --host a:R,b:R,…: R slots on each namespace, by its address.
host_list=$(printf '%s:'"$per_host"',' "${addrs[@]}")
host_list="${host_list%,}"
ranks=$((hosts * per_host))
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 EMP_NETNS_HOSTS="$bed/hosts"
# Each daemon is started by the agent, never by another daemon (no tree
# spawn); every "host" believes it owns all cores, so no binding.
mpi=(mpirun -n "$ranks" --host "$host_list" --bind-to none --timeout 300
    --mca plm_rsh_agent "$root/scripts/netns/mpirun-agent.sh" --mca plm_rsh_no_tree_spawn 1
    --mca oob_tcp_if_include "$net" -x EMP_CLUSTER="$cluster" -x PATH)

passed=0
failed=0
where="$ranks ranks in $hosts namespaces over $wire"
out="$dir/job.out"
report() { # report OK WHAT
    if [ "$1" -eq 1 ]; then
        passed=$((passed + 1))
        echo "ok - mpirun: $2"
        grep -E '^#' "$out" | sed 's/^/#   /' || true
    else
        failed=$((failed + 1))
        echo "not ok - mpirun: $2"
        sed 's/^/#   /' "$out" | tail -n 40
    fi
}

# tap_job PROGRAM: passes when mpirun exits 0 and rank 0 printed an "ok"
# for every test of its plan (the other ranks run quiet).
tap_job() {
    local prog="$1" t0=$SECONDS rc plan oks
    set +e
    "${mpi[@]}" "$bin/$prog" >"$out" 2>&1
    rc=$?
    set -e
    plan=$(sed -n 's/^1\.\.\([0-9][0-9]*\)$/\1/p' "$out" | head -n 1)
    oks=$(grep -c '^ok ' "$out" || true)
    local good=0
    if [ "$rc" -eq 0 ] && [ -n "$plan" ] && [ "$oks" -eq "$plan" ] && ! grep -q '^not ok' "$out"; then
        good=1
    fi
    report "$good" "$prog, $where: exit $rc, $oks/${plan:-?} ok ($((SECONDS - t0)) s)"
}

tap_job tap-p2p
tap_job tap-coll

# The C job API: a token around the ring of ranks by learnt endpoints.
t0=$SECONDS
ring="$dir/job_ring"
good=0
if ${CC:-cc} -Wall -Wextra -Werror -O2 -I "$root/libemp/include" "$root/libemp/examples/c/job_ring.c" \
    -L "$bin/lib" -lemp -Wl,--disable-new-dtags -Wl,-rpath,"$bin/lib" -o "$ring" >"$out" 2>&1; then
    set +e
    "${mpi[@]}" "$ring" >"$out" 2>&1
    rc=$?
    set -e
    # Rank 0's token went through every rank in order.
    want=$(seq -s, 0 $((ranks - 1)))
    if [ "$rc" -eq 0 ] && [ "$(grep -c '^rank .* got "' "$out")" -eq "$ranks" ] &&
        grep -q "^rank 0 of $ranks on node 0 port 0: got \"$want\"" "$out"; then
        good=1
        # Each rank ran on its own namespace's NIC: node = rank / ranks-per-host.
        for ((r = 0; r < ranks; r++)); do
            grep -q "^rank $r of $ranks on node $((r / per_host)) " "$out" || good=0
        done
    fi
fi
report "$good" "job_ring (C job API), $where: token $want around the ring ($((SECONDS - t0)) s)"

# Open MPI's own point-to-point and collectives over the libfabric provider
# emp (pml cm, mtl ofi): fabric/test/mpi_emp.c (ping-pong 0 B-4 MiB with
# data checks, wildcard receives, every collective) and the benchmark
# program of `emp bench mpi` (a quick pass: latency, barrier, allreduce),
# mpi_emp.c again with MPI_Barrier/MPI_Allreduce on the NICs (libemp-mpicoll.so),
# each rank on its namespace's NIC. Skipped (and said so) without mpicc
# or the provider.
if [ -e "$bin/lib/libemp-fi.so" ] && command -v mpicc >/dev/null; then
    ofi_emp=(--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include emp -x FI_PROVIDER_PATH="$bin/lib")
    t0=$SECONDS
    good=0
    rc=-1
    if mpicc -O2 -Wall -Wextra -Werror -o "$dir/mpi_emp" "$root/fabric/test/mpi_emp.c" >"$out" 2>&1; then
        set +e
        "${mpi[@]}" "${ofi_emp[@]}" "$dir/mpi_emp" >"$out" 2>&1
        rc=$?
        set -e
        if [ "$rc" -eq 0 ] && grep -Eq '^# [1-9][0-9]* passed, 0 failed$' "$out"; then
            good=1
        fi
    fi
    report "$good" "mpi_emp.c over the provider emp (mtl ofi), $where: exit $rc ($((SECONDS - t0)) s)"
    grep -E '^(latency|not ok)' "$out" | sed 's/^/#   /' || true
    # The same with libemp-mpicoll.so preloaded: MPI_Barrier and
    # MPI_Allreduce on the NICs, across the namespaces; a fallback to Open
    # MPI's collectives (the library says "emp-mpicoll:") fails the step.
    t0=$SECONDS
    good=0
    rc=-1
    if [ -x "$dir/mpi_emp" ] && [ -e "$bin/lib/libemp-mpicoll.so" ]; then
        set +e
        "${mpi[@]}" "${ofi_emp[@]}" -x LD_PRELOAD="$bin/lib/libemp-mpicoll.so" -x EMP_MPICOLL_VERBOSE=1 \
            "$dir/mpi_emp" >"$out" 2>&1
        rc=$?
        set -e
        if [ "$rc" -eq 0 ] && grep -Eq '^# [1-9][0-9]* passed, 0 failed$' "$out" && ! grep -q 'emp-mpicoll:' "$out"; then
            good=1
        fi
    fi
    report "$good" "mpi_emp.c with the NIC collectives (libemp-mpicoll.so), $where: exit $rc ($((SECONDS - t0)) s)"
    t0=$SECONDS
    good=0
    mpicc -O2 -Wall -Wextra -Werror -o "$dir/mpi_bench" "$root/fabric/test/mpi_bench.c" >"$out" 2>&1 && {
        set +e
        "${mpi[@]}" "${ofi_emp[@]}" "$dir/mpi_bench" -q -r 3 -m latency,barrier,allreduce -s 8,65536 -a 8 >"$out" 2>&1
        rc=$?
        set -e
        if [ "$rc" -eq 0 ] && [ "$(grep -c '^result ' "$out")" -eq 4 ]; then
            good=1
        fi
    }
    report "$good" "mpi_bench over the provider emp (mtl ofi), $where: exit $rc ($((SECONDS - t0)) s)"
    grep '^result ' "$out" | sed 's/^/#   /' || true
else
    echo "ok - mpirun: Open MPI over the provider emp # SKIP no $bin/lib/libemp-fi.so or no mpicc"
fi

echo "mpirun-suite: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
