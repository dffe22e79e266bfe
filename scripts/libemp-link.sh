#!/usr/bin/env bash
# Links the C library, libemp.so.1, from libemp's staticlib with the system
# C compiler and the version script libemp/libemp.map: every function emp.h
# declares is exported at version EMP_1.0, nothing else is exported.
#
# Not cargo's cdylib, because rustc hands the linker its own anonymous
# version script for every cdylib ({ global: <each symbol>; local: *; }),
# which a named one cannot join: GNU ld refuses the pair, rust-lld defines
# EMP_1.0 but puts no symbol in it. zlib-rs builds libz-rs.so the same way.
#
#   scripts/libemp-link.sh [STATICLIB OUTDIR]
#
# Without arguments (what `make build` runs): target/release/libemp.a into
# target/release/lib/ (under $CARGO_TARGET_DIR if set), a directory cargo
# never writes to. OUTDIR gets libemp.so.1 (SONAME libemp.so.1) and the
# link-time name libemp.so -> libemp.so.1. $CC picks the compiler (cc).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
map="$root/libemp/libemp.map"

case $# in
0)
    target="${CARGO_TARGET_DIR:-$root/target}"
    staticlib="$target/release/libemp.a"
    out="$target/release/lib"
    ;;
2)
    staticlib="$1"
    out="$2"
    ;;
*)
    echo "usage: $0 [STATICLIB OUTDIR]" >&2
    exit 2
    ;;
esac

if [ ! -f "$staticlib" ]; then
    echo "libemp-link: $staticlib not built: run \`make build\` (libemp's crate-type includes staticlib)" >&2
    exit 1
fi

read -r -a cc <<<"${CC:-cc}"
mkdir -p "$out"

# Link next to the result and rename into place, so a program starting
# meanwhile never maps a half-written library.
tmp="$(mktemp "$out/.libemp.so.1.XXXXXX")"
trap 'rm -f "$tmp"' EXIT

# --whole-archive: nothing in this link references the emp_* functions, so
# without it no member of the archive would be pulled in; --gc-sections then
# drops what the exported functions do not reach. -z defs turns a missing
# native library into a link error. The native libraries are what
#   cargo rustc -p emp --release --lib --crate-type staticlib -- --print native-static-libs
# lists for the staticlib.
"${cc[@]}" -shared -o "$tmp" \
    -Wl,-soname,libemp.so.1 \
    -Wl,--version-script="$map" \
    -Wl,-z,defs -Wl,-z,relro,-z,now -Wl,--gc-sections -Wl,--as-needed \
    -Wl,--whole-archive "$staticlib" -Wl,--no-whole-archive \
    -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc

chmod 0755 "$tmp"
mv -f "$tmp" "$out/libemp.so.1"
trap - EXIT
ln -sfn libemp.so.1 "$out/libemp.so"
