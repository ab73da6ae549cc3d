"""The worker's event loop alone, over loopback UDP sockets (no root, no namespace)."""

import os
import socket
import time

import pytest

from mrc_emu.io import clock as clock_module
from mrc_emu.io import loop as lp
from mrc_emu.io import port as port_module

needs_sockio = pytest.mark.skipif(lp._sockio is None, reason="the C extension mrc_emu.io._sockio was not built")


class FakeTime:
    """The two clocks Clock reads, moved by hand: CLOCK_REALTIME is CLOCK_MONOTONIC + `offset`."""

    def __init__(self, mono_ns: int, offset_ns: int) -> None:
        self.mono_ns, self.offset_ns = mono_ns, offset_ns

    def monotonic_ns(self) -> int:
        return self.mono_ns

    def time_ns(self) -> int:
        return self.mono_ns + self.offset_ns


def test_clock_dilation_slows_time(monkeypatch):
    fake = FakeTime(mono_ns=5_000_000, offset_ns=0)
    monkeypatch.setattr(clock_module, "time", fake)
    clock = lp.Clock(dilation=4)
    before = clock.now()
    fake.mono_ns += 20_000_000
    assert clock.now() - before == 5_000_000  # 20 ms of wall time are 5 ms of the transport's
    assert clock.from_monotonic(fake.mono_ns) == clock.now()
    assert lp.Clock().from_monotonic(123) == 123  # undilated: monotonic time itself
    with pytest.raises(ValueError, match="at least 1"):
        lp.Clock(dilation=0.5)


def test_clock_maps_realtime_stamps_onto_its_own_time(monkeypatch):
    fake = FakeTime(mono_ns=7_000_000, offset_ns=1_700_000_000 * 10**9)
    monkeypatch.setattr(clock_module, "time", fake)
    clock = lp.Clock(dilation=2)
    fake.mono_ns += 4_000_000
    stamp = fake.time_ns()  # a kernel stamp taken now
    assert clock.from_realtime(stamp) == clock.now()
    assert clock.from_realtime(stamp - 2_000_000) == clock.now() - 1_000_000  # 2 ms earlier: 1 ms dilated
    fake.offset_ns += 3_000_000  # NTP stepped CLOCK_REALTIME: a resync follows it
    clock.resync()
    assert clock.from_realtime(fake.time_ns()) == clock.now()


def test_lag_meter_percentiles_bound_the_samples():
    m = lp.LagMeter()
    for us in [1] * 98 + [500, 20_000]:
        m.record(us * 1000)
    assert m.percentile_us(50) == 1.0
    assert 500 <= m.percentile_us(99) <= 1.25 * 500
    assert m.percentile_us(100) == 20_000  # never above the largest sample
    assert m.max_ns == 20_000_000
    merged = lp.LagMeter.from_dict(m.to_dict())
    merged.merge(m)
    assert merged.n == 200 and merged.percentile_us(99) == m.percentile_us(99)


def test_lag_buckets_hold_their_values_within_a_quarter():
    for us in list(range(0, 70)) + [127, 128, 129, 1000, 65_535, 10**6, 10**9]:
        bucket = lp.LagMeter._bucket(us)
        upper = lp.LagMeter._upper_us(bucket)
        assert us <= upper <= max(3, 1.25 * us), (us, bucket, upper)
        assert bucket == 0 or lp.LagMeter._upper_us(bucket - 1) < us


def test_horizon_is_the_slowest_worker_and_survives_fork():
    h = lp.Horizon(3)
    for i, t in enumerate([50, 20, 70]):
        h.publish(i, t)
    assert h.min() == 20
    pid = os.fork()
    if pid == 0:  # the child publishes; the parent must see it (shared memory, not a copy)
        h.publish(1, 90)
        os._exit(0)
    os.waitpid(pid, 0)
    assert h.min() == 50


class Echo:
    """An endpoint that counts datagrams and remembers the time it was handed each one."""

    def __init__(self) -> None:
        self.got: list[tuple[bytes, int]] = []
        self.pumps: list[tuple[int, int]] = []
        self.wake: int | None = None

    def on_datagram(self, payload, src, sport, now, tclass=0, port=0):
        self.got.append((bytes(payload), now))

    def pump(self, now, send, clock=None, horizon=None):
        self.pumps.append((now, horizon))

    def next_wakeup(self):
        return self.wake


class OneMux:
    """Routes every datagram to one endpoint."""

    def __init__(self, endpoint):
        self.endpoint = endpoint

    def route(self, payload):
        return self.endpoint


def _loop(echo, clock, horizon=None, index=0):
    rx, tx = _pair()
    loop = lp.EventLoop(clock, horizon, index)
    port = lp.Port("h0", tx, rx, OneMux(echo))
    loop.add_port(port)
    loop.add_endpoint(echo, port)
    loop.measure(True)
    return loop, rx, tx


def _pair():
    rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    rx.bind(("::1", 0))
    tx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    return rx, tx


def _until_the_kernel_stamps(rx, tx, deadline_s: float = 5.0) -> None:
    """Wait until datagrams are stamped on arrival. The kernel turns arrival stamps on for the
    whole machine a moment after the first socket asks for them (a deferred static key); until
    then it stamps a datagram when it is read."""
    give_up = time.monotonic() + deadline_s
    while time.monotonic() < give_up:
        tx.sendto(b"warm-up", rx.getsockname())
        held_until = time.monotonic_ns() + 3_000_000
        while time.monotonic_ns() < held_until:
            pass
        read = time.time_ns()
        (_, _, _, stamp, _, _), = lp._sockio.recv_batch(rx.fileno(), 1)
        if stamp and read - stamp >= 2_000_000:
            return
    pytest.fail("the kernel never stamped a datagram on arrival")


@needs_sockio
def test_datagrams_are_handed_over_at_their_arrival_time_not_when_read():
    echo = Echo()
    clock = lp.Clock()
    loop, rx, tx = _loop(echo, clock)
    _until_the_kernel_stamps(rx, tx)
    sent_at = clock.now()
    tx.sendto(b"late", rx.getsockname())
    busy_until = time.monotonic_ns() + 30_000_000  # the worker is busy elsewhere for 30 ms
    while time.monotonic_ns() < busy_until:
        pass
    read_from = clock.now()
    loop.run(lambda: bool(echo.got))
    (payload, at), = echo.got
    assert payload == b"late"
    assert sent_at <= at <= read_from - 25_000_000  # the kernel's stamp, not the 30 ms later read
    assert loop.socket_lag.max_ns >= 25_000_000  # and the wait is measured as the emulator's lag
    loop.close()


def test_due_wakeups_pump_and_their_lateness_is_measured():
    echo = Echo()
    clock = lp.Clock()
    loop, rx, tx = _loop(echo, clock)
    # due well after the first pump: were the set-up or that pump slower than the wait (a VM under
    # TCG took more than 2 ms), the wakeup would already be due when armed, and be no timer at all
    due = echo.wake = clock.now() + 20_000_000
    first = {"n": None}

    def stop():
        if len(echo.pumps) >= 2 and first["n"] is None:
            first["n"] = len(echo.pumps)
            echo.wake = None
        return first["n"] is not None

    loop.run(stop)
    # pumped once at start (add schedules it), then again when the wakeup was due, not before
    assert len(echo.pumps) == 2
    assert echo.pumps[1][0] >= due
    assert loop.timer_lag.n >= 1
    loop.close()


def test_pump_gets_the_slowest_workers_horizon():
    echo = Echo()
    clock = lp.Clock()
    horizon = lp.Horizon(2)
    stale = clock.now() - 5_000_000
    horizon.publish(1, stale)  # the other worker has not run for 5 ms
    loop, rx, tx = _loop(echo, clock, horizon, index=0)
    loop.run(lambda: bool(echo.pumps))
    now, seen = echo.pumps[0]
    assert seen == stale < now
    assert horizon.min() == stale  # this worker stopped: its slot no longer holds anyone back
    loop.close()


class Busy:
    """A sender whose every pump takes 3 ms (a burst of data through the kernel) and is always due."""

    def __init__(self, order: list) -> None:
        self.order = order
        self.now = 0

    def pump(self, now, send, clock=None, horizon=None):
        self.now = now
        self.order.append("busy")
        spin_until = time.monotonic_ns() + 3_000_000
        while time.monotonic_ns() < spin_until:
            pass

    def next_wakeup(self):
        return self.now


@needs_sockio
def test_answering_endpoints_are_pumped_before_the_senders_and_their_wait_is_lag():
    """A responder (first=True) given a datagram is pumped before any of the busy senders queued
    ahead of it, every turn; how long it waited from the datagram's arrival counts as loop lag."""
    order: list = []

    class Answering(Echo):
        def pump(self, now, send, clock=None, horizon=None):
            super().pump(now, send, clock, horizon)
            order.append(("answer", len(self.got)))

    answering = Answering()
    clock = lp.Clock()
    loop, rx, tx = _loop(Echo(), clock)  # a port whose datagrams the answering endpoint gets
    port = loop.ports[0]
    port.mux = OneMux(answering)
    for _ in range(4):
        loop.add_endpoint(Busy(order), port)
    loop.add_endpoint(answering, port, first=True)
    tx.sendto(b"ack me", rx.getsockname())
    loop.run(lambda: order.count("busy") >= 8)
    answered = order.index(("answer", 1))
    assert answered < order.index("busy"), order  # the datagram was read and answered before any burst
    assert loop.timer_lag.n >= 1
    loop.close()


@needs_sockio
def test_a_datagram_stamped_before_what_was_taken_as_read_is_counted_late():
    """The kernel may queue a datagram to a socket after the worker looked at it empty (it sat in
    a per-CPU backlog): its stamp is then older than the port's read_through, and the horizon
    had passed it. That is counted, for the run's verdict, rather than taken silently."""
    echo = Echo()
    clock = lp.Clock()
    loop, rx, tx = _loop(echo, clock)
    _until_the_kernel_stamps(rx, tx)
    port = loop.ports[0]
    port.read_through = ahead = clock.now() + 50_000_000  # as if the socket had been seen empty 50 ms from now
    tx.sendto(b"held in a backlog", rx.getsockname())
    loop.run(lambda: bool(echo.got))
    (_, arrived), = echo.got
    assert port.late == 1 and loop.stats.late_max_ns == ahead - arrived > 0  # behind what was taken as read
    loop.measure(False)
    assert loop.stats.late_datagrams == 1
    loop.close()


@needs_sockio
def test_a_late_datagram_holds_the_published_horizon_back_by_twice_its_lateness():
    echo = Echo()
    clock = lp.Clock()
    horizon = lp.Horizon(1)
    loop, rx, tx = _loop(echo, clock, horizon)
    _until_the_kernel_stamps(rx, tx)
    port = loop.ports[0]
    port.read_through = ahead = clock.now() + 20_000_000  # the kernel will hand over a datagram 20 ms "late"
    tx.sendto(b"held in a backlog", rx.getsockname())
    loop.run(lambda: bool(echo.got) and bool(echo.pumps))  # read before the first pump, in one turn
    (_, arrived), = echo.got
    lateness = ahead - arrived
    assert lateness > 0 and loop.stats.slack_max_ns == 2 * lateness
    now, seen = echo.pumps[-1]
    assert seen <= now - 2 * lateness  # the horizon the endpoint was given is that far behind
    loop.close()


def test_a_late_answer_holds_every_decision_back_until_every_worker_has_read_past_it():
    """A responder that answers 30 ms late (its worker was off the CPU) sends an ACK that its
    recipient reads with a kernel stamp 30 ms later than the network alone would have given it:
    a requester that has read its sockets through some time knows nothing of it. So until every
    worker has read past the moment the answer left, Horizon.min() is held back by the lag."""
    echo = Echo()
    clock = lp.Clock()
    horizon = lp.Horizon(2)
    rx, tx = _pair()
    loop = lp.EventLoop(clock, horizon, 0)
    port = lp.Port("h0", tx, rx, OneMux(echo))
    loop.add_port(port)
    loop.add_endpoint(echo, port, first=True)  # an answering endpoint
    loop.measure(True)
    other = clock.now() - 1_000_000
    horizon.publish(1, other)  # the other worker has read through 1 ms ago, and not since
    loop.wake(echo, since=clock.now() - 30_000_000)  # a datagram it was handed 30 ms ago
    seen: list[tuple[int, int]] = []
    released: dict[str, int] = {}

    def stop() -> bool:
        seen.append((loop.stats.turns, horizon.min()))
        if loop.stats.turns == 4:
            released["at"] = clock.now()
            horizon.publish(1, clock.now() + 10**12)  # the other worker reads past everything
        return loop.stats.turns >= 8

    loop.run(stop)
    assert echo.pumps  # it answered, 30 ms late
    assert loop.stats.answer_lag_max_ns >= 30_000_000
    held = [m for turns, m in seen if 2 <= turns <= 4]  # published from the turn after the answer
    assert held and all(m <= other - 29_000_000 for m in held)  # every decision held back by the lag
    assert seen[-1][1] >= released["at"] - 1_000_000  # once everyone read past it, no longer
    loop.close()
    rx.close()
    tx.close()


def test_a_port_without_the_c_receive_says_its_datagrams_were_timed_when_read(monkeypatch):
    """Without _sockio a port reads through SocketLink.receive: no kernel arrival stamps, so each
    datagram's time includes the worker's lag. The loop's stats name the host (the run's
    emulation block then refuses to call the run faithful)."""
    monkeypatch.setattr(port_module, "_sockio", None)
    echo = Echo()
    loop, rx, tx = _loop(echo, lp.Clock())
    assert not loop.ports[0].stamped
    tx.sendto(b"read by Python", rx.getsockname())
    loop.run(lambda: bool(echo.got))
    loop.measure(False)
    stats = loop.stats.to_dict()
    assert stats["python_receive"] == ["h0"] and stats["unstamped_datagrams"] == 1
    loop.close()


@needs_sockio
def test_a_port_with_the_c_receive_names_no_host_read_by_python():
    echo = Echo()
    loop, rx, tx = _loop(echo, lp.Clock())
    assert loop.ports[0].stamped
    tx.sendto(b"stamped by the kernel", rx.getsockname())
    loop.run(lambda: bool(echo.got))
    loop.measure(False)
    assert loop.stats.python_receive == [] and loop.stats.unstamped_datagrams == 0
    loop.close()
