#!/usr/bin/env bash
# Installs what EMP needs to build and test, idempotently. Safe to rerun.
# Today: a Rust toolchain (cargo), a C compiler (the uapi layout test
# compiles the C header), libpmix-dev and Open MPI's mpirun (jobs started
# by a PMIx launcher), libfabric's headers and tools. Kernel and QEMU
# tooling arrive with the driver. Third-party MPI programs for the
# provider's tests: netpipe-openmpi, hpcc, python3-mpi4py.
set -euo pipefail

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)
command -v make >/dev/null 2>&1 || need_apt+=(make)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3) # make lint: scripts/dev/modcycles.py
# Jobs started by mpirun (docs/launch.md): libemp loads libpmix.so.2 at run
# time; its layout test compiles against pmix.h (pkg-config pmix); the
# chassis tests run ranks under Open MPI's mpirun.
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
{ command -v pkg-config >/dev/null 2>&1 && pkg-config --exists pmix; } || need_apt+=(libpmix-dev)
command -v mpirun >/dev/null 2>&1 || need_apt+=(openmpi-bin)
# The libfabric provider (fabric/): built against libfabric's public headers
# (libfabric-dev ships rdma/providers/fi_prov.h); its tests run fi_info and
# fi_pingpong (libfabric-bin) and Open MPI programs (libopenmpi-dev: mpicc).
[ -f /usr/include/rdma/providers/fi_prov.h ] || need_apt+=(libfabric-dev)
command -v fi_pingpong >/dev/null 2>&1 || need_apt+=(libfabric-bin)
# mpicc comes with openmpi-bin, mpi.h with libopenmpi-dev.
dpkg-query -W -f='${Status}' libopenmpi-dev 2>/dev/null | grep -q 'ok installed' || need_apt+=(libopenmpi-dev)
# MPI programs nobody here wrote, run over the provider by the chassis tests
# (tests/tests/fabric.rs): NetPIPE (NPopenmpi, its integrity mode), the HPC
# Challenge suite (hpcc, which checks its own results) and mpi4py's
# bundled benchmarks (/usr/bin/python3 -m mpi4py.bench).
command -v NPopenmpi >/dev/null 2>&1 || need_apt+=(netpipe-openmpi)
command -v hpcc >/dev/null 2>&1 || need_apt+=(hpcc)
# The distribution's python (another python3 may come first on PATH).
/usr/bin/python3 -c 'import mpi4py' >/dev/null 2>&1 || need_apt+=(python3-mpi4py)
# The namespace test bed (scripts/netns/bed.sh): ip and tc, and nft for
# loss on kernels without sch_netem.
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || need_apt+=(iproute2)
command -v nft >/dev/null 2>&1 || need_apt+=(nftables)
if ((${#need_apt[@]})); then
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: need ${need_apt[*]}; run as root or install them" >&2
        exit 1
    fi
    echo "setup: installing ${need_apt[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo not found; install Rust (rustup) first: https://rustup.rs" >&2
    exit 1
fi
# make lint: rustfmt and clippy come with the toolchain; add them if rustup can.
for tool in fmt clippy; do
    if ! cargo "$tool" --version >/dev/null 2>&1; then
        command -v rustup >/dev/null 2>&1 && rustup component add "${tool/fmt/rustfmt}" >/dev/null 2>&1 || true
        cargo "$tool" --version >/dev/null 2>&1 || { echo "setup: cargo $tool not found (rustup component add $tool)" >&2; exit 1; }
    fi
done
echo "setup: ok ($(cargo --version), $(cc --version | head -1))"
