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
