"""scripts/rxe_pcap.py, the reading of an interop run's pcap (issue 31), on hand-made captures: a
stream reordered between sender and receiver and one that lost a packet look different around
the receiver's NAK, and a responder's ACK waits are measured from the capture."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

from mrc_emu.wire import format as fmt
from mrc_emu.wire.encoder import Encap, FrameTemplate
from mrc_emu.wire.format import AckPacket, DataPacket, Syndrome

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from rxe_pcap import check_pcap  # noqa: E402

RXE, MRC = "fd31:31::1", "fd31:31::2"
TO_RXE = FrameTemplate(fmt.Endpoints(MRC, RXE, 0xC000), Encap.udp())
TO_MRC = FrameTemplate(fmt.Endpoints(RXE, MRC, 0xC000), Encap.udp())


def _pcap(path: Path, frames: list[tuple[int, bytes]]) -> Path:
    """A classic pcap (microseconds) of Ethernet frames around these IPv6 frames, at times in us."""
    out = bytearray(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
    for us, frame in frames:
        record = b"\x02" * 12 + b"\x86\xdd" + frame
        out += struct.pack("<IIII", us // 1_000_000, us % 1_000_000, len(record), len(record)) + record
    path.write_bytes(out)
    return path


def _data(psn: int) -> bytes:
    return TO_RXE.encode(DataPacket(7, psn & fmt.PSN_MASK, 0x1000 + 64 * psn, 5, bytes(64)))


def _nak(psn: int) -> bytes:
    return TO_MRC.encode(AckPacket(9, psn & fmt.PSN_MASK, Syndrome.NAK_PSN_SEQUENCE))


def _ack(psn: int) -> bytes:
    return TO_MRC.encode(AckPacket(9, psn & fmt.PSN_MASK))


def test_a_reordered_packet_is_late_and_a_lost_one_is_resent(tmp_path):
    start = fmt.PSN_MASK - 2  # the PSNs wrap on the way
    reordered = [_data(start), _data(start + 2), _nak(start + 1), _data(start + 1), _data(start + 3),
                 _data(start + 1), _data(start + 2), _data(start + 3)]  # the requester's go-back-N resend
    got = check_pcap(_pcap(tmp_path / "r.pcap", list(enumerate(reordered))), RXE)["mrc-emu"]
    assert got["order"] == {"reordered": 1, "most_behind": 1, "first_seen_resent": 0}
    assert got["naks"]["count"] == 1
    detail = got["naks"]["detail"][0]
    assert detail["expected_came"] == "late" and detail["around"] == "-1 +1 NAK +0 +2 +0r +1r +2r"
    lost = [_data(start), _data(start + 2), _nak(start + 1), _data(start + 3), _data(start + 1),
            _data(start + 2), _data(start + 3)]
    got = check_pcap(_pcap(tmp_path / "l.pcap", list(enumerate(lost))), RXE)["mrc-emu"]
    assert got["order"] == {"reordered": 0, "most_behind": 0, "first_seen_resent": 1}
    assert got["naks"]["detail"][0]["expected_came"] == "resent"
    assert got["parsed"] == got["packets"] == 6 and got["retransmitted"] == 2


def test_ack_waits_run_from_a_packets_capture_to_the_first_ack_that_covers_it(tmp_path):
    frames = [(0, _data(10)), (1000, _data(11)), (2000, _data(12)), (5000, _ack(11)), (9000, _ack(12))]
    got = check_pcap(_pcap(tmp_path / "a.pcap", frames), RXE)["mrc-emu"]
    assert got["ack_wait_ms"]["max"] == 7.0 and got["ack_wait_ms"]["packets"] == 3
    assert check_pcap(_pcap(tmp_path / "b.pcap", frames), RXE)["rxe"]["parsed"] == 2


def test_a_packet_refused_behind_an_earlier_gap_came_before_its_nak(tmp_path):
    """3's original was captured while the receiver still waited for 1 (and dropped it); its resend
    was lost before the capture, so the NAK naming 3 finds it captured since the previous NAK."""
    frames = [_data(0), _data(2), _nak(1), _data(3), _data(1), _data(2), _data(4), _nak(3), _data(3), _data(4)]
    got = check_pcap(_pcap(tmp_path / "g.pcap", list(enumerate(frames))), RXE)["mrc-emu"]
    assert [d["expected_came"] for d in got["naks"]["detail"]] == ["resent", "before"]
