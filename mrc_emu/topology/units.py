"""The units topology and scenario files are written in: sizes ('64MiB'), rates ('100mbit') and
durations ('1ms'), each parsed to one integer or float unit.

Why it exists: the topology model, its port model and the scenarios all read these, and the port
model is read by the topology model, so the parsers sit below both rather than in either. It must
never import another module of mrc_emu or touch the system.
"""

from __future__ import annotations

import re
from typing import Any

_SIZE_RE = re.compile(r"^\s*(\d[\d_]*(?:\.\d+)?)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 10**6, "mb": 10**6, "mib": 2**20,
               "g": 10**9, "gb": 10**9, "gib": 2**30}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(kbit|mbit|gbit)\s*$", re.IGNORECASE)
_RATE_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s)\s*$")
_DURATION_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


def parse_size(text: str | int) -> int:
    """'64MiB', '1.5GB', '4096', '100k', '1_000' (or an int) -> bytes, at least one; raises
    ValueError on anything else. The one language of sizes: the CLI's and the scenarios'."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _SIZE_RE.match(str(text))
        unit = (m.group(2) or "").lower() if m else ""
        if not m or unit not in _SIZE_UNITS:
            raise ValueError(f"{text!r} is not a size (examples: 4096, 100k, 64MiB, 1.5GB)")
        value = int(float(m.group(1).replace("_", "")) * _SIZE_UNITS[unit])
    if value < 1:
        raise ValueError(f"{text!r} is less than one byte")
    return value


def parse_rate(text: str) -> float:
    """'100mbit' -> 1e8 bits/s; raises ValueError on anything else."""
    m = _RATE_RE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a rate like '100mbit', '1gbit' or '500kbit'")
    value = float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]
    if value <= 0:
        raise ValueError(f"{text!r} must be above zero")
    return value


def parse_duration_ns(text: Any) -> int:
    """'1ms', '500us', '2.5ms', '1s' -> nanoseconds; ValueError on anything else."""
    m = _DURATION_RE.match(str(text))
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration above zero like '1ms', '500us' or '20000ns'")
    return int(float(m.group(1)) * _DURATION_UNITS[m.group(2)])
