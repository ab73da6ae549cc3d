"""What a machine must have to build a fabric, and the error that says what is missing.

Why it exists: every fabric command checks the same prerequisites first and reports a missing
privilege or kernel feature as one clear line. The nodes themselves are plain named network
namespaces (namespaces.py): a switch is its kernel, and no process of ours runs in it.
"""

from __future__ import annotations

import os


class FabricSetupError(RuntimeError):
    """The machine cannot build a fabric: a missing privilege, program or kernel feature."""


def check_prerequisites() -> None:
    if os.geteuid() != 0:
        raise FabricSetupError(
            "building a fabric needs root (network namespaces, veths, routes): run with sudo"
        )
    if not os.path.exists("/proc/sys/net/ipv6/conf/all/seg6_enabled"):
        raise FabricSetupError("this kernel has no SRv6 (CONFIG_IPV6_SEG6_LWTUNNEL): no seg6_enabled sysctl")
