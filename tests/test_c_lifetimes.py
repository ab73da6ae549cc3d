"""The C extensions against Python code that pulls objects from under them: no crash, no stale memory.

Each case is one the C code once got wrong: an object it used without owning while Python code
ran (a callback of the send loop, another thread while the GIL was released), a C attribute
deleted, a type used before its __init__, a datagram cut short by the kernel. The cases that
crashed the interpreter run in a child interpreter, so that a crash fails one test, not the run.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from mrc_emu.io import sockets as sockets_module
from mrc_emu.transport import requester as requester_module
from mrc_emu.transport import responder as responder_module

REPO = Path(__file__).resolve().parents[1]
needs_spray = pytest.mark.skipif(requester_module._spray is None, reason="mrc_emu.transport._spray is not built")
needs_place = pytest.mark.skipif(responder_module._place is None, reason="mrc_emu.transport._place is not built")
needs_sockio = pytest.mark.skipif(sockets_module._sockio is None, reason="mrc_emu.io._sockio is not built")


def _child(code: str) -> list[str]:
    """Run `code` in a fresh interpreter of this checkout; the lines it printed. It must not crash."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, f"the child interpreter ended with {done.returncode}: {done.stderr[-3000:]}"
    return done.stdout.splitlines()


# the C send loop called directly: one EV, a WRITE of full packets, frames through a Python `send`
_SPRAY = """
    from types import SimpleNamespace
    from mrc_emu.topology import builtin
    from mrc_emu.transport import _spray
    from mrc_emu.transport.multipath.paths import qp_paths
    from mrc_emu.transport.sent import SentPackets

    MTU = 1024
    heads = {0: qp_paths(builtin(), "h0", "h2").forward[0].template.head(0x22, MTU)}

    class Hop:  # a path as the send loop sees it: handed to `send`, never read
        pass

    def spray(packets, send, schedule, paths):
        wr = SimpleNamespace(local=bytes(packets * MTU), remote_va=0x1000, rkey=7, imm=None, length=packets * MTU,
                             next_offset=0, acked=0)
        return _spray.spray(SentPackets([0]), heads, paths, MTU, wr, send, 0, 0, 1 << 20, len(schedule), 0, 1e12,
                            schedule, 0, None, None, 0)  # no clock, no CC, no periodic AckReq
"""


@needs_spray
def test_the_send_loop_owns_the_paths_it_hands_to_send():
    """`send` replaces the path in `paths`: the loop's later frames of the batch still get the old
    one, alive (it was a dangling pointer, freed when the first send returned)."""
    lines = _child(_SPRAY + """
    import weakref
    paths = {0: Hop()}
    first = weakref.ref(paths[0])
    alive = []
    def send(frame, path):
        alive.append(first() is not None and path is first())
        paths[0] = Hop()
        return True
    sent = spray(4, send, [0] * 4, paths)[0]
    print(sent, all(alive), len(alive))
    """)
    assert lines == ["4 True 4"]


@needs_spray
def test_the_send_loop_stops_at_a_schedule_its_send_shortened():
    """The schedule's length is read again for each batch (it was read once: an emptied list was
    read past its end, a segfault)."""
    lines = _child(_SPRAY + """
    schedule = [0] * 40
    def send(frame, path):
        schedule.clear()
        return True
    print(spray(40, send, schedule, {0: Hop()})[0])
    """)
    assert lines == ["16"]  # the first batch (BATCH frames) was planned before the schedule was emptied


@needs_spray
def test_a_template_cannot_be_resized_while_the_send_loop_encodes_from_it():
    lines = _child(_SPRAY + """
    def send(frame, path):
        heads[0][0].extend(b"more")  # the template's bytearray, which the next batch copies
        return True
    try:
        spray(40, send, [0] * 40, {0: Hop()})
    except BufferError as e:
        print("BufferError", e)
    """)
    assert len(lines) == 1 and lines[0].startswith("BufferError")


@needs_spray
def test_the_send_loop_refuses_to_be_entered_again_from_its_own_send():
    """A second call would overwrite the slots of the first one's batch, not yet sent."""
    lines = _child(_SPRAY + """
    def send(frame, path):
        spray(1, lambda frame, path: True, [0], {0: Hop()})
        return True
    try:
        spray(2, send, [0] * 2, {0: Hop()})
    except RuntimeError as e:
        print("RuntimeError", e)
    """)
    assert len(lines) == 1 and lines[0].startswith("RuntimeError")


@needs_spray
@needs_sockio
def test_the_send_loop_refuses_a_batch_sender_of_another_object():
    """send_many's function takes its sender as the C Sender that made it: a wrapper that lends
    another object's capsule was cast to one (a crash)."""
    lines = _child(_SPRAY + """
    import socket
    from mrc_emu.io import _sockio
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sender = _sockio.Sender(sock.fileno(), {})
    class Lending:
        send_many = property(lambda self: sender.send_many)
        def __call__(self, frame, path):
            return True
    try:
        spray(2, Lending(), [0] * 2, {0: Hop()})
    except TypeError as e:
        print("TypeError", e)
    """)
    assert lines == ["TypeError send.send_many is another object's batch sender"]


# a responder with the C placement, and one valid data packet for its QP
_PLACE = """
    import random, socket, struct
    from mrc_emu.topology import builtin
    from mrc_emu.transport.config import QpConfig
    from mrc_emu.transport.multipath.paths import qp_paths
    from mrc_emu.transport.responder import Responder
    from mrc_emu.wire import format as fmt
    from mrc_emu.wire import headers
    from mrc_emu.wire.decoder import open_frame

    PATHS = qp_paths(builtin(), "h0", "h2")
    SRC, DST = (socket.inet_pton(socket.AF_INET6, a) for a in (PATHS.src_address, PATHS.dst_address))
    responder = Responder(DST, QpConfig(mtu=256), random_bits=random.Random(1).getrandbits)
    mr = responder.register(bytearray(4096))
    responder.accept(0x22, 0x11, 0, PATHS.back)
    qp = responder.qps[0x22]
    opened = open_frame(PATHS.forward[0].template.data(fmt.DataPacket(0x22, 0, mr.va, mr.rkey, b"x" * 256)))
    payload, sport = bytes(opened.payload), opened.sport
"""


@needs_place
@pytest.mark.parametrize("name", ["peer", "pending_imm", "ce_counts"])
def test_a_qp_attribute_the_c_placement_reads_cannot_be_deleted(name):
    """A deletion left NULL where the placement looks at every packet: the next one crashed it."""
    lines = _child(_PLACE + f"""
    try:
        del qp.{name}
    except TypeError as e:
        print("refused:", e)
    print(responder._place(payload, SRC, sport, 0, fmt.TCLASS_DATA | fmt.ECN_CE))
    """)
    assert lines == [f"refused: a QP's {name} cannot be deleted (the C placement reads it at every packet)", "True"]


@needs_place
def test_a_placer_made_without_init_raises_instead_of_reading_its_missing_tables():
    """Placer.__new__ alone leaves its tables NULL; a packet that gets as far as its QP table (its
    ICRC right for the Placer's zero address and port) dereferenced them."""
    lines = _child(_PLACE + """
    from mrc_emu.transport._place import Placer
    roce = payload[:-4]
    forged = roce + struct.pack("<I", headers.icrc(SRC, bytes(16), sport, 0, roce))
    try:
        Placer.__new__(Placer).place(forged, SRC, sport, 0)
    except TypeError as e:
        print("TypeError", e)
    """)
    assert len(lines) == 1 and lines[0].startswith("TypeError a Placer made without its tables")


@needs_sockio
def test_send_loop_holds_its_frames_while_it_sends_without_the_gil():
    """send_loop releases the GIL for its sendmmsg loop; another thread that empties the list of
    frames meanwhile must not free them under it. Over TCP on loopback with small buffers, the
    loop blocks until this thread reads: data arriving means it is inside that loop."""
    frees = threading.Event()

    class Frame(bytes):
        def __del__(self) -> None:
            frees.set()

    listener = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    listener.bind(("::1", 0))
    listener.listen(1)
    client = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    client.connect(listener.getsockname())
    server, _ = listener.accept()
    frames, count = [Frame(b"f" * 1000)], 2000  # 2 MB: far more than the buffers hold
    addrs = [socket.inet_pton(socket.AF_INET6, "::1")]
    result = {}
    sender = threading.Thread(target=lambda: result.update(
        sent=sockets_module._sockio.send_loop(client.fileno(), frames, addrs, count, 16)))
    sender.start()
    try:
        assert select.select([server], [], [], 30)[0], "send_loop sent nothing"
        frames.clear()  # the list's reference is gone; the loop's own must remain
        freed_while_sending = frees.is_set()
        received = bytearray()
        deadline = time.monotonic() + 60
        while len(received) < count * 1000 and time.monotonic() < deadline:
            received += server.recv(1 << 16)
    finally:
        sender.join(60)
        for s in (server, client, listener):
            s.close()
    assert not freed_while_sending
    assert result["sent"] == count and bytes(received) == b"f" * (count * 1000)
    assert frees.is_set()  # and released once it returned


@needs_sockio
def test_recv_batch_drops_and_counts_a_datagram_longer_than_its_slots():
    """A datagram beyond SLOT_BYTES (9216) comes back with MSG_TRUNC: it was handed on cut to
    9216 bytes as if whole."""
    rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    rx.bind(("::1", 0))
    tx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sockets_module._sockio.enable_stamps(rx.fileno())
    tx.sendto(b"j" * 10_000, rx.getsockname())
    tx.sendto(b"whole", rx.getsockname())
    drops: dict[str, int] = {}
    got = []
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        select.select([rx], [], [], 1)
        got += sockets_module._sockio.recv_batch(rx.fileno(), 8, drops)
    rx.close()
    tx.close()
    assert [item[0] for item in got] == [b"whole"] and drops == {"truncated": 1}
