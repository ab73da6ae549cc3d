#!/usr/bin/env bash
# Set up (idempotently) and run the whole test suite. As root, the system tests run too.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MRC_EMU_VENV:-$repo/.venv}"
"$repo/scripts/install.sh"
cd "$repo"
exec "$venv/bin/python" -m pytest "$@"
