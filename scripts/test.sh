#!/usr/bin/env bash
# Set up (idempotently) and run the whole test suite, system and slow tests included; it makes
# itself root through sudo when it is not. Extra arguments go to pytest (a later -m wins, e.g.
# `scripts/test.sh -m "not slow"` for the quick part only). It refuses to run, with one line naming
# it, when a C extension or the port program is missing or stale: the tests that compare C with
# Python would only skip (scripts/check_native.py).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/as-root.sh"
venv="${MRC_EMU_VENV:-$repo/.venv}"
"$repo/scripts/install.sh"
"$venv/bin/python" "$repo/scripts/check_native.py"
cd "$repo"
exec "$venv/bin/python" -m pytest -m "slow or not slow" "$@"
