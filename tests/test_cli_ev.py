"""`mrc-emu ev expand` (no root): the shipped example in text and JSON, one-line errors on bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mrc_emu import cli

EXAMPLE = Path(cli.__file__).resolve().parent.parent / "topologies" / "ev-profiles" / "example-gen.yaml"


def run(*args: str):
    return CliRunner().invoke(cli.main, list(args))


def test_ev_expand_has_help():
    result = run("ev", "expand", "--help")
    assert result.exit_code == 0 and "PROFILE.yaml" in result.output


def test_ev_expand_the_shipped_example():
    result = run("ev", "expand", str(EXAMPLE))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "GEN profile over a STEV format [8, 8, 16]: 16 EV(s), 6 generated bit(s) each" in lines[0]
    assert len(lines) == 17
    assert lines[1].split() == ["0", "compact", "0x00", "expanded", "a000beef" + "00" * 28]
    assert lines[2].split() == ["1", "compact", "0x04", "expanded", "a002beef" + "00" * 28]
    assert lines[16].split() == ["15", "compact", "0x3c", "expanded", "a30abeef" + "00" * 28]


def test_ev_expand_json():
    result = run("ev", "expand", str(EXAMPLE), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["format"] == {"mode": "STEV", "fields": [8, 8, 16]}
    assert data["profile"] == {"mode": "GEN", "ev_count": 16, "ev_min_active": 4, "generated_bits": 6}
    assert [ev["expanded"][:8] for ev in data["evs"][:4]] == ["a000beef", "a002beef", "a008beef", "a00abeef"]
    assert all(len(bytes.fromhex(ev["expanded"])) == 32 == len(bytes.fromhex(ev["compact"])) for ev in data["evs"])
    assert data["evs"][1]["compact"] == "04" + "00" * 31 and data["evs"][1]["fields"] == ["0xa0", "0x2", "0xbeef"]


def test_ev_expand_srv6_prints_the_addresses(tmp_path):
    path = tmp_path / "srv6.yaml"
    path.write_text("format: {mode: SRV6, fields: [32, 16, 16]}\n"
                    "profile:\n  mode: GEN\n  ev_count: 2\n  ev_min_active: 1\n  fields:\n"
                    "    - {width: 32, init_val: 0xFC000000}\n"
                    "    - {width: 16, init_val: 0xE000, mask: 0x1, max_val: 1}\n"
                    "    - {width: 16, init_val: 0xF00D}\n")
    result = run("ev", "expand", str(path))
    assert result.exit_code == 0, result.output
    assert "da fc00:0:e000:f00d::  srh ::" in result.output and "da fc00:0:e001:f00d::" in result.output
    data = json.loads(run("ev", "expand", str(path), "--json").output)
    assert [ev["ipv6_da"] for ev in data["evs"]] == ["fc00:0:e000:f00d::", "fc00:0:e001:f00d::"]


def test_ev_expand_an_explicit_profile(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("format: {mode: STEV, fields: [16, 16]}\n"
                    "profile: {mode: EXP, ev_count: 2, ev_min_active: 1, fields: [{width: 16}, {width: 16}],"
                    " evs: ['0x00010001', '0x00020002']}\n")
    result = run("ev", "expand", str(path))
    assert result.exit_code == 0, result.output
    assert "compact 0x00010001  expanded 00010001" + "00" * 28 in result.output


BAD = [
    ("profile:\n  mode: GEN\n", "format: missing"),
    ("format: [8]\nprofile: {}\n", "format: expected a mapping"),
    ("format: {mode: STEV, fields: [8, 8, 16], extra: 1}\nprofile: {}\n", "format.extra: unknown key"),
    ("format: {mode: STEV, fields: [8, 8, 16]}\nprofile:\n  mode: GEN\n  ev_count: 16\n  ev_min_active: 4\n  fields:\n"
     "    - {width: 8, init_val: 0xA0, mask: 0x0F, max_val: 15}\n    - {width: 4, mask: 0x1A, max_val: 3}\n",
     "profile.fields[1].mask: 0x1A has bits outside width 4"),
    ("format: {mode: STEV, fields: [8, 8, 16]}\nprofile:\n  mode: GEN\n  ev_count: 16\n  fields: [{width: 8, mask: 0xF, max_val: 15}]\n",
     "profile.ev_min_active: OFFLINE -> ONLINE needs MIN_ACTIVE"),
    ("format: {mode: STEV, fields: [8, 8, 16]}\nprofile:\n  mode: GEN\n  ev_count: 17\n  ev_min_active: 1\n"
     "  fields: [{width: 8, mask: 0xF, max_val: 15}]\n", "profile.ev_count: 17 exceeds the 16 EVs the fields generate"),
    ("format: {mode: STEV, fields: [8, 8, 16]}\nprofile: {mode: GEN, ev_count: 1, ev_min_active: 1, fields: [{widht: 8}]}\n",
     "profile.fields[0].widht: unknown attribute"),
    ("format: {mode: STEV, fields: [40]}\nprofile: {}\n", "format.fields: total width 40 exceeds the 32 bits STEV carries"),
    ("format: {mode: STEV, fields: [8]\n", "not valid YAML"),
]


@pytest.mark.parametrize(("text", "message"), BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_ev_expand_a_bad_file_is_one_line_naming_file_and_field(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = run("ev", "expand", str(path))
    assert result.exit_code == 1
    assert result.output.startswith(f"mrc-emu: error: {path}") and message in result.output, result.output
    assert result.output.count("\n") == 1  # one line, nothing half-printed


def test_ev_expand_a_missing_file(tmp_path):
    result = run("ev", "expand", str(tmp_path / "none.yaml"))
    assert result.exit_code == 1 and "cannot read EV profile file" in result.output and result.output.count("\n") == 1


def test_ev_expand_without_a_file_is_a_usage_error():
    assert run("ev", "expand").exit_code == 2
