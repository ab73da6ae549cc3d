"""`python -m mrc_emu.cli`: the same command line as the `mrc-emu` script."""

from . import main

main()
