"""The kernel's interfaces, as the fabric uses them: netlink, namespaces, BPF, waiting on a condition.

Why it exists: the fabric speaks to the kernel through a few primitives that know nothing of a
fabric: batched rtnetlink messages (`netlink`), entering and naming network namespaces (`netns`,
`namespaces`), BPF objects and maps through libbpf and the bpf syscall (`bpfobj`), and waiting for
a condition with a deadline or for a moment of a schedule (`waiting`). Held apart, they are what a
unit test checks byte for byte, and what every other fabric module builds on.

What it must never do: import the rest of the fabric or know a topology, a fabric or its journal
(they sit above it); wait for anything with a fixed sleep.
"""
