"""Only the optional C fast paths live here; everything else is in pyproject.toml.

mrc_emu.wire._fastpath encodes a data packet into its frame template; mrc_emu.transport._spray
is the requester's send loop for first transmissions; mrc_emu.transport._place checks and places
the responder's common data packet; mrc_emu.io._sockio receives and sends in batches (both
_fastpath and _place run the ICRC of mrc_emu/wire/crc32.h). All are optional: where no C compiler,
Python headers or zlib headers exist, the build warns and installs without them
(scripts/install.sh installs them), and mrc_emu/wire/encoder.py and mrc_emu/transport/requester.py
and responder.py run their pure-Python paths (the same bytes, the same bookkeeping; the tests run
both).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("mrc_emu.wire._fastpath", ["mrc_emu/wire/_fastpath.c"], optional=True, libraries=["z"],
              depends=["mrc_emu/wire/crc32.h", "mrc_emu/wire/patch.h"], extra_compile_args=["-O3"]),
    Extension("mrc_emu.transport._spray", ["mrc_emu/transport/_spray.c"], optional=True, libraries=["z"],
              depends=["mrc_emu/wire/crc32.h", "mrc_emu/wire/patch.h", "mrc_emu/transport/send_many.h"],
              extra_compile_args=["-O3"]),
    Extension("mrc_emu.transport._place", ["mrc_emu/transport/_place.c"], optional=True, libraries=["z"],
              depends=["mrc_emu/wire/crc32.h"], extra_compile_args=["-O3"]),
    Extension("mrc_emu.io._sockio", ["mrc_emu/io/_sockio.c"], optional=True, depends=["mrc_emu/transport/send_many.h"],
              extra_compile_args=["-O2"]),
])
