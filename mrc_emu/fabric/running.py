"""A running fabric as one object: its name, its topology and its journal, opened once.

Why it exists: every operation on a running fabric (status, links, faults, captures,
transfers, FRR) needs the same three things. Reading the journal and parsing the topology
again by name in each call repeated work and let a caller mix up fabrics; a `Fabric` is
opened once (`Fabric.open(name)`) and passed down. The topology is fixed for the fabric's
life; what changes while it runs (links taken down, processes started and ended) stays in
the journal, and `state()` reads it afresh.
"""

from __future__ import annotations

from pathlib import Path

from ..topology import Topology, from_dict
from . import registry
from .kernel import netns
from .nodes import FabricSetupError


class Fabric:
    """The handle on one running fabric; close it (or use `with`) to release the journal."""

    def __init__(self, name: str, topology: Topology, journal: registry.Journal) -> None:
        self.name = name
        self.topology = topology
        self.journal = journal

    @classmethod
    def open(cls, name: str) -> Fabric:
        """The fabric `name`; if none runs, the error says how to start one."""
        record = registry.read(name)
        topology = from_dict(record.topology, record.source or "<journal>")
        return cls(name, topology, registry.Journal.open(name))

    def state(self) -> registry.FabricRecord:
        """What the journal says now: links taken down, live processes, readiness."""
        return registry.read(self.name)

    def netns(self, node: str) -> Path:
        """Where the node's namespace is named (whether or not it still exists)."""
        return netns.netns_path(self.name, node)

    def node_path(self, node: str) -> Path:
        """The namespace of a node of this fabric, checked to exist."""
        self.topology.node(node)
        path = self.netns(node)
        if not path.exists():
            raise FabricSetupError(f"namespace {path} of node {node} is gone; run 'mrc-emu clean'")
        return path

    def close(self) -> None:
        self.journal.close()

    def __enter__(self) -> Fabric:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Fabric({self.name!r}, {self.topology.name})"
