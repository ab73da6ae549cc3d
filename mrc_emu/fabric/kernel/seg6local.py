"""Whether this kernel holds SRv6 SIDs as seg6local routes, and which SRv6 a fabric uses.

Why it exists: a kernel built without CONFIG_IPV6_SEG6_LWTUNNEL has SRv6's sysctls and its SRH
processing but refuses seg6local routes; config.py then leaves them out and the fabric puts
the BPF endpoint program on its interfaces instead (datapath/srv6.py). The probe is one
netlink request in a scratch namespace of this thread's own, once per process.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager

from ...topology import addressing as ad
from . import netns
from .netlink import Batch, NetlinkError, Seg6Local

MODE_ENV = "MRC_EMU_SRV6"


@contextmanager
def _scratch_namespace() -> Iterator[None]:
    """This thread in a new, unnamed network namespace for the body; it vanishes when the thread
    leaves it (no name, no file: nothing to record or remove)."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        netns._check(netns._libc.unshare(netns.CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        try:
            yield
        finally:
            netns.setns(home)
    finally:
        os.close(home)


@functools.lru_cache(maxsize=1)
def kernel_problem() -> str | None:
    """Why this kernel cannot hold the fabric's SIDs as seg6local routes (None: it can). Tried
    once, on a route like the fabric's, in a scratch namespace. Needs root."""
    try:
        with _scratch_namespace():
            batch = Batch()
            batch.link_up(1, what="lo up")
            batch.route(ad.end_sid(1) + "/48", 1, seg6local=Seg6Local("End", next_csid=(ad.USID_BLOCK_BITS, ad.USID_BITS)))
            batch.send()
    except NetlinkError as exc:
        return f"the kernel refuses seg6local routes ({exc}; CONFIG_IPV6_SEG6_LWTUNNEL is not set)"
    except OSError as exc:
        return f"cannot probe seg6local: {exc}"
    return None


def mode() -> str:
    """'kernel' (seg6local routes) or 'bpf' (srv6.bpf.c on every fabric interface)."""
    forced = os.environ.get(MODE_ENV, "")
    if forced in ("kernel", "bpf"):
        return forced
    if forced:
        raise ValueError(f"{MODE_ENV}={forced!r}: use 'kernel', 'bpf' or leave it unset (whichever works here)")
    return "kernel" if kernel_problem() is None else "bpf"
