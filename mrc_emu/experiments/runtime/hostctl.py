"""Each host's OCP controller inside its worker: the EV and CC profiles its QPs take by id, and the QPs' lifecycle.

Why it exists: in the OCP model a QP does not own its paths or its congestion control: it takes an
EV profile id and a CC profile id at RST -> INIT, the destination's attributes at -> RTR and the
sender's at -> RTS (mrc.h), and the EV states live in the EV profile, shared by every QP bound to
it. The worker (worker.py) sets QPs up through this module, so every transfer of a run goes
through the api mirror (mrc_emu.api): one `Controller` per host; one EXP EV profile per (host,
peer, EV list), so the QPs of a host towards one peer share what one of them learns; one CC
profile per algorithm; a `Qp` walked RST -> INIT -> RTR -> RTS whose `transport_config()` gives
the transport its timeout, retries and MPR (a QP the api refuses fails its transfer with the
api's one-line reason). The host's EV event queue is the controller's (mask and drop count).

An EV's value in the profile is what the wire carries for it: for SRV6 formats the outer
destination (bytes 0-15) and, for a uSID carrier, the single SRH segment (bytes 16-31; a full SRH
segment list, `--format SRV6`, cannot be written in 32 bytes: its first segment stands for it
until a REPLACE_EV gives a carrier), for STEV the 32-bit value (flow label bits and source port),
for UDP the source port; its port is the plane's (plane + 1). The format is the QP's, given, never
guessed from the values. A requester follows its slots' values (transport/multipath/evvalues.py),
so `replace_ev` re-paths a running QP; the CC profile's config (NSCC's fields by name, DCQCN's) is
what the QP's congestion control is made with (`cc_config`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...api import CtlDeviceAttr, EvEventMask, EvField, EvFormatMode, EvOp, EvOpEntry, EvProfileMode, EvState, ProfileState, RetryCnt
from ...api import cc as api_cc
from ...api.controller import DEFAULT_OPT, Controller, OptAttr, port_mask
from ...api.evops import ev_slots
from ...api.files import ProfileFile
from ...api.ports import PortAdminState
from ...api.qp import QPCONFIG_KEYS, DeviceCap, QpCap, QpState
from ...transport.config import QpConfig
from ...transport.multipath.paths import Path

ALGORITHM = {"nscc": api_cc.NSCC, "dcqcn": api_cc.DCQCN, "fixed": api_cc.CC_DISABLED}  # the transport's CC names
# the format's fields: SRV6 an outer destination and an SRH segment, STEV 32 bits, UDP a source port
WIDTHS = {EvFormatMode.SRV6: [128, 128], EvFormatMode.STEV: [32], EvFormatMode.UDP: [16]}
MAX_PROFILES = 1 << 14  # an emulated device holds a profile per peer of an all-to-all over `huge`


def guess_mode(path: Path) -> EvFormatMode:
    """A path's format when none is given: SRV6 if it has an outer header, STEV if a flow label, else UDP
    (a STEV value whose flow label bits are zero looks like UDP: give the mode)."""
    if path.template.encap.outer_dst is not None:
        return EvFormatMode.SRV6
    return EvFormatMode.STEV if path.template.flow_label else EvFormatMode.UDP


def _value(path: Path, mode: EvFormatMode) -> bytes:
    """The EV value a path's frames carry in format `mode`."""
    if mode == EvFormatMode.SRV6:
        encap = path.template.encap
        one_segment = encap.extra == 24  # an SRH of one segment (8 + 16 bytes): the decapsulation address
        return encap.outer_dst + (encap.outer[-16:] if one_segment else bytes(16))
    if mode == EvFormatMode.STEV:
        return ((path.template.flow_label << 16) | path.template.ends.sport).to_bytes(4, "big")
    return path.template.ends.sport.to_bytes(2, "big")


class HostControl:
    """The controller of one host and the profiles its QPs use."""

    def __init__(self, host: str, planes: int) -> None:
        attrs = CtlDeviceAttr(phy_port_mask=port_mask(planes), ev_max_profiles=MAX_PROFILES,
                              ev_max_count=1 << 24, ev_free_count=1 << 24,
                              algorithms=(api_cc.NSCC, api_cc.DCQCN),
                              # a QP's CC is made once from its profile: a CONFIG change online would not reach it,
                              # so the device does not offer one (EV profiles' online changes do reach the QPs)
                              opt_attr=DEFAULT_OPT & ~OptAttr.CC_PROFILE_MODIFY_ONLINE)
        self.ctl = Controller(host, planes, attrs=attrs, event_capacity=1024)
        self.host = host
        self.planes = planes
        self._fmt: dict[tuple, int] = {}  # (mode, widths) -> format profile id
        self._ev: dict[tuple, int] = {}
        self._slots: dict[int, tuple[str, dict[tuple[bytes, int], int]]] = {}  # EV profile id -> (peer, (value, port) -> slot)
        self._cc: dict[tuple, int] = {}
        self._first: dict[int, dict[int, tuple[bytes, int]]] = {}  # EV profile id -> slot -> its first (value, port)

    def _format(self, mode: EvFormatMode, widths: list[int] | None = None) -> int:
        """The id of the ONLINE format profile of `mode` with these field widths (default: WIDTHS), made once."""
        widths = list(WIDTHS[mode] if widths is None else widths)
        key = (mode, tuple(widths))
        if key not in self._fmt:
            fmt = self.ctl.create_ev_fmt_profile()
            self.ctl.modify_ev_fmt_profile(fmt.profile_id, state=ProfileState.OFFLINE, mode=mode, fields=widths)
            self.ctl.modify_ev_fmt_profile(fmt.profile_id, state=ProfileState.ONLINE)
            self._fmt[key] = fmt.profile_id
        return self._fmt[key]

    def ev_profile(self, peer: str, paths: dict[int, Path], ev_min_active: int, mode: EvFormatMode | None = None) -> int:
        """The id of the EXP profile holding these paths' EVs in format `mode` (slot i = EV i; slots the QP does
        not use are DENIED), made on first use; QPs towards `peer` over the same EVs share it."""
        count = max(paths) + 1
        mode = mode if mode is not None else guess_mode(next(iter(paths.values())))
        values = {ev: _value(path, mode) for ev, path in paths.items()}
        key = (peer, mode, tuple(sorted((ev, values[ev], paths[ev].plane) for ev in paths)), ev_min_active)
        if key in self._ev:
            return self._ev[key]
        fmt_id = self._format(mode)
        profile = self.ctl.create_ev_profile()
        pid = profile.profile_id
        self.ctl.modify_ev_profile(pid, fmt_id=fmt_id, state=ProfileState.OFFLINE, mode=EvProfileMode.EXP,
                                   ev_count=count, fields=[EvField(w) for w in WIDTHS[mode]])
        unused = bytes([0xFF]) + bytes(len(next(iter(values.values()))) - 1)  # a slot no path of this QP has
        entries = []
        for slot in range(count):
            if slot in paths:
                entries.append(EvOpEntry(ev_new=values[slot], port_new=(paths[slot].plane or 0) + 1, state=EvState.GOOD))
            else:
                entries.append(EvOpEntry(ev_new=unused[:-1] + bytes([slot & 0xFF]), port_new=1, state=EvState.DENIED))
        self.ctl.ev_op(pid, EvOp.REPLACE_EV, entries)
        self.ctl.modify_ev_profile(pid, state=ProfileState.ONLINE, ev_min_active=max(1, min(ev_min_active, len(paths))),
                                   ev_event_mask=EvEventMask.GOOD | EvEventMask.ASSUMED_BAD)
        self._ev[key] = pid
        self._slots[pid] = (peer, {(e.ev_new.ljust(32, b"\0"), e.port_new): slot
                                   for slot, e in enumerate(entries) if slot in paths})
        self._first[pid] = dict(enumerate(ev_slots(self.ctl.ev_profile(pid))))
        return pid

    def load_profile(self, loaded: ProfileFile, peer: str, ports: dict[int, int]) -> int:
        """The id of an EV profile made on this controller from a profile file (its format, mode, GEN fields
        or EXP values on `ports`, slot -> 1-based port; ev_min_active and event mask), ONLINE, made once per
        file and peer: the QP binds it by id as the file gave it (a GEN profile stays GEN)."""
        key = ("file", loaded.path, peer)
        if key in self._ev:
            return self._ev[key]
        fmt_id = self._format(loaded.fmt.mode, list(loaded.fmt.fields))
        source = loaded.profile
        pid = self.ctl.create_ev_profile().profile_id
        self.ctl.modify_ev_profile(pid, fmt_id=fmt_id, state=ProfileState.OFFLINE, mode=source.mode,
                                   ev_count=source.ev_count, fields=list(source.fields))
        if source.mode == EvProfileMode.EXP:
            self.ctl.ev_op(pid, EvOp.REPLACE_EV, [EvOpEntry(ev_new=value, port_new=ports.get(slot, 1), state=EvState.GOOD)
                                                  for slot, value in enumerate(source.explicit)])
        self.ctl.modify_ev_profile(pid, state=ProfileState.ONLINE, ev_min_active=source.ev_min_active,
                                   ev_event_mask=source.ev_event_mask)
        self._ev[key] = pid
        self._slots[pid] = (peer, {slot: k for k, slot in enumerate(ev_slots(self.ctl.ev_profile(pid)))})
        self._first[pid] = dict(enumerate(ev_slots(self.ctl.ev_profile(pid))))
        return pid

    def replace_ev(self, profile_id: int, slot: int, value: bytes | None, port: int | None = None) -> tuple[bytes, int]:
        """REPLACE_EV of slot `slot` of an ONLINE EV profile by `value` on `port` (None: the slot's own), GOOD:
        every QP bound to it sends that EV's next packet on the new value; `value` None puts back the slot's
        first value and port (its QPs their first path). The old (value, port); ValueError for a value the
        slot's format cannot take here (a STEV or UDP value must keep the UDP source port the responder knows
        the EV by)."""
        profile = self.ctl.ev_profile(profile_id)
        slots = ev_slots(profile)
        if not 0 <= slot < len(slots):
            raise ValueError(f"EV {slot}: the profile has EVs 0..{len(slots) - 1}")
        old = slots[slot]
        if slots.index(old) != slot:
            raise ValueError(f"EV {slot} has the value of EV {slots.index(old)}: REPLACE_EV would name that one")
        if value is None:  # back to the first value
            first = self._first.get(profile_id, {}).get(slot)
            if first is None:
                raise ValueError(f"EV {slot}: profile {profile_id} has no first value of this controller's to put back")
            value, port = first
        mode = profile.fmt.mode
        width = sum(profile.fmt.fields) // 8
        if len(value) > width or not any(value):
            raise ValueError(f"a {mode.name} value is 1..{width} bytes, not all zero; got {len(value)} bytes")
        value = value.ljust(32, b"\0")
        if mode == EvFormatMode.SRV6 and not any(value[:16]):
            raise ValueError(f"EV {slot}: an SRV6 value needs its outer destination (bytes 0-15 are zero)")
        if mode == EvFormatMode.STEV and value[2:4] != old[0][2:4]:
            raise ValueError(f"EV {slot}: a STEV value keeps its low 16 bits (UDP source port 0x{old[0][2:4].hex()}, "
                             "the responder's name for the EV); give new flow label bits (the high 16)")
        if mode == EvFormatMode.UDP and value[:2] != old[0][:2]:
            raise ValueError(f"EV {slot}: a UDP EV is its source port 0x{old[0][:2].hex()}, the responder's name for "
                             "it: only its port can change")
        port = old[1] if port is None else port
        if not 1 <= port <= self.planes:
            raise ValueError(f"port {port}: {self.host} has ports 1..{self.planes}")
        self.ctl.ev_op(profile_id, EvOp.REPLACE_EV, [EvOpEntry(ev=old[0], port=old[1], ev_new=value, port_new=port,
                                                               state=EvState.GOOD)])
        peer, named = self._slots.get(profile_id, ("", {}))
        named = {k: v for k, v in named.items() if v != slot} | {(value, port): slot}
        self._slots[profile_id] = (peer, named)
        return old

    def cc_profile(self, cc: str, config: dict[str, Any] | None = None) -> int:
        """The id of the ONLINE CC profile of transport CC `cc` with this config (NSCC's mrc_ctl_cc_nscc_cfg
        fields by name, DCQCN's parameters; empty: derived), made on first use."""
        config = dict(config or {})
        key = (cc, tuple(sorted(config.items())))
        if key not in self._cc:
            algorithm = ALGORITHM.get(cc)
            if algorithm is None:
                raise ValueError(f"CC {cc!r} has no CC profile algorithm (known: {', '.join(ALGORITHM)})")
            profile = self.ctl.create_cc_profile()
            self.ctl.modify_cc_profile(profile.profile_id, state=ProfileState.OFFLINE, algorithm=algorithm)
            self.ctl.modify_cc_profile(profile.profile_id, state=ProfileState.ONLINE, config=config)
            self._cc[key] = profile.profile_id
        return self._cc[key]

    def cc_config(self, cc_profile_id: int) -> dict[str, Any]:
        """What a QP's CC is made with from its CC profile: the config's fields, by the transport's names."""
        return dict(self.ctl.cc_profile(cc_profile_id).config or {})

    def requester_qp(self, peer: str, paths: dict[int, Path], config: QpConfig, cc: str, ev_min_active: int,
                     mode: EvFormatMode | None = None, cc_config: dict[str, Any] | None = None,
                     ev_profile_id: int | None = None):
        """A QP to RTS on its profiles (the EV profile `ev_profile_id` if given, else one of these paths in format
        `mode`; the CC profile of `cc` with `cc_config`), and the transport's config from it: (ev profile, Qp,
        QpConfig, the CC profile's config)."""
        ev_id = ev_profile_id if ev_profile_id is not None else self.ev_profile(peer, paths, ev_min_active, mode)
        cc_id = self.cc_profile(cc, cc_config)
        qp = self.ctl.create_qp()
        qp.modify(state=QpState.INIT, ev_profile_id=ev_id, cc_profile_id=cc_id)
        qp.modify(state=QpState.RTR, max_wimm_dest=0, mpr_dest=config.mpr)
        qp.modify(state=QpState.RTS, max_wimm=self.ctl.device.max_wimm, mpr=config.mpr,
                  retry=RetryCnt(config.retry_linear, config.retry_exp), timeout=config.ack_timeout_exp)
        got = qp.transport_config()
        return (self.ctl.ev_profile(ev_id), qp, replace(config, **{k: got[k] for k in QPCONFIG_KEYS}),
                self.cc_config(got["cc_profile_id"]))

    def responder_qp(self, peer: str, back: dict[int, Path], config: QpConfig, recvs: int,
                     mode: EvFormatMode | None = None, cap: int = 0):
        """The destination's QP: INIT on the profile of its ACK paths (format `mode`), RTR with the receive
        side's attributes and its QP caps `cap` (api.QpCap), and `recvs` receives posted (a WRITE_WITH_IMM
        needs one: no RNR); (the Qp, the responder's QpConfig: its SACK window MPR_DEST, TRIM NACKs and service
        times as the caps and the device leave them)."""
        ev_id, cc_id = self.ev_profile(peer, back, 1, mode), self.cc_profile("fixed")
        qp = self.ctl.create_qp(max_recv_wr=max(128, recvs))
        qp.modify(state=QpState.INIT, ev_profile_id=ev_id, cc_profile_id=cc_id)
        qp.modify(state=QpState.RTR, max_wimm_dest=self.ctl.device.max_wimm_dest, mpr_dest=config.mpr, cap=QpCap(cap))
        if recvs:
            qp.post_recv(recvs)
        device, cap = self.ctl.device.cap, QpCap(cap)
        return qp, replace(config, mpr=qp.attrs["mpr_dest"],
                           trim_nack=bool(device & DeviceCap.TRIM_NACK) and not cap & QpCap.TRIM_NACK_DEST_UNSUPPORTED,
                           svc_time=bool(device & DeviceCap.SVC_TIME) and not cap & QpCap.SVC_TIME_DEST_UNSUPPORTED)

    def follow_ports(self, mask: int) -> dict[int, str]:
        """The runtime's port-status mask (bit p: 1-based port p enabled, `port disable|enable`) as the api's
        port admin state, so that query_port reads what the endpoint does; each port's state after it."""
        for port in range(1, self.planes + 1):
            state = PortAdminState.ENABLED if mask >> port & 1 else PortAdminState.DISABLED
            if self.ctl.query_port(port) != state:
                self.ctl.modify_port(port, state)
        return {port: self.ctl.query_port(port).name for port in range(1, self.planes + 1)}

    def take_events(self) -> tuple[list[dict[str, Any]], int]:
        """The EV events queued on this host's controller (its QPs' device changes, by the profiles'
        masks), oldest first, and the drop count the first carries."""
        events = self.ctl.poll_events(1 << 20)
        dropped = events[0].drop_count if events else 0
        out = []
        for e in events:
            peer, slots = self._slots.get(e.profile_id, ("", {}))
            out.append({"profile_id": e.profile_id, "peer": peer, "ev": slots.get((e.ev, e.port)), "value": e.ev.hex(),
                        "port": e.port, "state": EvState(e.state).name})
        return out, dropped
