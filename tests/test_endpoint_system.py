"""EV probes answered by the remote MRC endpoint on a real fabric: arrival port and service time (root)."""

from __future__ import annotations

import threading

import pytest
from conftest import wait_for

from mrc_emu.experiments.runtime.transfer import Control, send
from mrc_emu.fabric import links
from mrc_emu.topology import evs_between

pytestmark = pytest.mark.system
MiB = 1024 * 1024




def test_assumed_bad_evs_are_revived_by_probes_the_destination_answers(default_fabric):
    """A spine link of each plane fails mid-WRITE and comes back: the EVs through them go
    ASSUMED_BAD and are revived by probes that h2's responder answered, each naming the port it
    arrived at (read from the packet's arrival interface after SRv6 decapsulation: port 1 for
    plane 0, port 2 for plane 1) and a service time > 0 that the RTT includes."""
    fabric, topo = default_fabric, default_fabric.topology
    cut = [("p0l0", "p0s1"), ("p1l0", "p1s0")]
    through = {ev.index: ev.plane for ev in evs_between(topo, "h0", "h2") if any(ev.crosses(a, b) for a, b in cut)}
    assert sorted(set(through.values())) == [0, 1]
    control, box = Control(), {}

    def target():
        try:
            box["result"] = send(fabric, "h0", "h2", 64 * MiB, control=control, linger_s=10.0)
        except BaseException as exc:  # surfaced by the test thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    wait_for(lambda: control.progress >= 0.2 or control.finished.is_set(), what="transfer progress")
    assert not control.finished.is_set(), "the transfer ended before the fault"
    for a, b in cut:
        links.set_state(fabric, a, b, False)
    wait_for(lambda: all(control.ev_states.get(k) == "ASSUMED_BAD" for k in through) or control.finished.is_set(),
             timeout=10, what="EVs through the failed links to become ASSUMED_BAD")
    for a, b in cut:
        links.set_state(fabric, a, b, True)
    thread.join(timeout=60)
    assert not thread.is_alive() and "error" not in box
    result = box["result"]
    assert result.verified, result.error
    revived = [e for e in result.ev_events if e["ev"] in through and e["new"] == "GOOD"]
    assert {e["ev"] for e in revived} == set(through)
    assert all(e["reason"] == "probe returned" for e in revived)
    answers = result.requester["stats"]["probe_answers"]
    for ev, plane in through.items():
        answer = answers[ev]
        print(f"\nEV {ev} (plane {plane}): port {answer['port']}, rtt {answer['rtt_ns']} ns, "
              f"service {answer['service_ns']} ns")
        assert answer["port"] == plane + 1
        assert 0 < answer["service_ns"] < answer["rtt_ns"]
    assert result.responder["drops"].get("unknown_probe", 0) == 0


def test_port_disabled_live_carries_nothing_more_and_controller_probes_name_ports(default_fabric):
    """During a WRITE h0 -> h2, h0's port 1 is disabled at 30 % and enabled at 70 %: plane 0's EVs
    carry no data in between (per-EV counters), with zero retransmissions, and the data is
    verified; an EV_PROBE batch from h0's controller at 50 % is answered by h2's endpoint, each
    response naming the arrival port of its EV's plane (plane 1 only: port 1 is disabled then)."""
    fabric, topo = default_fabric, default_fabric.topology
    evs = evs_between(topo, "h0", "h2")
    plane0 = [ev.index for ev in evs if ev.plane == 0]
    plane1 = [ev.index for ev in evs if ev.plane == 1]
    control, box = Control(), {}
    ops = control.endpoint
    probes = [(k, "h2", ev) for k, ev in enumerate(plane1)]
    # rsp_timeout 100 ms: under a full-rate WRITE on this 2-core VM a response takes a few ms
    control.hooks += [(0.3, lambda: ops.set_port_status("h0", 0b100)),
                      (0.5, lambda: box.setdefault("batch", ops.ev_probe("h0", probes, 100_000_000))),
                      (0.7, lambda: ops.set_port_status("h0", 0b110))]
    result = send(fabric, "h0", "h2", 128 * MiB, control=control, linger_s=2.0)
    assert result.verified, result.error
    assert result.requester["stats"]["retransmits"] == 0
    off, on = (a.time_ns - result.start_ns for a in ops.applied)
    assert [a.mask for a in ops.applied] == [0b100, 0b110]
    samples = [(t, sent) for t, sent, _ in result.ev_timeline]
    order = sorted(result.evs)
    during = [sent for t, sent in samples if off < t < on]
    assert len(during) >= 2, "no per-EV sample while the port was disabled"
    for ev in plane0:
        i = order.index(ev)
        assert during[0][i] == during[-1][i], f"EV {ev} carried data on the disabled port"
    assert all(during[-1][order.index(ev)] > during[0][order.index(ev)] for ev in plane1)
    assert result.per_ev[order.index(plane0[0])]["packets_sent"] > during[-1][order.index(plane0[0])]  # back after
    batch = box["batch"]
    assert batch.done.wait(10) and not batch.timed_out
    print("\n" + "\n".join(f"EV_PROBE req {r['req_id']}: port {r['port']}, rtt {r['rtt']} ns (adj_svc_time "
                            f"{r['adj_svc_time']}; measured {r['rtt_raw']} ns)" for r in batch.responses))
    assert sorted(r["req_id"] for r in batch.responses) == list(range(len(plane1)))
    assert all(r["port"] == 2 and 0 < r["rtt"] <= r["rtt_raw"] and r["adj_svc_time"] == 1 for r in batch.responses)
