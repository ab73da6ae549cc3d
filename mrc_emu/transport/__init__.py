"""The MRC transport: sans-IO state machines for the requester and the responder of a QP.

Why it exists: MRC's behaviour (spraying over EVs, placement by address, SACK, per-EV loss
detection, EV states and probes, congestion control) must run unchanged over an in-memory
network in virtual time (unit tests, no root) and over real sockets in a fabric. Modules:
`config` (QP attributes, PSN arithmetic), `requester`, `responder`, `recovery` (sent-packet
table, loss rules, timers, selective or go-back-N), `probing` (EV probes), `ev` (EV profile),
`rtt` (one RTT estimator per EV), `cc` (congestion control profiles: `nscc` UEC's NSCC,
`dcqcn` the RoCEv2 baseline's), `paths` (per-EV frame templates, and the driver interface);
`_spray.c` the optional C send loop.

What it must never do: touch a socket, read a clock, draw randomness itself (no socket,
select, time, os or random imports: time comes in as `now`, randomness from an injected
source), or import the fabric or the drivers (mrc_emu.io drives it, not the other way).
"""
