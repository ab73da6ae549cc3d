"""Shared fixtures. System tests need root and the kernel's SRv6; they skip with the reason."""

import os
import uuid

import pytest


def system_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces): run the suite with sudo, as CI does"
    if not os.path.exists("/proc/sys/net/ipv6/conf/all/seg6_enabled"):
        return "kernel has no SRv6 support"
    return None


def pytest_collection_modifyitems(config, items):
    reason = system_skip_reason()
    if reason is None:
        return
    for item in items:
        if "system" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def fabric_name():
    """A fabric name no other test uses; the fabric is taken down if the test left it up."""
    from mrc_emu.fabric import registry

    name = "t" + uuid.uuid4().hex[:6]
    yield name
    if registry.journal_path(name).exists():
        registry.remove(name)


@pytest.fixture
def default_fabric(fabric_name):
    from mrc_emu.fabric import build
    from mrc_emu.topology import builtin

    topo = builtin()
    build.up(topo, fabric_name)
    yield fabric_name, topo
    build.down(fabric_name)
