#!/usr/bin/env bash
# Set up (idempotently) and run the main job on the built-in default topology: bring the
# fabric up, probe every EV between every pair of hosts, take it down.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MRC_EMU_VENV:-$repo/.venv}"
"$repo/scripts/install.sh"
exec "$venv/bin/mrc-emu" check "$@"
