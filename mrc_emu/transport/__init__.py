"""The MRC transport: sans-IO state machines for the requester and the responder of a QP.

Why it exists: MRC's behaviour (spraying over EVs, placement by address, SACK, per-EV loss
detection, EV states and probes, congestion control) must run unchanged over an in-memory
network in virtual time (unit tests, no root) and over real sockets in a fabric. Modules:
`config` (QP attributes, PSN arithmetic), `requester`, `responder`, `recovery` (sent-packet
table, loss rules, timers, selective or go-back-N), `probing` (EV probes), `endpoint` (a host's
endpoint at QPN 0x2), `mux` (a host's QPs behind its sockets), `ledger` (what the fault figures
are read from); `_spray.c` the optional C send loop, `_place.c` the C placement. Two packages
below them, which import nothing of the transport outside themselves: `multipath` (the paths a
QP sprays over and their state: `paths` from the topology's EV list with the driver interface,
`evpaths` from an OCP EV profile, `ev` the EV profile, `evshare` where its states live, `rtt`
one estimator per EV, `portstatus` which ports may carry packets) and `cc` (congestion control
profiles by name: `nscc` UEC's NSCC, `dcqcn` the RoCEv2 baseline's, `fixed`).

What it must never do: touch a socket, read a clock, draw randomness itself (no socket,
select, time, os or random imports: time comes in as `now`, randomness from an injected
source), or import the fabric or the drivers (mrc_emu.io drives it, not the other way).
"""
