#!/usr/bin/env bash
# Idempotent set-up of mrc-emu on a fresh Debian 12 / Ubuntu 24.04, as root:
# the system packages the fabric needs, a virtual environment in .venv, the project in it.
# Safe to run again: apt and pip skip what is already there, and the C code is built again only
# when scripts/check_native.py finds it missing or older than its sources.
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
    gcc python3-dev zlib1g-dev   # the C extensions (setup.py), optional for a user, required by scripts/test.sh
    clang libbpf-dev linux-libc-dev libbpf1   # the switch port program (mrc_emu/fabric/bpf), loaded with libbpf
    chromium         # headless, for the tests of `mrc-emu view`'s page (tests/browser.py); the view itself needs no browser
)
# bpftool only inspects the port program's maps by hand (`bpftool map dump pinned /sys/fs/bpf/mrc-emu/...`);
# Debian 12 packages it, some releases ship it elsewhere (linux-tools): install it where apt knows it
if apt-cache show bpftool >/dev/null 2>&1; then apt_packages+=(bpftool); fi
# soft-RoCE's user side (rdma-core, the verbs API from Python, ibv_devinfo, ib_write_bw) for
# scripts/interop-rxe.sh, which makes rdma_rxe the peer of the transports: only where the running
# kernel ships the rdma_rxe module (a stock Debian/Ubuntu kernel; not a small VM kernel without RDMA)
if modinfo rdma_rxe >/dev/null 2>&1; then apt_packages+=(rdma-core ibverbs-providers python3-pyverbs ibverbs-utils perftest); fi
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

# The C code, built again whenever scripts/check_native.py finds it missing or older than a
# source or header it is made from (a checkout that changed one, or a build that failed).
check_native=("$venv/bin/python" "$repo/scripts/check_native.py")
# The BPF programs (mrc_emu/fabric/bpf/*.bpf.c: the switch port program, the SRv6 endpoint
# program for kernels without seg6local), compiled for this machine's headers. Without them,
# `up` of a topology that needs one says to run this script. A failed compile stops here.
if ! "${check_native[@]}" bpf 2>/dev/null; then
    for bpf_src in "$repo"/mrc_emu/fabric/bpf/*.bpf.c; do
        bpf_obj="${bpf_src%.c}.o"
        echo "install.sh: compiling $bpf_obj"
        rm -f "$bpf_obj"  # never the old object beside a new source
        clang -O2 -g -Wall -target bpf -I"/usr/include/$(uname -m)-linux-gnu" -c "$bpf_src" -o "$bpf_obj"
    done
fi
# The C extensions of setup.py, in place (the editable install imports them from the tree). Each
# is optional: one that does not compile leaves its Python path, a warning here, and
# scripts/test.sh refusing to run. A fresh build directory each time: setuptools would otherwise
# copy the last good build of an extension that now fails to compile.
if ! "${check_native[@]}" extensions 2>/dev/null; then
    echo "install.sh: building the C extensions in place"
    build="$(mktemp -d)"
    find "$repo/mrc_emu" -name '_*.so' -delete  # the extensions' old builds (ignored by git): none survives a failure
    (cd "$repo" && "$venv/bin/python" setup.py -q build_ext --inplace --build-lib "$build/lib" --build-temp "$build/temp")
    rm -rf "$build"
    "${check_native[@]}" extensions || echo "install.sh: the pure-Python paths will stand in for what is missing" >&2
fi
echo "install.sh: ready ($venv/bin/mrc-emu)"
