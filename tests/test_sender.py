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


def _in_own_namespace(c_send: bool) -> dict:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a namespace of its own, then the sends
        try:
            os.close(read)
            if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "unshare")
            raw = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
            link = sockets.SocketLink(raw, socket.socket(socket.AF_INET6, socket.SOCK_DGRAM), c_send=c_send)
            subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
            path, nowhere = SimpleNamespace(first_hop="::1"), SimpleNamespace(first_hop="2001:db8::1")
            down = [link.send(_frame("2001:db8::1"), nowhere), link.send(bytearray(_frame("2001:db8::1")), nowhere)]
            up = [link.send(_frame("::1"), path) for _ in range(3)]
            out = {"down": down, "up": up, "frames_sent": link.frames_sent, "send_errors": link.send_errors,
                   "errors": dict(link.errors), "is_c": isinstance(link.send, sockets._sockio.Sender)}
            try:  # (Python's sendto counts its resolver's error as well; C refuses the hop before any send)
                link.send(_frame("::1"), SimpleNamespace(first_hop="not-an-address"))
            except (ValueError, OSError) as e:
                out["bad"] = type(e).__name__
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out = {"failed": repr(e)}
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        out = json.loads(f.read())
    os.waitpid(pid, 0)
    return out


def test_the_c_sender_answers_and_counts_as_the_python_send_does():
    with_c, without_c = _in_own_namespace(True), _in_own_namespace(False)
    assert "failed" not in with_c and "failed" not in without_c, (with_c, without_c)
    assert with_c.pop("is_c") and not without_c.pop("is_c")
    assert with_c["down"] == [False, False] and with_c["up"] == [True, True, True]
    assert with_c["errors"] == {"ENETUNREACH": 2} and with_c["frames_sent"] == 3 and with_c["send_errors"] == 2
    bad_c, bad_py = with_c.pop("bad"), without_c.pop("bad")
    assert bad_c and bad_py  # a first hop that is no address is refused either way
    assert with_c == without_c
