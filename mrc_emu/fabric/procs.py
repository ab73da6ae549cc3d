"""Child processes of a running fabric: started, made ready and stopped one way.

Why it exists: transfers run their endpoints, and scenarios their fault agents, in child
processes (each gets a core of its own and acts in its own time, untouched by the GIL of
the parent). Every such child must: die with its parent (PR_SET_PDEATHSIG: a killed run
leaves no process behind), ignore Ctrl-C (the parent handles it and stops its children in
order), be in the fabric's journal before it runs (so `clean` can kill it after a crash)
and be recorded as ended when it is, tell its parent whether it is ready or why it could
not start, within a deadline, and stop when asked (a farewell, then SIGKILL if it does not
leave in time). `Child` does all of that for any target function; what a child does and
which messages it understands (dataclasses, sent over a pipe) is the target's business,
so one child may as well serve the sockets of many hosts as of one.

Never imports the transport: the fabric layer only knows processes, pipes and the journal.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.connection
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .kernel.waiting import WaitTimeout, until
from .running import Fabric

PR_SET_PDEATHSIG = 1
M = TypeVar("M")


class ChildError(RuntimeError):
    """A child process did not start, reported a failure, died, or did not answer in time."""


@dataclass(frozen=True)
class Ready:
    """From the child: set up, serving requests from now on (`detail`: whatever it reports)."""

    detail: Any = None


@dataclass(frozen=True)
class Failed:
    """From the child: it could not start, or what it was doing raised; it has ended."""

    error: str


@dataclass(frozen=True)
class Stop:
    """To the child, the farewell: finish, send what you owe, and exit."""


@dataclass(frozen=True)
class _Recorded:
    """To the child: your pid is in the journal, you may start."""


class Parent:
    """The child's end of the pipe to its parent."""

    def __init__(self, conn: multiprocessing.connection.Connection) -> None:
        self._conn = conn

    def send(self, message: Any) -> None:
        self._conn.send(message)

    def recv(self) -> Any:
        return self._conn.recv()

    def poll(self, timeout: float = 0.0) -> bool:
        return self._conn.poll(timeout)

    def fileno(self) -> int:
        return self._conn.fileno()

    def ready(self, detail: Any = None) -> None:
        self._conn.send(Ready(detail))


def _die_with_parent(parent_pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl: nobody will signal us
        os._exit(1)


def _child_main(conn, parent_pid: int, cpu: int | None, target: Callable[..., None], args: tuple) -> None:
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and tells us to stop
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    try:
        if not isinstance(conn.recv(), _Recorded):
            return
        target(Parent(conn), *args)
    except BaseException as exc:  # reported to the parent, which raises it
        try:
            conn.send(Failed(f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass


class Child:
    """The parent's handle on one child process running `target(parent, *args)`.

    The target must call `parent.ready()` once it is set up; anything it raises reaches the
    parent as a `ChildError`. Messages that arrive while the parent waits for another kind
    are kept, in order, for a later `expect` or `poll`.
    """

    def __init__(self, fabric: Fabric, what: str, target: Callable[..., None], args: tuple = (), *,
                 cpu: int | None = None, ready_timeout: float = 30.0, farewell: Any = None) -> None:
        self.fabric = fabric
        self.what = what
        self.farewell = Stop() if farewell is None else farewell
        ctx = multiprocessing.get_context("fork")
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=_child_main, name=f"mrc-emu {what}", daemon=True,
                                args=(child_conn, os.getpid(), cpu, target, args))
        self.proc.start()
        child_conn.close()
        self._inbox: list[Any] = []
        self._ended = False
        try:
            fabric.journal.process(self.proc.pid, what)
        except BaseException:
            self.proc.kill()
            self.proc.join()
            raise
        try:
            self.conn.send(_Recorded())
            self.ready = self.expect(Ready, ready_timeout, starting=True)
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def fileno(self) -> int:
        return self.conn.fileno()

    def send(self, message: Any) -> None:
        self.conn.send(message)

    def _read(self, starting: bool = False) -> Any:
        try:
            message = self.conn.recv()
        except EOFError:
            raise ChildError(f"{self.what} {'exited while starting' if starting else 'died'}") from None
        if isinstance(message, Failed):
            raise ChildError(f"{self.what} {'failed to start' if starting else 'failed'}: {message.error}")
        return message

    def poll(self, kind: type[M] | tuple[type, ...], where: Callable[[M], bool] | None = None) -> M | None:
        """A message of `kind` (and, given `where`, one it accepts) if one has arrived; the others
        are kept, in order. Never waits."""
        def wanted(message: Any) -> bool:
            return isinstance(message, kind) and (where is None or where(message))

        for i, message in enumerate(self._inbox):
            if wanted(message):
                return self._inbox.pop(i)
        while self.conn.poll():
            message = self._read()
            if wanted(message):
                return message
            self._inbox.append(message)
        return None

    def expect(self, kind: type[M] | tuple[type, ...], timeout: float = 30.0, *, starting: bool = False,
               where: Callable[[M], bool] | None = None) -> M:
        """The next message of `kind` (that `where` accepts, if given), within `timeout` seconds."""
        found: list[M] = []

        def arrived() -> bool:
            if starting:  # nothing is kept before Ready
                if self.conn.poll():
                    found.append(self._read(starting=True))
                return bool(found)
            message = self.poll(kind, where)
            if message is not None:
                found.append(message)
            return bool(found)

        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        try:
            until(arrived, timeout, f"{self.what} to answer ({names})", interval=1.0, wake=[self.conn])
        except WaitTimeout as exc:
            raise ChildError(str(exc)) from None
        if not isinstance(found[0], kind):
            raise ChildError(f"{self.what} sent {found[0]!r} before it was ready")
        return found[0]

    def stop(self, timeout: float = 5.0) -> None:
        """Say farewell, wait up to `timeout` seconds for it to leave, then kill it; journal its end."""
        if self._ended:
            return
        self._ended = True
        if self.proc.is_alive():
            try:
                self.conn.send(self.farewell)
            except OSError:
                pass  # it is on its way out already
            self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.fabric.journal.process_ended(self.proc.pid)
        self.conn.close()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

