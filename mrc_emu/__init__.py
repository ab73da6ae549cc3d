"""mrc-emu: a packet-level emulator of MRC (Multipath Reliable Connection).

Layers, imports pointing down only (tests/test_layers.py checks it):
    topology (pure data), api (the OCP API mirror, pure data beside it) and wire (bytes) at the
    bottom, with stats (the one percentile definition), which imports nothing;
    fabric (namespaces, kernel config) and transport (sans-IO MRC state machines) side by side
    above them, never importing each other;
    io (drivers: sockets, in-memory network, event loop) above the transport;
    experiments joining fabric, transport and io: its analysis (figures) under its runtime
    (transfers, fault agents) under its scenarios (scenario files, runner, reports);
    cli on top.
"""

__version__ = "0.1.0"
