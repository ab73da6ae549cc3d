"""The error a transfer on a running fabric raises when it cannot be set up or run.

Why it exists: transfer.py (the WRITEs) and stev.py (the STEV checks a transfer runs first, and
`stev-coverage`) both raise it, and the CLI turns it into one line; held here, neither of the two
imports the other to reach it. It must never grow logic: it is a name the layers above catch.
"""

from __future__ import annotations


class TransferError(RuntimeError):
    """A transfer could not be set up or run (bad arguments, no progress in time)."""
