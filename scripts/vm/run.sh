#!/usr/bin/env bash
# Boots QEMU guests (TCG) on our kernel with emp.ko, the firmware image and
# the test programs in an initramfs; the host runs emp-nicd with the NICs'
# SRAM in files that QEMU maps as ivshmem BAR2. Collects each guest's
# console, fails on any test failure, timeout, kernel warning, lockdep
# splat, kmemleak report or oops.
#
#   scripts/vm/run.sh [--firmware IMAGE] [--expect-probe-failure REASON] [guest command…]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
firmware=firmware-blobs/emp-fw.bin
expect_fail=""
while [ $# -gt 0 ]; do
    case "$1" in
        --firmware) firmware="$2"; shift 2 ;;
        --expect-probe-failure) expect_fail="$2"; shift 2 ;;
        *) break ;;
    esac
done
guest_cmd="${*:-}"
[ -n "$guest_cmd" ] || [ -n "$expect_fail" ] || guest_cmd=/bin/tap-driver

kbuild=$(scripts/kernel/build.sh)
make -s driver KDIR="$kbuild" >&2
# Guest test programs: static binaries (the guest has no libc).
static=target/static/x86_64-unknown-linux-gnu/release
CARGO_TARGET_DIR=target/static RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build -q --release -p emp-tests --bins --target x86_64-unknown-linux-gnu >&2
cache="${EMP_CACHE:-$HOME/.cache/emp}"
work=$(mktemp -d /tmp/emp-vm.XXXXXX)
shm=/dev/shm/$(basename "$work")
mkdir -p "$shm"
nicd_pid=""
cleanup() {
    [ -n "$nicd_pid" ] && kill "$nicd_pid" 2>/dev/null && wait "$nicd_pid" 2>/dev/null || true
    rm -rf "$work" "$shm"
}
trap cleanup EXIT

# --- initramfs ---
cat > "$work/init" <<INIT
#!/bin/sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox mount -t devtmpfs dev /dev
/bin/busybox mkdir -p /sys/kernel/debug && /bin/busybox mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
echo "EMP-VM: booted"
/bin/busybox insmod /emp.ko
echo "EMP-VM: insmod rc=\$?"
$guest_cmd
if [ -e /sys/kernel/debug/kmemleak ]; then
    echo scan > /sys/kernel/debug/kmemleak
    /bin/busybox cat /sys/kernel/debug/kmemleak
fi
/bin/busybox rmmod emp
echo "EMP-VM: rmmod rc=\$?"
echo "EMP-VM: done"
/bin/busybox poweroff -f
INIT
cat > "$work/cpio.list" <<LIST
dir /dev 755 0 0
nod /dev/console 600 0 0 c 5 1
dir /proc 755 0 0
dir /sys 755 0 0
dir /bin 755 0 0
dir /lib 755 0 0
dir /lib/firmware 755 0 0
dir /lib/firmware/emp 755 0 0
dir /tmp 1777 0 0
file /bin/busybox /bin/busybox 755 0 0
slink /bin/sh busybox 777 0 0
file /init $work/init 755 0 0
file /emp.ko $root/driver/emp.ko 644 0 0
file /lib/firmware/emp/emp-fw.bin $root/$firmware 644 0 0
file /bin/tap-driver $root/$static/tap-driver 755 0 0
file /bin/tap-p2p $root/$static/tap-p2p 755 0 0
LIST
"$kbuild/usr/gen_init_cpio" "$work/cpio.list" | gzip -1 > "$work/initramfs.gz"

# --- the NIC ---
target/release/emp-nicd --nics 1 --vm-sram-dir "$shm" --socket-dir "$work" --trusted firmware-blobs \
    > "$work/nicd.log" 2>&1 &
nicd_pid=$!
for _ in $(seq 100); do [ -f "$shm/sram0" ] && break; sleep 0.05; done
size=$(stat -c %s "$shm/sram0")

# --- the guest ---
accel="tcg,thread=multi"
cpu=max
if grep -qE 'vmx|svm' /proc/cpuinfo && ! lsmod 2>/dev/null | grep -q kvm_pvm && [ -w /dev/kvm ]; then
    accel=kvm; cpu=host
fi
set +e
timeout 300 qemu-system-x86_64 -accel "$accel" -cpu "$cpu" -smp 1 -m 256M -machine q35 \
    -kernel "$kbuild/arch/x86/boot/bzImage" -initrd "$work/initramfs.gz" \
    -append "console=ttyS0 panic=-1 oops=panic rdinit=/init" \
    -object memory-backend-file,id=sram0,size="$size",mem-path="$shm/sram0",share=on \
    -device ivshmem-plain,memdev=sram0 \
    -nographic -no-reboot -serial stdio -monitor none -display none > "$work/console.log" 2>&1
rc=$?
set -e
cat "$work/console.log"
echo "--- emp-nicd log ---"
cat "$work/nicd.log"
fail=0
[ $rc -eq 0 ] || { echo "vm: qemu exited with $rc"; fail=1; }
grep -q "EMP-VM: done" "$work/console.log" || { echo "vm: the guest did not finish"; fail=1; }
if grep -qE "WARNING:|BUG:|Oops|possible circular locking|possible recursive locking|unreferenced object|Call Trace" "$work/console.log"; then
    echo "vm: kernel splat"; fail=1
fi
if [ -n "$expect_fail" ]; then
    grep -q "$expect_fail" "$work/console.log" || { echo "vm: expected the probe to fail with: $expect_fail"; fail=1; }
else
    grep -q "EMP NIC node 0 running" "$work/console.log" || { echo "vm: the driver did not bring the NIC up"; fail=1; }
fi
grep -q "not ok" "$work/console.log" && { echo "vm: a guest test failed"; fail=1; }
exit $fail
