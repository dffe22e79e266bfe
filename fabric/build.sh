#!/usr/bin/env bash
# Builds the libfabric provider libemp-fi.so into target/release/lib/
# (next to libemp.so.1, which it links with rpath $ORIGIN), and the
# provider's unit test program fabric/test/fi_emp_unit, and `emp bench
# mpi`'s program fabric/test/mpi_bench. `make build` runs it
# after scripts/libemp-link.sh. Point FI_PROVIDER_PATH at the output
# directory to load the provider.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
out="$target/release/lib"
cc="${CC:-cc}"

if [ ! -f /usr/include/rdma/providers/fi_prov.h ]; then
    echo "fabric: libfabric headers missing (apt-get install libfabric-dev, or make setup)" >&2
    exit 1
fi
if [ ! -e "$out/libemp.so" ]; then
    echo "fabric: $out/libemp.so not built: run scripts/libemp-link.sh (make build)" >&2
    exit 1
fi
cflags=(-std=gnu11 -O2 -g -fPIC -Wall -Wextra -Werror -fvisibility=hidden -I"$root/libemp/include")
"$cc" "${cflags[@]}" -shared -o "$out/libemp-fi.so.tmp" "$root/fabric/emp_fi.c" \
    -Wl,--version-script="$root/fabric/emp_fi.map" -Wl,-z,defs \
    -L"$out" -Wl,-rpath,'$ORIGIN' -lemp -lfabric -lpthread
mv "$out/libemp-fi.so.tmp" "$out/libemp-fi.so"
"$cc" -std=gnu11 -O2 -g -Wall -Wextra -Werror -o "$out/fi_emp_unit" "$root/fabric/test/fi_emp_unit.c" -lfabric
# The MPI benchmark program of `emp bench mpi`, when Open MPI's mpicc is
# here (libopenmpi-dev; scripts/setup.sh installs it).
if command -v mpicc >/dev/null 2>&1; then
    mpicc -std=gnu11 -O2 -g -Wall -Wextra -Werror -o "$out/mpi_bench" "$root/fabric/test/mpi_bench.c"
else
    echo "fabric: mpicc not found: $out/mpi_bench (emp bench mpi) not built" >&2
fi
