"""Scenarios: a scenario file run end to end, once per transport, and what it leaves behind.

Why it exists: a scenario says a fabric, workloads, faults at given moments and the transports to
compare; scenario.py reads it, faults.py holds the fault kinds (each turned into fault agents'
actions or controller steps), transports.py says how MRC and the baseline make their WRITEs,
runner.py runs it all on the runtime (baseline_path.py measures the link the baseline's flow
takes), and the analysis writes results.json, report.md and the figures; schema.py gives
results.json's schema these transports and fault kinds.

What it must never do: be imported by the runtime or the analysis (it sits on top of both), drive
the fabric or the transport itself (the runtime does), or compute a figure the analysis owns.
"""
