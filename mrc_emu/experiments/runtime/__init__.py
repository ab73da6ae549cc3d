"""The runtime: MRC transfers driven on a running fabric, through the drivers, or in virtual time.

Why it exists: a transfer joins the three layers below: the fabric (namespaces, links, child
processes), the transport (the QPs' state machines) and the drivers (io: sockets and the event
loop). This package is that join: the parent's side of a run (transfer.py) and its endpoint
workers (worker.py, each host's controller hostctl.py and endpoint operations endpoint_ops.py),
what a transfer is and how its QPs are made and reported whoever drives them (spec.py, qps.py),
the same transfers over the virtual fabric instead, without root (virtual.py),
the controller record (controller.py), the agents that carry out faults in their own processes
(fault_agent.py), EV probes (probes.py), STEV coverage (stev.py) and the fabric self-check
(fabric_check.py).

What it must never do: import the scenarios (they drive it, not the other way: a transfer knows
no scenario file, no fault kind, no transport comparison), hold MRC protocol logic (the
transport's) or kernel configuration (the fabric's); it may read `analysis` for the figures.
"""
