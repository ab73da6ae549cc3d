"""The socket driver: a QP's frames over a raw IPv6 socket, datagrams in from UDP port 4791.

Why it exists: inside a fabric namespace the transport's frames must become real packets.
`SocketLink` sends each whole frame (outer IPv6, SRH, inner IPv6, UDP, RoCE) through a raw
socket, routed by the frame's outer destination (the path's first hop), and hands the
datagrams a UDP socket on [address]:4791 receives to an endpoint; the kernel has checked
each one's UDP checksum. The worker's event loop (loop.py) drives many such links at once.
The sockets are created by the caller inside the host's namespace (fabric.ops). Where the C
extension is built, `send` is its Sender (_sockio.c): the same sendto and the same meaning of
each failure, without the interpreter's call and address parsing per frame; its `send_many`
lets the requester's C send loop hand over a batch of frames in one sendmmsg.
"""

from __future__ import annotations

import errno
import socket
import sys
from collections.abc import Callable

from ..transport.multipath.paths import Endpoint, Path

try:  # sendto per frame from C (optional; see _sockio.c)
    from . import _sockio
except ImportError:  # pragma: no cover - the extension was not built
    _sockio = None

RECV_BUFFER = 16 * 1024 * 1024
# the raw socket's send buffer: every frame waiting in the host port's queues (TBF under time
# dilation) is charged to it, and at the kernel's default (208 KiB) a QP's NSCC window of 1.5 NIC
# BDPs (150 KB on `incast` with a 1 ms base RTT) filled it: the worker's sendto then blocked, and
# every host it serves with it (a 16-host ring at K = 16: loop lag p50 640 us at 5 % CPU, each
# flow 3.2 times slower than the model); a NIC holds its window's frames, the qdisc's limit
# decides what is lost
SEND_BUFFER = 16 * 1024 * 1024
# what a failed send means; the C Sender (_sockio.c PORT_DOWN, QUEUE_FULL) reads the same errnos
PORT_DOWN_ERRNOS = (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.EINVAL)  # the host's own port is down
QUEUE_FULL_ERRNOS = (errno.ENOBUFS, errno.EAGAIN)  # lost at the host, as in a full NIC queue
_CMSG_SPACE = socket.CMSG_SPACE(4) + socket.CMSG_SPACE(20)  # IPV6_TCLASS (an int), IPV6_PKTINFO (in6_pktinfo)


class SocketLink:
    """A raw IPv6 socket that sends whole frames and a UDP socket on [address]:4791 that receives.

    Both must have been created inside the host's namespace (see fabric.ops); this class
    only uses them. The kernel checks each arriving UDP checksum and counts failures.
    """

    def __init__(self, send_sock: socket.socket, recv_sock: socket.socket, c_send: bool = True,
                 ports_by_ifindex: dict[int, int] | None = None) -> None:
        """`c_send`: send through the C Sender when it is built (False: the Python `send`).
        `ports_by_ifindex`: interface index -> the host's 1-based port, for each datagram's
        arrival port (IPV6_PKTINFO; 0 when not known)."""
        self.send_sock = send_sock
        self.recv_sock = recv_sock
        self.ports_by_ifindex = ports_by_ifindex or {}
        recv_sock.setblocking(False)
        for option in (socket.IPV6_RECVTCLASS, socket.IPV6_RECVPKTINFO):  # traffic class, arrival interface
            try:
                recv_sock.setsockopt(socket.IPPROTO_IPV6, option, 1)
            except OSError:
                pass
        self._send_errors = 0
        self.errors: dict[str, int] = {}  # failed sends by errno name
        self._frames_sent = 0
        self._packed: dict[str, bytes] = {}
        self._addresses: dict[str, tuple[str, int]] = {}  # first hop -> what sendto takes, built once
        self._sendto = send_sock.sendto
        self._sender = _sockio.Sender(send_sock.fileno(), self.errors) if c_send and _sockio is not None else None
        if self._sender is not None:
            self.send = self._sender  # the same contract as the method below

    @property
    def frames_sent(self) -> int:
        return self._frames_sent + (self._sender.frames_sent if self._sender is not None else 0)

    @property
    def send_errors(self) -> int:
        return self._send_errors + (self._sender.send_errors if self._sender is not None else 0)

    def send(self, frame: bytes | bytearray, path: Path) -> bool:
        """Send one whole frame to the path's first hop. False: it cannot leave this host (the
        host's own port of that plane is down); True: sent, or lost at the host as in a full NIC
        queue. Other errors raise."""
        address = self._addresses.get(path.first_hop)
        if address is None:
            address = self._addresses[path.first_hop] = (path.first_hop, 0)
        try:
            self._sendto(frame, address)
            self._frames_sent += 1
            return True
        except OSError as e:
            self._send_errors += 1
            name = errno.errorcode.get(e.errno, str(e.errno))
            self.errors[name] = self.errors.get(name, 0) + 1
            if e.errno in PORT_DOWN_ERRNOS:
                return False  # the host's own port of that plane is down
            if e.errno in QUEUE_FULL_ERRNOS:
                return True  # dropped locally, like a full NIC queue: loss recovery handles it
            raise

    def receive(self, endpoint: Endpoint, now_ns: Callable[[], int], budget: int = 32) -> int:
        """Hand up to `budget` waiting datagrams to the endpoint; how many there were.

        The driver pumps the endpoint between batches, and a responder sends its ACKs only when
        pumped: the budget bounds how many packets an ACK can wait for (a larger one made the
        goodput bursty: docs/transport.md, Responder)."""
        recv = self.recv_sock.recvmsg
        packed = self._packed
        n = 0
        while n < budget:
            try:
                data, ancillary, _flags, addr = recv(65535, _CMSG_SPACE)
            except BlockingIOError:
                break
            src = packed.get(addr[0])
            if src is None:
                src = packed[addr[0]] = socket.inet_pton(socket.AF_INET6, addr[0])
            tclass = port = 0
            for level, kind, value in ancillary:
                if level == socket.IPPROTO_IPV6 and kind == socket.IPV6_TCLASS and len(value) >= 4:
                    tclass = int.from_bytes(value[:4], sys.byteorder) & 0xFF
                elif level == socket.IPPROTO_IPV6 and kind == socket.IPV6_PKTINFO and len(value) >= 20:
                    port = self.ports_by_ifindex.get(int.from_bytes(value[16:20], sys.byteorder), 0)
            endpoint.on_datagram(data, src, addr[1], now_ns(), tclass, port)
            n += 1
        return n


UDP_NO_CHECK6_RX = 102  # linux/udp.h: take IPv6 datagrams that carry no UDP checksum (zero)


SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33  # asm-generic/socket.h: past the system's limit (root)


def _set_buffer(sock: socket.socket, force: int, plain: int, size: int) -> None:
    """A socket buffer of `size` bytes: forced past net.core's limit where root, else as allowed."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, force, size)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, plain, size)


def raw_sender(buffer: int = SEND_BUFFER) -> socket.socket:
    """A raw IPv6 socket that sends whole frames, with a send buffer of `buffer` bytes (SEND_BUFFER:
    the host's queues, not the socket, decide when a frame cannot leave). Call it inside the
    host's namespace."""
    sock = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
    _set_buffer(sock, SO_SNDBUFFORCE, socket.SO_SNDBUF, buffer)
    return sock


def udp_receiver(address: str, port: int = 4791, buffer: int = RECV_BUFFER) -> socket.socket:
    """A UDP socket bound to the host address on the RoCEv2 port, with a large receive buffer
    (`buffer` bytes), that takes datagrams with a zero UDP checksum too: a RoCEv2 sender over IPv6
    may send none, the ICRC covering the packet (rdma_rxe does; the kernel would drop them else,
    docs/interop.md). Call it inside the host's namespace."""
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_RX, 1)
    _set_buffer(sock, SO_RCVBUFFORCE, socket.SO_RCVBUF, buffer)
    sock.bind((address, port))
    return sock
