"""`mrc-emu plan`: the capacity planner of multi-plane Clos fabrics (no fabric, no root).

Why it exists: how many endpoints, switches and links a radix and a plane count give is
the arithmetic behind MRC's multi-plane design; topology.planner does it, this prints it.
"""

from __future__ import annotations

import click

from .common import JSON_OPTION, emit, friendly


@click.command()
@click.option("--radix", "-r", type=int, required=True, help="Ports per switch at the plane's port speed (51.2T / 100G = 512).")
@click.option("--planes", "-p", type=int, default=1, show_default=True, help="Planes (ports per endpoint NIC).")
@click.option("--tiers", "-t", type=int, default=2, show_default=True, help="Switch tiers of each plane's Clos.")
@click.option("--endpoints", "-e", "target", type=int, default=None,
              help="Target endpoint count: also say how many tiers it needs (default: what --tiers reaches).")
@click.option("--topology-out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write the two-tier plan (for --endpoints, else its full size) as a topology file, "
                   "for `run`/`send --clock virtual -t FILE`.")
@JSON_OPTION
@friendly
def plan(radix: int, planes: int, tiers: int, target: int | None, topology_out: str | None, as_json: bool) -> None:
    """Capacity planner: endpoints, switches and links of a multi-plane Clos (formula: docs/planner.md).

    Example, the published MRC figure: --radix 512 --planes 8 --tiers 2 -> 131,072 endpoints,
    where the same 51.2T switch with 800G ports (radix 64, one plane) needs 4 tiers.
    """
    from ..topology import planner

    chosen = planner.plan(radix, planes, tiers)
    goal = target or chosen.endpoints
    needed = planner.tiers_needed(radix, goal)
    sized = planner.plan(radix, planes, needed, goal) if needed else None
    single = planner.single_plane_equivalent(radix, planes, goal) if planes > 1 else None
    data = {"plan": chosen.to_dict(), "target_endpoints": goal, "tiers_needed": needed,
            "plan_for_target": sized.to_dict() if sized else None,
            "single_plane_same_asic": single.to_dict() if single else None}
    lines = [f"radix {radix}, {planes} plane(s), {tiers} tier(s): {chosen.endpoints:,} endpoints; "
             f"{chosen.switches:,} switches ({chosen.switches_per_plane:,} per plane), {chosen.links:,} links"]
    if sized:
        lines.append(f"{goal:,} endpoints need {needed} tier(s) at radix {radix}: {sized.switches:,} switches, "
                     f"{sized.links:,} links")
    else:
        lines.append(f"{goal:,} endpoints need more than 12 tiers at radix {radix}")
    if single:
        lines.append(f"the same ASIC as one plane with {planes}x faster ports (radix {single.radix}) needs "
                     f"{single.tiers} tiers for {goal:,} endpoints: {single.switches:,} switches, {single.links:,} links")
    if topology_out:
        lines.append(_write_topology(radix, planes, tiers, target, topology_out))
        data["topology_file"] = topology_out
    emit(data, as_json, "\n".join(lines))


def _write_topology(radix: int, planes: int, tiers: int, target: int | None, path: str) -> str:
    """The plan as a topology file (two tiers: the topology model's leaves and spines); what was written."""
    from pathlib import Path

    import yaml

    from ..topology import planner
    from ..topology.model import from_dict

    if tiers != 2:
        raise click.UsageError(f"--topology-out: a topology here has two tiers (leaves and spines), not {tiers}")
    fields = planner.topology_fields(radix, planes, target)
    topo = from_dict(fields, path)  # the topology model's limits, said by field
    Path(path).write_text(yaml.safe_dump(fields, sort_keys=False))
    return (f"wrote {path}: {topo.name}, {topo.host_count:,} hosts, {len(topo.nodes) - topo.host_count:,} switches, "
            f"{len(topo.links):,} links (try: mrc-emu send h0 h{topo.host_count - 1} --clock virtual -t {path})")



COMMANDS = [plan]
