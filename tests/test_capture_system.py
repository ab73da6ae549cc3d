"""Captures for real (root): a 4 MiB WRITE captured whole on the destination's ports, and read back
by code of its own (pcap_reader) to the sender's SHA-256; a capture that drops says how many.
Also `clean --name`, which removes one fabric of several."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pcap_reader
import pytest

from mrc_emu.experiments.runtime.transfer import send
from mrc_emu.fabric import ops
from mrc_emu.fabric.kernel import netns

pytestmark = pytest.mark.system
CLI = [sys.executable, "-m", "mrc_emu.cli"]
SIZE = 4 * 2**20
MTU = 4096


def test_capture_of_a_4mib_write_holds_every_data_packet_and_its_bytes(default_fabric, tmp_path):
    out = tmp_path / "h2.pcap"
    cap = ops.Capture(default_fabric, "h2", str(out))  # every port of the destination host, whole packets
    try:
        sent = send(default_fabric, "h0", "h2", SIZE, mtu=MTU)
    finally:
        result = cap.stop()
    assert sent.verified
    assert result.complete, result.problem()
    assert result.interfaces == ["h2-eth0", "h2-eth1"] and result.packets == pcap_reader.count(out)
    # read back by address: every WRITE's RETH VA and payload, as it arrived over h2's links (SRv6-
    # encapsulated; the kernel's decapsulated copy of each is in the pcap too, and left out here)
    digest, used, covered = pcap_reader.sha256_of(out, SIZE)
    assert covered == SIZE and used >= SIZE // MTU
    assert digest == sent.sha256_source
    arrived = [w for w in pcap_reader.writes(out) if w.encapsulated]
    assert {w.psn for w in arrived} == {w.psn for w in pcap_reader.writes(out) if not w.encapsulated}
    assert len({w.psn for w in arrived}) == SIZE // MTU
    if not shutil.which("tshark"):
        pytest.skip("tshark not installed (scripts/install.sh installs it): the pcap was not dissected by Wireshark")
    shown = subprocess.run(["tshark", "-r", str(out), "-Y", "infiniband.bth.opcode == 10 && ipv6.routing.type == 4",
                            "-T", "fields", "-e", "infiniband.bth.psn"], capture_output=True, text=True, timeout=120)
    psns = shown.stdout.split()
    assert len(psns) >= SIZE // MTU and len(set(psns)) == SIZE // MTU, shown.stderr[-2000:]


def test_a_capture_that_drops_says_exactly_how_many(default_fabric, tmp_path):
    """A ring of 1 KiB (libpcap's least) overflows at once: the drops are counted, not hidden."""
    out = tmp_path / "small.pcap"
    cap = ops.Capture(default_fabric, "h2", str(out), buffer_kib=1)
    try:
        assert send(default_fabric, "h0", "h2", 4 * SIZE, mtu=MTU).verified
    finally:
        result = cap.stop()
    assert result.dropped_kernel > 0 and not result.complete
    assert result.packets + result.dropped_kernel == result.received  # nothing unaccounted for
    assert result.packets == pcap_reader.count(out)
    assert f"lost {result.lost:,} packets: {result.dropped_kernel:,} dropped by the kernel" in result.problem()


def test_clean_name_removes_only_that_fabric(tmp_path):
    """A state directory of its own: `clean` here sees only the journals of this test."""
    env = {**os.environ, "MRC_EMU_STATE_DIR": str(tmp_path / "state")}
    names = ["c" + uuid.uuid4().hex[:6], "c" + uuid.uuid4().hex[:6]]

    def namespaces(name: str) -> list[str]:
        return [p.name for p in netns.NETNS_DIR.glob(f"{name}-*")]

    try:
        for name in names:
            subprocess.run(CLI + ["up", "--name", name], env=env, capture_output=True, check=True, timeout=120)
        done = subprocess.run(CLI + ["clean", "--name", names[0], "--json"], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0 and json.loads(done.stdout) == {"removed": [names[0]]}, done.stderr
        assert namespaces(names[0]) == [] and namespaces(names[1])
        assert not (tmp_path / "state" / f"{names[0]}.journal").exists()
        assert (tmp_path / "state" / f"{names[1]}.journal").exists()
    finally:
        done = subprocess.run(CLI + ["clean"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and namespaces(names[1]) == []
