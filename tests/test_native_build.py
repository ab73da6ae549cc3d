"""scripts/check_native.py, which makes scripts/test.sh refuse a checkout whose C code is missing or stale."""

import ast
import importlib.util
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_native", REPO / "scripts" / "check_native.py")
check_native = importlib.util.module_from_spec(_spec)
sys.modules["check_native"] = check_native
_spec.loader.exec_module(check_native)


def test_every_extension_of_setup_py_is_checked_with_the_headers_it_includes():
    found = check_native.extensions()
    assert set(found) == {"mrc_emu.wire._fastpath", "mrc_emu.transport._spray", "mrc_emu.transport._place",
                          "mrc_emu.io._sockio"}
    spray = {p.relative_to(REPO).as_posix() for p in found["mrc_emu.transport._spray"]}
    assert {"mrc_emu/transport/_spray.c", "mrc_emu/wire/patch.h", "mrc_emu/wire/crc32.h",
            "mrc_emu/transport/send_many.h"} <= spray


def test_setup_py_depends_on_every_header_its_sources_include():
    """setuptools (pip, build_ext) rebuilds an extension only when one of its sources or `depends` changed."""
    for node in ast.walk(ast.parse((REPO / "setup.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Extension":
            depends = next((ast.literal_eval(k.value) for k in node.keywords if k.arg == "depends"), [])
            for source in ast.literal_eval(node.args[1]):
                headers = set(check_native.local_headers(REPO / source)) - {REPO / source}
                missed = headers - {REPO / p for p in depends}
                assert not missed, f"{source}: setup.py's depends misses {sorted(str(h) for h in missed)}"


def test_a_missing_extension_is_named(tmp_path):
    setup_py = tmp_path / "setup.py"
    setup_py.write_text('setup(ext_modules=[Extension("mrc_emu.wire._absent", ["mrc_emu/wire/_absent.c"])])\n')
    (problem,) = check_native.extension_problems(setup_py)
    assert problem.startswith("mrc_emu.wire._absent (not importable")


def test_a_build_older_than_a_header_it_includes_is_stale(tmp_path):
    source, header, built = tmp_path / "x.c", tmp_path / "x.h", tmp_path / "x.so"
    source.write_text('#include <stdint.h>\n#include "x.h"\n')
    header.write_text("#define X 1\n")
    built.write_bytes(b"")
    assert check_native._stale(built, check_native.local_headers(source)) is None
    later = built.stat().st_mtime + 5
    os.utime(header, (later, later))
    assert check_native._stale(built, check_native.local_headers(source)) == header
