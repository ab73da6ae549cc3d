"""`mrc-emu ev ...`: EV profiles of the OCP controller API (mrc_emu.api), no fabric, no root.

Why it exists: a user writing an OCP-style EV profile wants to see the EVs it yields before any
QP uses them. `ev expand` reads a profile file (mrc_emu.api.files) and prints each EV's compact
value and its 32 expanded bytes (and, for SRV6, the addresses they mean). Every error is one
line naming the file and the field, exit 1; nothing is printed before the whole file checked out.
"""

from __future__ import annotations

import click

from .common import JSON_OPTION, emit, friendly


@click.group()
def ev() -> None:
    """EV profiles (OCP mrc_ctl.h): formats STEV/SRV6/UDP, profiles AUTO/EXP/GEN (docs/api.md)."""


@ev.command()
@click.argument("profile_file", metavar="PROFILE.yaml", type=click.Path(dir_okay=False))
@JSON_OPTION
@friendly
def expand(profile_file: str, as_json: bool) -> None:
    """The EVs a GEN or EXP profile yields: compact value, 32 expanded bytes (hex), SRV6 addresses.

    Example (shipped): mrc_emu/topologies/ev-profiles/example-gen.yaml, the worked example of the
    OCP API's GENERATED expansion with 16 EVs.
    """
    from ..api import files

    loaded = files.load(profile_file)
    evs = loaded.expanded()
    fmt, profile = loaded.fmt, loaded.profile
    data = {"file": profile_file, "format": {"mode": fmt.mode.name, "fields": list(fmt.fields)},
            "profile": {"mode": profile.mode.name, "ev_count": profile.ev_count, "ev_min_active": profile.ev_min_active,
                        "generated_bits": profile.generated_bits},
            "evs": [item.to_dict(fmt.mode) for item in evs]}
    lines = [f"{profile_file}: {profile.mode.name} profile over a {fmt.mode.name} format {list(fmt.fields)}: "
             f"{len(evs)} EV(s), {profile.generated_bits} generated bit(s) each"]
    used = max(1, (profile.generated_bits + 7) // 8 if profile.mode.name == "GEN" else (fmt.total_width + 7) // 8)
    for item in evs:
        shown = "0x" + item.compact[:used].hex()  # the compact EV's leading bytes: the rest are zero
        line = f"  {item.index:3d}  compact {shown}  expanded {item.expanded.hex()}"
        if fmt.mode.name == "SRV6":
            address = item.to_dict(fmt.mode)
            line += f"  da {address['ipv6_da']}  srh {address['srh_segment']}"
        lines.append(line)
    emit(data, as_json, "\n".join(lines))


COMMANDS = [ev]
