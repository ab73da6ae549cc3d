#!/usr/bin/env python3
"""Virtual-time benchmark: the virtual fabric's speed, measured side by side in one run (ratios matter).

No root. Three measurements of one size, each the median of ROUNDS:
  model      the fabric model alone: N pre-built full-MTU data frames from h0 to h2, sprayed over
             its EVs, through NIC, leaf, spine and leaf ports to h2 (no transport): packet-hops/s
  memory     a WRITE between the same QPs over io.memory's MemoryNetwork (the transport with a
             delay per EV and no fabric): frames/s of wall time
  virtual    the same WRITE over the virtual fabric (experiments/runtime/virtual.py): frames/s and
             packet-hops/s of wall time, and the virtual time it took
and the ratios: virtual frames/s over memory frames/s (what the model costs on top of the bare
transport) and the model's share of the virtual run's wall time. Prints JSON.

    .venv/bin/python scripts/bench_virtual.py [SIZE_MIB] [TOPOLOGY]

Cross-validation (root: it builds fabrics; virtual_compare.py, beside this script):

    sudo .venv/bin/python scripts/bench_virtual.py compare [--only demo,incast8,link-down,ring16] ...
"""

import json
import os
import random
import socket
import sys
import time

from mrc_emu.experiments.runtime.virtual import send_virtual
from mrc_emu.io.memory import MemoryNetwork
from mrc_emu.stats import percentile
from mrc_emu.topology import builtin
from mrc_emu.transport.config import QpConfig
from mrc_emu.transport.multipath.paths import qp_paths
from mrc_emu.transport.requester import Requester
from mrc_emu.transport.responder import Responder
from mrc_emu.vfabric.engine import Engine
from mrc_emu.vfabric.fabric import VirtualFabric
from mrc_emu.wire.format import DataPacket

SPEED_ARGS = sys.argv[1:] if sys.argv[1:2] != ["compare"] else []
SIZE = int(float(SPEED_ARGS[0]) * 2**20) if SPEED_ARGS else 16 * 2**20
TOPOLOGY = SPEED_ARGS[1] if len(SPEED_ARGS) > 1 else "default"
ROUNDS = 3
MTU = 4096


def _hosts(topo):
    hosts = [h.name for h in topo.hosts]
    return hosts[0], hosts[-1]


def model_alone(topo) -> dict:
    """Pre-built frames through the model alone, offered by the source's ports as a NIC would."""
    src, dst = _hosts(topo)
    paths = qp_paths(topo, src, dst)
    frames = [(bytes(p.template.encode(DataPacket(1, psn, psn * MTU, 7, bytes(MTU)))), p)
              for psn, p in zip(range(SIZE // MTU), (p for _ in iter(int, 1) for p in paths.forward.values()))]
    engine = Engine()
    fabric = VirtualFabric(topo, engine, random.Random(0))
    got = [0]
    fabric.attach(dst, lambda *a: got.__setitem__(0, got[0] + 1))
    send = fabric.sender(src)
    began = time.perf_counter()
    for frame, path in frames:
        send(frame, path)
    engine.run()
    wall = time.perf_counter() - began
    assert got[0] == len(frames), (got[0], len(frames))
    return {"wall_s": wall, "packet_hops": fabric.packet_hops, "packet_hops_per_s": fabric.packet_hops / wall}


def memory(topo) -> dict:
    """The same WRITE over io.memory: the transport alone, a 2 us delay per EV."""
    src, dst = _hosts(topo)
    paths = qp_paths(topo, src, dst)
    bits = random.Random(0).getrandbits
    config = QpConfig(mtu=MTU, link_rate_bps=100e9, base_rtt_ns=10_000)
    responder = Responder(socket.inet_pton(socket.AF_INET6, paths.dst_address), config, random_bits=bits)
    mr = responder.register(bytearray(SIZE))
    responder.accept(0x22, 0x11, 0, paths.back)
    requester = Requester(socket.inet_pton(socket.AF_INET6, paths.src_address), 0x11, 0x22, paths.forward, config,
                          random_bits=bits)
    net = MemoryNetwork(0)
    for ev in paths.forward:
        net.fault(ev).delay_ns = 2_000
    requester.post_write(os.urandom(SIZE), mr.va, mr.rkey)
    began = time.perf_counter()
    assert net.run([requester, responder], lambda: requester.done)
    wall = time.perf_counter() - began
    return {"wall_s": wall, "frames": net.frames_sent, "frames_per_s": net.frames_sent / wall}


def virtual(topo) -> dict:
    src, dst = _hosts(topo)
    began = time.perf_counter()
    result = send_virtual(topo, src, dst, SIZE, config=QpConfig(mtu=MTU))
    wall = time.perf_counter() - began  # the whole run, set-up and hashing too
    assert result.verified
    v = result.virtual
    return {"wall_s": wall, "run_wall_s": v["wall"]["seconds"], "frames": v["frames_sent"],
            "frames_per_s": v["frames_sent"] / v["wall"]["seconds"], "packet_hops": v["packet_hops"],
            "packet_hops_per_s": v["wall"]["packet_hops_per_s"], "virtual_ms": v["virtual_ns"] / 1e6,
            "goodput_gbps": result.goodput_gbps}


def median(runs: list[dict]) -> dict:
    return {k: percentile([r[k] for r in runs], 50) if isinstance(runs[0][k], float) else runs[0][k] for k in runs[0]}


def main() -> None:
    topo = builtin(TOPOLOGY)
    model = median([model_alone(topo) for _ in range(ROUNDS)])
    mem = median([memory(topo) for _ in range(ROUNDS)])
    virt = median([virtual(topo) for _ in range(ROUNDS)])
    model_share = model["wall_s"] / model["packet_hops"] * virt["packet_hops"] / virt["run_wall_s"]
    print(json.dumps({
        "topology": topo.name, "size_mib": SIZE / 2**20, "rounds": ROUNDS, "load": os.getloadavg()[0],
        "model": {k: round(v, 3) for k, v in model.items()}, "memory": {k: round(v, 3) for k, v in mem.items()},
        "virtual": {k: round(v, 3) for k, v in virt.items()},
        "virtual_frames_per_s_over_memory": round(virt["frames_per_s"] / mem["frames_per_s"], 3),
        "model_share_of_virtual_wall": round(model_share, 3),
        "virtual_time_over_wall_time": round(virt["virtual_ms"] / 1e3 / virt["run_wall_s"], 5),
    }, indent=2))


if __name__ == "__main__":
    if sys.argv[1:2] == ["compare"]:
        from virtual_compare import compare_main

        compare_main(sys.argv[2:])
    else:
        main()
