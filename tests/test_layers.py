"""The layers import down only and stay small, as their packages' docstrings say; the transport
stays sans-IO and below the drivers (no root: the source is read, not run)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mrc_emu

PACKAGE = Path(mrc_emu.__file__).parent
TRANSPORT = sorted((PACKAGE / "transport").rglob("*.py"))
FORBIDDEN_IN_TRANSPORT = {"socket", "select", "time", "random", "os"}  # sockets, clocks, randomness
VFABRIC = sorted((PACKAGE / "vfabric").rglob("*.py"))
# the virtual fabric's time is its engine's, its randomness a generator passed in, and it touches no system
FORBIDDEN_IN_VFABRIC = FORBIDDEN_IN_TRANSPORT | {"threading", "subprocess", "datetime"}
MAX_LINES, MAX_MODULES = 450, 14  # what a reader holds at once: a module, a folder


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


def package_of(path: Path) -> str:
    """The package a module's relative imports start from (a package's __init__ is its own)."""
    folder = path.parent.relative_to(PACKAGE.parent)
    return ".".join(folder.parts)


def imports_of(path: Path) -> set[str]:
    return imports(path.read_text(), package_of(path))


def test_the_import_reader_sees_every_form():
    source = "import os.path\nfrom time import monotonic_ns\nfrom random import Random as R\nfrom ..io import sockets\n"
    assert imports(source, "mrc_emu.transport") == {"os.path", "time", "time.monotonic_ns", "random", "random.Random",
                                                    "mrc_emu.io", "mrc_emu.io.sockets"}
    assert package_of(PACKAGE / "transport" / "cc" / "nscc.py") == "mrc_emu.transport.cc"
    assert "mrc_emu.fabric.kernel.netns" in imports_of(PACKAGE / "fabric" / "datapath" / "impair.py")


@pytest.mark.parametrize("path", TRANSPORT, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_transport_touches_no_socket_clock_or_randomness(path):
    top_level = {name.split(".")[0] for name in imports_of(path)}
    assert not top_level & FORBIDDEN_IN_TRANSPORT, f"{path.name} imports {sorted(top_level & FORBIDDEN_IN_TRANSPORT)}"


@pytest.mark.parametrize("path", TRANSPORT, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_transport_imports_neither_the_fabric_nor_the_drivers(path):
    above = sorted(m for m in imports_of(path) if m.startswith(("mrc_emu.fabric", "mrc_emu.io", "mrc_emu.vfabric",
                                                                 "mrc_emu.experiments", "mrc_emu.cli")))
    assert not above, f"{path.name} imports {above}"


@pytest.mark.parametrize("path", VFABRIC, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_virtual_fabric_reads_no_clock_and_draws_no_global_randomness(path):
    top_level = {name.split(".")[0] for name in imports_of(path)}
    assert not top_level & FORBIDDEN_IN_VFABRIC, f"{path.name} imports {sorted(top_level & FORBIDDEN_IN_VFABRIC)}"


@pytest.mark.parametrize("package", ["topology", "wire", "api", "fabric", "transport", "io", "vfabric", "experiments",
                                     "view", "cli"])
def test_no_module_over_450_lines(package):
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in (PACKAGE / package).rglob("*.py")}
    assert sizes and max(sizes.values()) <= MAX_LINES, {k: v for k, v in sizes.items() if v > MAX_LINES}


def test_no_package_holds_more_than_14_modules():
    folders = [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    counts = {str(f.relative_to(PACKAGE.parent)): len(list(f.glob("*.py"))) for f in folders}
    assert counts["mrc_emu/experiments/runtime"] > 1  # the walk sees the subpackages
    assert max(counts.values()) <= MAX_MODULES, {k: v for k, v in counts.items() if v > MAX_MODULES}


PACKAGES = sorted(p.parent for p in PACKAGE.rglob("__init__.py") if p.parent not in (PACKAGE, PACKAGE / "topologies"))


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_package_says_what_it_must_never_do(package):
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
    assert doc and "must never" in doc


def unit(module: str) -> str:
    """The package of mrc_emu a module belongs to, named to its subpackage: 'fabric' (its own
    modules), 'fabric.kernel', 'experiments.runtime', 'stats'."""
    parts = module.split(".")[1:]
    if len(parts) > 1 and (PACKAGE / parts[0] / parts[1]).is_dir():
        return f"{parts[0]}.{parts[1]}"
    return parts[0] if parts else ""


def layer(module: str) -> str:
    """The layer a module belongs to: its package, except that the experiments' three
    subpackages are layers of their own (the fabric's and the transport's are not)."""
    name = unit(module)
    return name if name.startswith("experiments.") else name.split(".")[0]


def _name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


# what each layer may import of mrc_emu beside itself (any layer may import stats, which imports
# nothing of mrc_emu: the one percentile definition)
ALLOWED = {
    "topology": set(),
    "wire": set(),
    "api": {"topology"},  # the OCP controller API mirror: pure data beside the topology model
    "fabric": {"topology"},  # kernel, datapath and faults, and the fabric's own modules, among themselves
    "transport": {"topology", "wire", "api"},  # cc and multipath, and the transport's own modules
    "io": {"topology", "wire", "api", "transport"},
    "vfabric": {"topology", "wire", "api", "transport", "io"},  # the virtual fabric: a driver beside io, never the fabric
    "topologies": set(),  # the shipped topology and scenario files: data, no code
    "experiments": set(),
    "experiments.analysis": {"topology", "wire", "api", "transport", "io"},
    "experiments.runtime": {"topology", "wire", "api", "fabric", "transport", "io", "vfabric", "experiments.analysis"},
    "experiments.scenarios": {"topology", "wire", "api", "fabric", "transport", "io", "vfabric", "experiments.analysis",
                              "experiments.runtime"},
    # the web view: reads the fabric and the runtime's records, acts through the fabric's faults and the controller
    "view": {"topology", "fabric", "experiments.runtime"},
    "cli": {"topology", "wire", "api", "fabric", "transport", "io", "vfabric", "experiments.analysis",
            "experiments.runtime", "experiments.scenarios", "view"},
}
# inside a layer: what a subpackage may import of its layer beside itself
INSIDE = {
    "transport.cc": set(),  # a profile sees events, nothing of the QP
    "transport.multipath": set(),  # the requester and the responder use the paths, not the other way
    "fabric.kernel": set(),  # primitives that know no fabric
    "fabric.datapath": {"fabric", "fabric.kernel"},  # never the faults, which use it
}
SYSTEM = {"socket", "subprocess", "ctypes", "select", "pyroute2", "mininet", "multiprocessing"}
MODULES = sorted(PACKAGE.rglob("*.py"))


def _mrc_imports(path: Path) -> set[str]:
    return {m for m in imports_of(path) if m.startswith("mrc_emu.")}


def test_every_module_is_in_a_layer():
    assert {layer(_name(p)) for p in MODULES} == set(ALLOWED) | {"stats", ""}  # "": mrc_emu's own __init__


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_each_layer_imports_only_the_layers_below(name):
    for path in (p for p in MODULES if layer(_name(p)) == name):
        wrong = {layer(m) for m in _mrc_imports(path)} - ALLOWED[name] - {name, "stats"}
        assert not wrong, f"{path.relative_to(PACKAGE)} imports {sorted(wrong)}"


@pytest.mark.parametrize("name", sorted(INSIDE))
def test_a_subpackage_imports_of_its_layer_only_what_it_builds_on(name):
    for path in (p for p in MODULES if unit(_name(p)) == name):
        same_layer = {unit(m) for m in _mrc_imports(path) if layer(m) == layer(_name(path))}
        wrong = same_layer - INSIDE[name] - {name}
        assert not wrong, f"{path.relative_to(PACKAGE)} imports {sorted(wrong)}"


def test_stats_imports_nothing_but_arithmetic():
    assert {m.split(".")[0] for m in imports_of(PACKAGE / "stats.py")} <= {"__future__", "math", "collections", "itertools"}


def test_topology_never_touches_the_system():
    for path in (PACKAGE / "topology").rglob("*.py"):
        top_level = {m.split(".")[0] for m in imports_of(path)}
        assert not top_level & SYSTEM, f"{path.relative_to(PACKAGE)} imports {sorted(top_level & SYSTEM)}"


def test_no_layer_below_imports_the_experiments():
    for name in ("topology", "fabric", "transport", "wire", "io", "vfabric", "api"):
        for path in (PACKAGE / name).rglob("*.py"):
            assert not any(m.startswith("mrc_emu.experiments") for m in _mrc_imports(path)), path.relative_to(PACKAGE)


def test_only_the_cli_imports_the_view():
    for path in (p for p in MODULES if layer(_name(p)) not in ("view", "cli")):
        assert not any(m.startswith("mrc_emu.view") for m in _mrc_imports(path)), path.relative_to(PACKAGE)


# ---- no import circles -----------------------------------------------------------------------

# Circles allowed for now, each named (none): a new one fails, and so does an allowed one that is gone.
KNOWN_CIRCLES: set[frozenset[str]] = set()


def _module_name(path: Path, package: Path) -> str:
    parts = [package.name, *path.relative_to(package).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Every module of mrc_emu -> the modules of mrc_emu it imports, wherever in the file (inside a
    function or under TYPE_CHECKING too). Relative imports are resolved; `from pkg import mod` is
    an edge to the module `pkg.mod` when it is one, else to `pkg`. A package's implicit import of
    its parents is not an edge: the runtime does it for every module alike."""
    paths = {_module_name(path, package): path for path in package.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = here.split(".")[:len(here.split(".")) - node.level + 1] if node.level else []
                module = ".".join([*base, node.module] if node.module else base)
                targets |= {f"{module}.{alias.name}" if f"{module}.{alias.name}" in paths else module
                            for alias in node.names}
        graph[name] = {target for target in targets if target in paths and target != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = lowlink[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is None:
                work.pop()
                if work:
                    lowlink[work[-1][0]] = min(lowlink[work[-1][0]], lowlink[node])
                if lowlink[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
            elif successor not in index:
                index[successor] = lowlink[successor] = len(index)
                stack.append(successor)
                on_stack.add(successor)
                work.append((successor, iter(sorted(graph[successor]))))
            elif successor in on_stack:
                lowlink[node] = min(lowlink[node], index[successor])
    return found


def test_the_import_graph_resolves_every_form(tmp_path):
    package = tmp_path / "mrc_emu"
    for name in ("__init__", "a/__init__", "a/one", "a/two", "b/__init__", "b/three"):
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / f"{name}.py").write_text("")
    (package / "a/one.py").write_text("from . import two\nfrom ..b import three\nimport mrc_emu.b\n")
    (package / "a/two.py").write_text("def f():\n    from .one import thing\n")
    (package / "b/three.py").write_text("from mrc_emu.a import name_not_a_module\nfrom . import three\n")
    graph = import_graph(package)
    assert graph["mrc_emu.a.one"] == {"mrc_emu.a.two", "mrc_emu.b.three", "mrc_emu.b"}
    assert graph["mrc_emu.a.two"] == {"mrc_emu.a.one"}
    assert graph["mrc_emu.b.three"] == {"mrc_emu.a"}
    assert circles(graph) == [{"mrc_emu.a.one", "mrc_emu.a.two"}]


def test_circles_finds_each_component_whole():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert sorted(map(sorted, circles(graph))) == [["a", "b", "c"], ["d", "e"]]


def test_no_import_circle_anywhere():
    found = circles(import_graph())
    for circle in found:
        print("import circle:", " <-> ".join(sorted(circle)))
    unknown = [sorted(circle) for circle in found if frozenset(circle) not in KNOWN_CIRCLES]
    assert not unknown, f"modules that import each other (move the shared piece down): {unknown}"
    gone = [sorted(circle) for circle in KNOWN_CIRCLES if circle not in map(frozenset, found)]
    assert not gone, f"no longer a circle, remove from KNOWN_CIRCLES: {gone}"
