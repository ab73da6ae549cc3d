"""The experiments layer: MRC on a running fabric, measured.

What it is: three packages, each importing only those after it. `scenarios` (scenario files,
their fault kinds, the transports compared, the runner, and what a run leaves behind: results,
report, plots) drives `runtime` (transfers on a pool of endpoint worker processes, each host's
controller, the controller record, fault agents, EV probes, STEV coverage, the fabric
self-check), and both read `analysis` (the figures computed from what a run returned: fault
figures, congestion, the emulation's verdict). It is where the fabric (namespaces, sockets in
them, link state) and the transport (sans-IO MRC state machines) meet.

What it must never do: be imported by the fabric, the transport, the wire format or the
topology (they are the layers below it; only the CLI and scripts sit above); hold MRC
protocol logic (that is the transport's) or kernel configuration (the fabric's).
"""
