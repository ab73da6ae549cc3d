"""The layers import down only, as their packages' docstrings say (no root: the source is read, not run)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mrc_emu"
# what each layer may import of mrc_emu (itself always)
ALLOWED = {
    "topology": set(),
    "fabric": {"topology"},
    "experiments": {"topology", "fabric", "transport", "wire", "io"},
}
SYSTEM = {"socket", "subprocess", "ctypes", "select", "pyroute2", "mininet", "multiprocessing"}


def _imports(path: Path) -> set[str]:
    """Top-level names imported by a module: mrc_emu layers as 'layer', others by their first name."""
    layer = path.relative_to(PACKAGE).parts[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                out.add(parts[1] if parts[0] == "mrc_emu" and len(parts) > 1 else parts[0])
            elif node.level == 1:
                out.add(layer)
            else:  # from ..x import y
                out.add((node.module or "").split(".")[0] or next(a.name for a in node.names))
    return out


def _modules(layer: str) -> list[Path]:
    return sorted((PACKAGE / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_imports_only_the_layers_below(layer):
    layers = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} | {"cli"}
    for path in _modules(layer):
        wrong = (_imports(path) & layers) - ALLOWED[layer] - {layer}
        assert not wrong, f"{path.relative_to(PACKAGE)} imports {sorted(wrong)}"


def test_topology_never_touches_the_system():
    for path in _modules("topology"):
        assert not _imports(path) & SYSTEM, f"{path.relative_to(PACKAGE)} imports {sorted(_imports(path) & SYSTEM)}"


def test_no_layer_below_imports_the_experiments():
    for layer in ("topology", "fabric", "transport", "wire"):
        for path in _modules(layer):
            assert "experiments" not in _imports(path), path.relative_to(PACKAGE)


@pytest.mark.parametrize("layer", ["topology", "fabric", "experiments", "cli"])
def test_no_module_over_450_lines(layer):
    for path in _modules(layer):
        assert len(path.read_text().splitlines()) <= 450, path.relative_to(PACKAGE)
