"""Captures without root: tcpdump's exit report read right, a lossy pcap said loudly, the report's pcap line."""

import pytest

from mrc_emu.experiments.scenarios import report
from mrc_emu.fabric.ops import CaptureResult

# what tcpdump --immediate-mode printed for the 4 MiB WRITE of issue 14
LOSSY = """tcpdump: data link type LINUX_SLL2
tcpdump: listening on any, link-type LINUX_SLL2 (Linux cooked v2), snapshot length 262144 bytes
740 packets captured
2111 packets received by filter
1371 packets dropped by kernel
"""
WHOLE = "2086 packets captured\n2086 packets received by filter\n0 packets dropped by kernel\n"


def test_kernel_drops_are_counted_and_said():
    result = CaptureResult.of(LOSSY, "/x/h2.pcap", ["h2-eth0", "h2-eth1"])
    assert (result.packets, result.received, result.dropped_kernel, result.left_in_ring) == (740, 2111, 1371, 0)
    assert result.lost == 1371 and not result.complete
    assert result.problem() == ("the capture lost 1,371 packets: 1,371 dropped by the kernel (tcpdump's ring was full); "
                                "the pcap holds 740 of the 2,111 its filter saw")
    assert result.to_dict()["problem"] == result.problem()


def test_a_whole_capture_has_no_problem():
    result = CaptureResult.of(WHOLE, "/x/h2.pcap", ["h2-eth0"])
    assert result.complete and result.lost == 0 and result.problem() is None


def test_packets_still_in_the_ring_at_exit_are_lost():
    """Received by the filter, not dropped, not written: tcpdump exited before the ring reached the file."""
    result = CaptureResult.of("2078 packets captured\n2087 packets received by filter\n0 packets dropped by kernel\n",
                              "/x/h2.pcap", ["h2-eth0"])
    assert result.left_in_ring == 9 and not result.complete
    assert "9 not written before tcpdump exited" in result.problem()


def test_interface_drops_and_one_packet():
    result = CaptureResult.of("1 packet captured\n3 packets received by filter\n0 packets dropped by kernel\n"
                              "2 packets dropped by interface\n", "/x/p.pcap", ["lo"])
    assert (result.packets, result.dropped_interface, result.lost) == (1, 2, 4)  # 2 by the interface, 2 left
    assert result.problem() == ("the capture lost 4 packets: 2 dropped by the interface, 2 not written before tcpdump "
                                "exited; the pcap holds 1 of the 3 its filter saw")


def test_no_report_is_a_problem():
    result = CaptureResult.of("tcpdump: eth9: No such device exists\n", "/x/p.pcap", ["eth9"])
    assert result.packets is None and not result.complete and "without its statistics" in result.problem()


@pytest.mark.parametrize("stderr, says", [
    (WHOLE, "pcap (mrc): `mrc.pcap`, 2,086 packets of h0's ports (h0-eth0, h0-eth1; whole packets), none lost, made "
            "in a separate run of the same scenario, which took 800 ms against 488 ms uncaptured (verified); the figures "
            "above are from the run without capture"),
    (LOSSY, "**pcap (mrc) INCOMPLETE**: `mrc.pcap`: the capture lost 1,371 packets: 1,371 dropped by the kernel"),
])
def test_report_line_of_a_pcap(stderr, says):
    capture = CaptureResult.of(stderr, "/out/mrc.pcap", ["h0-eth0", "h0-eth1"]).to_dict()
    capture.update(run="separate", host="h0", completion_ms=799.7, verified=True)
    run = {"completion_ms": 487.6, "capture": capture}
    assert report.pcap_line("mrc", run).startswith(says)
    assert "/out/mrc.pcap" in report.pcap_line("mrc", run, markdown=False)
    assert "did not complete" in report.pcap_line("mrc", {**run, "capture": dict(capture, completion_ms=None)})


def test_results_with_a_lossy_pcap_validate_and_report_md_says_so(tmp_path):
    import json

    import jsonschema
    from test_scenario import _fake_results

    results = _fake_results()
    capture = CaptureResult.of(LOSSY, str(tmp_path / "mrc.pcap"), ["h0-eth0"], snaplen=384).to_dict()
    capture.update(run="separate", host="h0", completion_ms=12.5, verified=True)
    results["runs"]["mrc"].update(pcap=capture["path"], capture=capture)
    report.write(results, tmp_path)
    jsonschema.validate(json.loads((tmp_path / "results.json").read_text()), report.RESULTS_SCHEMA)
    assert "**pcap (mrc) INCOMPLETE**" in (tmp_path / "report.md").read_text()
    broken = dict(capture, run="same")  # a pcap of the measured run is not what results.json may say
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(dict(results, runs={"mrc": dict(results["runs"]["mrc"], capture=broken)}),
                            report.RESULTS_SCHEMA)
