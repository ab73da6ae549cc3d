"""Topology model layer: pure data (nodes, links, addresses, EVs, the capacity planner).

What it is: the Clos model of a multi-plane fabric read from YAML, the addressing plan,
EV enumeration (the controller's list of paths between two hosts), the planner, and the switch
port model (port.py: every egress port's thresholds; port_verdict.py: the rule a port applies to
an arriving packet, the port program's and the virtual fabric's); every other layer takes its
facts from here.

What it must never do: touch the system (no namespaces, sockets, processes, netlink or
root: it reads topology files and computes), or import any other layer of mrc_emu.
"""

from .evs import Ev, EvFormat, ev_count, evs_between, probe_segments
from .model import Link, Node, Role, Topology, TopologyError, builtin, from_dict, load, resolve

__all__ = [
    "Ev", "EvFormat", "Link", "Node", "Role", "Topology", "TopologyError",
    "builtin", "ev_count", "evs_between", "from_dict", "load", "probe_segments", "resolve",
]
