"""The pcap of one scripts/interop_rxe.py run, read by mrc-emu's own decoder: what each side sent,
whether every packet parsed (UDP checksum, lengths, ICRC), and what the order of arrival says.

The capture is taken on rxe's end of the veth, so mrc-emu's packets appear in the order rxe got
them and rxe's in the order it sent them. Besides the counts (per sender: packets, parsed,
refused and why, opcodes, data packets whose PSN it had sent before), three things that explain
a resend on a link that lost nothing (issue 31):

- `order`: a sender's data packets that came behind a higher PSN of the same sender although
  they were not resends of a captured packet: `reordered` between the sender and rxe, or
  `first_seen_resent`, the first packet of a go-back-N resend whose original was lost before
  the capture;
- `naks`: for each PSN-sequence NAK (up to NAK_DETAIL of them), the data packets around it as
  the capture has them, each PSN less the NAK's (the PSN its receiver expected), `r` marking a
  repeat, and where the expected PSN came: `late` (after the NAK, as itself: reordered behind
  a later PSN), `resent` (after the NAK, first in a resend run from it: its first transmission
  never reached the capture, lost before it), `before` (captured since the previous NAK and
  still refused: behind an earlier gap, or reordered after the capture), `never`;
- `ack_wait_ms`: for a responder's ACKs, how long each data packet waited from its capture until
  an ACK covering it was sent (p50, p99, max, ms): rxe's requester retries when it waits longer
  than its ACK timeout.
"""

from __future__ import annotations

import bisect
import socket
import struct
from collections import Counter
from pathlib import Path

from mrc_emu.stats import percentile
from mrc_emu.wire import format as fmt
from mrc_emu.wire.decoder import decode_udp, open_frame

NAK_DETAIL = 12  # NAKs described one by one; the rest only counted
AROUND = 6  # data packets shown before and after each NAK
PSN_MOD = fmt.PSN_MASK + 1
HALF = PSN_MOD // 2


def pcap_records(pcap: Path):
    """(capture time in ns, frame from the IPv6 header on) of each Ethernet IPv6 record of a classic pcap."""
    raw = pcap.read_bytes()
    magic = raw[:4]
    endian = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    nano = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    offset = 24
    while offset + 16 <= len(raw):
        seconds, fraction, included = struct.unpack(endian + "III", raw[offset:offset + 12])
        record = raw[offset + 16:offset + 16 + included]
        offset += 16 + included
        if len(record) > 14 and record[12:14] == b"\x86\xdd":
            yield seconds * 1_000_000_000 + fraction * (1 if nano else 1000), record[14:]


def _unwrap(psn: int, ref: int | None) -> int:
    """A 24-bit PSN as an unbounded number near `ref` (the previous one of the same sender)."""
    if ref is None:
        return psn
    return ref + ((psn - ref + HALF) % PSN_MOD) - HALF


def check_pcap(pcap: Path, rxe_address: str) -> dict:
    """Every RoCE packet of the pcap through mrc-emu's decoder, by sender (module docstring)."""
    rxe = socket.inet_pton(socket.AF_INET6, rxe_address)
    sides = ("rxe", "mrc-emu")
    out = {side: {"packets": 0, "parsed": 0, "refused": Counter(), "opcodes": Counter(), "retransmitted": 0,
                  "udp_checksum_zero": 0} for side in sides}
    seen: dict[str, set[int]] = {side: set() for side in sides}
    data: dict[str, list[tuple[int, int, bool]]] = {side: [] for side in sides}  # (time, PSN, repeat)
    events: dict[str, list[tuple[str, int, int, int]]] = {side: [] for side in sides}  # (kind, index, time, PSN)
    last: dict[str, int | None] = {side: None for side in sides}
    for t, frame in pcap_records(pcap):
        side = "rxe" if frame[8:24] == rxe else "mrc-emu"
        other = sides[side == "rxe"]
        counts = out[side]
        counts["packets"] += 1
        opened = open_frame(frame)
        if isinstance(opened, fmt.DropReason):
            counts["refused"][opened.value] += 1
            continue
        if frame[6] == 17 and frame[46:48] == b"\0\0":
            counts["udp_checksum_zero"] += 1  # none sent (the ICRC covers the packet), as RoCEv2 over IPv6 may
        packet = decode_udp(opened.payload, opened.src, opened.dst, opened.sport)
        if isinstance(packet, fmt.DropReason):
            counts["refused"][packet.value] += 1
            continue
        counts["parsed"] += 1
        nak = isinstance(packet, fmt.AckPacket) and packet.is_nak
        op = packet.opcode if isinstance(packet, fmt.DataPacket) else "NAK" if nak else type(packet).__name__
        counts["opcodes"][op.name if hasattr(op, "name") else op] += 1
        if isinstance(packet, fmt.DataPacket):
            psn = last[side] = _unwrap(packet.psn, last[side])
            repeat = psn in seen[side]
            counts["retransmitted"] += repeat
            seen[side].add(psn)
            data[side].append((t, psn, repeat))
        elif isinstance(packet, fmt.AckPacket):  # about the other side's data: its PSNs' frame of reference
            kind = "nak" if nak and packet.syndrome == fmt.Syndrome.NAK_PSN_SEQUENCE else "nak-other" if nak else "ack"
            events[other].append((kind, len(data[other]), t, _unwrap(packet.psn, last[other])))
    for side in sides:
        out[side] |= _order(data[side]) | _naks(data[side], events[side]) | _ack_wait(data[side], events[side])
        out[side]["refused"], out[side]["opcodes"] = dict(out[side]["refused"]), dict(out[side]["opcodes"])
    return out


def _order(data: list[tuple[int, int, bool]]) -> dict:
    """The sender's packets first captured behind a higher PSN of its own: `reordered` (its
    original, come late) or `first_seen_resent` (the start of a resend run from it: the PSN after
    it repeats next, so its original never reached the capture)."""
    top, late, resent, most = None, 0, 0, 0
    for i, (_, psn, repeat) in enumerate(data):
        if top is not None and psn < top and not repeat:
            if _starts_resend(data, i):
                resent += 1
            else:
                late += 1
                most = max(most, top - psn)
        top = psn if top is None else max(top, psn)
    return {"order": {"reordered": late, "most_behind": most, "first_seen_resent": resent}}


def _starts_resend(data: list[tuple[int, int, bool]], i: int) -> bool:
    """Whether data[i] begins a go-back-N resend run: the next packet repeats the PSN after it."""
    return i + 1 < len(data) and data[i + 1][2] and data[i + 1][1] == data[i][1] + 1


def _naks(data: list[tuple[int, int, bool]], events: list[tuple[str, int, int, int]]) -> dict:
    """Each PSN-sequence NAK about this sender's data, with the data around it (module docstring)."""
    naks = [(index, psn) for kind, index, _, psn in events if kind == "nak"]
    described, since = [], 0
    for index, expected in naks[:NAK_DETAIL]:
        around = [f"{psn - expected:+d}{'r' if repeat else ''}" for _, psn, repeat in data[max(0, index - AROUND):index]]
        around.append("NAK")
        around += [f"{psn - expected:+d}{'r' if repeat else ''}" for _, psn, repeat in data[index:index + AROUND]]
        after = next((k for k in range(index, len(data)) if data[k][1] == expected), None)
        if any(psn == expected for _, psn, _ in data[since:index]):
            fate = "before"  # captured since the last NAK, yet refused: behind an earlier gap, or reordered past the capture
        elif after is None:
            fate = "never"
        else:
            fate = "resent" if _starts_resend(data, after) else "late"
        described.append({"expected": expected, "around": " ".join(around), "expected_came": fate})
        since = index
    return {"naks": {"count": len(naks), "detail": described}} if naks else {}


def _ack_wait(data: list[tuple[int, int, bool]], events: list[tuple[str, int, int, int]]) -> dict:
    """How long this sender's data waited for an ACK (or NAK) covering it, from its capture."""
    acks = [(t, psn if kind == "ack" else psn - 1) for kind, _, t, psn in events if kind in ("ack", "nak")]
    if not acks or not data:
        return {}
    times, covered, top = [], [], None
    for t, psn in acks:
        top = psn if top is None else max(top, psn)
        times.append(t)
        covered.append(top)
    waits = []
    for t, psn, repeat in data:
        if repeat:
            continue
        k = bisect.bisect_left(covered, psn)
        while k < len(times) and times[k] < t:  # an ACK before this packet's capture covers an earlier copy
            k += 1
        if k < len(times):
            waits.append((times[k] - t) / 1e6)
    if not waits:
        return {}
    return {"ack_wait_ms": {"p50": round(percentile(waits, 50), 2), "p99": round(percentile(waits, 99), 2),
                            "max": round(max(waits), 2), "packets": len(waits)}}
