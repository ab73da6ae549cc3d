#!/usr/bin/env bash
# Set up (idempotently) and run the main job on the built-in default topology: a 128 MiB
# RDMA WRITE while a leaf-spine link fails, once with MRC and once with the BGP baseline;
# prints the comparison and writes results, plots and pcaps to ./mrc-emu-demo (or --out DIR).
# It makes itself root through sudo when it is not.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/as-root.sh"
venv="${MRC_EMU_VENV:-$repo/.venv}"
"$repo/scripts/install.sh"
exec "$venv/bin/mrc-emu" demo "$@"
