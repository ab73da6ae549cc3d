"""The SRv6 endpoint program's configuration, without root: which SRv6 a fabric uses, the map
values each interface gets, and the topologies the program refuses."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mrc_emu.fabric import cabling
from mrc_emu.fabric.datapath import srv6
from mrc_emu.fabric.kernel import seg6local
from mrc_emu.topology import Role, builtin
from mrc_emu.topology import addressing as ad


@pytest.mark.parametrize("forced", ["kernel", "bpf"])
def test_the_environment_forces_either_srv6(monkeypatch, forced):
    monkeypatch.setenv(seg6local.MODE_ENV, forced)
    monkeypatch.setattr(seg6local, "kernel_problem", lambda: pytest.fail("a forced mode probes nothing"))
    assert seg6local.mode() == forced


def test_an_unknown_srv6_mode_is_one_clear_error(monkeypatch):
    monkeypatch.setenv(seg6local.MODE_ENV, "ebpf")
    with pytest.raises(ValueError, match=r"MRC_EMU_SRV6='ebpf': use 'kernel', 'bpf'"):
        seg6local.mode()


def test_without_a_forced_mode_the_probe_decides(monkeypatch):
    monkeypatch.delenv(seg6local.MODE_ENV, raising=False)
    monkeypatch.setattr(seg6local, "kernel_problem", lambda: None)
    assert seg6local.mode() == "kernel"
    monkeypatch.setattr(seg6local, "kernel_problem", lambda: "the kernel refuses seg6local routes")
    assert seg6local.mode() == "bpf"


def test_every_interface_carries_its_nodes_id_host_flag_and_end_x_ports():
    topo = builtin("default")
    records = srv6.node_records(topo)
    assert len(records) == 2 * len(topo.links)  # both ends of every link, no other interface
    for name, node in topo.nodes.items():
        ports = {ad.port_of(topo.peer(link, name)[1]) for link in topo.links_of(name)}
        for link in topo.links_of(name):
            node_id, flags, endx = srv6._NODE.unpack(records[cabling.index_of(link, name)])
            assert node_id == node.node_id
            assert flags == (srv6.NODE_HOST if node.role is Role.HOST else 0)
            assert {k for k in range(srv6.MAX_PORTS) if endx[k // 8] >> (k % 8) & 1} == ports


@pytest.mark.parametrize("name", ["default", "incast", "large", "huge", "fourplane"])
def test_the_shipped_topologies_have_one_link_per_neighbour_pair(name):
    assert srv6.topology_problem(builtin(name)) is None


def test_two_links_between_one_pair_are_refused_by_name():
    link = lambda a, b, i: SimpleNamespace(a=a, b=b, link_id=i)  # noqa: E731
    topo = SimpleNamespace(links=[link("p0l0", "p0s0", 1), link("p0l0", "p0s1", 2), link("p0s0", "p0l0", 3)])
    assert srv6.topology_problem(topo) == ("p0s0 and p0l0 have two links (1 and 3): without seg6local an End.X "
                                           "cannot choose between them")
