#!/usr/bin/env bash
# Open MPI's launch agent for hosts that are network namespaces on this
# machine: given to mpirun instead of ssh,
#
#   EMP_NETNS_HOSTS=D/hosts mpirun --mca plm_rsh_agent scripts/netns/mpirun-agent.sh \
#       --host 198.18.0.1,198.18.0.2 --mca oob_tcp_if_include 198.18.0.0/24 ...
#
# mpirun runs `mpirun-agent.sh HOST COMMAND…` once per host to start its
# daemon there, as it would run `ssh HOST COMMAND…`. HOST is an address or a
# name from the hosts file (lines "<ipv4> <namespace>", as scripts/netns/
# bed.sh writes D/hosts; EMP_NETNS_HOSTS names it, or `--hosts FILE` before
# HOST); a HOST that is itself a namespace named in the file is taken as is.
# The command runs in that namespace, in a UTS namespace of its own whose
# hostname is the namespace's name: every "host" needs its own hostname
# (PMIx's shared-memory store is keyed by it; with one shared hostname
# jobs hang), and libemp finds a rank's host in the cluster file by it.
# Like ssh, the words of COMMAND are joined with spaces and run by sh.
set -euo pipefail

hosts_file="${EMP_NETNS_HOSTS:-}"
if [ "${1:-}" = "--hosts" ]; then
    hosts_file="${2:-}"
    shift 2 || true
fi
if [ $# -lt 2 ]; then
    echo "usage: [EMP_NETNS_HOSTS=FILE] $0 [--hosts FILE] HOST COMMAND..." >&2
    exit 2
fi
host="$1"
shift
if [ -z "$hosts_file" ] || [ ! -r "$hosts_file" ]; then
    echo "mpirun-agent: no hosts file (EMP_NETNS_HOSTS or --hosts; bed.sh writes D/hosts): '${hosts_file}'" >&2
    exit 2
fi

ns=""
while read -r addr name _; do
    case "$addr" in '' | '#'*) continue ;; esac
    if [ "$addr" = "$host" ] || [ "$name" = "$host" ]; then
        ns="$name"
        break
    fi
done <"$hosts_file"
if [ -z "$ns" ]; then
    echo "mpirun-agent: $host is not in $hosts_file" >&2
    exit 255 # what ssh returns when it cannot reach the host
fi
if [ ! -e "/run/netns/$ns" ]; then
    echo "mpirun-agent: namespace $ns (for $host) does not exist" >&2
    exit 255
fi

# "$*": the command as one string, as ssh hands it to the remote shell. The
# namespace name is passed as $0's argument, not spliced into the script.
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$1" && shift && exec sh -c "$*"' sh "$ns" "$*"
