"""Congestion control: the profiles that say how many bytes a QP may have in flight, and how fast.

Why it exists: spraying spreads load, it does not limit it. `base` is the interface a profile
implements (the events the requester and its recovery feed it), `nscc` UEC 1.0's NSCC (MRC's),
`dcqcn` the RoCEv2 baseline's, `fixed` a constant window, and `registry` finds one by name
(`make_cc`).

What it must never do: import the rest of the transport (a profile sees events with their
times, not packets, EVs' states or the requester), read a clock or keep an RTT estimator of its
own (every event carries its time and the EV's srtt); a profile must never import the registry.
"""
