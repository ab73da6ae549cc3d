"""Refuse a checkout whose C code is not all built: setup.py's extensions and the BPF programs.

Why it exists: every C extension is optional (setup.py), so that a machine without a compiler
still installs and runs the pure-Python paths, and the tests that compare a C path with its
Python twin skip where the C one is missing. In CI that turned a compile error into a few skips
and a green run. scripts/test.sh runs this after scripts/install.sh: a module that is missing,
does not import, or was built before its source last changed stops the run, with one line that
names it. install.sh asks it too, to know what to build again. The extensions' names, sources
are read from setup.py, so a new extension is checked without being listed here; the headers of
each are the ones its #include "..." lines name. It never builds anything.

    .venv/bin/python scripts/check_native.py [extensions] [bpf]   # both by default
    # exit 0: built and current; 1: one line on stderr
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BPF_DIR = REPO / "mrc_emu" / "fabric" / "bpf"  # every *.bpf.c there is compiled by install.sh into its *.bpf.o
ELF_MAGIC = b"\x7fELF"
EM_BPF = 247  # the ELF machine of a BPF object (e_machine, at offset 18)
_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def extensions(setup_py: Path = REPO / "setup.py") -> dict[str, list[Path]]:
    """Module name -> what it is built from: its C sources (setup.py's Extension(...) calls), the headers they
    include and the ones setup.py says it depends on, and setup.py itself."""
    out = {}
    for node in ast.walk(ast.parse(setup_py.read_text(), str(setup_py))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Extension":
            name, sources = ast.literal_eval(node.args[0]), ast.literal_eval(node.args[1])
            depends = next((ast.literal_eval(k.value) for k in node.keywords if k.arg == "depends"), [])
            headers = [h for source in sources for h in local_headers(REPO / source)]
            out[name] = list(dict.fromkeys([*headers, *(REPO / p for p in depends), REPO / "setup.py"]))  # setup.py: the flags
    return out


def local_headers(source: Path) -> list[Path]:
    """`source` and the files its #include "..." lines name, transitively (system headers aside)."""
    seen, todo = [], [source]
    while todo:
        path = todo.pop()
        if path in seen or not path.exists():
            continue
        seen.append(path)
        todo += [(path.parent / name).resolve() for name in _LOCAL_INCLUDE.findall(path.read_text())]
    return seen


def _stale(built: Path, inputs: list[Path]) -> Path | None:
    """The first input changed after `built` was made, or None."""
    made = built.stat().st_mtime
    return next((p for p in inputs if p.exists() and p.stat().st_mtime > made), None)


def extension_problems(setup_py: Path = REPO / "setup.py") -> list[str]:
    """What of setup.py's extensions is missing or out of date, one phrase each, naming the module."""
    out = []
    for name, inputs in extensions(setup_py).items():
        try:
            module = importlib.import_module(name)
        except Exception as e:  # a module whose initialisation fails is as missing as an absent one
            out.append(f"{name} (not importable: {type(e).__name__}: {e})")
            continue
        built = Path(module.__file__).resolve()
        if REPO not in built.parents:
            out.append(f"{name} (imported from {built}, not from this checkout)")
        elif (changed := _stale(built, inputs)) is not None:
            out.append(f"{name} (built before {changed.relative_to(REPO)} last changed)")
    return out


def bpf_problems() -> list[str]:
    """What is wrong with the compiled BPF programs (the port program, the SRv6 endpoint
    program), if anything: one phrase naming each."""
    out = []
    for source in sorted(BPF_DIR.glob("*.bpf.c")):
        program = source.with_suffix(".o")
        name = program.relative_to(REPO)
        if not program.exists():
            out.append(f"{name} (not compiled)")
            continue
        with program.open("rb") as f:
            head = f.read(20)
        order = "big" if head[5:6] == b"\x02" else "little"  # EI_DATA: the object's byte order
        if head[:4] != ELF_MAGIC or int.from_bytes(head[18:20], order) != EM_BPF:
            out.append(f"{name} (not a BPF object)")
        elif (changed := _stale(program, local_headers(source))) is not None:
            out.append(f"{name} (compiled before {changed.relative_to(REPO)} last changed)")
    return out


CHECKS = {"extensions": extension_problems, "bpf": bpf_problems}


def main(argv: list[str]) -> int:
    unknown = [a for a in argv if a not in CHECKS]
    if unknown:
        print(f"check_native.py: unknown part {unknown[0]!r} (parts: {', '.join(CHECKS)})", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))  # this checkout's package, whatever else the environment has
    found = [problem for part in (argv or CHECKS) for problem in CHECKS[part]()]
    if found:
        print(f"check_native.py: C code missing or out of date (its tests would only skip; run scripts/install.sh "
              f"to see why): {'; '.join(found)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
