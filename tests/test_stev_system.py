"""STEV on a running fabric (root): the leaves' ECMP hash on flow label and ports spreads STEV values
over the spines, each value's frames keep to one spine, and a STEV transfer is verified."""

import json
import subprocess
import sys

import pytest

from mrc_emu.experiments.runtime import stev
from mrc_emu.experiments.runtime.spec import TransferError
from mrc_emu.experiments.runtime.transfer import send
from mrc_emu.fabric import config, static_routes
from mrc_emu.topology.evs import EvFormat

pytestmark = pytest.mark.system




def test_stev_values_cover_the_spines_and_a_transfer_verifies(default_fabric):
    fabric = default_fabric
    with pytest.raises(TransferError, match="STEV needs plain IPv6 routing"):
        stev.check_fabric(fabric)
    static_routes.install(fabric)
    if not config.custom_hash_supported():
        with pytest.raises(TransferError, match="no custom multipath hash"):
            stev.check_fabric(fabric)
        pytest.skip("this kernel has no custom multipath hash (net.ipv6.fib_multipath_hash_fields)")
    assert config.multipath_hash(fabric.node_path("p0l0")) == (3, 0x3F)
    assert config.multipath_hash(fabric.node_path("h0")) == (3, 0x3F)
    result = stev.coverage(fabric, "h0", "h2", count=64, frames=3)
    assert result.one_spine_each, result.text()  # every frame arrived, all of a value's through one spine
    assert sum(result.packets_per_path.values()) == 64 * 3
    assert {r.plane for r in result.routes} == {0, 1}
    assert result.hit > 1, result.text()  # the hash spreads values (it could, in principle, not)
    again = stev.coverage(fabric, "h0", "h2", count=8, frames=2)
    assert [r.spine for r in again.routes] == [r.spine for r in result.routes[:8]]  # a value is a stable path
    cli = subprocess.run([sys.executable, "-m", "mrc_emu.cli", "stev-coverage", "h0", "h2", "--values", "4", "--json",
                          "--name", fabric.name], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    report = json.loads(cli.stdout)
    assert report["paths"] == 8 and report["values"] == 4 and report["one_spine_each"]
    assert [r["spine"] for r in report["routes"]] == [r.spine for r in result.routes[:4]]
    done = send(fabric, "h0", "h2", 4 << 20, ev_format=EvFormat.STEV)
    assert done.verified and done.ev_format == "STEV"
