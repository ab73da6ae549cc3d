"""The live view: a web page (and its JSON / server-sent-events endpoint) of a fabric, its queues and every QP's EVs.

Why it exists: people pick an MRC emulator to *see* spraying and failover. `mrc-emu view` serves
one page for a running fabric (live.py reads its links, faults, controller record, switch port
counters and the transfers' live board; actions.py carries out the page's link and spine
actions through the same fault and controller records as the CLI), `mrc-emu run --view` the
same during a scenario, and `mrc-emu view --results DIR` a finished run replayed from its
results.json (replay.py). server.py is the HTTP side (aiohttp): the page, its vendored chart
library (static/vendor, with its licence), /api/topology, /api/state, /api/events (SSE) and
/api/action; docs/view.md documents the schema. model.py holds what both sources share.

What it must never do: be imported by any layer below the CLI; act on a fabric other than
through fabric/faults/fault_ops.py and the controller record (so `fault list` shows what the
page did); listen on another address than the one it is given (127.0.0.1 by default); load
anything from outside the package at run time (no CDN).
"""
