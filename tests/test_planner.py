"""The capacity planner reproduces the published MRC figures."""

import json

import pytest
from click.testing import CliRunner

from mrc_emu import cli
from mrc_emu.topology import planner


def test_published_mrc_figure():
    p = planner.plan(512, 8, 2)
    assert p.endpoints == 131_072
    assert p.switches_per_plane == 512 + 256 and p.switches == 8 * 768
    single = planner.single_plane_equivalent(512, 8, 131_072)
    assert single.radix == 64 and single.tiers == 4  # an 800G single-plane fabric needs 4 tiers
    assert planner.endpoints(64, 3) == 65_536 < 131_072 <= planner.endpoints(64, 4)


@pytest.mark.parametrize("radix, tiers, n", [(4, 1, 4), (4, 2, 8), (4, 3, 16), (64, 2, 2048), (512, 2, 131_072)])
def test_endpoint_formula(radix, tiers, n):
    assert planner.endpoints(radix, tiers) == n


def test_full_clos_switch_count_matches_closed_form():
    for radix in (4, 8, 64):
        for tiers in (2, 3):
            assert planner.plan(radix, 1, tiers).switches_per_plane == (2 * tiers - 1) * (radix // 2) ** (tiers - 1)


def test_cli_plan_json_and_errors():
    result = CliRunner().invoke(cli.main, ["plan", "--radix", "512", "--planes", "8", "--tiers", "2", "--json"])
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["plan"]["endpoints"] == 131_072 and data["single_plane_same_asic"]["tiers"] == 4
    bad = CliRunner().invoke(cli.main, ["plan", "--radix", "63"])
    assert bad.exit_code == 1 and "even number" in bad.output
    too_many = CliRunner().invoke(cli.main, ["plan", "--radix", "8", "--endpoints", "10000000000000"])
    assert too_many.exit_code == 0 and "more than 12 tiers" in too_many.output


def test_a_two_tier_plan_is_written_as_a_topology_the_virtual_fabric_runs(tmp_path):
    from mrc_emu.experiments.runtime.virtual import send_virtual
    from mrc_emu.topology.model import from_dict, load

    full = from_dict(planner.topology_fields(64, 8))  # radix 64, 8 planes: the published shape at 100G x 8
    assert (full.host_count, full.planes, full.spines_per_plane, full.leaves_per_plane) == (2048, 8, 32, 64)
    assert len(full.links) == planner.plan(64, 8, 2).links  # at full size one link per leaf-spine pair is the plan
    runner = CliRunner()
    out = tmp_path / "r8.yaml"
    result = runner.invoke(cli.main, ["plan", "-r", "8", "-p", "2", "-e", "12", "--topology-out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}: r8x2-12, 12 hosts" in result.output
    small = load(out)
    got = send_virtual(small, "h0", "h11", 256 * 1024, seed=1)
    assert got.verified and len(got.evs) == small.planes * small.spines_per_plane
    assert runner.invoke(cli.main, ["plan", "-r", "8", "-t", "3", "--topology-out", str(out)]).exit_code == 2
    bad = runner.invoke(cli.main, ["plan", "-r", "256", "-p", "8", "--topology-out", str(tmp_path / "big.yaml")])
    assert bad.exit_code == 1 and "spines_per_plane" in bad.output and not (tmp_path / "big.yaml").exists()
