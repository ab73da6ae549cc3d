"""The MRC wire format: packets as bytes, both ways.

Why it exists: every packet MRC sends is defined once here. `format` holds the constants and
packet records, `layers` the scapy definitions (the reference, slow), `headers` the byte
layouts and checksums, `encoder` the byte-template fast path that the data path sends with
(optional C in `_fastpath.c`), `decoder` the hostile-input-proof reader, `switchport` what a
switch port reads of a frame and does to its bytes (CE marks, trims). Golden tests prove the
fast path and scapy make the same bytes.

What it must never do: keep state about a connection, read a clock, touch a socket, or
import the transport, the fabric or the topology; it turns records into bytes and back.
"""
