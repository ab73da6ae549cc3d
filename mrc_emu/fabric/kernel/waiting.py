"""Waiting: for a condition, with a deadline (`until`), or for a moment of a schedule (`pause_until`).

Why it exists: the kernel, FRR, tcpdump and child processes all get ready asynchronously
(carrier comes up up to a second after `ip link set up`, zebra creates its socket when it
likes, BGP converges session by session). Every such wait polls a condition until a
deadline and fails naming what did not happen; written once here, not as a loop per caller.
A fixed sleep instead of a condition is either too short on a loaded machine or wastes
time everywhere else, so nothing in the project sleeps to wait for something. The one
legitimate fixed wait is a schedule's own clock (a flap's half period, a fault's duration):
`pause_until` waits for a moment, not for an event.

Pure standard library: every layer may use it (the fabric, the experiments, the tests).
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """Something waited for did not happen before its deadline; the message says what."""


def until(condition: Callable[[], T], timeout: float, what: str | Callable[[], str], *,
          interval: float = 0.01, wake: Sequence[Any] = ()) -> T:
    """Return the first truthy value of `condition()`, checked until `timeout` seconds pass.

    `what` names the awaited thing in the error (a callable is asked at the deadline, so it can
    say what is still missing). `wake`: files or sockets whose readability may make the
    condition true; between checks the wait ends as soon as one is readable, instead of after
    `interval`. The condition may raise to give up early (a process that exited, say).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            detail = what() if callable(what) else what
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {detail}")
        select.select(list(wake), [], [], min(interval, left))


def pause_until(moment: float) -> None:
    """Wait until time.monotonic() reaches `moment`: a schedule's next step, not an event."""
    left = moment - time.monotonic()
    if left > 0:
        select.select([], [], [], left)
