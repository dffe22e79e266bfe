#!/usr/bin/env bash
# The kernel under fire: boots one TCG guest (scripts/vm/run.sh) and runs
# tap-kfuzz, the unprivileged ioctl/mmap fuzzer of /dev/emp-nic, as the
# ordinary user empuser (group emp, no CAP_IPC_LOCK, RLIMIT_MEMLOCK
# 64 MiB). Then, as root in the guest:
#   - every counter in /sys/kernel/debug/emp-nic/ (open ports, pinned
#     pages, MR regions, group slots, armed ports, eventfds) must read 0;
#   - kmemleak is scanned twice (after its minimum object age) and must
#     report nothing;
#   - tap-driver, the driver's normal test program, must still pass;
# and run.sh fails the run on any kernel splat in the console (WARNING,
# BUG, Oops, lockdep reports, kmemleak reports).
#
#   scripts/vm/kfuzz.sh [--calls N] [--threads T] [--seed S]
# Defaults: 1 000 000 calls (`make kfuzz`), 4 threads, a seed from the
# clock (printed; EMP_KFUZZ_SEED also sets it). The VM suite runs a short
# run (--calls 40000). docs/fuzzing.md describes the fuzzer.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
calls=1000000
threads=4
seed="${EMP_KFUZZ_SEED:-$(( $(date +%s%N) & 0xffffffffffff ))}"
while [ $# -gt 0 ]; do
    case "$1" in
        --calls) calls="$2"; shift 2 ;;
        --threads) threads="$2"; shift 2 ;;
        --seed) seed="$2"; shift 2 ;;
        -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "kfuzz.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
    esac
done
case "$calls$threads" in *[!0-9]*) echo "kfuzz.sh: --calls and --threads take numbers" >&2; exit 2 ;; esac
echo "# kfuzz: seed $seed, $calls calls, $threads threads"

# The guest's time budget: boot and checks, plus the calls at a rate TCG
# keeps even on a loaded machine (docs/fuzzing.md has measured rates).
export EMP_VM_TIMEOUT=$(( 240 + calls / 150 ))

guest="as_user '/bin/tap-kfuzz --seed $seed --calls $calls --threads $threads'
for f in /sys/kernel/debug/emp-nic/*; do
    v=\$(/bin/busybox cat \$f)
    if [ \"\$v\" = 0 ]; then echo \"# counter \$f: 0\"; else echo \"not ok - counter \$f is \$v after every fuzzer process exited\"; fi
done
[ -e /sys/kernel/debug/emp-nic/pinned_pages ] || echo 'not ok - no driver counters in /sys/kernel/debug/emp-nic'
if [ -e /sys/kernel/debug/kmemleak ]; then
    /bin/busybox sleep 6
    echo scan > /sys/kernel/debug/kmemleak
    echo scan > /sys/kernel/debug/kmemleak
    if [ -s /sys/kernel/debug/kmemleak ]; then echo 'not ok - kmemleak reports leaks after the fuzzer'; /bin/busybox cat /sys/kernel/debug/kmemleak; else echo '# kmemleak: no leak after two scans'; fi
else
    echo 'not ok - no kmemleak in this kernel'
fi
echo '# the NIC after the fuzzer: tap-driver'
/bin/tap-driver"
exec scripts/vm/run.sh "$guest"
