"""Port admin state (mrc_ctl.h c:248-311): a controller disables or enables a host's ports.

Why it exists: taking a plane out of service on one host (maintenance, a bad NIC port) is a port
admin action, not an EV action: every EV on a disabled port stops carrying data at once
(`evops.data_evs(profile, ports)`), and the port reads IBV_PORT_DOWN whatever its link does. Ports
are 1-based and exist where the device's phy_port_mask has their bit (bit N = port N). Both
transitions (ENABLED -> DISABLED, DISABLED -> ENABLED) are allowed at any time; setting the state a
port already has is a no-op (the header does not forbid it). The only attribute is ADMIN_STATE; a
call without it is EINVAL. It must never touch the system: the fabric-facing `port disable|enable`
command will apply what this records.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag

from .errors import MrcApiError


class PortAdminState(IntEnum):
    """enum mrc_ctl_port_admin_state."""

    DISABLED = 0
    ENABLED = 1


class PortAttr(IntFlag):
    """enum mrc_ctl_port_attr_mask."""

    ADMIN_STATE = 1 << 0


class PortState(IntEnum):
    """What ibv_query_port reports (the two values that matter here)."""

    DOWN = 1  # IBV_PORT_DOWN
    ACTIVE = 4  # IBV_PORT_ACTIVE


class PortAdmin:
    """The ports of one device: admin state per port, and the link state the fabric reports."""

    def __init__(self, phy_port_mask: int):
        if isinstance(phy_port_mask, bool) or not isinstance(phy_port_mask, int) or phy_port_mask < 0:
            raise MrcApiError(f"phy_port_mask: {phy_port_mask!r} is not a mask")
        if phy_port_mask & 1:
            raise MrcApiError("phy_port_mask: bit 0 is set, but ports are 1-based (bit N = port N)")
        self.phy_port_mask = phy_port_mask
        self.admin = {port: PortAdminState.ENABLED for port in self.ports}
        self.link_up = {port: True for port in self.ports}

    @property
    def ports(self) -> list[int]:
        return [port for port in range(1, self.phy_port_mask.bit_length()) if self.phy_port_mask >> port & 1]

    def _check_port(self, port_num: object) -> int:
        if isinstance(port_num, bool) or not isinstance(port_num, int) or port_num not in self.admin:
            raise MrcApiError(f"port_num: {port_num!r} is not a port of this device (ports {self.ports})")
        return port_num

    def modify_port(self, port_num: int, port_admin_state: PortAdminState | int,
                    attr_mask: PortAttr | int = PortAttr.ADMIN_STATE) -> None:
        """mrc_ctl_modify_port: set the admin state, or raise changing nothing."""
        port = self._check_port(port_num)
        if isinstance(attr_mask, bool) or not isinstance(attr_mask, int) or attr_mask != PortAttr.ADMIN_STATE:
            raise MrcApiError(f"attr_mask: {attr_mask!r} is not ADMIN_STATE (0x01), the only port attribute")
        if port_admin_state not in set(PortAdminState) or isinstance(port_admin_state, bool):
            raise MrcApiError(f"port_admin_state: {port_admin_state!r} is not DISABLED (0) or ENABLED (1)")
        self.admin[port] = PortAdminState(port_admin_state)

    def query_port(self, port_num: int, attr_mask: PortAttr | int = PortAttr.ADMIN_STATE) -> PortAdminState:
        """mrc_ctl_query_port: the admin state."""
        port = self._check_port(port_num)
        if isinstance(attr_mask, bool) or not isinstance(attr_mask, int) or attr_mask != PortAttr.ADMIN_STATE:
            raise MrcApiError(f"attr_mask: {attr_mask!r} is not ADMIN_STATE (0x01), the only port attribute")
        return self.admin[port]

    def port_state(self, port_num: int) -> PortState:
        """What ibv_query_port reads: DOWN when disabled (the header's rule) or when the link is down."""
        port = self._check_port(port_num)
        up = self.admin[port] == PortAdminState.ENABLED and self.link_up[port]
        return PortState.ACTIVE if up else PortState.DOWN

    def carries_data(self, port_num: int) -> bool:
        """May an EV on this port carry data? Port 0 (a GEN EV bound to no port) always may."""
        return port_num == 0 or (port_num in self.admin and self.port_state(port_num) == PortState.ACTIVE)
