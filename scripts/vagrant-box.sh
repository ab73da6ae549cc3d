#!/usr/bin/env bash
# Build a Debian 12 (bookworm) Vagrant box for the libvirt provider, once, and cache it: no box
# can be downloaded on a machine that only reaches package registries, so scripts/vagrant-check.sh
# makes its own from the same apt sources as this machine. Prints the box file's path.
#
#   disk: a 20 GiB sparse disk, one MBR partition (ext4), GRUB on the MBR, converted to qcow2
#   system: debootstrap --variant=minbase, linux-image-amd64 (Debian's stock 6.1 kernel: netem,
#           RED, fq_codel, VRF, dummy), openssh-server, sudo, ifupdown DHCP on eth0, ca-certificates,
#           python3, rsync (vagrant's rsync synced folder), dbus (hostnamectl, which vagrant calls)
#   vagrant: user `vagrant` (password vagrant) with Vagrant's insecure public key, passwordless sudo
#   access: this machine's apt sources, apt and pip settings and CA bundle (vagrant-host-config.sh)
#
# The box lands in .vagrant-cache/ (MRC_EMU_VAGRANT_CACHE), named after a hash of this script and
# the host settings, and is reused while both are unchanged. Everything this script mounts or
# attaches is recorded when made and undone, newest first, on exit, failure or Ctrl-C.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${MRC_EMU_VAGRANT_CACHE:-$repo/.vagrant-cache}"
disk_gib=20
suite=bookworm

if [ "$(id -u)" -ne 0 ]; then
    echo "vagrant-box.sh: needs root (debootstrap, a loop device, mounts); run it with sudo" >&2
    exit 1
fi
for tool in debootstrap qemu-img sfdisk losetup mkfs.ext4 partx; do
    command -v "$tool" >/dev/null 2>&1 || { echo "vagrant-box.sh: $tool is missing (apt-get install debootstrap qemu-utils fdisk mount e2fsprogs)" >&2; exit 1; }
done
vagrant_key="$(find /usr/share/rubygems-integration /usr/lib/ruby /opt/vagrant -path '*vagrant-*/keys/vagrant.pub' 2>/dev/null | head -n 1 || true)"
if [ -z "$vagrant_key" ]; then
    echo "vagrant-box.sh: Vagrant's insecure public key (keys/vagrant.pub of the vagrant gem) not found; install vagrant" >&2
    exit 1
fi

mkdir -p "$cache"
host_config="$(mktemp -d "$cache/host-config.XXXXXX")"
"$repo/scripts/vagrant-host-config.sh" "$host_config" >/dev/null
# the apt sources this machine uses for the suite: "URI SUITE COMPONENT" per index
sources="$(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' 'Created-By: Packages' | grep -E " $suite(-[a-z]+)? " | sort -u)"
mirror="$(awk -v s="$suite" '$2 == s {print $1; exit}' <<<"$sources")"
if [ -z "$mirror" ]; then
    echo "vagrant-box.sh: this machine's apt sources have no '$suite' suite to build the box from" >&2
    rm -rf "$host_config"
    exit 1
fi
version="$( (cat "${BASH_SOURCE[0]}" "$vagrant_key"; echo "$sources"; cat "$host_config/apt.conf" "$host_config/pip.conf") | sha256sum | cut -c1-12)"
box="$cache/mrc-emu-debian12-$version.box"
if [ -f "$box" ]; then
    rm -rf "$host_config"
    echo "$box"
    exit 0
fi

work="$(mktemp -d "$cache/build.XXXXXX")"
root="$work/root"
undo=()  # commands that undo what was made, in order of making; run newest first
cleanup() {
    local rc=$? i
    trap - EXIT INT TERM
    for ((i = ${#undo[@]} - 1; i >= 0; i--)); do
        eval "${undo[i]}" || echo "vagrant-box.sh: cleanup step failed: ${undo[i]}" >&2
    done
    rm -rf "$work" "$host_config"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
step() { echo "vagrant-box.sh: $*" >&2; }

step "building $box from $mirror (a few minutes)"
raw="$work/disk.raw"
truncate -s "${disk_gib}G" "$raw"
printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk -q "$raw"
loop="$(losetup --show -f -P "$raw")"
undo+=("losetup -d $loop")
part="${loop}p1"
for _ in $(seq 50); do [ -b "$part" ] && break; partx -a "$loop" 2>/dev/null || true; sleep 0.1; done
[ -b "$part" ] || { echo "vagrant-box.sh: partition $part never appeared" >&2; exit 1; }
mkfs.ext4 -q -L mrc-emu-root "$part"
uuid="$(blkid -s UUID -o value "$part")"
mkdir "$root"
mount "$part" "$root"
undo+=("umount $root")

step "debootstrap $suite"
debootstrap --variant=minbase \
    --include=systemd-sysv,udev,kmod,dbus,iproute2,ifupdown,isc-dhcp-client,openssh-server,sudo,ca-certificates,python3,rsync,initramfs-tools,zstd \
    "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }

mount --bind /dev "$root/dev"; undo+=("umount $root/dev")
mount -t devpts devpts "$root/dev/pts"; undo+=("umount $root/dev/pts")
mount -t proc proc "$root/proc"; undo+=("umount $root/proc")
mount -t sysfs sysfs "$root/sys"; undo+=("umount $root/sys")
mount -t tmpfs tmpfs "$root/run"; undo+=("umount $root/run")
# no service starts inside the chroot
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"

# the same sources, apt settings, pip settings and CA bundle as this machine
rm -f "$root/etc/apt/sources.list"
awk '{print "deb " $1 " " $2 " " $3}' <<<"$sources" >"$root/etc/apt/sources.list"
cp "$host_config/apt.conf" "$root/etc/apt/apt.conf.d/80mrc-emu-host"
cp "$host_config/pip.conf" "$root/etc/pip.conf"
if [ -f "$host_config/ca-certificates.crt" ]; then
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp "$host_config/ca-certificates.crt" "$root/usr/local/share/ca-certificates/mrc-emu-host.crt"
fi

cat >"$root/etc/fstab" <<EOF
UUID=$uuid / ext4 errors=remount-ro 0 1
EOF
echo mrc-emu-box >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 mrc-emu-box\n::1 localhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
cat >"$root/etc/network/interfaces" <<'EOF'
auto lo
iface lo inet loopback

allow-hotplug eth0
iface eth0 inet dhcp
EOF
mkdir -p "$root/etc/default"
cat >"$root/etc/default/grub" <<'EOF'
GRUB_DEFAULT=0
GRUB_TIMEOUT=1
GRUB_DISTRIBUTOR=Debian
GRUB_CMDLINE_LINUX_DEFAULT=""
# eth0 whatever the NIC model; the serial console is what `virsh console` shows
GRUB_CMDLINE_LINUX="console=tty0 console=ttyS0,115200n8 net.ifnames=0 biosdevname=0"
GRUB_TERMINAL="console serial"
GRUB_SERIAL_COMMAND="serial --speed=115200"
EOF

step "kernel, GRUB, the vagrant user"
chroot_env=(env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 PATH=/usr/sbin:/usr/bin:/sbin:/bin)
chroot "$root" "${chroot_env[@]}" update-ca-certificates >/dev/null 2>&1
chroot "$root" "${chroot_env[@]}" apt-get update -qq
chroot "$root" "${chroot_env[@]}" apt-get install -y -qq --no-install-recommends linux-image-amd64 grub-pc >"$work/apt.log" 2>&1 ||
    { tail -n 20 "$work/apt.log" >&2; exit 1; }
chroot "$root" "${chroot_env[@]}" grub-install --target=i386-pc --modules="part_msdos ext2" "$loop" >/dev/null 2>&1
# without udev in the chroot there is no /dev/disk/by-uuid, and grub-mkconfig would name the loop
# device as root: say the UUID for this one run (the VM's own update-grub has udev)
mkdir -p "$root/etc/default/grub.d"
echo "GRUB_DEVICE=UUID=$uuid" >"$root/etc/default/grub.d/zz-mrc-emu-build.cfg"
chroot "$root" "${chroot_env[@]}" update-grub >/dev/null 2>&1
rm "$root/etc/default/grub.d/zz-mrc-emu-build.cfg"
grep -q "root=UUID=$uuid" "$root/boot/grub/grub.cfg" || { echo "vagrant-box.sh: grub.cfg does not boot UUID=$uuid" >&2; exit 1; }

chroot "$root" "${chroot_env[@]}" useradd --create-home --shell /bin/bash vagrant
echo vagrant:vagrant | chroot "$root" "${chroot_env[@]}" chpasswd
install -d -m 700 "$root/home/vagrant/.ssh"
install -m 600 "$vagrant_key" "$root/home/vagrant/.ssh/authorized_keys"
chroot "$root" "${chroot_env[@]}" chown -R vagrant:vagrant /home/vagrant/.ssh
echo 'vagrant ALL=(ALL) NOPASSWD:ALL' >"$root/etc/sudoers.d/vagrant"
chmod 440 "$root/etc/sudoers.d/vagrant"
# each VM made from the box gets its own machine id (systemd writes one at first boot)
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id" "$root/usr/sbin/policy-rc.d"
chroot "$root" "${chroot_env[@]}" apt-get clean
fstrim "$root" 2>/dev/null || true  # freed blocks (debootstrap's packages) become holes in the sparse disk

for ((i = ${#undo[@]} - 1; i >= 1; i--)); do eval "${undo[i]}"; done  # every mount, newest first
undo=("${undo[0]}")
e2fsck -fy "$part" >/dev/null 2>&1 || true

step "qcow2 and box"
qemu-img convert -f raw -O qcow2 "$raw" "$work/box.img"
eval "${undo[0]}"; undo=()
rm -f "$raw"
printf '{"provider": "libvirt", "format": "qcow2", "virtual_size": %d}\n' "$disk_gib" >"$work/metadata.json"
cat >"$work/Vagrantfile" <<'EOF'
# mrc-emu's local Debian 12 box (scripts/vagrant-box.sh): a virtio disk, as it was built for
Vagrant.configure("2") do |config|
  config.vm.provider :libvirt do |libvirt|
    libvirt.disk_bus = "virtio"
  end
end
EOF
tar -C "$work" -cf "$work/box.tar" metadata.json Vagrantfile box.img
mv "$work/box.tar" "$box"
echo "$box"
