"""Virtual time: the MRC transport over a discrete-event model of the fabric.

Why it exists: the namespace fabric runs the transport in wall time on this machine's CPUs, so
its figures are the machine's speed as much as the fabric's, and a run cannot be repeated
exactly. Here the same transport objects (requester, responder, recovery, CC, EV profile,
probing, a host's MRC endpoint) are driven by an event engine instead of sockets, and their
frames, the bytes the wire layer encodes, cross a model of the same topology: links with a rate
and a propagation delay, every egress port with the port program's queue rule (mark, trim,
drop: topology/port_verdict.py, wire/switchport.py), SRv6 forwarding as the kernel's seg6local
End, End.X and NEXT-C-SID do it, ECMP for plain IPv6, host NICs that serialise, and faults on
links at virtual times. `engine` is the heap of timestamped events, `ports` an egress queue,
`forwarding` what a node does with a frame, `fabric` the model built from a Topology, `faults`
the link faults, `routing` the baseline's BGP/BFD repair as timers, `hosts` what drives the
endpoints. The same seed gives the same run, to the
byte and the nanosecond.

What it must never do: read a clock or draw from a global random source (time is the engine's,
randomness a seeded generator passed in), touch a socket or the kernel, copy or change what the
transport decides (it carries frames and gives time), or import the fabric or the experiments
(experiments/runtime/virtual.py sets transfers up on it, as the workers do on sockets).
"""
