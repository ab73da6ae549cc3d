"""netem's loss beside the XDP and nft drops, without root: the request it sends, the scenario
syntax (`mechanism: netem`), the agent's actions and the record's mechanism, and the refusal,
one line naming the module, where the kernel has no netem."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from mrc_emu import cli
from mrc_emu.experiments.runtime import fault_agent
from mrc_emu.experiments.scenarios import runner, scenario
from mrc_emu.experiments.scenarios.faults import LossFault
from mrc_emu.experiments.scenarios.scenario import ScenarioError
from mrc_emu.fabric import registry
from mrc_emu.fabric.datapath import impair
from mrc_emu.fabric.faults import fault_ops, fault_record
from mrc_emu.fabric.running import Fabric
from mrc_emu.topology import builtin


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "STATE_DIR", tmp_path / "state")
    return tmp_path / "state"


def _fabric(name: str) -> Fabric:
    topo = builtin()
    return Fabric(name, topo, registry.Journal.create(name, {"topology": topo.to_dict(), "source": topo.source}))


def test_the_loss_word_is_iproutes():
    """`tc qdisc add ... netem loss 5%` writes rint(0.05 x UINT32_MAX) (q_netem.c)."""
    assert impair.loss_word(0.05) == 214748365
    assert (impair.loss_word(0.0), impair.loss_word(1.0)) == (0, 0xFFFFFFFF)
    with pytest.raises(ValueError):
        impair.loss_word(1.5)


def test_the_loss_is_what_tc_sends():
    """`tc qdisc add dev lo root handle 6d72: netem limit 100000 loss 5%` (iproute2 6.1, captured with
    strace -xx) sent this tc_netem_qopt; ours is the same, then TCA_NETEM_LATENCY64 0."""
    iproute2 = bytes.fromhex("00000000a0860100cdcccc0c000000000000000000000000")
    assert impair.netem_options(0, loss=0.05) == iproute2 + bytes.fromhex("0c000a000000000000000000")


def test_a_netem_loss_request_is_what_the_kernel_reads():
    batch = impair.QdiscBatch()
    batch.netem(7, impair.TC_H_ROOT, 0, loss=0.05)
    (raw,) = batch.messages()
    msg = tcmsg(raw)
    msg.decode()
    options = msg.get_attr("TCA_OPTIONS")
    assert (msg.get_attr("TCA_KIND"), msg["handle"]) == ("netem", impair.NETEM_HANDLE)
    assert (options["delay"], options["loss"], options["limit"]) == (0, 214748365, impair.NETEM_LIMIT)


def _scenario(tmp_path, fault: str):
    path = tmp_path / "s.yaml"
    path.write_text(f"topology: default\ntransports: [mrc]\nworkloads:\n  - {{kind: write, src: h0, dst: h2, size: 1MiB}}\n"
                    f"faults:\n  - {fault}\n")
    return scenario.load(path)


def test_a_loss_fault_by_netem_in_a_scenario(tmp_path, monkeypatch):
    (xdp,) = _scenario(tmp_path, "{kind: loss, link: [p0l0, p0s1], percent: 5, at: 0.2}").faults
    (netem,) = _scenario(tmp_path, "{kind: loss, link: [p0l0, p0s1], percent: 5, mechanism: netem, at: 0.2}").faults
    assert isinstance(netem, LossFault) and (xdp.mechanism, netem.mechanism) == ("xdp", "netem")
    assert (xdp.drops, xdp.qdiscs, netem.drops, netem.qdiscs) == (True, False, False, True)
    assert (xdp.apply(), xdp.revert()) == (fault_agent.Drop(0.05), fault_agent.DropOff())
    assert (netem.apply(), netem.revert()) == (fault_agent.NetemLoss(0.05), fault_agent.NetemLossOff())
    assert netem.describe() == "loss 5% by netem p0l0-p0s1 at 20%" and xdp.describe() == "loss 5% p0l0-p0s1 at 20%"
    monkeypatch.setattr(impair, "netem_missing", lambda: "this kernel has no netem (module sch_netem)")
    assert xdp.unavailable() is None and "sch_netem" in netem.unavailable()
    scn = _scenario(tmp_path, "{kind: loss, link: [p0l0, p0s1], percent: 5, mechanism: netem, at: 0.2}")
    assert list(runner.skipped_faults(scn)) == [0]


@pytest.mark.parametrize("fault, words", [
    ("{kind: loss, link: [p0l0, p0s1], percent: 5, mechanism: tc}", r"field .faults\[0\]\.mechanism.: .tc.: a loss is applied by"),
    ("{kind: delay, link: [p0l0, p0s1], ms: 5, mechanism: netem}", "only a loss takes a mechanism"),
])
def test_a_bad_mechanism_names_the_field(tmp_path, fault, words):
    with pytest.raises(ScenarioError, match=words):
        _scenario(tmp_path, fault)


def test_the_agent_records_a_netem_loss_as_netem_on_the_sending_ends():
    agent = fault_agent._Agent.__new__(fault_agent._Agent)  # only what _mechanism reads
    agent.ingress, agent.egress = [("p0s1", "eth0")], [("p0l0", "eth2")]
    assert agent._mechanism(fault_agent.NetemLoss(0.05)) == (fault_record.NETEM, [("p0l0", "eth2")], {})
    assert agent._mechanism(fault_agent.Drop(0.05))[:2] == (fault_record.XDP, [("p0s1", "eth0")])
    assert fault_agent._applies(fault_agent.NetemLoss(0.05)) and fault_agent._applies(fault_agent.NetemLossOff()) is False


def test_a_netem_loss_without_netem_is_refused_before_anything_is_touched(state_dir, monkeypatch):
    fabric = _fabric("fn")
    monkeypatch.setattr(impair, "netem_missing", lambda: "this kernel has no netem (module sch_netem)")
    with pytest.raises(impair.NetemMissing, match="sch_netem"):
        fault_ops.drop(fabric, "p0l0", "p0s1", 5, mechanism=fault_record.NETEM)
    with pytest.raises(ValueError, match="nft or netem"):
        fault_ops.drop(fabric, "p0l0", "p0s1", 5, mechanism=fault_record.XDP)
    assert fault_record.FaultRecord(fabric).active() == []


def test_the_cli_takes_by_netem(state_dir):
    result = CliRunner().invoke(cli.main, ["fault", "loss", "--help"])
    assert "--by [nft|netem]" in result.output
    result = CliRunner().invoke(cli.main, ["fault", "loss", "p0l0", "p0s1", "--percent", "5", "--by", "xdp", "-n", "nofab"])
    assert result.exit_code == 2 and "'xdp' is not one of" in result.output
