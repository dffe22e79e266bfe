#!/usr/bin/env bash
# The main job: a 4-NIC chassis (one emp-nicd, in-memory switch) running the
# signed EMP control program; real processes measure ping-pong latency and
# streaming bandwidth, EMP beside TCP loopback in the same run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
emp=target/release/emp
dir="$(mktemp -d /tmp/emp-demo.XXXXXX)"
trap '"$emp" cluster down --dir "$dir" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT

"$emp" cluster up -n 4 --dir "$dir"
"$emp" info --dir "$dir"
echo
"$emp" bench latency --dir "$dir" --sizes 8,64,1024,8192,65536
echo
"$emp" bench bw --dir "$dir" --sizes 4096,65536,1048576
echo
echo "# The point-to-point TAP suite, 4 ranks on 4 NICs:"
"$emp" run -n 4 --dir "$dir" -- target/release/tap-p2p
echo
"$emp" stats --dir "$dir"
