#!/usr/bin/env bash
# Inside the VM, as root (the Vagrantfile's host-config provisioner): install the host's package-access
# settings that scripts/vagrant-host-config.sh wrote into DIR, before anything is installed, so the VM
# reaches the same registries the same way (apt proxy, pip settings, the CA of a TLS-intercepting proxy).
# DIR is removed afterwards (vagrant copies it in again on each provisioning).
set -euo pipefail
dir="$1"
if [ -s "$dir/apt.conf" ]; then
    cp "$dir/apt.conf" /etc/apt/apt.conf.d/80mrc-emu-host
fi
if [ -s "$dir/ca-certificates.crt" ]; then
    mkdir -p /usr/local/share/ca-certificates
    cp "$dir/ca-certificates.crt" /usr/local/share/ca-certificates/mrc-emu-host.crt
    # one file holding many certificates: the bundle takes them all, `rehash` warns about the file
    update-ca-certificates >/dev/null 2>&1 || true
fi
if [ -s "$dir/pip.conf" ]; then
    cp "$dir/pip.conf" /etc/pip.conf
fi
if [ -s "$dir/proxy.env" ]; then
    # every login shell and sudo (env_keep below) sees the host's proxy
    sed 's/^/export /' "$dir/proxy.env" >/etc/profile.d/mrc-emu-proxy.sh
    echo 'Defaults env_keep += "http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY"' >/etc/sudoers.d/mrc-emu-proxy
    chmod 440 /etc/sudoers.d/mrc-emu-proxy
fi
rm -rf "$dir"
echo "vagrant-guest-config.sh: apt, pip and CA settings of the host installed"
