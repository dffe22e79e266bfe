#!/usr/bin/env bash
# The namespace test bed: N network namespaces joined by veth pairs to a
# bridge, with loss, delay and reordering on every link, and the cluster
# files that run EMP across them. docs/cluster.md ("The namespace test bed")
# is the user's guide.
#
#   bed.sh up --name P --hosts N --dir D [--loss 1%] [--delay 100us]
#             [--reorder PCT] [--subnet 198.18.K] [--mtu 9000]
#             [--impair auto|netem|nft]
#   bed.sh down --dir D
#   bed.sh show --dir D
#
# Made by `up` (and nothing else; every object is written to D/bed.record
# before it is created, so `down` removes what exists even after an `up`
# that was interrupted half-way):
#   namespaces P-0 … P-(N-1), each with lo up and the veth end P-n<i>
#     (MAC 02:00:c6:12:K:i, address 198.18.K.(i+1)/24);
#   the bridge P-br in the root namespace (address 198.18.K.254/24: mpirun's
#     daemons in the namespaces connect back to it), whose ports are the
#     other veth ends P-h<i>; every veth and the bridge at MTU --mtu;
#   impairment on every link, per direction: a frame from namespace i to
#     namespace j passes the egress of P-n<i> and the egress of P-h<j>, so
#     it meets the given loss and delay twice (once per hop);
#       netem:  `tc netem` on both ends of each veth;
#       nft:    when the kernel has no sch_netem, loss only, by an nftables
#               bridge table P_bed that drops the given fraction of the
#               frames entering and leaving each bridge port; the delay is
#               then applied by emp-nicd itself (`--link-delay-us`, twice
#               --delay: the one-way delay netem would give, in the cluster
#               files' nicd_args), to EMP's frames only; reordering is not
#               applied (said loudly and recorded);
#   in D: cluster-udp.toml and cluster-packet.toml (one host per namespace,
#     one node each), hosts (lines "<ipv4> <namespace>"), bed.record, and a
#     state directory D/P-i per namespace.
# Needs root, iproute2 (ip, tc) and, without sch_netem, nftables.
set -euo pipefail

die() {
    echo "bed: $*" >&2
    exit 1
}
usage() {
    sed -n '7,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# --- down -------------------------------------------------------------------

# Removes everything the record names, newest first; tolerates what is
# already gone and says what it could not remove.
bed_down() {
    local dir="$1" record="$1/bed.record" bad=0
    [ -f "$record" ] || {
        echo "bed: no bed recorded in $dir (nothing to remove)"
        return 0
    }
    local kind what
    while read -r kind what; do
        case "$kind" in
        nft)
            if nft list table bridge "$what" >/dev/null 2>&1; then
                nft delete table bridge "$what" || { echo "bed: could not delete nft table $what" >&2; bad=1; }
            fi
            ;;
        netns)
            if [ -e "/run/netns/$what" ]; then
                # Anything still running in it (a daemon left by a failed
                # suite) keeps the namespace alive: stop it first.
                local pids
                pids=$(ip netns pids "$what" 2>/dev/null || true)
                if [ -n "$pids" ]; then
                    echo "bed: stopping processes left in $what: $pids" >&2
                    # shellcheck disable=SC2086
                    kill -TERM $pids 2>/dev/null || true
                    sleep 0.5
                    pids=$(ip netns pids "$what" 2>/dev/null || true)
                    # shellcheck disable=SC2086
                    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
                fi
                ip netns del "$what" || { echo "bed: could not delete namespace $what" >&2; bad=1; }
            fi
            ;;
        link)
            if ip link show "$what" >/dev/null 2>&1; then
                ip link del "$what" || { echo "bed: could not delete link $what" >&2; bad=1; }
            fi
            ;;
        file) rm -f "$what" ;;
        dir) rm -rf "$what" ;;
        topdir | name | param | impair) ;;
        *) echo "bed: unknown record line: $kind $what" >&2 ;;
        esac
    done < <(tac "$record")
    if [ "$bad" -ne 0 ]; then
        echo "bed: some objects of $dir remain; $record kept" >&2
        return 1
    fi
    local made_top=0
    ! grep -q '^topdir ' "$record" || made_top=1
    rm -f "$record"
    # D itself, if up created it (and nothing else was put there).
    [ "$made_top" -eq 0 ] || rmdir "$dir" 2>/dev/null || true
    echo "bed: removed the bed in $dir"
}

# --- up ---------------------------------------------------------------------

has_netem() {
    # A throw-away namespace: adding a netem qdisc there is the only test
    # that tells (it may be built in, a module, or absent).
    local probe="ebprobe-$$" ok=1
    ip netns add "$probe" 2>/dev/null || return 1
    if tc -n "$probe" qdisc add dev lo root netem delay 1us 2>/dev/null; then ok=0; fi
    ip netns del "$probe" 2>/dev/null || true
    return $ok
}

# "100us" / "1.5ms" / "1s" → whole microseconds.
delay_us() {
    [[ "$1" =~ ^([0-9]+(\.[0-9]+)?)(us|ms|s)$ ]] || die "--delay wants e.g. 100us or 2ms: $1"
    awk -v v="${BASH_REMATCH[1]}" -v u="${BASH_REMATCH[3]}" \
        'BEGIN { m = (u == "us") ? 1 : (u == "ms") ? 1000 : 1000000; printf "%d\n", v * m + 0.5 }'
}

# "1%" / "0.5" (percent) → parts per million, for nft's numgen.
percent_ppm() {
    local p="${1%\%}"
    [[ "$p" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "bad percentage: $1"
    awk -v p="$p" 'BEGIN { if (p > 100) exit 1; printf "%d\n", p * 10000 + 0.5 }' || die "percentage over 100: $1"
}

bed_up() {
    local name="" hosts="" dir="" loss="" delay="" reorder="" subnet="198.18.0" mtu=9000 impair=auto
    while [ $# -gt 0 ]; do
        case "$1" in
        --name) name="$2"; shift 2 ;;
        --hosts) hosts="$2"; shift 2 ;;
        --dir) dir="$2"; shift 2 ;;
        --loss) loss="$2"; shift 2 ;;
        --delay) delay="$2"; shift 2 ;;
        --reorder) reorder="$2"; shift 2 ;;
        --subnet) subnet="$2"; shift 2 ;;
        --mtu) mtu="$2"; shift 2 ;;
        --impair) impair="$2"; shift 2 ;;
        *) usage ;;
        esac
    done
    [ -n "$name" ] && [ -n "$hosts" ] && [ -n "$dir" ] || usage
    # Interface names are at most 15 bytes: P-h<i> with i < 1000.
    [[ "$name" =~ ^[a-z][a-z0-9]{0,9}$ ]] || die "--name must be 1-10 lower-case letters/digits starting with a letter: $name"
    [[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 253 ] || die "--hosts must be 1..253: $hosts"
    [[ "$subnet" =~ ^198\.(18|19)\.([0-9]{1,3})$ ]] && [ "${BASH_REMATCH[2]}" -le 255 ] ||
        die "--subnet must be 198.18.K or 198.19.K (the benchmarking range, never routed out): $subnet"
    local k="${BASH_REMATCH[2]}" oct2="${BASH_REMATCH[1]}"
    [[ "$mtu" =~ ^[0-9]+$ ]] && [ "$mtu" -ge 1280 ] && [ "$mtu" -le 65535 ] || die "--mtu must be 1280..65535: $mtu"
    [ -z "$delay" ] || [[ "$delay" =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] || die "--delay wants e.g. 100us or 2ms: $delay"
    [ -z "$loss" ] || percent_ppm "$loss" >/dev/null
    [ -z "$reorder" ] || percent_ppm "$reorder" >/dev/null
    case "$impair" in auto | netem | nft) ;; *) die "--impair must be auto, netem or nft: $impair" ;; esac
    [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, bridge, tc)"
    command -v ip >/dev/null && command -v tc >/dev/null || die "needs ip and tc (iproute2: scripts/setup.sh installs it)"

    # Which impairment: netem when the kernel has it, else nftables (loss)
    # and emp-nicd's own transmit delay (delay).
    local use=none link_delay_us=0
    if [ -n "$loss$delay$reorder" ]; then
        if [ "$impair" != nft ] && has_netem; then
            use=netem
        elif [ "$impair" = netem ]; then
            die "this kernel has no sch_netem (tc: \"Specified qdisc kind is unknown\"; CONFIG_NET_SCH_NETEM is off and no module loads); use --impair auto or nft"
        else
            [ -z "$delay" ] || link_delay_us=$(delay_us "$delay")
            link_delay_us=$((2 * link_delay_us))
            [ "$link_delay_us" -le 1000000 ] || die "--delay $delay: without sch_netem emp-nicd delays at most 1 s one way (--delay ≤ 500ms)"
            [ "$impair" = nft ] || echo "bed: NOTE: this kernel has no sch_netem (tc netem is unavailable):${loss:+ loss $loss is applied with nftables;}" \
                "${delay:+delay $delay per hop is applied by emp-nicd on transmit (--link-delay-us $link_delay_us in the nicd_args of the cluster files: EMP frames only, not TCP); }reordering${reorder:+ $reorder} is NOT applied" >&2
            [ -z "$loss" ] || command -v nft >/dev/null || die "no sch_netem and no nft (apt-get install nftables): cannot apply loss"
            [ -z "$loss" ] || use=nft
        fi
    fi

    local record="$dir/bed.record"
    if [ -f "$record" ]; then
        echo "bed: a bed is recorded in $dir: removing it first"
        bed_down "$dir"
    fi
    local i
    for ((i = 0; i < hosts; i++)); do
        [ ! -e "/run/netns/$name-$i" ] || die "namespace $name-$i exists but is not recorded in $dir; remove it (ip netns del $name-$i) or pick another --name"
        ! ip link show "$name-h$i" >/dev/null 2>&1 || die "link $name-h$i exists but is not recorded in $dir"
    done
    ! ip link show "$name-br" >/dev/null 2>&1 || die "bridge $name-br exists but is not recorded in $dir"
    if ip -4 addr show | grep -q " $subnet\."; then
        die "the root namespace already has an address in $subnet.0/24: pick another --subnet"
    fi

    local made_top=0
    [ -d "$dir" ] || made_top=1
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    record="$dir/bed.record"
    : >"$record"
    [ "$made_top" -eq 0 ] || echo "topdir $dir" >>"$record"
    echo "name $name" >>"$record"
    echo "param hosts=$hosts subnet=$subnet mtu=$mtu loss=${loss:-0} delay=${delay:-0} reorder=${reorder:-0} link_delay_us=$link_delay_us" >>"$record"
    # From here on, a failure or an interrupt removes what was made.
    local done_up=0
    trap 'rc=$?; if [ "$done_up" -eq 0 ]; then echo "bed: up did not finish; removing what it made" >&2; bed_down "$dir" >&2 || true; fi; exit $rc' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM

    echo "link $name-br" >>"$record"
    ip link add "$name-br" mtu "$mtu" type bridge
    # No spanning tree, no learning delay: frames flow as soon as ports are up.
    ip link set "$name-br" type bridge stp_state 0 forward_delay 0
    ip addr add "$subnet.254/24" dev "$name-br"
    ip link set "$name-br" up

    local netem_args=()
    [ -z "$delay" ] || netem_args+=(delay "$delay")
    [ -z "$loss" ] || netem_args+=(loss "${loss%\%}%")
    # netem reorders only delayed frames: PCT% go at once, the rest wait.
    [ -z "$reorder" ] || netem_args+=(reorder "${reorder%\%}%")
    if [ -n "$reorder" ] && [ -z "$delay" ] && [ "$use" = netem ]; then
        die "--reorder needs --delay (netem reorders by sending some frames before delayed ones)"
    fi

    local ns nsif hostif mac addr
    for ((i = 0; i < hosts; i++)); do
        ns="$name-$i" nsif="$name-n$i" hostif="$name-h$i"
        mac=$(printf '02:00:c6:%02x:%02x:%02x' "$oct2" "$k" "$i")
        addr="$subnet.$((i + 1))"
        echo "netns $ns" >>"$record"
        ip netns add "$ns"
        echo "link $hostif" >>"$record"
        ip link add "$hostif" mtu "$mtu" type veth peer name "$nsif" mtu "$mtu" netns "$ns"
        ip link set "$hostif" master "$name-br" up
        ip -n "$ns" link set lo up
        ip -n "$ns" link set "$nsif" address "$mac" up
        ip -n "$ns" addr add "$addr/24" dev "$nsif"
        if [ "$use" = netem ]; then
            tc -n "$ns" qdisc add dev "$nsif" root netem "${netem_args[@]}"
            tc qdisc add dev "$hostif" root netem "${netem_args[@]}"
        fi
        echo "dir $dir/$ns" >>"$record"
        mkdir -p "$dir/$ns"
    done

    if [ "$use" = nft ]; then
        local ppm rules=""
        ppm=$(percent_ppm "$loss")
        for ((i = 0; i < hosts; i++)); do
            rules+="    iifname \"$name-h$i\" numgen random mod 1000000 < $ppm counter drop"$'\n'
            rules+="    oifname \"$name-h$i\" numgen random mod 1000000 < $ppm counter drop"$'\n'
        done
        echo "nft ${name}_bed" >>"$record"
        nft -f - <<EOF
table bridge ${name}_bed {
  chain impair {
    type filter hook forward priority 0; policy accept;
$rules  }
}
EOF
    fi
    echo "impair $use" >>"$record"

    write_files "$name" "$hosts" "$dir" "$subnet" "$oct2" "$k" "$mtu" "$link_delay_us"

    done_up=1
    trap - EXIT INT TERM
    local what="no impairment"
    case "$use" in
    netem) what="tc netem ${netem_args[*]} on both ends of every veth" ;;
    nft) what="loss $loss per hop by nftables (no sch_netem: no reordering)" ;;
    esac
    [ "$link_delay_us" -eq 0 ] || what="$what, delay ${link_delay_us} us one way by emp-nicd (no sch_netem)"
    echo "bed: up: $hosts namespaces $name-0..$name-$((hosts - 1)) on bridge $name-br ($subnet.254), mtu $mtu, $what; files in $dir"
}

write_files() {
    local name="$1" hosts="$2" dir="$3" subnet="$4" oct2="$5" k="$6" mtu="$7" link_delay_us="$8" wire i f
    echo "file $dir/hosts" >>"$dir/bed.record"
    : >"$dir/hosts"
    for ((i = 0; i < hosts; i++)); do
        echo "$subnet.$((i + 1)) $name-$i" >>"$dir/hosts"
    done
    for wire in udp packet; do
        f="$dir/cluster-$wire.toml"
        echo "file $f" >>"$dir/bed.record"
        {
            echo "# Written by scripts/netns/bed.sh: $hosts namespaces of bed $name, one NIC each."
            echo "[cluster]"
            echo "wire = \"$wire\""
            # Jumbo frames up to the link's MTU: the packet wire's frame is
            # the Ethernet payload; a udp datagram also carries IPv4 and UDP
            # headers (28 bytes), or IP fragments it.
            if [ "$wire" = packet ]; then
                echo "mtu = $((mtu > 9000 ? 9000 : mtu))"
            else
                echo "mtu = $((mtu - 28 > 9000 ? 9000 : mtu - 28))"
            fi
            # No netem: the daemons delay their own frames.
            [ "$link_delay_us" -eq 0 ] || echo "nicd_args = [\"--link-delay-us\", \"$link_delay_us\"]"
            for ((i = 0; i < hosts; i++)); do
                echo
                echo "[[host]]"
                echo "name = \"$name-$i\""
                echo "launch = [\"ip\", \"netns\", \"exec\", \"$name-$i\"]"
                echo "dir = \"$dir/$name-$i\""
            done
            for ((i = 0; i < hosts; i++)); do
                echo
                echo "[[node]]"
                echo "id = $i"
                echo "host = \"$name-$i\""
                echo "interface = \"$name-n$i\""
                printf 'mac = "02:00:c6:%02x:%02x:%02x"\n' "$oct2" "$k" "$i"
                echo "udp = \"$subnet.$((i + 1)):47000\""
            done
        } >"$f"
    done
}

bed_show() {
    local dir="$1"
    [ -f "$dir/bed.record" ] || die "no bed recorded in $dir"
    cat "$dir/bed.record"
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
up) bed_up "$@" ;;
down | show)
    [ "${1:-}" = --dir ] && [ -n "${2:-}" ] && [ $# -eq 2 ] || usage
    [ "$cmd" = show ] && bed_show "$2"
    if [ "$cmd" = down ]; then
        [ "$(id -u)" -eq 0 ] || die "needs root"
        bed_down "$2"
    fi
    ;;
*) usage ;;
esac
