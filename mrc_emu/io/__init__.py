"""Drivers: what carries the transport's frames and gives it time.

Why it exists: the MRC state machines in `transport/` are sans-IO; something must hand them
datagrams and the clock, and put their frames on a wire. `memory` is a network in virtual
time with injectable per-EV faults (the unit tests, no root); `sockets` is a raw IPv6 socket
out and a UDP socket on port 4791 in, inside a fabric namespace (real packets); `prober`
sends one EV probe per path and times its return (`mrc-emu probe`); `loop` is a worker's event
loop over the sockets of many hosts, which measures its own lag and publishes a horizon.

What it must never do: decide anything the transport decides (what to send, when a packet
is lost, which EV to use), or build namespaces and routes (that is `fabric/`). The sockets
it uses are created by the caller inside the right namespace.
"""
