"""BPF objects from Python: load a compiled object with libbpf, pin it, open pins, read and write maps.

Why it exists: the port program (bpf/port.bpf.c) is compiled C with BTF maps and a spin lock,
which only a real loader relocates; libbpf (Debian's libbpf1, which iproute2 already needs) does
it, called through ctypes, so a fabric loads it once, sized to its topology, without spawning
bpftool. Map access afterwards is plain bpf(2) on pinned objects, from any process (`mrc-emu
stats`). It knows nothing of ports or thresholds (fabric/datapath/ports.py does), and it removes only the
pins a caller names.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import struct
import subprocess
from pathlib import Path

BPFFS = Path("/sys/fs/bpf")
PIN_ROOT = BPFFS / "mrc-emu"  # every fabric pins under PIN_ROOT/<fabric>; cleanup removes nothing outside it
BPF_MAP_LOOKUP_ELEM, BPF_MAP_UPDATE_ELEM, BPF_OBJ_GET = 1, 2, 7
BPF_F_LOCK = 4
_SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(platform.machine())
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class BpfError(OSError):
    """A BPF object could not be loaded, pinned or read; the message says what to do."""


def bpf_syscall(cmd: int, attr: ctypes.Array, error: type[OSError] = BpfError) -> int:
    """bpf(2) with `attr`; a refusal raises `error` (errno, what failed). Also xdp.py's."""
    if _SYS_BPF is None:
        raise error(0, f"bpf(2) syscall number unknown on {platform.machine()}")
    result = _libc.syscall(_SYS_BPF, cmd, attr, len(attr))
    if result < 0:
        err = ctypes.get_errno()
        raise error(err, f"bpf({cmd}) failed: {os.strerror(err)}")
    return int(result)


_bpf = bpf_syscall


BPF_PROG_LOAD_CMD = 5


def load_instructions(prog_type: int, instructions: list[bytes], error: type[OSError], what: str,
                      log_size: int = 8192) -> int:
    """BPF_PROG_LOAD of hand-written instructions (the XDP dropper, the ECN decapsulation program):
    the program's fd, or `error` saying `what` failed with the verifier's log."""
    code = b"".join(instructions)
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(log_size)
    attr = ctypes.create_string_buffer(128)
    struct.pack_into("<IIQQIIQ", attr, 0, prog_type, len(code) // 8, ctypes.addressof(insns),
                     ctypes.addressof(license_), 1, len(log), ctypes.addressof(log))
    try:
        return bpf_syscall(BPF_PROG_LOAD_CMD, attr, error)
    except error as exc:
        raise error(exc.errno, f"loading {what} failed: {exc.strerror} {log.value.decode(errors='replace')}") from None


BPF_PROG_TEST_RUN = 10


def test_run(prog_fd: int, frame: bytes, error: type[OSError] = BpfError) -> tuple[int, bytes]:
    """(return value, frame out) of a packet program on one frame (BPF_PROG_TEST_RUN): how a
    program is checked without a fabric. The kernel refuses an IPv4/IPv6 frame shorter than its
    header."""
    data_in = ctypes.create_string_buffer(frame, len(frame))
    data_out = ctypes.create_string_buffer(len(frame) + 256)
    attr = ctypes.create_string_buffer(80)
    # union bpf_attr.test: prog_fd, retval, data_size_in, data_size_out, data_in, data_out, repeat, duration
    struct.pack_into("<IIIIQQII", attr, 0, prog_fd, 0, len(frame), len(data_out), ctypes.addressof(data_in),
                     ctypes.addressof(data_out), 1, 0)
    bpf_syscall(BPF_PROG_TEST_RUN, attr, error)
    retval, _, size_out = struct.unpack_from("<III", attr, 4)
    return retval, data_out.raw[:size_out]


def ensure_bpffs() -> bool:
    """Mount bpffs at /sys/fs/bpf if nothing is mounted there; True if this call mounted it.
    It stays mounted: it is the system's standard place (systemd mounts it at boot), other
    tools pin there too, and an empty bpffs costs nothing."""
    with open("/proc/self/mounts") as f:
        if any(line.split()[1:3] == [str(BPFFS), "bpf"] for line in f):
            return False
    BPFFS.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "bpf", "bpf", str(BPFFS)], capture_output=True, text=True)
    if done.returncode:
        raise BpfError(0, f"cannot mount bpffs at {BPFFS}: {done.stderr.strip()} (needs root and CONFIG_BPF_SYSCALL)")
    return True


def obj_get(path: Path) -> int:
    """An fd for a pinned program or map."""
    name = ctypes.create_string_buffer(str(path).encode())
    attr = ctypes.create_string_buffer(16)
    struct.pack_into("<QII", attr, 0, ctypes.addressof(name), 0, 0)
    try:
        return _bpf(BPF_OBJ_GET, attr)
    except BpfError as exc:
        raise BpfError(exc.errno, f"cannot open pinned BPF object {path}: {exc.strerror}") from None


class MapHandle:
    """A BPF array map by fd: fixed-size values read and written whole, under the map's spin
    lock when it has one (BPF_F_LOCK: what the program changes under the lock is read whole)."""

    def __init__(self, fd: int, value_size: int, locked: bool = False) -> None:
        self.fd = fd
        self.value_size = value_size
        self._flags = BPF_F_LOCK if locked else 0
        self._key = ctypes.c_uint32(0)
        self._value = ctypes.create_string_buffer(value_size)
        self._attr = ctypes.create_string_buffer(32)

    def _call(self, cmd: int, key: int) -> None:
        self._key.value = key
        struct.pack_into("<IIQQQ", self._attr, 0, self.fd, 0, ctypes.addressof(self._key),
                         ctypes.addressof(self._value), self._flags)
        _bpf(cmd, self._attr)

    def get(self, key: int) -> bytes:
        self._call(BPF_MAP_LOOKUP_ELEM, key)
        return self._value.raw

    def put(self, key: int, value: bytes) -> None:
        if len(value) != self.value_size:
            raise ValueError(f"value of {len(value)} bytes for a map of {self.value_size}-byte values")
        ctypes.memmove(self._value, value, len(value))
        self._call(BPF_MAP_UPDATE_ELEM, key)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _libbpf() -> ctypes.CDLL:
    name = ctypes.util.find_library("bpf") or "libbpf.so.1"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        raise BpfError(0, "libbpf not found: apt-get install libbpf1 (or run scripts/install.sh)") from None
    for fn in ("bpf_object__open_file", "bpf_object__find_map_by_name", "bpf_object__find_program_by_name"):
        getattr(lib, fn).restype = ctypes.c_void_p
    lib.bpf_object__open_file.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    lib.bpf_object__find_map_by_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.bpf_object__find_program_by_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.bpf_map__set_max_entries.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.bpf_object__load.argtypes = [ctypes.c_void_p]
    lib.bpf_object__close.argtypes = [ctypes.c_void_p]
    lib.bpf_program__pin.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.bpf_map__pin.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.bpf_program__fd.argtypes = [ctypes.c_void_p]
    lib.bpf_map__fd.argtypes = [ctypes.c_void_p]
    return lib


def load_and_pin(obj_path: Path, program: str, maps: dict[str, int], pin_dir: Path) -> int:
    """Load `obj_path` with each named map resized to its max_entries, pin the program as
    pin_dir/prog and each map as pin_dir/<map>; return an fd for the program (caller closes it)."""
    return _load(obj_path, program, maps, pin_dir)[0]


def load(obj_path: Path, program: str, maps: dict[str, int]) -> tuple[int, dict[str, int]]:
    """Load `obj_path` as load_and_pin does, pinning nothing: fds for the program and for each
    named map (the caller closes them). What the kernel holds lives as long as something uses
    it: a program attached to interfaces goes with the last of them."""
    return _load(obj_path, program, maps, None)


def _load(obj_path: Path, program: str, maps: dict[str, int], pin_dir: Path | None) -> tuple[int, dict[str, int]]:
    lib = _libbpf()
    obj = lib.bpf_object__open_file(str(obj_path).encode(), None)
    if not obj:
        err = ctypes.get_errno()
        raise BpfError(err, f"libbpf cannot open {obj_path}: {os.strerror(err)}")
    try:
        handles = {}
        for name, entries in maps.items():
            handles[name] = lib.bpf_object__find_map_by_name(obj, name.encode())
            if not handles[name] or lib.bpf_map__set_max_entries(handles[name], entries):
                raise BpfError(0, f"{obj_path} has no map {name!r}: rebuild it (scripts/install.sh)")
        prog = lib.bpf_object__find_program_by_name(obj, program.encode())
        if not prog:
            raise BpfError(0, f"{obj_path} has no program {program!r}: rebuild it (scripts/install.sh)")
        err = lib.bpf_object__load(obj)
        if err:
            raise BpfError(-err, f"the kernel refused {obj_path}: {os.strerror(-err)} (libbpf printed the verifier's log)")
        if pin_dir is not None:
            pin_dir.mkdir(parents=True, exist_ok=True)
            if lib.bpf_program__pin(prog, str(pin_dir / "prog").encode()):
                raise BpfError(ctypes.get_errno(), f"cannot pin the program under {pin_dir}")
            for name, handle in handles.items():
                if lib.bpf_map__pin(handle, str(pin_dir / name).encode()):
                    raise BpfError(ctypes.get_errno(), f"cannot pin map {name} under {pin_dir}")
            return os.dup(lib.bpf_program__fd(prog)), {}
        return os.dup(lib.bpf_program__fd(prog)), {name: os.dup(lib.bpf_map__fd(h)) for name, h in handles.items()}
    finally:
        lib.bpf_object__close(obj)
