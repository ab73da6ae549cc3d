"""A fault agent: a child process that fails or restores a link on cue, timed exactly.

Why it exists: the moment of a fault must be known to the microsecond to measure recovery,
and the fault must not stall the transfer it disturbs. Done in the requester's own loop, a
netlink request (about 2 ms, as the kernel flushes routes) blocks sending; done in another
thread, it waits for the GIL. So a child process holds the link helper's netlink sockets,
opened in the nodes' namespaces with their requests encoded in advance (fabric/links.py),
and acts when told; it reports when its request started and returned (CLOCK_MONOTONIC,
shared by all processes). Recorded in the fabric's journal; dies with its parent.
"""

from __future__ import annotations

import multiprocessing
import select
import signal
import time

from ..fabric import links as link_state
from ..fabric import netns, xdp
from ..fabric.nodes import FabricSetupError
from ..fabric.running import Fabric
from .transfer import _die_with_parent, stop_child


def _agent(conn, fabric: Fabric, link, a: str, extra: dict) -> None:
    """The link a-b's fault agent; "down" and "up" through the link helper, encoded now."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from pyroute2 import IPRoute

    switch = link_state.LinkSwitch(fabric, [link], at=a)
    sockets = []
    for node, intf in ((link.a, link.a_intf), (link.b, link.b_intf)):
        with netns.entered(fabric.node_path(node)):  # a netlink socket stays in the namespace it was opened in
            ipr = IPRoute()
        sockets.append((ipr, ipr.link_lookup(ifname=intf)[0]))
    state_of = {"down": switch.down, "up": switch.up}
    # The dropping program is attached to both ends from the start (drop fraction 0): the
    # first generic XDP program switches a static key, which stalls every CPU, and swapping
    # programs waits for RCU. Done now, before any transfer runs, a fault is one map write.
    dropper = xdp.Dropper()
    for ipr, index in sockets:
        xdp.attach(ipr, index, dropper.prog_fd)
    conn.send("ready")
    while True:
        action = conn.recv()
        if action == "quit":
            break
        if action.startswith("after:"):  # "after:<ms>:<action>": the fault's own schedule
            _, ms, action = action.split(":", 2)
            select.select([], [], [], float(ms) / 1000)
        try:
            began = time.monotonic_ns()
            if action in extra:
                extra[action]()
            elif action.startswith("xdp:"):  # drop this fraction on both ends' ingress
                dropper.set(float(action[4:]))
            elif action == "xdp-off":
                dropper.set(0.0)
            elif action in state_of:  # "down" at a's end; "up" at both, with the configuration
                state_of[action]()
            else:
                raise ValueError(f"unknown fault action {action!r}")
        except Exception as exc:  # reported to the parent, which raises it
            conn.send(("error", time.monotonic_ns(), f"{type(exc).__name__}: {exc}"))
            continue
        conn.send((action, began, time.monotonic_ns()))
    for ipr, index in sockets:
        try:
            xdp.attach(ipr, index, -1)
        except OSError:
            pass  # the interface is gone with its namespace
        ipr.close()
    switch.close()
    dropper.close()


class LinkFaultAgent:
    """Faults on the link a-b from its own process: 'down' (a's end), 'up' (both ends, with their
    configuration), 'xdp:<fraction>' (drop that fraction on both ends' ingress: 1 is a blackhole), 'xdp-off'.

    `extra` maps more action names to callables, run in the agent (a switch reboot, a flap).
    """

    def __init__(self, fabric: Fabric, a: str, b: str, extra: dict | None = None) -> None:
        links = fabric.topology.links_between(a, b)
        if len(links) != 1:
            raise FabricSetupError(f"expected one link between {a} and {b}, found {len(links)}")
        self.fabric = fabric
        ctx = multiprocessing.get_context("fork")
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_agent, args=(child_conn, fabric, links[0], a, extra or {}),
                                 daemon=True)
        self._proc.start()
        fabric.journal.process(self._proc.pid, f"fault agent for {a}-{b}")
        if not self._conn.poll(10) or self._conn.recv() != "ready":
            self.close()
            raise FabricSetupError(f"the fault agent for {a}-{b} did not start")
        self.results: list[tuple[str, int, int]] = []
        self._sent = 0
        self._failed = 0

    def trigger(self, action: str) -> None:
        """Ask for 'down', 'up', an extra action, or 'after:<ms>:<action>'; returns at once."""
        self._conn.send(action)
        self._sent += 1

    def pending(self) -> int:
        """Actions asked for whose answer has not been read yet."""
        return self._sent - len(self.results) - self._failed

    def wait(self, timeout: float = 10.0) -> tuple[str, int, int]:
        """(action, monotonic ns when the request started, when it returned)."""
        if not self._conn.poll(timeout):
            raise FabricSetupError("the fault agent did not answer")
        result = self._conn.recv()
        if result[0] == "error":
            self._failed += 1
            raise FabricSetupError(f"the fault failed: {result[2]}")
        self.results.append(result)
        return result

    def close(self) -> None:
        stop_child(self.fabric, self._proc, self._conn, "quit")

    def __enter__(self) -> LinkFaultAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
