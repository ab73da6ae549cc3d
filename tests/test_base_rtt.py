"""NSCC's base RTT for a run without root: measured from EV probes (answers made up here) unless
the topology says one, handed to NSCC's QPs with MaxWnd from it, and reported with its source."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mrc_emu.experiments.runtime import base_rtt
from mrc_emu.experiments.runtime.endpoint_ops import EpBatch
from mrc_emu.experiments.scenarios.transports import Transport
from mrc_emu.topology import builtin, from_dict
from mrc_emu.topology.port import DEFAULT_BASE_RTT_NS
from mrc_emu.transport.cc.nscc import max_wnd_for
from mrc_emu.transport.config import QpConfig
from mrc_emu.transport.multipath.paths import qp_paths

INCAST = builtin("incast")  # 400 Mbit/s, no base_rtt of its own
GIVEN = from_dict({**INCAST.to_dict(), "base_rtt": "300us"}, "<test>")


class FakeOps:
    """EndpointOps answering each probe of (src, dst, ev) at once with the next of `rtts[(src, dst, ev)]`
    (None: lost), service time 250 us."""

    def __init__(self, rtts: dict[tuple[str, str, int], list[int | None]]) -> None:
        self.rtts = {k: list(v) for k, v in rtts.items()}
        self.asked: list[tuple[str, int]] = []

    def ev_probe(self, host: str, requests: list[tuple[int, str, int]], rsp_timeout_ns: int) -> EpBatch:
        batch = EpBatch(host, requests, rsp_timeout_ns)
        self.asked.append((host, len(requests)))
        for req_id, dst, ev in requests:
            rtt = self.rtts[(host, dst, ev)].pop(0)
            if rtt is not None:
                batch.responses.append({"req_id": req_id, "rtt_raw": rtt, "rtt": rtt - 250_000, "adj_svc_time": 1,
                                        "service_ns": 250_000})
        batch.timed_out = len(batch.responses) < len(requests)
        batch.done.set()
        return batch

    def step(self, *_) -> None:
        pass


def test_an_evs_idle_loop_is_its_least_probe_and_the_runs_the_median_over_evs():
    rtts = {("h4", "h0", 0): [500_000, 400_000, 450_000], ("h4", "h0", 1): [None, 410_000, None],
            ("h8", "h0", 0): [900_000, 800_000, 700_000], ("h8", "h0", 1): [None, None, None]}
    ops = FakeOps(rtts)
    found = base_rtt.measure(INCAST, ops, {}, {}, {"h4": [("h0", 0), ("h0", 1)], "h8": [("h0", 0), ("h0", 1)]})
    assert ops.asked == [("h4", 2)] * 3 + [("h8", 2)] * 3  # one host at a time, round after round
    # EV loops 400, 410 and 700 us (h8's EV 1 never answered): the median is 410 us
    assert (found.ns, found.loop_ns, found.source, found.evs, found.probes) == (410_000, 410_000, "measured", 3, 7)
    assert (found.loop_min_ns, found.loop_max_ns, found.network_ns) == (400_000, 700_000, 160_000)
    assert "410 us, measured: the median idle loop of 3 EVs, 410 us (400-700 us; 7 EV probes" in found.describe()
    assert base_rtt.measure(INCAST, FakeOps({("h4", "h0", 0): [None] * 3}), {}, {}, {"h4": [("h0", 0)]}) is None


def test_nscc_without_a_topology_base_rtt_gets_the_measured_one_and_maxwnd_from_it():
    mrc = Transport.MRC.spec("h4", "h0", 1 << 20, 4096, topology=INCAST)
    baseline = Transport.BASELINE.spec("h4", "h0", 1 << 20, 4096, topology=INCAST)
    assert mrc.config.base_rtt_ns is None and mrc.config.cc_options is None  # left to the run to measure
    assert baseline.config.base_rtt_ns == DEFAULT_BASE_RTT_NS  # DCQCN's window: the topology's (default) BDP
    plans = [qp_paths(INCAST, "h4", "h0"), qp_paths(INCAST, "h4", "h0")]
    ops = FakeOps({("h4", "h0", ev): [420_000] * 3 for ev in range(4)})
    specs, found = base_rtt.for_specs(INCAST, [mrc, baseline], plans, ops, {}, {})
    assert ops.asked == [("h4", 4)] * 3  # the QP's own 4 EVs
    # the idle loop, and what a probe does not pay: 4 links of 4,302 B data frames (Ethernet, the
    # outer IPv6 and SRH of 4 segments, IPv6, UDP, BTH, RETH, 4 KiB, ICRC) and 210 B ACKs at 400 Mbit/s
    serial = round(4 * (14 + 112 + 40 + 8 + 12 + 16 + 4096 + 4 + 14 + 112 + 40 + 8 + 12 + 4 + 16 + 4) * 8e9 / 400e6)
    assert (found.loop_ns, found.network_ns, found.serialization_ns) == (420_000, 170_000, serial) and serial == 360_960
    # NSCC's base RTT: the network's part of the loop (the answering endpoint's 250 us of service
    # left out) and the serialization; its MaxWnd covers the whole loop the endpoints close
    assert (found.ns, found.window_ns) == (170_000 + serial, 420_000 + serial)
    assert specs[0].config.base_rtt_ns == found.ns
    # 1.5 BDP of the NIC (two planes' links at 400 Mbit/s: MRC sprays over both): 117,144 B; UEC's
    # scaling factor a from one plane's link, as uet-htsim's initNsccParams takes the link speed
    # and no RTT sample takes NSCC's base RTT under a packet's serialization (an idle TBF's bucket skips it)
    # and each sample gets back what its idle hops' token buckets skip: all of that serialization
    # but the busy last hop's data frame (4,302 B: 86,040 ns)
    assert specs[0].config.cc_options == {"max_cwnd": max_wnd_for(800e6, found.window_ns), "scale_rate_bps": 400e6,
                                          "base_rtt_floor_ns": serial, "unseen_ns": serial - 86_040}
    assert specs[0].config.cc_rate_bps == 800e6 and "MaxWnd covers the whole loop, 781 us" in found.describe()
    assert specs[1] is baseline
    assert base_rtt.source_of(INCAST, specs[0], found) == {"ns": found.ns, "source": "measured"}
    assert base_rtt.source_of(INCAST, specs[1], found) == {"ns": DEFAULT_BASE_RTT_NS, "source": "topology default"}


def test_a_topology_base_rtt_wins_and_no_probe_goes_out():
    mrc = Transport.MRC.spec("h4", "h0", 1 << 20, 4096, topology=GIVEN)
    assert mrc.config.base_rtt_ns == 300_000 and mrc.config.cc_options == {"max_cwnd": max_wnd_for(800e6, 300_000),
                                                                  "scale_rate_bps": 400e6}
    ops = FakeOps({})
    specs, found = base_rtt.for_specs(GIVEN, [mrc], [qp_paths(GIVEN, "h4", "h0")], ops, {}, {})
    assert found is None and not ops.asked and specs == [mrc]
    assert base_rtt.source_of(GIVEN, mrc, None) == {"ns": 300_000, "source": "topology"}
    assert from_dict(GIVEN.to_dict(), "<again>").ports.base_rtt_given  # a stored topology keeps saying it
    assert not from_dict(INCAST.to_dict(), "<again>").ports.base_rtt_given  # ... and one that did not, not


def test_no_answer_falls_back_to_the_topology_default_and_a_given_max_cwnd_stays():
    mrc = Transport.MRC.spec("h4", "h0", 1 << 20, 4096, topology=INCAST)
    mrc = replace(mrc, config=replace(mrc.config, cc_options={"max_cwnd": 99_000}))
    ops = FakeOps({("h4", "h0", ev): [None] * 3 for ev in range(4)})
    specs, found = base_rtt.for_specs(INCAST, [mrc], [qp_paths(INCAST, "h4", "h0")], ops, {}, {})
    assert (found.ns, found.source) == (DEFAULT_BASE_RTT_NS, "topology default")
    assert specs[0].config.base_rtt_ns == DEFAULT_BASE_RTT_NS
    assert specs[0].config.cc_options["max_cwnd"] == 99_000  # the given MaxWnd stays
    assert found.describe() == "1000 us, the topology default"


@pytest.mark.parametrize("cc", ["dcqcn", "fixed"])
def test_only_nscc_measures(cc):
    spec = Transport.MRC.spec("h4", "h0", 1 << 20, 4096, topology=INCAST)
    assert not base_rtt.measures(replace(spec, cc=cc))


def test_each_hosts_endpoint_is_taught_a_peers_paths_once():
    """Probe rounds after the first send no paths again: computing and sending them per request
    took minutes of the parent's CPU when 128 hosts measured their base RTT (bench_scale.py)."""
    from mrc_emu.experiments.runtime.endpoint_ops import EndpointOps, EpPaths, EpProbe

    class Worker:
        def __init__(self) -> None:
            self.sent: list = []

        def send(self, msg) -> None:
            self.sent.append(msg)

        def poll(self, _kind):
            return None

    worker = Worker()
    ops = EndpointOps()
    of = {"h4": worker, "h0": worker}
    address_of = {"h4": "fc00:2:1::1", "h0": "fc00:2::1"}
    for round_ in range(3):
        ops.ev_probe("h4", [(2 * round_, "h0", 0), (2 * round_ + 1, "h0", 1)])
        ops.step(of, address_of, INCAST)
    paths = [(m.host, m.peer) for m in worker.sent if isinstance(m, EpPaths)]
    assert sorted(paths) == [("h0", "fc00:2:1::1"), ("h4", "fc00:2::1")]
    assert sum(isinstance(m, EpProbe) for m in worker.sent) == 3


def test_mrc_makes_its_cc_with_the_nics_rate_and_the_baseline_with_its_one_links():
    """MRC's NIC port is split into one link per plane and a QP sprays over all of them: NSCC's BDP
    (MaxWnd 1.5 BDP) is the NIC's; the baseline's one ECMP path is one link, DCQCN's line rate."""
    mrc = Transport.MRC.spec("h4", "h0", 1 << 20, 4096, topology=GIVEN)
    baseline = Transport.BASELINE.spec("h4", "h0", 1 << 20, 4096, topology=GIVEN)
    assert GIVEN.planes == 2 and GIVEN.nic_rate_bps == 2 * GIVEN.link_rate_bps
    assert (mrc.config.link_rate_bps, mrc.config.cc_rate_bps) == (400e6, 800e6)  # a packet's serialization: one link
    assert (baseline.config.nic_rate_bps, baseline.config.cc_rate_bps) == (None, 400e6)
    with pytest.raises(ValueError, match="NIC rate"):
        QpConfig(nic_rate_bps=0)
