"""Only the C extensions live here; everything else is in pyproject.toml.

mrc_emu.wire._fastpath encodes a data packet into its frame template; mrc_emu.transport._spray
is the requester's send loop for first transmissions; mrc_emu.transport._place checks and places
the responder's common data packet; mrc_emu.io._sockio receives and sends in batches (both
_fastpath and _place run the ICRC of mrc_emu/wire/crc32.h). Each is optional for a user: where
no C compiler, Python headers or zlib headers exist, the build warns and installs without it
(scripts/install.sh installs them). What the fallbacks give up differs:

- without _fastpath, _spray or _place, mrc_emu/wire/encoder.py, transport/requester.py and
  responder.py run their pure-Python paths: the same bytes and the same bookkeeping (the tests
  compare both), only slower, so a run is more often emulator-bound;
- without _sockio, a worker reads its sockets in Python, one datagram per call and with no
  kernel arrival stamps: each datagram is timed when read, the worker's lag included, so such a
  run's emulation block names those hosts and never calls the run faithful; sending stays the
  same (the Python SocketLink.send), one frame per system call.

For the tests none is optional: scripts/test.sh (and so CI) stops, naming the module, when one is
missing or older than its sources (scripts/check_native.py), rather than let the C-against-Python
tests skip.
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
