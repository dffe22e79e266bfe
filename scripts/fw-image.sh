#!/usr/bin/env bash
# Builds the signed firmware image firmware-blobs/emp-fw.bin, idempotently:
#   1. builds emp-firmware and emp-tools (release; cargo skips what is current),
#   2. creates the development signing key firmware-blobs/dev.{key,pub} once,
#   3. packs target/release/libemp_firmware.so with the git build id,
#   4. signs it with firmware-blobs/dev.key and prints `emp fw inspect`.
# Reruns with an unchanged tree produce a byte-identical image (ed25519
# signatures are deterministic). The key and image are git-ignored.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

cargo="${CARGO:-cargo}"
target="${CARGO_TARGET_DIR:-target}"
blobs=firmware-blobs
emp="$target/release/emp"
payload="$target/release/libemp_firmware.so"
image="$blobs/emp-fw.bin"

"$cargo" build --release -p emp-firmware -p emp-tools

for f in "$emp" "$payload"; do
    if [ ! -f "$f" ]; then
        echo "fw-image: $f was not built" >&2
        exit 1
    fi
done

build_id="$(git rev-parse --short HEAD 2>/dev/null || true)"
build_id="${build_id:-unknown}"

mkdir -p "$blobs"
"$emp" fw keygen --out "$blobs" --name dev --if-missing

# Pack to a temporary file and sign into place, so emp-fw.bin is never
# left unsigned or half written.
unsigned="$(mktemp "$blobs/.emp-fw.unsigned.XXXXXX")"
trap 'rm -f "$unsigned"' EXIT
"$emp" fw pack --payload "$payload" --out "$unsigned" --build-id "$build_id"
"$emp" fw sign --key "$blobs/dev.key" "$unsigned" --out "$image"

"$emp" fw inspect "$image" --trusted "$blobs"
