#!/usr/bin/python3
"""The real RoCE side of scripts/interop-rxe.sh: one RC QP on rdma_rxe (soft-RoCE), driven
through pyverbs (Debian's python3-pyverbs, the system Python: not mrc-emu's venv).

It talks to scripts/interop_rxe.py over its stdin and stdout, one JSON object a line:

  out  {"qpn", "psn", "gid", "rkey", "va"}       this QP, and its MR (the responder's target)
  in   {"qpn", "psn", "gid", "rkey", "va"}       mrc-emu's QP (and its region, as requester's target)
  responder role (mrc-emu's baseline requester WRITEs into this MR):
  in   {"done": true}                            every WRITE completed at mrc-emu's side
  out  {"sha256": ...}                           of the MR's bytes
  requester role (this QP WRITEs into mrc-emu's region): a WRITE of `size` bytes to the region's
  start, then a WRITE WITH IMMEDIATE of the same size after it; each polled to its completion
  out  {"wcs": [{"opcode", "status", "success", "byte_len"}...], "sha256": [first, second], "imm"}

Sizes are the WRITE's bytes; the data is SHA-256 in counter mode over a seed, so both sides can
say what was sent without shipping it. A WC that is not IBV_WC_SUCCESS is reported, not raised.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import sys
import time
from pathlib import Path

try:
    import pyverbs.enums as e
    from pyverbs.addr import GID, AHAttr, GlobalRoute
    from pyverbs.cq import CQ
    from pyverbs.device import Context
    from pyverbs.mr import MR
    from pyverbs.pd import PD
    from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
    from pyverbs.wr import SGE, SendWR
except ImportError:  # imported for `pattern` alone, by scripts/interop_rxe.py in mrc-emu's venv (no pyverbs)
    e = None

MTUS = (1024, 2048, 4096)
WC_WAIT_S = 600.0  # a WRITE that has not completed by then is reported as such


def pattern(seed: int, size: int) -> bytes:
    """`size` bytes of SHA-256 in counter mode: what each side writes, reproducible from the seed."""
    out = bytearray()
    block = 0
    while len(out) < size:
        out += hashlib.sha256(seed.to_bytes(8, "big") + block.to_bytes(8, "big")).digest() * 64
        block += 1
    return bytes(out[:size])


def roce_v2_gid_index(device: str, address: str) -> int:
    """The GID table index of `address` as a RoCE v2 GID of port 1 (rxe lists v1 and v2 of each)."""
    port = Path(f"/sys/class/infiniband/{device}/ports/1")
    want = ipaddress.IPv6Address(address)
    for gid_file in sorted((port / "gids").iterdir(), key=lambda p: int(p.name)):
        kind = port / "gid_attrs" / "types" / gid_file.name
        try:
            gid, gid_type = gid_file.read_text().strip(), kind.read_text().strip()
        except OSError:  # an empty slot
            continue
        if ipaddress.IPv6Address(gid) == want and "v2" in gid_type.lower():
            return int(gid_file.name)
    raise SystemExit(f"rxe_peer: no RoCE v2 GID {address} on {device} port 1")


def say(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def hear() -> dict:
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("rxe_peer: mrc-emu's side closed the pipe")
    return json.loads(line)


def connect(qp: QP, gid_index: int, mtu: int, peer: dict, my_psn: int, timeout: int) -> None:
    attr = QPAttr(port_num=1, path_mtu={1024: e.IBV_MTU_1024, 2048: e.IBV_MTU_2048, 4096: e.IBV_MTU_4096}[mtu])
    attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
    attr.pkey_index = 0
    qp.to_init(attr)
    route = GlobalRoute(dgid=GID(ipaddress.IPv6Address(peer["gid"]).exploded), sgid_index=gid_index, hop_limit=64)
    attr.ah_attr = AHAttr(gr=route, is_global=1, port_num=1)
    attr.dest_qp_num, attr.rq_psn = peer["qpn"], peer["psn"]
    attr.max_dest_rd_atomic, attr.min_rnr_timer = 1, 12
    qp.to_rtr(attr)
    attr.sq_psn, attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic = my_psn, timeout, 7, 7, 1
    qp.to_rts(attr)


def qp_state(qp: QP) -> str:
    """The QP's state as rxe has it (RTS while all is well; ERR once it gave up)."""
    state = qp.query(e.IBV_QP_STATE)[0].qp_state
    names = {e.IBV_QPS_RESET: "RESET", e.IBV_QPS_INIT: "INIT", e.IBV_QPS_RTR: "RTR", e.IBV_QPS_RTS: "RTS",
             e.IBV_QPS_SQD: "SQD", e.IBV_QPS_SQE: "SQE", e.IBV_QPS_ERR: "ERR"}
    return names.get(state, str(state))


def wait_wc(cq: CQ) -> dict:
    """Poll the CQ for one completion (busy: rxe completes in a kernel thread, no event channel here)."""
    deadline = time.monotonic() + WC_WAIT_S
    while time.monotonic() < deadline:
        n, wcs = cq.poll()
        if n:
            wc = wcs[0]
            return {"opcode": int(wc.opcode), "status": int(wc.status), "success": wc.status == e.IBV_WC_SUCCESS,
                    "byte_len": int(wc.byte_len), "wr_id": int(wc.wr_id)}
        time.sleep(0.001)  # a poll interval, not a wait for a condition: the loop ends on the completion
    return {"status": -1, "success": False, "error": f"no completion within {WC_WAIT_S:.0f} s"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="rxe0")
    parser.add_argument("--address", required=True, help="the IPv6 address of rxe's netdev (its RoCE v2 GID)")
    parser.add_argument("--role", choices=("responder", "requester"), required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--mtu", type=int, default=4096, choices=MTUS)
    parser.add_argument("--psn", type=int, default=0x1234)
    parser.add_argument("--timeout", type=int, default=16, help="the QP's local ACK timeout t: 4.096 us x 2^t (268 ms)")
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--imm", type=lambda s: int(s, 0), default=0x1A2B3C4D)
    args = parser.parse_args()

    gid_index = roce_v2_gid_index(args.device, args.address)
    ctx = Context(name=args.device)
    pd = PD(ctx)
    cq = CQ(ctx, 64)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(max_send_wr=8, max_recv_wr=8)))
    region = args.size if args.role == "responder" else 2 * args.size
    mr = MR(pd, region, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
    say({"qpn": qp.qp_num, "psn": args.psn, "gid": args.address, "rkey": mr.rkey, "va": mr.buf, "gid_index": gid_index})
    peer = hear()
    connect(qp, gid_index, args.mtu, peer, args.psn, args.timeout)
    say({"ready": True})
    if args.role == "responder":
        hear()  # mrc-emu's requester completed (on rxe's ACKs)
        say({"sha256": hashlib.sha256(mr.read(args.size, 0)).hexdigest(), "qp_state": qp_state(qp)})
        return 0
    data = pattern(args.seed, args.size)
    mr.write(data, args.size)
    mr.write(data[::-1], args.size, args.size)  # the second WRITE's bytes differ from the first's
    wcs = []
    for k, (opcode, offset) in enumerate(((e.IBV_WR_RDMA_WRITE, 0), (e.IBV_WR_RDMA_WRITE_WITH_IMM, args.size))):
        wr = SendWR(wr_id=k + 1, opcode=opcode, num_sge=1, sg=[SGE(mr.buf + offset, args.size, mr.lkey)],
                    send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(peer["rkey"], peer["va"] + offset)
        if opcode == e.IBV_WR_RDMA_WRITE_WITH_IMM:
            wr.imm_data = args.imm
        qp.post_send(wr)
        wcs.append(wait_wc(cq))
    say({"wcs": wcs, "sha256": [hashlib.sha256(data).hexdigest(), hashlib.sha256(data[::-1]).hexdigest()],
         "imm": args.imm, "qp_state": qp_state(qp)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
