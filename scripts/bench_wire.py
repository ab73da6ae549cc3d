#!/usr/bin/env python3
"""Wire fast path benchmark: everything measured side by side in one run (ratios matter).

Needs root: it brings up the default fabric under the name 'benchw', sends from h0 along
one EV to h2 (traffic stays inside the fabric's namespaces), and takes the fabric down.
Prints JSON: fast encoder + send pps, raw-socket ceiling pps (identical pre-built bytes),
scapy build pps, the ratio fast/ceiling (target >= 0.8) and decoder pps (target >= 200k).
"""

import json
import sys
import time

from scapy.compat import raw

from mrc_emu.fabric import build, ops
from mrc_emu.topology import addressing as ad
from mrc_emu.topology import builtin, evs_between
from mrc_emu.wire import fast, layers
from mrc_emu.wire.format import DataPacket, Endpoints

PAYLOAD = 1024
N = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000


def rate(n, seconds):
    return round(n / seconds)


def main() -> None:
    topo = builtin()
    name = "benchw"
    build.up(topo, name)
    try:
        ev = evs_between(topo, "h0", "h2")[0]
        src, dst = ad.host_address(topo, "h0"), ad.host_address(topo, "h2")
        ends = Endpoints(src, dst, ev.udp_sport)
        template = fast.FrameTemplate(ends, fast.Encap.srv6(src, ev.segments))
        payload = bytes(range(256)) * (PAYLOAD // 256)
        send, recv = ops.host_sockets(name, "h0")
        recv.close()
        first_hop = (ev.segments[0], 0)
        packets = [DataPacket(1, psn & 0xFFFFFF, 0x10000 + psn * PAYLOAD, 7, payload) for psn in range(N)]

        prebuilt = template.data(packets[0])
        t = time.perf_counter()
        for _ in range(N):
            send.sendto(prebuilt, first_hop)
        ceiling = rate(N, time.perf_counter() - t)

        t = time.perf_counter()
        for packet in packets:
            send.sendto(template.data(packet), first_hop)
        fast_send = rate(N, time.perf_counter() - t)

        t = time.perf_counter()
        for packet in packets:
            template.data(packet)
        encode_only = rate(N, time.perf_counter() - t)

        frames = [template.data(p) for p in packets[:20_000]]
        t = time.perf_counter()
        for frame in frames:
            fast.decode_frame(frame)
        decoder = rate(len(frames), time.perf_counter() - t)

        n_scapy = 500
        t = time.perf_counter()
        for packet in packets[:n_scapy]:
            raw(layers.srv6_frame(packet, ends, list(ev.segments)))
        scapy = rate(n_scapy, time.perf_counter() - t)
        send.close()
    finally:
        build.down(name)
    print(json.dumps({
        "payload_bytes": PAYLOAD, "frame_bytes": len(prebuilt), "packets": N,
        "ceiling_raw_socket_pps": ceiling, "fast_encode_and_send_pps": fast_send,
        "fast_encode_only_pps": encode_only, "scapy_build_pps": scapy, "decoder_pps": decoder,
        "ratio_fast_to_ceiling": round(fast_send / ceiling, 3), "ratio_fast_to_scapy": round(encode_only / scapy, 1),
        "targets": {"ratio_fast_to_ceiling": 0.8, "decoder_pps": 200_000},
    }, indent=2))


if __name__ == "__main__":
    main()
