"""Faults on a running fabric: applied, recorded, and undone from the record.

Why it exists: a fault must be undoable by whoever finds it, after a crash too. `fault_ops`
records each one in the fabric's fault record (`fault_record`: what, where, since when, by whom,
and how to undo it; `fault list`, `fault clear`) and then acts: links down, up or flapping
(links.py), loss and blackholes (XDP or netem from `datapath/`, or nftables rules, `nft`), a
degraded TBF, netem's delay.

What it must never do: apply a fault that its record does not hold, or undo one it does not
(never by a name pattern); be imported by the datapath or the kernel packages (it uses them).
"""
