"""mrc-emu: a packet-level emulator of MRC (Multipath Reliable Connection).

Layers, imports pointing down only:
    topology (pure data) -> fabric (namespaces, kernel config) -> wire (bytes)
    -> transport (MRC state machines) -> experiments (scenarios, faults, reports) -> cli
"""

__version__ = "0.1.0"
