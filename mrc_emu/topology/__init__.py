"""Topology model layer: pure data (nodes, links, addresses, EVs); no kernel, no root."""

from .evs import Ev, EvFormat, ev_count, evs_between, probe_segments
from .model import Link, Node, Role, Topology, TopologyError, builtin, from_dict, load, resolve

__all__ = [
    "Ev", "EvFormat", "Link", "Node", "Role", "Topology", "TopologyError",
    "builtin", "ev_count", "evs_between", "from_dict", "load", "probe_segments", "resolve",
]
