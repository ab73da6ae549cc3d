"""Only the optional C fast path lives here; everything else is in pyproject.toml.

The extension is optional: where no C compiler, Python headers or zlib headers exist, the
build warns and installs without it (scripts/install.sh installs them), and mrc_emu/wire/fast.py uses its pure-Python path (same bytes).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("mrc_emu.wire._fastpath", ["mrc_emu/wire/_fastpath.c"], optional=True,
                             libraries=["z"], extra_compile_args=["-O3"])])
