#!/usr/bin/env bash
# The issue's figures in one command: two network namespaces joined by a
# veth pair and a bridge, no loss (scripts/netns/bed.sh), then `emp bench
# latency` and `emp bench bw --config` over the packet wire and over the
# udp wire, each measured beside TCP over the same link in the same run;
# one table with the ratios (EMP/TCP, where lower is better for latency and
# higher for bandwidth). Always removes the bed. A benchmark, not a test:
# `--smoke` runs a few iterations of two sizes only, to check it works.
# `--auth "off mac aead"` runs each wire once per wire authentication mode
# (`[cluster] auth`, a fresh key), same veth, same run: the table adds each
# mode's cost, its figure over the same wire's figure with auth off.
#
#   bench.sh [--name P] [--subnet 198.18.K] [--wires "packet udp"] [--json]
#            [--lat-sizes 8,64,…] [--bw-sizes …,1048576] [--iters N] [--smoke]
#            [--nicd-args "…"] [--delay 100us] [--auth "off mac aead"]
#
# --nicd-args passes extra emp-nicd options to every daemon (e.g. --spin-us);
# --delay is handed to bed.sh (netem, or emp-nicd's link delay without it).
# Needs root and `make build` (target/release, firmware-blobs/emp-fw.bin).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
bin="$root/target/release"

name=empbench
subnet=198.18.202
wires="packet udp"
json=0
lat_sizes=8,64,512,4096,16384,65536
bw_sizes=4096,65536,262144,1048576
iters=""
nicd_args=""
delay=""
auths="off"
while [ $# -gt 0 ]; do
    case "$1" in
    --name) name="$2"; shift 2 ;;
    --subnet) subnet="$2"; shift 2 ;;
    --wires) wires="$2"; shift 2 ;;
    --json) json=1; shift ;;
    --lat-sizes) lat_sizes="$2"; shift 2 ;;
    --bw-sizes) bw_sizes="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --nicd-args) nicd_args="$2"; shift 2 ;;
    --delay) delay="$2"; shift 2 ;;
    --auth) auths="$2"; shift 2 ;;
    --smoke) lat_sizes=8,4096; bw_sizes=65536,1048576; iters=20; shift ;;
    *) sed -n '13,16p' "$0" >&2; exit 2 ;;
    esac
done
for w in $wires; do
    case "$w" in packet | udp) ;; *) echo "bench: --wires: udp or packet, not $w" >&2; exit 2 ;; esac
done
for a in $auths; do
    case "$a" in off | mac | aead) ;; *) echo "bench: --auth: off, mac or aead, not $a" >&2; exit 2 ;; esac
done
# Human-readable lines go to stderr with --json: stdout is the document.
say() { if [ "$json" -eq 1 ]; then echo "$@" >&2; else echo "$@"; fi; }

[ "$(id -u)" -eq 0 ] || { echo "bench: needs root (network namespaces, bridge)" >&2; exit 1; }
for b in emp emp-nicd; do
    [ -x "$bin/$b" ] || { echo "bench: $bin/$b is missing: run make build" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "bench: needs python3 (to join the runs into one table)" >&2; exit 1; }

work=$(mktemp -d "/tmp/emp-bench-$name.XXXXXX")
config=""
teardown() {
    if [ -n "$config" ]; then
        "$bin/emp" cluster down --config "$config" >/dev/null 2>&1 || true
    fi
    scripts/netns/bed.sh down --dir "$work/bed" >/dev/null || echo "bench: bed teardown failed: see above" >&2
    rm -rf "$work"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if ! scripts/netns/bed.sh up --name "$name" --hosts 2 --dir "$work/bed" --subnet "$subnet" \
    ${delay:+--delay "$delay"} >"$work/bed.log" 2>&1; then
    cat "$work/bed.log" >&2
    echo "bench: could not make the bed" >&2
    exit 1
fi
while IFS= read -r l; do say "# $l"; done <"$work/bed.log"

# --nicd-args go into the cluster files (`emp cluster up --nicd-args` refuses
# words with spaces through a launcher, as a remote shell would split them),
# before any nicd_args the bed wrote.
if [ -n "$nicd_args" ]; then
    words=""
    for w in $nicd_args; do
        [[ "$w" =~ ^[A-Za-z0-9_.,:=/+-]+$ ]] || { echo "bench: --nicd-args: unsafe word $w" >&2; exit 2; }
        words+="\"$w\", "
    done
    for f in "$work"/bed/cluster-*.toml; do
        if grep -q '^nicd_args = \[' "$f"; then
            sed -i "s|^nicd_args = \[|nicd_args = [$words|" "$f"
        else
            sed -i "s|^\[cluster\]\$|[cluster]\nnicd_args = [${words%, }]|" "$f"
        fi
    done
fi

extra=()
[ -z "$iters" ] || extra+=(--iters "$iters")
status=0
if [ "$auths" != off ]; then
    "$bin/emp" wire keygen --out "$work/wire.key" >/dev/null || { echo "bench: keygen failed" >&2; exit 1; }
fi
runs=""
for wire in $wires; do
    for auth in $auths; do
        # A run's label: the wire, and its auth mode when one is on.
        label=$wire
        config="$work/bed/cluster-$wire.toml"
        if [ "$auth" != off ]; then
            label="$wire/$auth"
            config="$work/bed/cluster-$wire-$auth.toml"
            sed "s|^\[cluster\]\$|[cluster]\nauth = \"$auth\"\nauth_key = \"$work/wire.key\"|" \
                "$work/bed/cluster-$wire.toml" >"$config"
        fi
        runs+="$label "
        file=${label//\//-}
        if ! "$bin/emp" cluster up --config "$config" >"$work/up.log" 2>&1; then
            cat "$work/up.log" >&2
            echo "bench: cluster up over $label failed" >&2
            status=1
            config=""
            continue
        fi
        for kind in latency bw; do
            sizes=$lat_sizes
            [ "$kind" = latency ] || sizes=$bw_sizes
            if "$bin/emp" bench "$kind" --config "$config" --json --sizes "$sizes" "${extra[@]}" \
                >"$work/$file-$kind.json" 2>"$work/$file-$kind.err"; then
                while IFS= read -r l; do say "# $label $kind: ${l#\# }"; done <"$work/$file-$kind.err"
            else
                cat "$work/$file-$kind.err" >&2
                echo "bench: emp bench $kind over $label failed" >&2
                rm -f "$work/$file-$kind.json"
                status=1
            fi
        done
        "$bin/emp" cluster down --config "$config" >/dev/null 2>&1 || true
        config=""
    done
done

# One table: per benchmark and size, each wire's EMP figure, the TCP figure
# of the same run, and their ratio.
python3 - "$work" "$json" "$runs" <<'EOF' || status=1
import json, os, sys
work, as_json, wires = sys.argv[1], sys.argv[2] == "1", sys.argv[3].split()
doc = {"benchmarks": []}
for kind in ("latency", "bw"):
    runs = {}
    for w in wires:
        p = os.path.join(work, f"{w.replace('/', '-')}-{kind}.json")
        if os.path.exists(p):
            with open(p) as f:
                runs[w] = json.load(f)
    if not runs:
        continue
    unit = next(iter(runs.values()))["unit"]
    sizes = sorted({r["size"] for run in runs.values() for r in run["rows"]})
    rows = []
    for s in sizes:
        row = {"size": s}
        for w, run in runs.items():
            r = next((r for r in run["rows"] if r["size"] == s), None)
            if r is None:
                continue
            tcp = r.get("tcp")
            row[w] = {"emp": r["emp"], "tcp": tcp, "ratio": (r["emp"] / tcp) if tcp else None}
        for w in list(row):
            # An auth mode's cost: its figure over the same wire's without auth.
            off = row.get(w.split("/")[0]) if "/" in w else None
            if off:
                row[w]["vs_off"] = row[w]["emp"] / off["emp"]
        rows.append(row)
    doc["benchmarks"].append({
        "benchmark": kind, "unit": unit,
        "paths": {w: {"emp": run.get("emp_path"), "tcp": run.get("tcp_path")} for w, run in runs.items()},
        "rows": rows,
    })
if as_json:
    print(json.dumps(doc))
    sys.exit(0)
for b in doc["benchmarks"]:
    better = "lower is better" if b["benchmark"] == "latency" else "higher is better"
    print(f"# {b['benchmark']} ({b['unit']}); EMP/TCP ratio: {better}; TCP measured beside each EMP wire in the same run")
    for w, p in b["paths"].items():
        print(f"#   {w}: {p['emp']} | {p['tcp']}")
    head = f"{'size':>8}"
    for w in wires:
        if w in b["paths"]:
            head += f" | {'EMP ' + w:>12} {'TCP':>10} {'ratio':>6}"
            if "/" in w:
                head += f" {'vs off':>6}"
    print(head)
    for r in b["rows"]:
        line = f"{r['size']:>8}"
        for w in wires:
            if w not in b["paths"]:
                continue
            c = r.get(w)
            if c is None:
                line += f" | {'-':>12} {'-':>10} {'-':>6}" + (f" {'-':>6}" if "/" in w else "")
                continue
            tcp = f"{c['tcp']:.2f}" if c["tcp"] is not None else "-"
            ratio = f"{c['ratio']:.2f}" if c["ratio"] is not None else "-"
            line += f" | {c['emp']:>12.2f} {tcp:>10} {ratio:>6}"
            if "/" in w:
                vs = f"{c['vs_off']:.2f}" if c.get("vs_off") is not None else "-"
                line += f" {vs:>6}"
        print(line)
    print()
EOF
exit $status
