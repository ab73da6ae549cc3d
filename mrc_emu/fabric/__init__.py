"""The fabric layer: a multi-plane leaf/spine fabric of network namespaces, and everything on it.

What it is: nodes that are named network namespaces (kernel/namespaces.py: no process per
node) whose SRv6 forwarding is the kernel's, veths, batched netlink configuration (addresses,
SIDs, routes), the journal of everything a run created (registry.py), one handle on a running
fabric (running.Fabric), link state (links.py), FRR or static routes for the baseline's
routing, captures and child processes (procs.py). Three packages below it: `kernel` (netlink,
namespaces, BPF objects, waiting on the kernel: primitives that know no fabric), `datapath`
(what is attached to ports: the tc BPF switch egress program that marks ECN, trims and drops,
bpf/port.bpf.c; RED; the hosts' CE decap; netem; XDP drops) and `faults` (the fault record of
every fault in force and how to undo it, the faults applied through it, nft loss).

What it must never do: import the transport, the wire format or the experiments (it
knows namespaces, interfaces, processes and the topology, not MRC; the transport and
the fabric stand side by side, and the experiments join them); remove or kill anything
its journal does not record (never a name pattern, never a process looked up by name);
wait for something with a fixed sleep.
"""
