#!/usr/bin/env bash
# The shipped Vagrantfile, run for real: a VM from the local Debian 12 box (scripts/vagrant-box.sh),
# provisioned by the project's own install script as a user's would be, the README's test command
# run inside it (or the commands given), the results copied out, the VM destroyed, and a check that
# nothing this run made is left: no libvirt domain, volume, network, pool, box or process.
#
#   scripts/vagrant-check.sh                     the whole test suite inside (scripts/test.sh, as root)
#   scripts/vagrant-check.sh --run 'CMD' ...     CMD instead (as root, in /vagrant, with the VM's venv;
#                                                files it writes to $MRC_EMU_RESULTS are copied out);
#                                                --run may be given several times, each runs in turn
#   scripts/vagrant-check.sh --keep ...          leave the VM up afterwards (it says how to destroy it)
#   scripts/vagrant-check.sh --in RUN_DIR --run 'CMD'   in a kept VM: the checkout synced again (vagrant
#                                                rsync), CMD run, results copied out; the VM stays up
#   scripts/vagrant-check.sh --destroy RUN_DIR   destroy a kept VM and everything its run recorded
#   options: --results DIR (default results/vagrant-RUN), --cpus N, --memory MIB,
#            --nice N (the VM's qemu, every thread, at nice N from its start: a host shared with
#            timing-sensitive work; kept for --in and applied again there)
#
# The VM runs with libvirt's plain emulation (TCG, driver qemu): this machine's /dev/kvm has no
# hardware virtualisation. Every object is recorded in RUN_DIR/record when it is made (or, for the
# ones vagrant-libvirt makes, by comparing libvirt's lists before and after `vagrant up`), and
# removed from that record on exit, failure or Ctrl-C. Each phase's wall time is printed at the end.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${MRC_EMU_VAGRANT_CACHE:-$repo/.vagrant-cache}"
keep=0
destroy_dir=""
in_dir=""
results=""
cpus=2
memory=4096
nice_level=""
commands=()
while [ "$#" -gt 0 ]; do
    case "$1" in
        --keep) keep=1 ;;
        --run) commands+=("$2"); shift ;;
        --results) results="$2"; shift ;;
        --cpus) cpus="$2"; shift ;;
        --memory) memory="$2"; shift ;;
        --nice) nice_level="$2"; shift ;;
        --destroy) destroy_dir="$(cd "$2" && pwd)"; shift ;;
        --in) in_dir="$(cd "$2" && pwd)"; shift ;;
        -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "vagrant-check.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
    shift
done
if [ "$(id -u)" -ne 0 ]; then
    echo "vagrant-check.sh: needs root (apt, libvirt's system instance, the box build); run it with sudo" >&2
    exit 1
fi

say() { echo "vagrant-check.sh: $*" >&2; }
# vagrant's progress bars (carriage returns, thousands of "Progress: N%") as one line per 10 %, each
# passed on as it comes (tr unbuffered: behind a pipe it held vagrant's output back for minutes)
# (and awk reading line by line: mawk, Debian's and Ubuntu's awk, reads a pipe in blocks unless
# -W interactive, so the log stood still at "Clock offset" through boot and provisioning)
line_awk=(awk)
if awk -W version 2>&1 | grep -q mawk; then line_awk=(awk -W interactive); fi
quiet_progress() { stdbuf -o0 tr '\r' '\n' | "${line_awk[@]}" '/Progress: [0-9]+%/ { p = int($NF / 10); if (p == last) next; last = p } { print; fflush() }' >&2; }
phases=()
phase_start=0
phase_name=""
phase() {  # end the running phase (its wall time recorded), start the next one
    local now
    now="$(date +%s.%N)"
    if [ -n "$phase_name" ]; then phases+=("$(printf '%-12s %8.1f s' "$phase_name" "$(echo "$now - $phase_start" | bc)")"); fi
    phase_name="$1"
    phase_start="$now"
    [ -z "$phase_name" ] || say "== $phase_name"
}
print_phases() {
    local line
    say "wall time per phase:"
    for line in "${phases[@]}"; do echo "  $line" >&2; done
}

# ---- libvirt's lists, to compare before and after ------------------------------------------------
virsh_() { virsh -q -c qemu:///system "$@"; }
# names only, one per line: virsh pads its lists with blank lines and trailing spaces
names() { awk 'NF {print $1}' | sort; }
list_domains() { virsh_ list --all --name | names; }
list_networks() { virsh_ net-list --all --name | names; }
list_pools() { virsh_ pool-list --all --name | names; }
list_volumes() {  # "POOL VOLUME" per volume of every pool
    local pool
    for pool in $(list_pools); do
        virsh_ vol-list --pool "$pool" 2>/dev/null | awk -v p="$pool" 'NF {print p " " $1}'
    done | sort
}
list_qemu() { ps -eo pid=,comm= | awk '$2 ~ /^qemu-system/ {print $1}' | sort; }
snapshot() {  # DIR: every list, one file each
    mkdir -p "$1"
    list_domains >"$1/domains"; list_networks >"$1/networks"; list_pools >"$1/pools"
    list_volumes >"$1/volumes"; list_qemu >"$1/qemu"
}
new_lines() { comm -13 "$1" "$2"; }  # lines of $2 not in $1 (both sorted)

# ---- the record: one "KIND VALUE..." line per object this run made ------------------------------
record() { echo "$*" >>"$run/record"; }
recorded() { awk -v k="$1" '$1 == k {sub(/^[^ ]+ /, ""); print}' "$run/record"; }

# the objects vagrant-libvirt made during `vagrant up` (the domain, its disks, the box's image
# uploaded to the pool, the management network, the pool itself when there was none), by comparing
# libvirt's lists with those taken before: recorded by name, removed by that name only
record_libvirt_made() {
    local after="$run/after-up" name
    snapshot "$after"
    while read -r name; do [ -z "$name" ] || record domain "$name"; done < <(new_lines "$run/before/domains" "$after/domains")
    while read -r name; do [ -z "$name" ] || record volume "$name"; done < <(new_lines "$run/before/volumes" "$after/volumes")
    while read -r name; do [ -z "$name" ] || record network "$name"; done < <(new_lines "$run/before/networks" "$after/networks")
    while read -r name; do [ -z "$name" ] || record pool "$name"; done < <(new_lines "$run/before/pools" "$after/pools")
    while read -r name; do [ -z "$name" ] || record qemu "$name"; done < <(new_lines "$run/before/qemu" "$after/qemu")
}

vagrant_env() {  # the shipped Vagrantfile, this run's box, TCG, rsync, the host's package settings
    export VAGRANT_CWD="$repo"
    export VAGRANT_DOTFILE_PATH="$run/vagrant"
    export MRC_EMU_BOX MRC_EMU_LIBVIRT_PREFIX MRC_EMU_HOST_CONFIG
    MRC_EMU_BOX="$(recorded box | head -n 1)"
    MRC_EMU_LIBVIRT_PREFIX="$(cat "$run/prefix")"
    MRC_EMU_HOST_CONFIG="$run/host-config"
    export MRC_EMU_PROVIDER=libvirt MRC_EMU_LIBVIRT_DRIVER=qemu MRC_EMU_SYNC=rsync
    export MRC_EMU_CPUS="$cpus" MRC_EMU_MEMORY="$memory"
}

# Undo everything recorded, newest kind last made first; then compare libvirt and the processes
# with the lists taken before the run. Returns 1 if anything this run made is still there.
teardown() {
    local pool volume name pid left=0
    [ -f "$run/record" ] || return 0
    # interrupted (or failed) inside `vagrant up`: what vagrant-libvirt had made by then (the box's
    # image half uploaded to the pool, a pool, a network, the domain) was not yet compared with the
    # lists taken before; compare now, so it is recorded and removed like the rest
    if [ -n "$(recorded machine)" ] && [ ! -d "$run/after-up" ]; then record_libvirt_made; fi
    if [ -n "$(recorded machine)" ]; then
        say "vagrant destroy -f"
        (vagrant_env; vagrant destroy -f) >&2 || say "vagrant destroy failed; removing the recorded objects one by one"
    fi
    for name in $(recorded domain); do
        if virsh_ dominfo "$name" >/dev/null 2>&1; then
            virsh_ destroy "$name" >/dev/null 2>&1 || true
            virsh_ undefine "$name" --remove-all-storage >/dev/null 2>&1 || virsh_ undefine "$name" >/dev/null || true
        fi
    done
    while read -r pool volume; do
        [ -n "$volume" ] || continue
        if virsh_ vol-info --pool "$pool" "$volume" >/dev/null 2>&1; then virsh_ vol-delete --pool "$pool" "$volume" >/dev/null || true; fi
    done < <(recorded volume)
    for name in $(recorded network); do
        if virsh_ net-info "$name" >/dev/null 2>&1; then
            virsh_ net-destroy "$name" >/dev/null 2>&1 || true
            virsh_ net-undefine "$name" >/dev/null || true
        fi
    done
    for name in $(recorded pool); do
        if virsh_ pool-info "$name" >/dev/null 2>&1; then
            virsh_ pool-destroy "$name" >/dev/null 2>&1 || true
            virsh_ pool-undefine "$name" >/dev/null || true
        fi
    done
    for name in $(recorded box); do
        if vagrant box list 2>/dev/null | awk '{print $1}' | grep -qxF "$name"; then
            vagrant box remove --force --all "$name" >/dev/null || true
        fi
    done
    for pid in $(recorded renicer); do kill "$pid" 2>/dev/null || true; done
    # the VM's qemu: gone with its domain; a straggler this run saw start is ended by its pid
    for pid in $(recorded qemu); do
        if kill -0 "$pid" 2>/dev/null; then say "qemu $pid still running: ending it"; kill "$pid" || true; fi
    done

    local now="$run/after"
    snapshot "$now"
    for kind in domains networks pools volumes qemu; do
        if [ -n "$(new_lines "$run/before/$kind" "$now/$kind")" ]; then
            say "LEFT BEHIND ($kind): $(new_lines "$run/before/$kind" "$now/$kind" | tr '\n' ' ')"
            left=1
        fi
    done
    for name in $(recorded box); do
        if vagrant box list 2>/dev/null | awk '{print $1}' | grep -qxF "$name"; then say "LEFT BEHIND (box): $name"; left=1; fi
    done
    # the libvirt daemons this run started, by the pids it recorded
    for pid in $(recorded daemon); do
        if kill -0 "$pid" 2>/dev/null; then kill "$pid" || true; fi
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then say "LEFT BEHIND (process): daemon $pid"; left=1; fi
    done
    if [ "$left" -eq 0 ]; then
        say "nothing left: no domain, volume, network, pool, qemu process, box or daemon of this run remains"
    fi
    mv "$run/record" "$run/record.done"
    return "$left"
}

# ---- --nice: the VM's qemu at a low priority ------------------------------------------------------
# The domain is the one this run's `vagrant up` made (libvirt's list against the one taken before),
# its qemu the pid in libvirt's own pid file; every thread is reniced (a nice value is per thread
# on Linux; threads made later inherit it from the thread that makes them).
run_domain() { new_lines "$run/before/domains" <(list_domains) | head -n 1; }
renice_vm() {  # 0 once the VM's qemu runs at $nice_level
    local domain pid task
    domain="$(run_domain)"
    [ -n "$domain" ] && [ -s "/run/libvirt/qemu/$domain.pid" ] || return 1
    pid="$(cat "/run/libvirt/qemu/$domain.pid")"
    [ -d "/proc/$pid/task" ] || return 1
    for task in /proc/"$pid"/task/*; do renice -n "$nice_level" -p "${task##*/}" >/dev/null 2>&1 || true; done
}
start_renicer() {  # in the background for the length of `vagrant up` (recorded; ended after it)
    [ -n "$nice_level" ] || return 0
    echo "$nice_level" >"$run/nice"
    ( while :; do renice_vm || true; sleep 2; done ) &
    record renicer "$!"
}
stop_renicer() {
    local pid
    for pid in $(recorded renicer); do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
    if [ -n "$nice_level" ]; then
        if renice_vm; then say "the VM's qemu runs at nice $nice_level"; else say "--nice: the VM's qemu not found"; fi
    fi
}

# ---- the libvirt daemons --------------------------------------------------------------------------
start_libvirt() {  # use a running system libvirt; start one (recorded) where there is none
    virsh_ uri >/dev/null 2>&1 && return 0
    if [ -d /run/systemd/system ]; then
        say "starting libvirtd (systemd)"
        systemctl start libvirtd.service virtlogd.service
        record service libvirtd.service
    else
        say "starting virtlogd and libvirtd (no systemd here; stopped again at the end)"
        local pidfile
        for daemon in virtlogd libvirtd; do
            pidfile="$run/$daemon.pid"
            "$daemon" --daemon --pid-file "$pidfile"
            for _ in $(seq 100); do [ -s "$pidfile" ] && break; sleep 0.1; done
            record daemon "$(cat "$pidfile")"
        done
    fi
    for _ in $(seq 100); do virsh_ uri >/dev/null 2>&1 && return 0; sleep 0.1; done
    say "libvirtd does not answer on qemu:///system"
    return 1
}

# ---- inside the VM: the commands, then their results copied out ----------------------------------
guest() { ssh -F "$run/ssh-config" -o ServerAliveInterval=30 default "$@"; }
guest_results=/tmp/mrc-emu-results
run_inside() {  # each of "${commands[@]}" as root in the synced checkout; returns the last failure's status
    local status=0 i=0 cmd log cmd_rc
    # as root in the synced checkout, with the venv install.sh made and a results directory to copy out
    local as_root="sudo env MRC_EMU_VENV=/opt/mrc-emu-venv MRC_EMU_RESULTS=$guest_results"
    guest "sudo rm -rf $guest_results && sudo mkdir -p $guest_results" </dev/null
    phase tests
    for cmd in "${commands[@]}"; do
        i=$((i + 1))
        say "inside the VM: $cmd"
        log="$results/run-$i.log"
        echo "\$ $cmd" >"$log"
        cmd_rc=0
        guest "$as_root bash -o pipefail -c $(printf '%q' "cd /vagrant && $cmd")" </dev/null 2>&1 | tee -a "$log" || cmd_rc=$?
        echo "exit $cmd_rc" >>"$log"
        say "exit $cmd_rc: $cmd"
        [ "$cmd_rc" -eq 0 ] || status="$cmd_rc"
    done
    phase copy-out
    guest "sudo tar -C $guest_results -cf - ." </dev/null | tar -C "$results" -xf -
    guest "uname -r; cat /etc/debian_version; nproc" </dev/null >"$results/vm.txt" 2>&1 || true
    say "copied out to $results: $(cd "$results" && ls | tr '\n' ' ')"
    return "$status"
}

# ---- --destroy RUN_DIR: a kept VM -------------------------------------------------------------------
if [ -n "$destroy_dir" ]; then
    run="$destroy_dir"
    [ -f "$run/record" ] || { say "$run has no record (already destroyed?)"; exit 1; }
    cpus="$(cat "$run/cpus")"; memory="$(cat "$run/memory")"
    phase destroy
    destroy_rc=0
    teardown || destroy_rc=$?
    phase ""
    print_phases
    exit "$destroy_rc"
fi

# ---- --in RUN_DIR: commands in a kept VM ---------------------------------------------------------------
if [ -n "$in_dir" ]; then
    run="$in_dir"
    [ -f "$run/record" ] && [ -n "$(recorded machine)" ] || { say "$run has no VM up (already destroyed?)"; exit 1; }
    [ "${#commands[@]}" -gt 0 ] || { say "--in needs at least one --run 'CMD'"; exit 2; }
    cpus="$(cat "$run/cpus")"; memory="$(cat "$run/memory")"
    [ -n "$nice_level" ] || [ ! -f "$run/nice" ] || nice_level="$(cat "$run/nice")"
    if [ -n "$nice_level" ]; then renice_vm || say "--nice: the VM's qemu not found"; fi
    results="${results:-$repo/results/vagrant-$(basename "$run")-$(date -u +%H%M%S)}"
    mkdir -p "$results"
    phase rsync
    (vagrant_env; vagrant rsync) >&2
    status=0
    run_inside || status=$?
    phase ""
    print_phases
    say "VM still up; destroy it with  scripts/vagrant-check.sh --destroy $run"
    exit "$status"
fi

# ---- the run ---------------------------------------------------------------------------------------
phase packages
needed=(vagrant vagrant-libvirt libvirt-daemon-system libvirt-clients qemu-system-x86 qemu-utils debootstrap fdisk mount e2fsprogs rsync bc dnsmasq-base)
missing=()
for pkg in "${needed[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    say "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

run_id="$(date -u +%Y%m%d-%H%M%S)-$$"
run="$cache/runs/$run_id"
mkdir -p "$run"
: >"$run/record"
echo "$cpus" >"$run/cpus"; echo "$memory" >"$run/memory"
echo "mrc-emu-check-$run_id-" >"$run/prefix"
results="${results:-$repo/results/vagrant-$run_id}"
mkdir -p "$results"
finish() {
    local rc=$? teardown_rc=0
    trap - EXIT INT TERM
    if [ "$keep" -eq 1 ] && [ -n "$(recorded machine)" ]; then
        phase ""
        print_phases
        say "VM kept: ssh in with  VAGRANT_CWD=$repo VAGRANT_DOTFILE_PATH=$run/vagrant vagrant ssh"
        say "         or           ssh -F $run/ssh-config default"
        say "destroy it (and everything recorded) with  scripts/vagrant-check.sh --destroy $run"
        exit "$rc"
    fi
    phase destroy
    teardown || teardown_rc=$?
    phase ""
    print_phases
    say "results: $results"
    [ "$rc" -ne 0 ] || rc="$teardown_rc"
    exit "$rc"
}
trap finish EXIT
trap 'say "interrupted"; exit 130' INT TERM

start_libvirt
snapshot "$run/before"

phase box
box_file="$("$repo/scripts/vagrant-box.sh")"
box_name="mrc-emu-check-$run_id"
record box "$box_name"
vagrant box add --name "$box_name" "$box_file" 2>&1 | quiet_progress
"$repo/scripts/vagrant-host-config.sh" "$run/host-config" >&2

phase up
record machine default
vagrant_env
up_rc=0
start_renicer
vagrant up --provider libvirt 2>&1 | quiet_progress || up_rc=$?
stop_renicer
record_libvirt_made
[ "$up_rc" -eq 0 ] || { say "vagrant up failed ($up_rc)"; exit "$up_rc"; }
vagrant ssh-config >"$run/ssh-config"
if [ "${#commands[@]}" -eq 0 ]; then
    # the README's test command, as is; pytest writes its junit file where it is copied out from
    commands=("scripts/test.sh --junitxml=$guest_results/junit.xml")
fi
status=0
run_inside || status=$?
exit "$status"
