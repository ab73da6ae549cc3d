#!/usr/bin/env bash
# Idempotent set-up of mrc-emu on a fresh Debian 12 / Ubuntu 24.04, as root:
# the system packages the fabric needs, a virtual environment in .venv, the project in it.
# Safe to run again: apt and pip skip what is already there.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MRC_EMU_VENV:-$repo/.venv}"

if [ "$(id -u)" -ne 0 ]; then
    echo "install.sh: needs root (it installs apt packages); run it with sudo" >&2
    exit 1
fi

apt_packages=(
    iproute2         # ip, for the few things netlink via pyroute2 cannot say
    ethtool tcpdump tshark nftables
    frr              # BGP (and BFD) in the switch namespaces: the baseline's route repair
    python3 python3-venv
    gcc python3-dev zlib1g-dev   # the optional C fast path of the wire encoder (setup.py)
    clang libbpf-dev linux-libc-dev libbpf1   # the switch port program (mrc_emu/fabric/bpf), loaded with libbpf
)
# bpftool only inspects the port program's maps by hand (`bpftool map dump pinned /sys/fs/bpf/mrc-emu/...`);
# Debian 12 packages it, some releases ship it elsewhere (linux-tools): install it where apt knows it
if apt-cache show bpftool >/dev/null 2>&1; then apt_packages+=(bpftool); fi
missing=()
for pkg in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "install.sh: apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The switch port program: a tc egress BPF object compiled for this machine's headers (rebuilt when
# its source is newer). Without it, `up` of a topology with a link_rate says to run this script.
bpf_src="$repo/mrc_emu/fabric/bpf/port.bpf.c"
bpf_obj="${bpf_src%.c}.o"
if [ ! -f "$bpf_obj" ] || [ "$bpf_src" -nt "$bpf_obj" ]; then
    echo "install.sh: compiling $bpf_obj"
    clang -O2 -g -Wall -target bpf -I"/usr/include/$(uname -m)-linux-gnu" -c "$bpf_src" -o "$bpf_obj"
fi

python="${MRC_EMU_PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    echo "install.sh: creating virtual environment $venv"
    "$python" -m venv "$venv"
fi
stamp="$venv/.mrc-emu-installed"
if [ ! -f "$stamp" ] || [ "$repo/pyproject.toml" -nt "$stamp" ]; then
    echo "install.sh: installing mrc-emu into $venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q -e "$repo[test,bench]"
    touch "$stamp"
fi
echo "install.sh: ready ($venv/bin/mrc-emu)"
