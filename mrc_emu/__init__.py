"""mrc-emu: a packet-level emulator of MRC (Multipath Reliable Connection).

Layers, imports pointing down only (tests/test_layers.py checks it):
    topology (pure data) and wire (bytes) at the bottom;
    fabric (namespaces, kernel config) and transport (sans-IO MRC state machines) side by side
    above them, never importing each other;
    io (drivers: sockets, in-memory network, event loop) above the transport;
    experiments (transfers, scenarios, faults, reports) joining fabric, transport and io;
    cli on top.
"""

__version__ = "0.1.0"
