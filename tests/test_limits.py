"""Kernel limits: raised for a fabric, never lowered, given back when the last fabric goes (no root:
the sysctl files are stand-ins in a temporary directory)."""

from mrc_emu.fabric import limits, registry
from mrc_emu.topology import builtin


def test_raise_then_restore_when_the_last_fabric_goes(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "STATE_DIR", tmp_path / "state")
    monkeypatch.setattr(limits, "entries_now", lambda: 0)
    files = {n: tmp_path / f"gc_thresh{n}" for n in (2, 3)}
    for f in files.values():
        f.write_text("1024\n")
    monkeypatch.setattr(limits, "NEIGH", str(tmp_path / "gc_thresh{}"))
    topo = builtin("large")
    registry.STATE_DIR.mkdir()
    (registry.STATE_DIR / "one.journal").write_text("")
    limits.raise_for(topo)
    need = limits.needed(topo)
    assert int(files[3].read_text()) == 1024 + need[str(files[3])] > 4 * len(topo.links)
    (registry.STATE_DIR / "two.journal").write_text("")  # a second fabric: room for both
    limits.raise_for(topo)
    assert int(files[3].read_text()) == 1024 + 2 * need[str(files[3])]
    (registry.STATE_DIR / "two.journal").unlink()
    limits.restore_if_last()  # one fabric still runs: nothing given back
    assert int(files[3].read_text()) > 1024
    (registry.STATE_DIR / "one.journal").unlink()
    limits.restore_if_last()
    assert files[3].read_text() == "1024" and files[2].read_text() == "1024"
    assert not (registry.STATE_DIR / limits.SAVED).exists()


def test_room_for_what_the_kernel_still_holds(tmp_path, monkeypatch):
    """Namespaces torn down a moment ago keep their neighbour entries for a while: counted in."""
    monkeypatch.setattr(registry, "STATE_DIR", tmp_path / "state")
    for n in (2, 3):
        (tmp_path / f"gc_thresh{n}").write_text("1024")
    monkeypatch.setattr(limits, "NEIGH", str(tmp_path / "gc_thresh{}"))
    monkeypatch.setattr(limits, "entries_now", lambda: 50_000)
    topo = builtin()
    limits.raise_for(topo)
    assert int((tmp_path / "gc_thresh3").read_text()) == 50_000 + limits.needed(topo)[str(tmp_path / "gc_thresh3")]


def test_a_limit_set_higher_stays_higher_and_comes_back_exactly(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "STATE_DIR", tmp_path / "state")
    monkeypatch.setattr(limits, "entries_now", lambda: 0)
    for n in (2, 3):
        (tmp_path / f"gc_thresh{n}").write_text("10000000")
    monkeypatch.setattr(limits, "NEIGH", str(tmp_path / "gc_thresh{}"))
    limits.raise_for(builtin())
    assert int((tmp_path / "gc_thresh3").read_text()) >= 10000000
    limits.restore_if_last()
    assert (tmp_path / "gc_thresh3").read_text() == "10000000"
