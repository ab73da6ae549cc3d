# Sourced by demo.sh and test.sh: run the calling script as root. Not root: start it again
# through sudo (keeping the MRC_EMU_* settings); without sudo, say what to do and stop.
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        exec sudo --preserve-env=MRC_EMU_VENV,MRC_EMU_PYTHON -- "$0" "$@"
    fi
    echo "$(basename "$0"): needs root (network namespaces, apt) and there is no sudo; run it as root" >&2
    exit 1
fi
