#!/usr/bin/env bash
# Builds the Rust-enabled guest kernel from linux-source-7.3 and
# scripts/kernel/config.fragment, cached outside the repo under
# $EMP_CACHE/kbuild/<version>-<hash of config + toolchain>, safe for
# concurrent runs (flock). Prints the build directory on stdout.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cache="${EMP_CACHE:-$HOME/.cache/emp}"
"$root/scripts/kernel/toolchain.sh" >&2
ksrc="$cache/linux-source-7.3"
frag="$root/scripts/kernel/config.fragment"
bindgen="$cache/bindgen/bin/bindgen"
kver=$(make -s -C "$ksrc" kernelversion 2>/dev/null)
key=$( { cat "$frag"; /usr/bin/rustc --version; clang-22 --version | head -1; "$bindgen" --version; echo "$kver"; } | sha256sum | cut -c1-12)
out="$cache/kbuild/$kver-$key"
mkdir -p "$out"
exec 9>"$out.lock"
flock 9
if [ -f "$out/.emp-done" ]; then
    echo "$out"
    exit 0
fi
kmake=(make -C "$ksrc" O="$out" LLVM=-22 RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc BINDGEN="$bindgen" LIBCLANG_PATH=/usr/lib/llvm-22/lib)
echo "kernel: configuring $kver in $out" >&2
"${kmake[@]}" -s tinyconfig >&2
"$ksrc/scripts/kconfig/merge_config.sh" -m -O "$out" "$out/.config" "$frag" >&2
"${kmake[@]}" -s olddefconfig >&2
for opt in CONFIG_RUST CONFIG_RUST_FW_LOADER_ABSTRACTIONS CONFIG_PCI_MSI CONFIG_MODULES CONFIG_PROVE_LOCKING CONFIG_DEBUG_KMEMLEAK; do
    if ! grep -q "^$opt=y" "$out/.config"; then
        echo "kernel: $opt did not stick (make rustavailable says why):" >&2
        "${kmake[@]}" rustavailable >&2 || true
        exit 1
    fi
done
echo "kernel: building (about 5-10 minutes on 2 cores; progress every 30 s)" >&2
log="$out/build.log"
start=$(date +%s)
( while sleep 30; do
      printf 'kernel: %ds, %d objects built\n' $(( $(date +%s) - start )) "$(grep -c '^  \(CC\|RUSTC\|AS\)' "$log" 2>/dev/null || echo 0)" >&2
  done ) &
ticker=$!
trap 'kill $ticker 2>/dev/null || true' EXIT
if ! "${kmake[@]}" -j"$(nproc)" all > "$log" 2>&1; then
    tail -40 "$log" >&2
    echo "kernel: build failed (full log: $log)" >&2
    exit 1
fi
touch "$out/.emp-done"
echo "kernel: built in $(( $(date +%s) - start ))s" >&2
echo "$out"
