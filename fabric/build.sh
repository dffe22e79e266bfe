#!/usr/bin/env bash
# Builds the libfabric provider libemp-fi.so into target/release/lib/
# (next to libemp.so.1, which it links with rpath $ORIGIN), and the
# provider's test programs fi_emp_unit, fi_emp_peer and fi_emp_fuzz
# (fabric/test/), and `emp bench mpi`'s program fabric/test/mpi_bench.
# `make build` runs it after scripts/libemp-link.sh. Point FI_PROVIDER_PATH
# at the output directory to load the provider.
#
#   fabric/build.sh --sanitize DIR   the same, built with AddressSanitizer and
#                                    UBSan into DIR (FI_PROVIDER_PATH=DIR), for
#                                    running the tests and the fuzzer checked
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
out="$target/release/lib"
lib="$out"
cc="${CC:-cc}"
san=()
rpath='$ORIGIN'
if [ "${1:-}" = "--sanitize" ]; then
    [ -n "${2:-}" ] || { echo "usage: fabric/build.sh [--sanitize DIR]" >&2; exit 2; }
    mkdir -p "$2"
    out="$(cd "$2" && pwd)"
    san=(-O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
    rpath="$lib"
fi

if [ ! -f /usr/include/rdma/providers/fi_prov.h ]; then
    echo "fabric: libfabric headers missing (apt-get install libfabric-dev, or make setup)" >&2
    exit 1
fi
if [ ! -e "$lib/libemp.so" ]; then
    echo "fabric: $lib/libemp.so not built: run scripts/libemp-link.sh (make build)" >&2
    exit 1
fi
cflags=(-std=gnu11 -O2 -g -Wall -Wextra -Werror "${san[@]}")
"$cc" "${cflags[@]}" -fPIC -fvisibility=hidden -I"$root/libemp/include" -I"$root/fabric" -shared \
    -o "$out/libemp-fi.so.tmp" "$root"/fabric/emp_fi_*.c \
    -Wl,--version-script="$root/fabric/emp_fi.map" -Wl,-z,defs \
    -L"$lib" -Wl,-rpath,"$rpath" -lemp -lfabric -lpthread
mv "$out/libemp-fi.so.tmp" "$out/libemp-fi.so"
"$cc" "${cflags[@]}" -o "$out/fi_emp_unit" "$root/fabric/test/fi_emp_unit.c" "$root/fabric/test/fi_emp_rma.c" \
    "$root/fabric/test/fi_emp_probe.c" -lfabric
"$cc" "${cflags[@]}" -o "$out/fi_emp_fuzz" "$root/fabric/test/fi_emp_fuzz.c" -lfabric
"$cc" "${cflags[@]}" -o "$out/fi_emp_peer" "$root/fabric/test/fi_emp_peer.c" -lfabric
# The MPI benchmark program of `emp bench mpi`, when Open MPI's mpicc is
# here (libopenmpi-dev; scripts/setup.sh installs it).
if command -v mpicc >/dev/null 2>&1; then
    mpicc -std=gnu11 -O2 -g -Wall -Wextra -Werror -o "$out/mpi_bench" "$root/fabric/test/mpi_bench.c"
    # MPI_Barrier/MPI_Allreduce on the NICs for unmodified programs (LD_PRELOAD).
    mpicc "${cflags[@]}" -fPIC -shared -I"$root/libemp/include" -o "$out/libemp-mpicoll.so" \
        "$root/fabric/emp_mpi_coll.c" -L"$lib" -Wl,-rpath,"$rpath" -lemp
else
    echo "fabric: mpicc not found: $out/mpi_bench (emp bench mpi) not built" >&2
fi
