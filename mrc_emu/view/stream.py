"""A client of a view's event stream: what scripts and tests read `/api/events` with.

Why it exists: the page is one consumer of the server-sent events (docs/view.md); a script that
follows a run (scripts/bench_view.py) or checks a replay reads the same stream, and this is the
one reader of its framing (`event: NAME` then `data: JSON` lines).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any


def read_events(url: str, timeout: float = 30.0) -> Iterator[tuple[str, Any]]:
    """The events at `url` (a view's .../api/events, with its query), as (event name, decoded data),
    in arrival order, until the server ends the stream or the caller stops iterating."""
    with urllib.request.urlopen(url, timeout=timeout) as stream:
        event = None
        for raw in stream:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event is not None:
                yield event, json.loads(line[6:])
