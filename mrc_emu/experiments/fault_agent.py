"""A fault agent: a child process that fails or restores a link on cue, timed exactly.

Why it exists: the moment of a fault must be known to the microsecond to measure recovery,
and the fault must not stall the transfer it disturbs. Done in the requester's own loop, a
netlink request (about 2 ms, as the kernel flushes routes) blocks sending; done in another
thread, it waits for the GIL. So a child process holds a netlink socket opened in the
node's namespace and acts when told; it reports when its request started and returned
(CLOCK_MONOTONIC, shared by all processes). Recorded in the fabric's journal; dies with
its parent.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

from ..fabric import netns, registry
from ..fabric.build import load_topology
from ..fabric.nodes import FabricSetupError
from .transfer import _die_with_parent


def _agent(conn, ns_path: str, intf: str, extra: dict) -> None:
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from pyroute2 import IPRoute

    fd = os.open(ns_path, os.O_RDONLY)
    netns.setns(fd)
    os.close(fd)
    with IPRoute() as ipr:
        (index,) = ipr.link_lookup(ifname=intf)
        conn.send("ready")
        while True:
            action = conn.recv()
            if action == "quit":
                return
            began = time.monotonic_ns()
            try:
                if action in extra:
                    extra[action]()
                else:
                    ipr.link("set", index=index, state=action)
            except Exception as exc:  # reported to the parent, which raises it
                conn.send(("error", began, f"{type(exc).__name__}: {exc}"))
                continue
            conn.send((action, began, time.monotonic_ns()))


class LinkFaultAgent:
    """Takes a's end of the link a-b down (`trigger("down")`) or up, from its own process.

    `extra` maps more action names to callables, run in the agent (e.g. a blackhole by nft).
    """

    def __init__(self, name: str, a: str, b: str, extra: dict | None = None) -> None:
        topo = load_topology(name)
        links = topo.links_between(a, b)
        if len(links) != 1:
            raise FabricSetupError(f"expected one link between {a} and {b}, found {len(links)}")
        (link,) = links
        intf = link.a_intf if link.a == a else link.b_intf
        self.name = name
        ctx = multiprocessing.get_context("fork")
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_agent, args=(child_conn, str(netns.netns_path(name, a)), intf, extra or {}),
                                 daemon=True)
        self._proc.start()
        with registry.Journal.open(name) as journal:
            journal.process(self._proc.pid, f"fault agent for {a}-{b}")
        if not self._conn.poll(10) or self._conn.recv() != "ready":
            self.close()
            raise FabricSetupError(f"the fault agent for {a}-{b} did not start")
        self.results: list[tuple[str, int, int]] = []

    def trigger(self, action: str) -> None:
        """Ask for 'down' or 'up'; returns at once (the request is made in the agent)."""
        self._conn.send(action)

    def wait(self, timeout: float = 10.0) -> tuple[str, int, int]:
        """(action, monotonic ns when the request started, when it returned)."""
        if not self._conn.poll(timeout):
            raise FabricSetupError("the fault agent did not answer")
        result = self._conn.recv()
        if result[0] == "error":
            raise FabricSetupError(f"the fault failed: {result[2]}")
        self.results.append(result)
        return result

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send("quit")
            except OSError:
                pass
            self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        with registry.Journal.open(self.name) as journal:
            journal.process_ended(self._proc.pid)

    def __enter__(self) -> LinkFaultAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
