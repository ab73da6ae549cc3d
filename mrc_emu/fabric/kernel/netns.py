"""Network namespace primitives: enter one from a thread, drop a name under /run/netns.

Why it exists: configuring 320 namespaces by forking `ip netns exec` would take minutes;
entering a namespace with setns(2) from the current thread costs microseconds, and a
netlink socket or sysctl file opened there stays bound to that namespace. Uses libc
through ctypes (os.setns only exists from Python 3.12). Never removes a path it was
not given: callers pass only what the registry recorded.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CLONE_NEWNET = 0x40000000
MS_BIND = 0x1000
MNT_DETACH = 0x2
NETNS_DIR = Path("/run/netns")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def setns(fd: int) -> None:
    _check(_libc.setns(fd, CLONE_NEWNET), "setns")


def move_to(path: str | os.PathLike) -> None:
    """Put this thread in the network namespace at `path` for good (a child process that lives
    there); `entered` is the one that comes back."""
    fd = os.open(path, os.O_RDONLY)
    try:
        setns(fd)
    finally:
        os.close(fd)


def netns_path(fabric: str, node: str) -> Path:
    """Where a node's namespace is named, so that `ip netns exec <fabric>-<node>` works."""
    return NETNS_DIR / f"{fabric}-{node}"


@contextmanager
def entered(path: str | os.PathLike) -> Iterator[None]:
    """Run the body with this thread inside the network namespace at `path`."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(path, os.O_RDONLY)
    try:
        setns(target)
        try:
            yield
        finally:
            setns(home)
    finally:
        os.close(target)
        os.close(home)


def unbind(path: Path) -> None:
    """Drop the name; the namespace and its interfaces go when nothing else holds it."""
    if not path.exists():
        return
    if _libc.umount2(str(path).encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (22,):  # EINVAL: not a mount point (a crash between create and mount)
            raise OSError(err, f"umount {path}: {os.strerror(err)}")
    path.unlink(missing_ok=True)


def write_sysctl(name: str, value: str | int) -> None:
    """Set a sysctl of the namespace this thread is in: 'net.ipv6.conf.all.forwarding'."""
    with open("/proc/sys/" + name.replace(".", "/"), "w") as f:
        f.write(str(value))


def process_start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks, or None: tells a recorded process from a reused PID."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])
