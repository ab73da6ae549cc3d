"""Named network namespaces made directly, as `ip netns add` makes them: no process per node.

Why it exists: a fabric of a thousand nodes needs a thousand namespaces. Mininet starts a
shell per node (mnexec, a pty, a prompt to wait for), and leaves a process per node to stop.
This thread instead calls unshare(CLONE_NEWNET), writes the namespace's sysctls while it is
inside (no extra switch), bind-mounts /proc/thread-self/ns/net onto the name and goes home, and
nothing keeps running: the name alone holds it (docs/scale.md has what each costs a node).

It never journals: the caller records each path before calling `create` (registry.py's
discipline), so a crash at any point leaves only names the journal holds. If anything fails
or is interrupted midway, this thread is back in its own namespace before the error leaves.
"""

from __future__ import annotations

import ctypes
import os
import resource
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from . import netns

_libc = ctypes.CDLL(None, use_errno=True)
_SELF = b"/proc/thread-self/ns/net"


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def create(path: Path, sysctls: Iterable[tuple[str, str | int]] = ()) -> None:
    """A new network namespace named at `path` (which must not exist), with `sysctls` already set."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o444))  # the mount point
    home = os.open(_SELF, os.O_RDONLY)
    try:
        try:
            _check(_libc.unshare(netns.CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            for name, value in sysctls:
                netns.write_sysctl(name, value)
            _check(_libc.mount(_SELF, str(path).encode(), None, netns.MS_BIND, None), f"bind-mount {path}")
        finally:
            netns.setns(home)  # also when unshare never ran: entering our own namespace is a no-op
    finally:
        os.close(home)


def _room_for(count: int) -> None:
    """Raise the soft limit of open files so that `count` more fit (it is often 1,024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            raise OSError(f"{count} namespaces need {wanted} open files, the hard limit is {hard}: "
                          f"raise it (ulimit -Hn, or LimitNOFILE=)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def open_all(paths: Iterable[Path]) -> list[int]:
    """An fd per namespace (for netlink's IFLA_NET_NS_FD), raising the soft fd limit if it is short."""
    paths = list(paths)
    _room_for(len(paths))
    fds: list[int] = []
    try:
        for path in paths:
            fds.append(os.open(path, os.O_RDONLY))
    except BaseException:
        close_all(fds)
        raise
    return fds


def close_all(fds: Iterable[int]) -> None:
    for fd in fds:
        os.close(fd)


@contextmanager
def held(paths: Iterable[str | Path]) -> Iterator[None]:
    """Hold every namespace at `paths` open for the body (that removes their names), then let go
    of all at once. Released one by one, each namespace's teardown ran in the kernel while the
    next names were being unmounted and slowed every umount (down of `huge` with its static
    routes: 5.3 s); released together, the kernel tears them all down in one batch afterwards."""
    paths = list(paths)
    _room_for(len(paths))
    fds = []
    for path in paths:
        try:
            fds.append(os.open(path, os.O_RDONLY))
        except OSError:
            pass  # already gone, or never made: nothing to hold
    try:
        yield
    finally:
        close_all(fds)
