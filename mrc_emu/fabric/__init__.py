"""The fabric layer: a multi-plane leaf/spine fabric of network namespaces, and everything on it.

What it is: nodes that are named network namespaces (namespaces.py: no process per node) whose
SRv6 forwarding is the kernel's, veths, batched netlink configuration (addresses, SIDs,
routes), the journal of everything a run created (registry.py), one handle on a running fabric
(running.Fabric), link state (links.py), packet faults (nft, XDP), degraded and delayed links
(build.shape_port, impair.py: netem), the fault record of every fault in force and how to undo
it (fault_record.py, fault_ops.py), switch egress ports that mark ECN, trim and drop (a tc BPF
program: ports.py, bpf/port.bpf.c, bpfobj.py), FRR for the baseline's routing, captures, child
processes (procs.py) and waiting on the kernel (waiting.until).

What it must never do: import the transport, the wire format or the experiments (it
knows namespaces, interfaces, processes and the topology, not MRC; the transport and
the fabric stand side by side, and the experiments join them); remove or kill anything
its journal does not record (never a name pattern, never a process looked up by name);
wait for something with a fixed sleep.
"""
