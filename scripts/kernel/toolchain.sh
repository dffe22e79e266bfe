#!/usr/bin/env bash
# Installs the kernel toolchain, idempotently, without pulling newer suites
# into the system (docs/kernel.md, apt: do not mix suites):
#   rustc-web + rust-web-src, clang/lld/llvm-22 (bookworm-security),
#   QEMU 10 (bookworm-backports), busybox-static, kernel build tools,
#   bindgen-cli (cargo, private root), linux-source-7.3 (trixie-backports,
#   downloaded and unpacked into the cache, never installed).
# Everything lands in $EMP_CACHE (default ~/.cache/emp), outside the repo.
set -euo pipefail
cache="${EMP_CACHE:-$HOME/.cache/emp}"
mkdir -p "$cache"
exec 9>"$cache/toolchain.lock"
flock 9

say() { printf 'kernel-toolchain: %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# --- apt suites, at low priority, on the mirrors the machine already uses ---
src=/etc/apt/sources.list.d/emp-extra.sources
if [ ! -f "$src" ]; then
    main_uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [ -n "$main_uri" ] || main_uri=$(awk '$1=="deb" && $3 ~ /^bookworm$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
    [ -n "$main_uri" ] || { say "cannot find the Debian mirror in /etc/apt"; exit 1; }
    say "adding bookworm-backports, trixie, trixie-backports from $main_uri (low priority)"
    as_root tee "$src" >/dev/null <<SRC
Types: deb
URIs: $main_uri
Suites: bookworm-backports trixie trixie-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    as_root tee /etc/apt/preferences.d/emp-pin >/dev/null <<'PIN'
Package: *
Pin: release n=bookworm
Pin-Priority: 900

Package: *
Pin: release n=bookworm-security
Pin-Priority: 900

Package: *
Pin: release n=bookworm-updates
Pin-Priority: 900

Package: *
Pin: release n=bookworm-backports
Pin-Priority: 100

Package: *
Pin: release n=trixie
Pin-Priority: 50

Package: *
Pin: release n=trixie-backports
Pin-Priority: 50
PIN
    rm -f "$cache/apt-updated"
fi
if [ ! -f "$cache/apt-updated" ] || [ -n "$(find "$cache/apt-updated" -mmin +1440 2>/dev/null)" ]; then
    say "apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
    touch "$cache/apt-updated"
fi

need=()
for p in rustc-web rust-web-src clang-22 libclang-22-dev lld-22 llvm-22 flex bison bc cpio file libelf-dev busybox-static kmod; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if ((${#need[@]})); then
    say "installing ${need[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
fi
if ! dpkg -s qemu-system-x86 >/dev/null 2>&1; then
    say "installing qemu-system-x86 from bookworm-backports"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -t bookworm-backports qemu-system-x86 || \
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends qemu-system-x86
fi

# --- bindgen (the kernel wants >= 0.72.1 with libclang 22) ---
if [ ! -x "$cache/bindgen/bin/bindgen" ]; then
    say "cargo install bindgen-cli (about a minute)"
    cargo install --locked --root "$cache/bindgen" bindgen-cli --version 0.73.2 >&2
fi

# --- kernel source ---
ksrc="$cache/linux-source-7.3"
if [ ! -f "$ksrc/Makefile" ]; then
    say "fetching linux-source-7.3 (about 170 MB)"
    tmp=$(mktemp -d "$cache/ksrc.XXXXXX")
    (cd "$tmp" && apt-get download -q -t trixie-backports linux-source-7.3 >&2)
    dpkg-deb -x "$tmp"/linux-source-7.3_*.deb "$tmp/x"
    tarball=$(ls "$tmp"/x/usr/src/linux-source-7.3*.tar.* | head -1)
    mkdir -p "$tmp/src"
    tar -xf "$tarball" -C "$tmp/src"
    rm -rf "$ksrc"
    mv "$tmp/src/"linux-source-7.3* "$ksrc"
    rm -rf "$tmp"
fi
say "ok: $(/usr/bin/rustc --version), $(clang-22 --version | head -1), bindgen $("$cache/bindgen/bin/bindgen" --version | awk '{print $2}'), source $ksrc"
