#!/usr/bin/env bash
# Boots QEMU guests (TCG) on our kernel with emp.ko, the firmware image and
# the test programs in an initramfs; the host runs emp-nicd with the NICs'
# SRAM in files that QEMU maps as ivshmem BAR2. Collects each guest's
# console, fails on any test failure, timeout, kernel warning, lockdep
# splat, kmemleak report or oops.
#
#   scripts/vm/run.sh [--vms N] [--plain] [--firmware IMAGE] [--expect-probe-failure REASON] [guest command…]
# The NIC is an ivshmem-doorbell function served by emp-nicd (MSI-X for
# completion events); --plain maps its SRAM as ivshmem-plain instead (no
# interrupts: libemp polls). --two-nics gives one guest two NICs
# (/dev/emp-nic and /dev/emp-nic1, both DMAing into its RAM) and runs
# tap-p2p between them, one rank per NIC. --gang gives one guest four NICs
# of one port slot each (/dev/emp-nic … /dev/emp-nic3) and runs `emp gang
# --devices …` there: two jobs of tap-p2p × 4 ranks, a rank per NIC, more
# ports than the NICs have slots, switched through emp.ko (EMP_GANG_JOBS,
# EMP_GANG_SLICE_MS override). --bench SIZES runs `emp bench latency`
# between two guests instead: EMP through emp.ko against TCP over a
# virtio-net link joining the two guests, in one run (ranks block on
# their port events: --blocking; EMP_BENCH_FLAGS overrides).
# One VM runs the driver tests (tap-driver); N >= 2 VMs run the
# point-to-point suite (tap-p2p) between them, one rank per VM, over one
# emp-nicd with N NICs on its in-memory switch, as an ordinary user
# (`as_user`). The guest applies driver/udev/60-emp.rules itself (there is
# no udevd) and has two users: empuser (in group emp) and outsider. A guest command replaces
# the default; it sees $rank and $size (e.g. the collectives suite:
#   run.sh --vms 2 'EMP_DEVICE=/dev/emp-nic EMP_RANK=$rank EMP_SIZE=$size /bin/tap-coll').
# EMP_VM_TIMEOUT bounds each guest's run in seconds (default 300; the
# long fuzzer run, scripts/vm/kfuzz.sh, sets more).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
firmware=firmware-blobs/emp-fw.bin
expect_fail=""
vms=1
plain=0
two_nics=0
gang=0
bench=""
while [ $# -gt 0 ]; do
    case "$1" in
        --vms) vms="$2"; shift 2 ;;
        --firmware) firmware="$2"; shift 2 ;;
        --plain) plain=1; shift ;;
        --two-nics) two_nics=1; shift ;;
        --gang) gang=1; shift ;;
        --bench) bench="$2"; shift 2 ;;
        --expect-probe-failure) expect_fail="$2"; shift 2 ;;
        *) break ;;
    esac
done
guest_cmd="${*:-}"
firmware=$(realpath "$firmware")
# The guest's RAM (the gang test runs eight ranks, each pinning its arena).
mem_mb=256
smp=1
# NICs one guest has (its NIC i is /dev/emp-nic, then /dev/emp-nicI).
guest_nics=$((1 + two_nics))
nicd_ports=()
if [ "$gang" = 1 ]; then
    vms=1
    guest_nics=4
    mem_mb=1024
    smp=2
    nicd_ports=(--ports 1)
    # Ranks run as root here: the scheduler needs CAP_SYS_ADMIN for
    # EMP_IOC_GANG and signals its own children.
    jobs=""
    # EMP_GANG_PROGRAM: tap-p2p (10 cases) or tap-coll (12: its groups
    # travel with the saved contexts through EMP_IOC_GANG).
    gang_program="${EMP_GANG_PROGRAM:-tap-p2p}"
    for _ in $(seq "${EMP_GANG_JOBS:-2}"); do jobs="$jobs --job '4 /bin/$gang_program'"; done
    guest_cmd="export EMP_TAP_BIG_MB=4 EMP_ARENA_MB=16; EMP_GANG_TRACE=1 /bin/emp gang --devices /dev/emp-nic,/dev/emp-nic1,/dev/emp-nic2,/dev/emp-nic3 --dir /tmp/gang --slice-ms ${EMP_GANG_SLICE_MS:-20} --timeout 600 $jobs && echo 'EMP-VM: gang ok'"
elif [ "$two_nics" = 1 ]; then
    vms=1
    guest_cmd='ls /dev/emp-nic /dev/emp-nic1 && { as_user "EMP_DEVICE=/dev/emp-nic1 EMP_RANK=1 EMP_SIZE=2 EMP_TAP_BIG_MB=8 EMP_ARENA_MB=24 /bin/tap-p2p" & as_user "EMP_DEVICE=/dev/emp-nic EMP_RANK=0 EMP_SIZE=2 EMP_TAP_BIG_MB=8 EMP_ARENA_MB=24 /bin/tap-p2p"; wait; }'
elif [ -n "$bench" ]; then
    vms=2
    guest_cmd="/bin/busybox ip link set eth0 up && /bin/busybox ip addr add 198.18.9.\$((rank + 1))/24 dev eth0 && \\
EMP_DEVICE=/dev/emp-nic EMP_RANK=\$rank EMP_SIZE=2 EMP_ARENA_MB=24 EMP_BENCH_TCP=198.18.9.1:7000 /bin/emp bench-rank latency --sizes=$bench ${EMP_BENCH_FLAGS:---blocking} && echo 'EMP-VM: bench ok'"
elif [ -z "$guest_cmd" ] && [ -z "$expect_fail" ]; then
    if [ "$vms" -gt 1 ]; then
        guest_cmd='as_user "EMP_DEVICE=/dev/emp-nic EMP_RANK=$rank EMP_SIZE=$size EMP_TAP_BIG_MB=8 EMP_ARENA_MB=24 /bin/tap-p2p"'
    else
        guest_cmd=/bin/tap-driver
    fi
fi

kbuild=$(scripts/kernel/build.sh)
make -s driver KDIR="$kbuild" >&2
# Guest test programs: static binaries (the guest has no libc).
static=target/static/x86_64-unknown-linux-gnu/release
CARGO_TARGET_DIR=target/static RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build -q --release -p emp-tests -p emp-tools --bins --target x86_64-unknown-linux-gnu >&2
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
rank=0; size=1
for w in \$(/bin/busybox cat /proc/cmdline); do
    case "\$w" in emp.rank=*) rank=\${w#emp.rank=} ;; emp.size=*) size=\${w#emp.size=} ;; esac
done
/bin/busybox insmod /emp.ko
echo "EMP-VM: insmod rc=\$?"
# No udevd here: apply what the repository's udev rule says (its GROUP and
# MODE) to the port devices, as udev would.
rule=/lib/udev/rules.d/60-emp.rules
dev_group=\$(/bin/busybox sed -n 's/.*KERNEL=="emp-nic[*]".*GROUP="\([^"]*\)".*/\1/p' \$rule)
dev_mode=\$(/bin/busybox sed -n 's/.*KERNEL=="emp-nic[*]".*MODE="\([0-7]*\)".*/\1/p' \$rule)
for d in /dev/emp-nic*; do
    [ -e "\$d" ] && /bin/busybox chgrp "\$dev_group" "\$d" && /bin/busybox chmod "\$dev_mode" "\$d"
done
# Ordinary users: empuser is in the device's group, outsider is not. What
# they may pin is RLIMIT_MEMLOCK's to say (root has CAP_IPC_LOCK, they do
# not): 64 MiB covers tap-p2p's arena and buffers.
as_user() { ( ulimit -l 65536 && /bin/busybox su -p -s /bin/sh empuser -c "echo \"# as \\\$(/bin/busybox id), RLIMIT_MEMLOCK \\\$(ulimit -l) KiB\"; \$*" ); }
as_outsider() { /bin/busybox su -p -s /bin/sh outsider -c "\$*"; }
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
cat > "$work/passwd" <<'PASSWD'
root:x:0:0:root:/:/bin/sh
empuser:x:1000:1000:EMP user (group emp):/tmp:/bin/sh
outsider:x:1001:1001:not in group emp:/tmp:/bin/sh
PASSWD
cat > "$work/group" <<'GROUP'
root:x:0:
emp:x:900:empuser
empuser:x:1000:
outsider:x:1001:
GROUP
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
dir /etc 755 0 0
file /etc/passwd $work/passwd 644 0 0
file /etc/group $work/group 644 0 0
dir /lib/udev 755 0 0
dir /lib/udev/rules.d 755 0 0
file /lib/udev/rules.d/60-emp.rules $root/driver/udev/60-emp.rules 644 0 0
file /bin/tap-user $root/$static/tap-user 755 0 0
file /bin/busybox /bin/busybox 755 0 0
slink /bin/sh busybox 777 0 0
file /init $work/init 755 0 0
file /emp.ko $root/driver/emp.ko 644 0 0
file /lib/firmware/emp/emp-fw.bin $firmware 644 0 0
file /bin/tap-driver $root/$static/tap-driver 755 0 0
file /bin/tap-p2p $root/$static/tap-p2p 755 0 0
file /bin/tap-coll $root/$static/tap-coll 755 0 0
file /bin/tap-kfuzz $root/$static/tap-kfuzz 755 0 0
file /bin/emp $root/$static/emp 755 0 0
LIST
"$kbuild/usr/gen_init_cpio" "$work/cpio.list" | gzip -1 > "$work/initramfs.gz"

# --- the NICs: one emp-nicd, one NIC per guest, on its in-memory switch ---
nics=$((vms + guest_nics - 1))
# A guest's further NICs DMA into the same guest's RAM.
for n in $(seq 1 $((guest_nics - 1))); do ln -s ram0 "$shm/ram$n"; done
target/release/emp-nicd --nics "$nics" "${nicd_ports[@]}" --vm-sram-dir "$shm" --socket-dir "$work" --trusted firmware-blobs \
    > "$work/nicd.log" 2>&1 &
nicd_pid=$!
for _ in $(seq 100); do [ -S "$work/ivshmem$((nics - 1)).sock" ] && break; sleep 0.05; done
sram_size=$(stat -c %s "$shm/sram0")

# --- the guests (TCG; KVM only where it really works, see docs/kernel.md) ---
accel="tcg,thread=multi"
cpu=max
if grep -qE 'vmx|svm' /proc/cpuinfo && ! lsmod 2>/dev/null | grep -q kvm_pvm && [ -w /dev/kvm ]; then
    accel=kvm; cpu=host
fi
pids=()
net_base=$((20000 + $$ % 20000))
for i in $(seq 0 $((vms - 1))); do
    if [ "$plain" = 1 ]; then
        # No interrupts: the NIC's SRAM file mapped directly (ports poll).
        nic_dev=(-object memory-backend-file,id=sram0,size="$sram_size",mem-path="$shm/sram$i",share=on
                 -device ivshmem-plain,memdev=sram0)
    else
        # emp-nicd's ivshmem server hands QEMU the SRAM and the MSI-X eventfd.
        nic_dev=(-chardev socket,id=nic,path="$work/ivshmem$i.sock" -device ivshmem-doorbell,chardev=nic,vectors=1)
        for n in $(seq 1 $((guest_nics - 1))); do
            nic_dev+=(-chardev socket,id=nic$n,path="$work/ivshmem$n.sock" -device ivshmem-doorbell,chardev=nic$n,vectors=1)
        done
    fi
    net=()
    if [ -n "$bench" ]; then
        # A virtio-net link between the two guests (UDP datagrams on the host).
        net=(-netdev "dgram,id=net0,local.type=inet,local.host=127.0.0.1,local.port=$((net_base + i)),remote.type=inet,remote.host=127.0.0.1,remote.port=$((net_base + 1 - i))"
             -device "virtio-net-pci,netdev=net0,mac=52:54:00:e0:00:0$i")
    fi
    timeout "${EMP_VM_TIMEOUT:-300}" qemu-system-x86_64 -accel "$accel" -cpu "$cpu" -smp "$smp" -m "${mem_mb}M" \
        -object memory-backend-file,id=ram,size="${mem_mb}M",mem-path="$shm/ram$i",share=on \
        -machine q35,memory-backend=ram \
        -kernel "$kbuild/arch/x86/boot/bzImage" -initrd "$work/initramfs.gz" \
        -append "console=ttyS0 panic=-1 oops=panic rdinit=/init emp.rank=$i emp.size=$vms" \
        "${nic_dev[@]}" "${net[@]}" \
        -nographic -no-reboot -serial stdio -monitor none -display none > "$work/console$i.log" 2>&1 &
    pids+=($!)
done
fail=0
for i in $(seq 0 $((vms - 1))); do
    if ! wait "${pids[$i]}"; then echo "vm$i: qemu failed or timed out"; fail=1; fi
done
for i in $(seq 0 $((vms - 1))); do
    c="$work/console$i.log"
    echo "--- guest $i ---"
    cat "$c"
    grep -q "EMP-VM: done" "$c" || { echo "vm$i: the guest did not finish"; fail=1; }
    if grep -qE "WARNING:|BUG:|Oops|possible circular locking|possible recursive locking|unreferenced object|Call Trace" "$c"; then
        echo "vm$i: kernel splat"; fail=1
    fi
    if [ -n "$expect_fail" ]; then
        grep -q "$expect_fail" "$c" || { echo "vm$i: expected the probe to fail with: $expect_fail"; fail=1; }
    else
        grep -q "EMP NIC node $i running" "$c" || { echo "vm$i: the driver did not bring the NIC up"; fail=1; }
        if [ -n "$bench" ]; then
            grep -q "EMP-VM: bench ok" "$c" || { echo "vm$i: the benchmark failed"; fail=1; }
        elif [ "$gang" = 1 ]; then
            grep -q "EMP-VM: gang ok" "$c" || { echo "vm$i: emp gang failed"; fail=1; }
            # Rank 0 of each job prints its suite's summary.
            cases=10; [ "$gang_program" = tap-coll ] && cases=12
            [ "$(grep -c "# $cases passed, 0 failed" "$c")" -eq "${EMP_GANG_JOBS:-2}" ] ||
                { echo "vm$i: not every job's TAP suite passed"; fail=1; }
            switches=$(sed -n 's/^emp gang: [0-9]* jobs, \([0-9]*\) switches.*/\1/p' "$c" | tr -d '\r')
            [ "${switches:-0}" -ge 4 ] || { echo "vm$i: only ${switches:-0} switches: the jobs did not take turns"; fail=1; }
        else
            grep -q "passed, 0 failed" "$c" || [ "$i" -ne 0 ] || { echo "vm$i: no TAP summary"; fail=1; }
        fi
    fi
    grep -q "^not ok" "$c" && { echo "vm$i: a guest test failed"; fail=1; }
done
echo "--- emp-nicd log ---"
cat "$work/nicd.log"
exit $fail
