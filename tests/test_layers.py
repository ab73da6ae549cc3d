"""The transport stays sans-IO and below the drivers; the packages a reader meets stay small."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mrc_emu

PACKAGE = Path(mrc_emu.__file__).parent
TRANSPORT = sorted((PACKAGE / "transport").glob("*.py"))
FORBIDDEN_IN_TRANSPORT = {"socket", "select", "time", "random", "os"}  # sockets, clocks, randomness


def imports(source: str, package: str) -> set[str]:
    """Every module `source` imports, absolute (relative imports resolved against `package`)."""
    found = set()
    parts = package.split(".")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = parts[:len(parts) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def test_the_import_reader_sees_every_form():
    source = "import os.path\nfrom time import monotonic_ns\nfrom random import Random as R\nfrom ..io import sockets\n"
    assert imports(source, "mrc_emu.transport") == {"os.path", "time", "time.monotonic_ns", "random", "random.Random",
                                                    "mrc_emu.io", "mrc_emu.io.sockets"}


@pytest.mark.parametrize("path", TRANSPORT, ids=lambda p: p.name)
def test_transport_touches_no_socket_clock_or_randomness(path):
    top_level = {name.split(".")[0] for name in imports(path.read_text(), "mrc_emu.transport")}
    assert not top_level & FORBIDDEN_IN_TRANSPORT, f"{path.name} imports {sorted(top_level & FORBIDDEN_IN_TRANSPORT)}"


@pytest.mark.parametrize("path", TRANSPORT, ids=lambda p: p.name)
def test_transport_imports_neither_the_fabric_nor_the_drivers(path):
    above = sorted(m for m in imports(path.read_text(), "mrc_emu.transport")
                   if m.startswith(("mrc_emu.fabric", "mrc_emu.io", "mrc_emu.experiments", "mrc_emu.cli")))
    assert not above, f"{path.name} imports {above}"


@pytest.mark.parametrize("package", ["transport", "wire", "io"])
def test_no_module_over_450_lines(package):
    sizes = {p.name: len(p.read_text().splitlines()) for p in (PACKAGE / package).glob("*.py")}
    assert sizes and max(sizes.values()) <= 450, sizes


@pytest.mark.parametrize("package", ["transport", "wire", "io"])
def test_every_package_says_what_it_must_never_do(package):
    doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text()))
    assert doc and "must never" in doc
