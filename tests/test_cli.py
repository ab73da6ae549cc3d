"""CLI behaviour that needs no root: help, clear errors, nothing created on bad input."""

import pytest
from click.testing import CliRunner

from mrc_emu import cli
from mrc_emu.fabric import nodes, registry


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "STATE_DIR", tmp_path / "state")
    return tmp_path / "state"


def run(*args):
    return CliRunner().invoke(cli.main, list(args))


@pytest.mark.parametrize("command", [[], ["up"], ["down"], ["clean"], ["status"], ["exec"], ["paths"], ["probe"],
                                     ["link"], ["link", "down"], ["link", "flap"], ["capture"], ["check"], ["send"],
                                     ["run"], ["demo"], ["plan"]])
def test_every_command_has_help(command):
    result = run(*command, "--help")
    assert result.exit_code == 0 and "Usage:" in result.output


def test_non_root_gets_one_clear_line(monkeypatch, state_dir):
    monkeypatch.setattr(nodes.os, "geteuid", lambda: 1000)
    result = run("up", "--name", "nr")
    assert result.exit_code == 1
    assert "needs root" in result.output and "sudo" in result.output
    assert not state_dir.exists() or not any(state_dir.iterdir())


def test_kernel_without_srv6_gets_one_clear_line(monkeypatch, state_dir):
    """The prerequisite left once Mininet no longer makes the nodes (mnexec is not needed)."""
    monkeypatch.setattr(nodes.os, "geteuid", lambda: 0)
    real_exists = nodes.os.path.exists
    monkeypatch.setattr(nodes.os.path, "exists", lambda p: False if "seg6_enabled" in str(p) else real_exists(p))
    result = run("up", "--name", "nm")
    assert result.exit_code == 1
    assert "no SRv6" in result.output and "seg6_enabled" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not state_dir.exists() or not any(state_dir.iterdir())


def test_invalid_topology_named(tmp_path, state_dir):
    bad = tmp_path / "t.yaml"
    bad.write_text("planes: 2\n")
    result = run("up", "-t", str(bad))
    assert result.exit_code == 1
    assert "t.yaml" in result.output and "spines_per_plane" in result.output


def test_bad_fabric_name(state_dir):
    result = run("status", "--name", "Bad Name!")
    assert result.exit_code == 1 and "fabric name" in result.output


def test_status_of_absent_fabric(state_dir):
    result = run("status", "--name", "absent")
    assert result.exit_code == 1 and "no fabric named 'absent'" in result.output


NOFAB = ["--name", "nofab"]


@pytest.mark.parametrize("command", [["status", *NOFAB], ["paths", "h0", "h2", *NOFAB], ["probe", "h0", "h2", *NOFAB],
                                     ["link", "down", "h0", "p0l0", *NOFAB],
                                     ["link", "flap", "h0", "p0l0", "--period", "10", *NOFAB],
                                     ["capture", "h0", "-o", "x.pcap", *NOFAB], ["exec", *NOFAB, "h0", "--", "true"],
                                     ["send", "h0", "h2", "--size", "1k", *NOFAB]])
def test_commands_on_no_fabric_say_how_to_start_one(command, state_dir):
    result = run(*command)
    assert result.exit_code == 1, result.output
    assert "no fabric named 'nofab'" in result.output and "mrc-emu up -n nofab" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_registry_journal_replay(state_dir):
    import os
    from pathlib import Path

    with registry.Journal.create("jr", {"topology": {}, "source": "x"}) as journal:
        journal.namespace(Path("/run/netns/jr-h0"))
        journal.process(999999, "a shell")
        journal.process_ended(999999)
        journal.link_state(3, False)
        journal.link_state(4, False)
        journal.link_state(3, True)
    record = registry.read("jr")
    assert record.namespaces == ["/run/netns/jr-h0"] and not record.processes and record.down_links == {4}
    with pytest.raises(registry.RegistryError, match="already"):
        registry.Journal.create("jr", {})
    # a write cut short by a crash is ignored
    with open(registry.journal_path("jr"), "a") as f:
        f.write('{"kind": "netns", "pa')
    assert registry.read("jr").namespaces == ["/run/netns/jr-h0"]
    assert record.topology == {} and record.source == "x" and record.owner_pid == os.getpid() and not record.ready


def test_kill_recorded_refuses_reused_pid():
    import os

    assert registry.kill_recorded({"pid": os.getpid(), "start": -1}) is False


@pytest.mark.parametrize("text, size", [("4096", 4096), ("100k", 100_000), ("64MiB", 64 * 2**20), ("1.5GB", 1_500_000_000),
                                        ("2 KiB", 2048), ("1_000", 1000)])
def test_sizes_parse(text, size):
    assert cli.parse_size(text) == size


@pytest.mark.parametrize("text", ["0", "-5", "lots", "5 parsecs", "1e-9"])
def test_bad_sizes_get_a_usage_error(text, state_dir):
    result = run("send", "h0", "h2", "--size", text)
    assert result.exit_code == 2 and "--size" in result.output


def test_send_without_a_fabric_is_one_clear_line(state_dir):
    result = run("send", "h0", "h2", "--name", "nofab", "--size", "1k")
    assert result.exit_code == 1
    assert "no fabric named 'nofab'" in result.output


def test_send_larger_than_memory_is_refused_up_front(monkeypatch, state_dir):
    """Both buffers of a WRITE are held in RAM: without room for them, one line before anything starts."""
    from mrc_emu.cli import transfer

    monkeypatch.setattr(transfer, "available_memory", lambda: 4 * 2**30)
    result = run("send", "h0", "h2", "--size", "5GiB", *NOFAB)
    assert result.exit_code == 1, result.output
    assert result.output.strip() == ("mrc-emu: error: --size 5.0 GiB needs 10.2 GiB of memory (the source bytes and the "
                                     "destination buffer are both held in RAM) and 4.0 GiB is available: send at most "
                                     "1.9 GiB, or free memory first")
    assert transfer.memory_problem(2**30, 4 * 2**30) is None  # 1 GiB fits: on to the fabric (none here)
    monkeypatch.setattr(transfer, "available_memory", lambda: None)  # unknown: not refused
    assert "no fabric named 'nofab'" in run("send", "h0", "h2", "--size", "5GiB", *NOFAB).output


def test_clean_of_a_name_no_journal_records(state_dir):
    result = run("clean", "--name", "absent")
    assert result.exit_code == 0 and result.output.strip() == "nothing to clean: no journal records a fabric 'absent'"


GEN_PROFILE = "mrc_emu/topologies/ev-profiles/default-h0-h2-gen.yaml"


@pytest.mark.parametrize("extra", [["--evs", "4"], ["--format", "SRV6_USID"], ["--ev-min-active", "2"]])
def test_send_ev_profile_with_an_ev_selection_is_a_usage_error(extra, state_dir):
    result = run("send", "h0", "h2", "--ev-profile", GEN_PROFILE, *extra, *NOFAB)
    assert result.exit_code == 2, result.output
    assert "--ev-profile names the EVs, their format and ev_min_active itself: not with " + extra[0] in result.output


def test_send_ev_profile_broken_file_is_one_line_naming_file_and_field(tmp_path, state_dir):
    bad = tmp_path / "bad.yaml"
    bad.write_text(open(GEN_PROFILE).read().replace("max_val: 16", "max_val: 40"))
    result = run("send", "h0", "h2", "--ev-profile", str(bad), *NOFAB)
    assert result.exit_code == 1
    assert result.output.strip() == (f"mrc-emu: error: {bad}: profile.fields[1].max_val: 40 does not fit the mask's 5 "
                                     "bit(s) (at most 31)")
    assert "no fabric" in run("send", "h0", "h2", "--ev-profile", GEN_PROFILE, *NOFAB).output  # a good file: on to the fabric


def test_send_in_virtual_time_needs_no_fabric_and_says_so(state_dir):
    # 2 MiB: a 1 MiB WRITE is over (0.1 ms) before EV 1's second witness probe goes unanswered
    result = run("send", "h0", "h2", "--size", "2MiB", "--clock", "virtual", "--seed", "3",
                 "--fault", "blackhole p0l0 p0s1 at 0.3")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "MATCH" in out and "goodput" in out and "EV  plane spine" in out
    assert "fault blackhole p0l0-p0s1 at 30%: in force at" in out
    assert "virtual time:" in out and "(seed 3)" in out and "packet-hops/s" in out
    assert "EV 1: GOOD -> ASSUMED_BAD" in out
    assert not state_dir.exists()  # no fabric, no journal


def test_send_in_virtual_time_as_json_is_the_results_schema(state_dir):
    import json

    result = run("send", "h0", "h3", "--size", "256k", "--clock", "virtual", "-t", "fourplane", "--json")
    data = json.loads(result.output)
    assert data["verified"] and data["emulation"] is None and data["virtual"]["topology"] == "four"
    assert len(data["per_ev"]) == 16 and data["virtual"]["clock"] == "virtual"


@pytest.mark.parametrize("args, message", [
    (["--clock", "virtual", "--workers", "2"], "--workers: no meaning in virtual time"),
    (["--clock", "virtual", "--time-dilation", "3"], "--time-dilation: no meaning in virtual time"),
    (["--seed", "4"], "--seed needs --clock virtual"),
    (["--fault", "blackhole p0l0 p0s1 at 0.3"], "--fault needs --clock virtual (on a running fabric"),
    (["--clock", "virtual", "--fault", "blackhole p0l0 at 0.3"], "name the link as 'A B'"),
    (["--clock", "virtual", "--link-delay", "fast"], "'fast' is not a duration"),
])
def test_send_options_of_the_other_clock_are_usage_errors(args, message, state_dir):
    result = run("send", "h0", "h2", "--size", "4k", *args)
    assert result.exit_code == 2 and message in result.output, result.output


def test_send_in_virtual_time_on_no_such_link_or_host_is_one_line(state_dir):
    result = run("send", "h0", "h2", "--size", "4k", "--clock", "virtual", "--fault", "down p0l0 p1s0 at 0.5")
    assert result.exit_code == 1 and result.output.strip() == (
        "mrc-emu: error: down p0l0-p1s0 at 50%: no link between p0l0 and p1s0")
    result = run("send", "h0", "h99", "--size", "4k", "--clock", "virtual")
    assert result.exit_code == 1 and "no node 'h99'" in result.output and "\n" not in result.output.strip()


@pytest.mark.parametrize("args, message", [
    (["ev", "replace", "h0", "h2", "--ev", "1"], "give --value HEX|IPV6 or --reset"),
    (["ev", "replace", "h0", "h2", "--ev", "1", "--value", "zz"], "is neither hex digits nor an IPv6 address"),
    (["ev", "replace", "h0", "h2", "--ev", "1", "--value", "0x00"], "not all zero"),
    (["ev", "replace", "h0", "h2", "--ev", "1", "--reset", "--port", "2"], "no --port with it"),
    (["ev", "probe", "h0", "h2"], "give --ev K or --value HEX"),
    (["ev", "probe", "h0", "h2", "--ev", "1", "--value", "fc00::1"], "give --ev K or --value HEX"),
    (["ev", "events", "--host", "h0", "--for", "3"], "--for goes with --follow"),
    (["send", "h0", "h2", "--cc-config", "maxwnd=4"], "config.maxwnd: not a field of uet-1.0-nscc"),
    (["send", "h0", "h2", "--cc-config", "max_cwnd"], "'max_cwnd' is not NAME=NUMBER"),
    (["send", "h0", "h2", "--clock", "virtual", "--cc-config", "max_cwnd=4096"], "--cc-config: no meaning in virtual"),
    (["send", "h0", "h2", "--clock", "virtual", "--qp-cap", "SVC_TIME_DEST_UNSUPPORTED"], "--qp-cap: no meaning"),
])
def test_controller_commands_refuse_bad_input_before_touching_a_fabric(args, message, state_dir):
    """ev replace/probe/events and send's CC config and QP caps: usage errors naming the option, exit 2,
    before any fabric is opened (none exists here)."""
    result = run(*args)
    assert result.exit_code == 2 and message in result.output, result.output


def test_ev_values_from_the_command_line():
    from mrc_emu.cli.ev import _ev_value

    assert _ev_value("0x1234c001") == bytes.fromhex("1234c001")
    assert _ev_value("c001") == bytes.fromhex("c001") and _ev_value("0xabc") == bytes.fromhex("0abc")
    assert _ev_value("fc00:0:5:b:6:3:f0d6::") == bytes.fromhex("fc0000000005000b00060003f0d60000")
    assert _ev_value("fc00:0:b:3:f0d6::,fc00:0:3:f0d6::") == bytes.fromhex(
        "fc000000000b0003f0d6000000000000" "fc0000000003f0d60000000000000000")
