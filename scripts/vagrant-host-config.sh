#!/usr/bin/env bash
# Write this machine's package-access settings into DIR, for a VM (the Vagrantfile reads
# MRC_EMU_HOST_CONFIG=DIR) or a disk image (scripts/vagrant-box.sh) to reach the same registries:
#   DIR/apt.conf            apt's proxy and validity settings (`apt-config dump`: Acquire::*Proxy*,
#                           Acquire::Check-Valid-Until, Acquire::Check-Date)
#   DIR/pip.conf            pip's settings (`pip config list`, file and environment), less those that
#                           name this machine's own files (find-links, file:// indexes, constraints),
#                           which do not exist in the VM
#   DIR/ca-certificates.crt this machine's CA bundle, when it has one (a TLS-intercepting proxy's CA
#                           is in it); the VM's pip and apt trust it
#   DIR/proxy.env           http_proxy, https_proxy, no_proxy (either case) as set here
# A user behind a proxy: `scripts/vagrant-host-config.sh .vagrant-host && MRC_EMU_HOST_CONFIG=.vagrant-host vagrant up`.
set -euo pipefail

if [ "$#" -ne 1 ]; then
    echo "usage: $(basename "$0") DIR" >&2
    exit 2
fi
out="$1"
mkdir -p "$out"

: >"$out/apt.conf"
if command -v apt-config >/dev/null 2>&1; then
    apt-config dump | grep -E '^Acquire::([a-z]+::)?Proxy|^Acquire::Check-(Valid-Until|Date) ' >"$out/apt.conf" || true
fi

# pip: the settings in force here, one per `section.key='value'` line; those naming this machine's
# files are left out (a path that only exists here would fail or mislead inside the VM)
pip_cmd=()
if command -v pip3 >/dev/null 2>&1; then pip_cmd=(pip3); elif command -v python3 >/dev/null 2>&1; then pip_cmd=(python3 -m pip); fi
{
    echo "[global]"
    if [ "${#pip_cmd[@]}" -gt 0 ]; then
        "${pip_cmd[@]}" config list 2>/dev/null | while IFS= read -r line; do
            key="${line%%=*}"
            key="${key#*.}"
            value="${line#*=}"
            value="${value#\'}"
            value="${value%\'}"
            case "$key" in
                find-links|constraint|requirement|build-constraint) continue ;;
                # the bundle copied below lands where Debian keeps it
                cert) [ -f "$value" ] && echo "cert = /etc/ssl/certs/ca-certificates.crt"; continue ;;
                client-cert) continue ;;
            esac
            kept=()
            for word in $value; do
                case "$word" in file:*|/*) ;; *) kept+=("$word") ;; esac
            done
            [ "${#kept[@]}" -gt 0 ] || continue
            echo "$key = ${kept[*]}"
        done | sort -u
    fi
} >"$out/pip.conf"

rm -f "$out/ca-certificates.crt"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt "$out/ca-certificates.crt"
fi

: >"$out/proxy.env"
for name in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
    if [ -n "${!name:-}" ]; then printf '%s=%q\n' "$name" "${!name}" >>"$out/proxy.env"; fi
done
echo "vagrant-host-config.sh: wrote $out (apt.conf: $(wc -l <"$out/apt.conf") line(s), pip.conf: $(($(wc -l <"$out/pip.conf") - 1)) setting(s), proxy.env: $(wc -l <"$out/proxy.env") variable(s))"
