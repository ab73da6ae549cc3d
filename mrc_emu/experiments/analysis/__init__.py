"""Analysis: the figures of a run, computed from what it returned.

Why it exists: the fault figures (detection, stall, repair, inflation, the windowed recovery:
metrics.py), the congestion figures (per-flow FCT, fairness, trim repair: congestion.py) and
the emulation's verdict on whether a run was faithful (emulation.py) are arithmetic on results,
kept apart from what produced them so a unit test checks each on hand-made inputs; report.py
and plots.py write results.json (and its schema), report.md and the figures from them.

What it must never do: import the runtime or the scenarios (they import it), start a process,
build a fabric or open a socket; it reads results (and writes the files above) and, for the emulation report, the kernel's
counters and the workers' own lag meters.
"""
