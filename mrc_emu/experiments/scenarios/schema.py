"""results.json's schema for the transports and fault kinds scenario files may name.

Why it exists: the analysis layer writes and documents results.json (analysis.report) but knows
neither the transports nor the fault kinds, which are this package's; here the two meet. It
must never hold a second copy of either list.
"""

from __future__ import annotations

from typing import Any

from ..analysis.report import results_schema
from .faults import FAULT_KINDS
from .transports import Transport

RESULTS_SCHEMA: dict[str, Any] = results_schema([t.value for t in Transport], list(FAULT_KINDS))
