"""The experiments layer: MRC on a running fabric, measured.

What it is: transfers (one endpoint process per host, host.py; the parent's side,
transfer.py), EV probes, the fabric self-check, scenario files and their runner, fault
kinds (faults.py) carried out by fault agents (fault_agent.py), the transports compared
(transports.py), metrics and reports. It is where the fabric (namespaces, sockets in
them, link state) and the transport (sans-IO MRC state machines) meet.

What it must never do: be imported by the fabric, the transport, the wire format or the
topology (they are the layers below it; only the CLI and scripts sit above); hold MRC
protocol logic (that is the transport's) or kernel configuration (the fabric's).
"""
