"""A fault agent: a child process that fails or restores a link on cue, timed exactly.

Why it exists: the moment of a fault must be known to the microsecond to measure recovery,
and the fault must not stall the transfer it disturbs. Done in the requester's own loop, a
netlink request (about 2 ms, as the kernel flushes routes) blocks sending; done in another
thread, it waits for the GIL. So a child process holds a netlink socket opened in the
node's namespace, with its requests encoded in advance, and acts when told; it reports when
its request started and returned (CLOCK_MONOTONIC, shared by all processes). Recorded in the fabric's journal; dies with
its parent.
"""

from __future__ import annotations

import multiprocessing
import select
import signal
import socket
import time

from ..fabric import netlink, netns, registry, xdp
from ..fabric.build import load_topology
from ..fabric.nodes import FabricSetupError
from .transfer import _die_with_parent, stop_child


def _agent(conn, ends: list[tuple[str, str]], extra: dict) -> None:
    """ends: (namespace path, interface) of both ends of the link; a's first."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from pyroute2 import IPRoute

    sockets = []
    for path, intf in ends:  # a netlink socket stays in the namespace it was opened in
        with netns.entered(path):
            ipr = IPRoute()
            if not sockets:  # a's end: a bare netlink socket for "down" and "up"
                raw = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
                raw.bind((0, 0))
        sockets.append((ipr, ipr.link_lookup(ifname=intf)[0]))
    # "down" and "up" encoded now, so that a fault is the request's system calls alone: timed
    # from just before the kernel acts (pyroute2 spends 0.3-0.6 ms encoding one message)
    state_of = {}
    for state in ("down", "up"):
        state_of[state] = netlink.Batch()
        state_of[state].link_up(sockets[0][1], state == "up", f"{ends[0][1]} {state}")
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
            elif action in state_of:  # "down" / "up" of a's end
                state_of[action].send(raw)
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
    raw.close()
    dropper.close()


class LinkFaultAgent:
    """Faults on the link a-b from its own process: 'down'/'up' (a's end), 'xdp:<fraction>'
    (drop that fraction on both ends' ingress: 1 is a blackhole), 'xdp-off'.

    `extra` maps more action names to callables, run in the agent (a switch reboot, a flap).
    """

    def __init__(self, name: str, a: str, b: str, extra: dict | None = None) -> None:
        topo = load_topology(name)
        links = topo.links_between(a, b)
        if len(links) != 1:
            raise FabricSetupError(f"expected one link between {a} and {b}, found {len(links)}")
        (link,) = links
        _, intf_a, intf_b = topo.peer(link, a)
        ends = [(str(netns.netns_path(name, a)), intf_a), (str(netns.netns_path(name, b)), intf_b)]
        self.name = name
        ctx = multiprocessing.get_context("fork")
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_agent, args=(child_conn, ends, extra or {}),
                                 daemon=True)
        self._proc.start()
        with registry.Journal.open(name) as journal:
            journal.process(self._proc.pid, f"fault agent for {a}-{b}")
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
        stop_child(self.name, self._proc, self._conn, "quit")

    def __enter__(self) -> LinkFaultAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
