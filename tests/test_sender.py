"""SocketLink.send in C (_sockio.Sender) against the Python method: the same answers and counts.

Needs root: each run is a child process in a network namespace of its own (unshare), with only
its loopback up: a frame to ::1 leaves, one to an address with no route fails as from a host
whose own port is down.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
from types import SimpleNamespace

import pytest

from mrc_emu.io import sockets

CLONE_NEWNET = 0x40000000
needs = [pytest.mark.skipif(os.getuid() != 0, reason="needs root (a network namespace of its own)"),
         pytest.mark.skipif(sockets._sockio is None, reason="the C extension mrc_emu.io._sockio is not built")]
pytestmark = needs


def _frame(dst: str) -> bytes:
    """An IPv6 packet with no next header (59): the kernel takes it and throws it away."""
    return bytes([0x60, 0, 0, 0, 0, 0, 59, 64]) + socket.inet_pton(socket.AF_INET6, "::1") + \
        socket.inet_pton(socket.AF_INET6, dst)


def _in_child_namespace(body) -> dict:
    """`body(link_for)` in a forked child, in a network namespace of its own with loopback up; the
    dict it returns comes back through a pipe. link_for(c_send): a SocketLink over a raw IPv6 socket."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "unshare")
            subprocess.run(["ip", "link", "set", "lo", "up"], check=True)

            def link_for(c_send: bool) -> sockets.SocketLink:
                raw = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
                return sockets.SocketLink(raw, socket.socket(socket.AF_INET6, socket.SOCK_DGRAM), c_send=c_send)

            out = body(link_for)
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out = {"failed": repr(e)}
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        out = json.loads(f.read())
    os.waitpid(pid, 0)
    return out


def _in_own_namespace(c_send: bool) -> dict:
    def body(link_for) -> dict:
        link = link_for(c_send)
        path, nowhere = SimpleNamespace(first_hop="::1"), SimpleNamespace(first_hop="2001:db8::1")
        down = [link.send(_frame("2001:db8::1"), nowhere), link.send(bytearray(_frame("2001:db8::1")), nowhere)]
        up = [link.send(_frame("::1"), path) for _ in range(3)]
        out = {"down": down, "up": up, "frames_sent": link.frames_sent, "send_errors": link.send_errors,
               "errors": dict(link.errors), "is_c": isinstance(link.send, sockets._sockio.Sender)}
        try:  # (Python's sendto counts its resolver's error as well; C refuses the hop before any send)
            link.send(_frame("::1"), SimpleNamespace(first_hop="not-an-address"))
        except (ValueError, OSError) as e:
            out["bad"] = type(e).__name__
        return out

    return _in_child_namespace(body)


def test_the_c_sender_answers_and_counts_as_the_python_send_does():
    with_c, without_c = _in_own_namespace(True), _in_own_namespace(False)
    assert "failed" not in with_c and "failed" not in without_c, (with_c, without_c)
    assert with_c.pop("is_c") and not without_c.pop("is_c")
    assert with_c["down"] == [False, False] and with_c["up"] == [True, True, True]
    assert with_c["errors"] == {"ENETUNREACH": 2} and with_c["frames_sent"] == 3 and with_c["send_errors"] == 2
    bad_c, bad_py = with_c.pop("bad"), without_c.pop("bad")
    assert bad_c and bad_py  # a first hop that is no address is refused either way
    assert with_c == without_c


def _spray_in_own_namespace(c_send: bool, c_loop: bool) -> dict:
    """A requester's first pumps through a SocketLink in a namespace of its own: every EV's first
    hop is ::1 but EV 2's, which has no route (its frames cannot leave, from the middle of a batch)."""
    import dataclasses
    import itertools
    import random

    from mrc_emu.topology import builtin
    from mrc_emu.transport.config import QpConfig
    from mrc_emu.transport.multipath.paths import qp_paths
    from mrc_emu.transport.requester import Requester

    def body(link_for) -> dict:
        link = link_for(c_send)
        qp = qp_paths(builtin(), "h0", "h2")
        paths = {ev: dataclasses.replace(p, first_hop="2001:db8::1" if ev == 2 else "::1")
                 for ev, p in qp.forward.items()}
        src = socket.inet_pton(socket.AF_INET6, qp.src_address)
        out = {}
        for clocked in (False, True):
            requester = Requester(src, 0x11, 0x22, paths, QpConfig(mtu=1024), c_loop=c_loop,
                                  random_bits=random.Random(2).getrandbits)
            requester.post_write(bytes(range(256)) * 800, 0x1000, 7)
            clock = itertools.count(5_000_000, 7_000).__next__ if clocked else None
            for i in range(6):
                requester.pump(1_000_000 + i, link.send, clock=clock)
            table = requester.recovery.sent
            record = {"pkts": sorted((p.psn, p.ev, p.offset, p.tx, p.sent_ns) for p in table.pkts.values()),
                      "flight": list(table.flight), "by_ev": {ev: list(q) for ev, q in table.by_ev.items()},
                      "bytes_in_flight": table.bytes_in_flight, "ev_flight": table.ev_flight,
                      "summary": requester.summary(), "events": [e.to_dict() for e in requester.ev_events],
                      "evs": [s.to_dict() for s in requester.profile.evs.values()]}
            out["clocked" if clocked else "virtual"] = record
        out.update(frames_sent=link.frames_sent, send_errors=link.send_errors, errors=dict(link.errors),
                   batched=c_loop and hasattr(link.send, "send_many"))
        return out

    return _in_child_namespace(body)


def test_the_batched_c_send_loop_leaves_what_sending_frame_by_frame_leaves():
    """sendmmsg from the C send loop (Sender.send_many) against the same loop through a Python
    send and against the requester's own loop: the same packets recorded, in flight and failed,
    when frames of one EV cannot leave from the middle of a batch."""
    batched, through_python, python_loop = (_spray_in_own_namespace(True, True), _spray_in_own_namespace(False, True),
                                            _spray_in_own_namespace(True, False))
    for run in (batched, through_python, python_loop):
        assert "failed" not in run, run
    assert batched.pop("batched") and not through_python.pop("batched") and not python_loop.pop("batched")
    virtual = batched["virtual"]
    assert virtual["summary"]["send_failures"] > 0 and set(batched["errors"]) == {"ENETUNREACH"}
    assert any(e["ev"] == 2 and "no route out of the host" in e["reason"] for e in virtual["events"])
    assert 2 in {p[1] for p in virtual["pkts"]} and virtual["summary"]["packets_sent"] > 32
    # without a clock every packet is stamped `now` alike; with one, frame by frame each gets its
    # own reading, and a batch all the one reading taken just before it was handed over
    for run in (through_python, python_loop):
        assert run["virtual"] == virtual
        assert run["clocked"]["flight"] == batched["clocked"]["flight"]
        stamps = [p[4] for p in run["clocked"]["pkts"]]
        assert len(set(stamps)) == len(stamps)
    stamps = [p[4] for p in sorted(batched["clocked"]["pkts"])]
    assert stamps == sorted(stamps) and len(set(stamps)) < len(stamps) / 4
    for run in (batched, through_python, python_loop):
        run.pop("clocked")
    assert batched == through_python == python_loop
