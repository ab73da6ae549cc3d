#!/usr/bin/env bash
# A real RoCE stack as the judge of the wire: Linux soft-RoCE (rdma_rxe) against mrc-emu's
# baseline transport (RoCEv2 RC as deployed), both directions, on a clean and on a lossy link.
#
#   sudo scripts/interop-rxe.sh [--sizes 4096,1048576,67108864] [--loss 1%] [--out DIR] [--no-mrc]
#
# As root, where `modprobe rdma_rxe` works (a stock Debian/Ubuntu kernel, e.g. the Vagrant VM);
# elsewhere it says why in one line and exits 77 (skipped). It loads rdma_rxe, makes a veth pair
# from the initial network namespace (rxe's side: in Linux 6.1 rxe's UDP socket lives in the
# initial namespace, docs/interop.md) to a namespace of its own (mrc-emu's side), adds an rxe
# device on the initial end with an IPv6 address (its RoCE v2 GID), and runs scripts/interop_rxe.py:
# the baseline's requester WRITEs into rxe's MR, rxe's requester WRITEs (and WRITEs WITH
# IMMEDIATE) into the baseline responder's region, at each size; then the same with netem loss on
# both ends of the link. Each run's pcap is decoded by mrc-emu's decoder. mrc-emu's process runs on
# one CPU (a NIC's one send queue; a precaution); the largest clean WRITE to rxe is run twice more
# without that, as a finding. A table at the end; the runs' JSON in --out (default $MRC_EMU_RESULTS or
# results/interop-rxe). Exit 0 only if every
# run completed with the data exact and every captured packet parsed. Then MRC's own requester
# to rxe, clean, lossy and reordered, as a finding that does not change the exit status
# (--no-mrc: not run).
#
# rdma-core, python3-pyverbs, ibverbs-utils and perftest come from apt if missing (scripts/install.sh
# installs them where the kernel ships rdma_rxe). Everything made is recorded when made and undone,
# newest first, on exit, failure or Ctrl-C: the rxe devices, netem, the veth, the namespace, and
# the module if this script loaded it.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MRC_EMU_VENV:-$repo/.venv}"
sizes="4096,1048576,67108864"
loss="1%"
out="${MRC_EMU_RESULTS:-$repo/results/interop-rxe}"
mrc=1
while [ "$#" -gt 0 ]; do
    case "$1" in
        --sizes) sizes="$2"; shift ;;
        --loss) loss="$2"; shift ;;
        --out) out="$2"; shift ;;
        --no-mrc) mrc=0 ;;
        -h|--help) sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "interop-rxe.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
    shift
done
say() { echo "interop-rxe.sh: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
    echo "interop-rxe.sh: skipped: needs root (modprobe rdma_rxe, an rxe device, a namespace)"; exit 77
fi
loaded_before=0
if [ -d /sys/module/rdma_rxe ]; then loaded_before=1; fi
if ! command -v modprobe >/dev/null 2>&1; then
    echo "interop-rxe.sh: skipped: no modprobe (kmod) here, so no rdma_rxe to load (a kernel without modules, e.g. a small VM kernel)"
    exit 77
fi
if ! modprobe_err="$(modprobe rdma_rxe 2>&1)"; then
    echo "interop-rxe.sh: skipped: modprobe rdma_rxe failed, this kernel has no soft-RoCE ($(echo "$modprobe_err" | head -n 1))"
    exit 77
fi

undo=()  # commands that undo what was made, in the order made; run newest first
cleanup() {
    local rc=$? i
    trap - EXIT INT TERM
    for ((i = ${#undo[@]} - 1; i >= 0; i--)); do eval "${undo[$i]}" >/dev/null 2>&1 || say "undo failed: ${undo[$i]}"; done
    exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM
if [ "$loaded_before" -eq 0 ]; then undo+=("modprobe -r rdma_rxe"); fi

# the user side of RDMA, idempotently (install.sh puts it in where the kernel has rdma_rxe)
need=()
command -v rdma >/dev/null 2>&1 || need+=(iproute2)
command -v tcpdump >/dev/null 2>&1 || need+=(tcpdump)
command -v ethtool >/dev/null 2>&1 || need+=(ethtool)
/usr/bin/python3 -c 'import pyverbs' 2>/dev/null || need+=(python3-pyverbs)
dpkg-query -W -f='${Status}' rdma-core 2>/dev/null | grep -q "install ok installed" || need+=(rdma-core ibverbs-providers ibverbs-utils perftest)
if [ "${#need[@]}" -gt 0 ]; then
    say "apt-get install ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if [ ! -x "$venv/bin/python" ]; then
    echo "interop-rxe.sh: no mrc-emu venv at $venv (run scripts/install.sh, or set MRC_EMU_VENV)" >&2; exit 1
fi

# ---- the link: initial namespace (rxe) <-> a namespace of this run (mrc-emu) --------------------------
id=$$
ns="mrc-rxe-$id"; host_if="rxh$id"; ns_if="rxn$id"; dev="mrxe$id"
rxe_addr="fd31:31::1"; mrc_addr="fd31:31::2"
ip netns add "$ns"; undo+=("ip netns del $ns")
ip link add "$host_if" type veth peer name "$ns_if" netns "$ns"; undo+=("ip link del $host_if")
ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
ip link set "$host_if" mtu 9000 up
ip -n "$ns" link set lo up
ip -n "$ns" link set "$ns_if" mtu 9000 up
ip addr add "$rxe_addr/64" dev "$host_if" nodad
ip -n "$ns" addr add "$mrc_addr/64" dev "$ns_if" nodad
# whole checksums in what tcpdump sees (veth hands AF_PACKET partial ones otherwise)
ethtool -K "$host_if" tx off >/dev/null; ip netns exec "$ns" ethtool -K "$ns_if" tx off >/dev/null
rdma link add "$dev" type rxe netdev "$host_if"; undo+=("rdma link delete $dev")
say "rxe device $dev on $host_if ($rxe_addr, initial namespace); mrc-emu at $mrc_addr in namespace $ns"
rdma link show "$dev/1" >&2
kernel="$(uname -r)"

# ---- where rxe's UDP socket lives (the issue's note on Linux 6.1) ---------------------------------------
udp_4791() { ss -Hlun 'sport = :4791' | wc -l; }
in_init="$(udp_4791)"; in_ns="$(ip netns exec "$ns" bash -c "$(declare -f udp_4791); udp_4791")"
ns_dev="mrxn$id"; ns_dev_made="no ($(ip netns exec "$ns" rdma link add "$ns_dev" type rxe netdev "$ns_if" 2>&1 | head -n 1))"
if rdma link show "$ns_dev/1" >/dev/null 2>&1; then
    undo+=("rdma link delete $ns_dev 2>/dev/null || true")
    ns_dev_made="yes"
    in_ns_after="$(ip netns exec "$ns" bash -c "$(declare -f udp_4791); udp_4791")"
    rdma link delete "$ns_dev"
else
    in_ns_after="-"
fi
say "namespace check (kernel $kernel): UDP sockets on port 4791: initial namespace $in_init, rxe's namespace-side" \
    "veth's namespace $in_ns; an rxe device added from inside that namespace on its veth: made $ns_dev_made," \
    "UDP sockets on 4791 there then: $in_ns_after"

mkdir -p "$out"
pcaps="$(mktemp -d)"; undo+=("rm -rf $pcaps")
results="$out/interop-rxe.jsonl"
: >"$results"
echo "{\"kernel\": \"$kernel\", \"udp_4791_initial_ns\": $in_init, \"udp_4791_other_ns\": $in_ns, \"rxe_made_in_other_ns\": \"$ns_dev_made\", \"udp_4791_other_ns_after\": \"$in_ns_after\"}" >"$out/namespace.json"

run() {  # LABEL [ARGS...]: both directions, every size (or what ARGS say)
    local label="$1"; shift
    "$venv/bin/python" "$repo/scripts/interop_rxe.py" --ns "$ns" --local "$mrc_addr" --rxe-address "$rxe_addr" \
        --iface "$host_if" --device "$dev" --sizes "$sizes" --label "$label" --pcaps "$pcaps" --out "$results" "$@" >/dev/null
}
status=0
say "clean link"
run clean || status=1
# the same largest WRITE to rxe with mrc-emu's process on any CPU (interop_rxe.py pins it to one):
# would a sender moving between CPUs reorder its packets on the veth? A finding (none so far); the
# exit status is the pinned runs' (docs/interop.md)
unpinned="$out/unpinned.jsonl"
: >"$unpinned"
say "clean link, mrc-emu's process on any CPU (twice)"
for _ in 1 2; do
    results="$unpinned" sizes="${sizes##*,}" run clean-unpinned --directions to-rxe --no-pin || true
done
say "netem loss $loss on both ends of the link"
tc qdisc add dev "$host_if" root netem loss "$loss"; undo+=("tc qdisc del dev $host_if root 2>/dev/null || true")
ip netns exec "$ns" tc qdisc add dev "$ns_if" root netem loss "$loss"
run lossy || status=1

if [ "$mrc" -eq 1 ]; then
    # MRC's own requester (SACK, 4 EVs, path avoidance) to rxe: a finding, not a pass/fail of this
    # script (RC takes only in-order PSNs; docs/interop.md says what rxe did)
    mrc_sizes="${MRC_EMU_RXE_MRC_SIZES:-1048576}"
    findings="$out/mrc-to-rxe.jsonl"
    : >"$findings"
    mrc_run() {
        local label="$1"; shift
        results="$findings" sizes="$mrc_sizes" run "$label" --directions mrc-to-rxe --limit 300 --keep-pcap-below $((64 << 20)) "$@" || true
    }
    say "MRC's own requester to rxe: netem loss $loss"
    mrc_run lossy
    tc qdisc del dev "$host_if" root
    ip netns exec "$ns" tc qdisc del dev "$ns_if" root
    say "MRC's own requester to rxe: clean link"
    mrc_run clean
    say "MRC's own requester to rxe: reordered (netem delay 1ms reorder 25% on mrc-emu's side)"
    ip netns exec "$ns" tc qdisc add dev "$ns_if" root netem delay 1ms reorder 25% 50%
    mrc_run reordered
    ip netns exec "$ns" tc qdisc del dev "$ns_if" root
fi
cp "$pcaps"/*.pcap "$out"/ 2>/dev/null || true  # the small runs' pcaps (the large ones were checked and deleted)

"$venv/bin/python" "$repo/scripts/interop_rxe.py" --table "$results" >&2
say "mrc-emu's process on any CPU (findings):"
"$venv/bin/python" "$repo/scripts/interop_rxe.py" --table "$unpinned" >&2
if [ "$mrc" -eq 1 ]; then
    say "MRC's own requester (findings, docs/interop.md):"
    "$venv/bin/python" "$repo/scripts/interop_rxe.py" --table "$findings" >&2
fi
say "results: $results"
if [ "$status" -ne 0 ]; then say "FAILED: a run did not complete exactly (above)"; fi
exit "$status"
