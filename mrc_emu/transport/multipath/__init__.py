"""Multipath: the paths a QP sprays over, and what the transport knows of each.

Why it exists: MRC's one idea is many paths per QP. Everything about them lives here, apart from
the state machines that use them: `paths` (each EV's frame template and first hop, from the
topology's EV list, and the driver interface `Path`/`Send`), `evpaths` (the same from an OCP EV
profile, its uSID carriers checked against the fabric), `ev` (the EV profile: per-EV state,
statistics, events and the spray schedule), `evshare` (where those states live: the api EV
profile's slots, shared by the QPs bound to it), `rtt` (one RTT estimator per EV) and
`portstatus` (which ports of a host and its peers may carry packets).

What it must never do: import the rest of the transport (the requester, the responder, the
recovery and the probing use it, not the other way), touch a socket, read a clock or draw
randomness.
"""
