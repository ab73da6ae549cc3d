"""The datapath's attachments: what a packet meets at a port besides the kernel's SRv6 forwarding.

Why it exists: the fabric's behaviour under load and under faults is made of programs and qdiscs
attached to interfaces, each with the same life (attached in netlink batches, recorded, read,
detached): the switch egress port program that marks ECN, trims and drops from a virtual queue
(`ports`, bpf/port.bpf.c), the kernel's RED qdisc as the other port model (`red`), the hosts'
ingress program that carries an outer CE mark inward (`ecn_decap`), netem's delay and loss on a
link's egress (`impair`) and the XDP program that drops on a link's ingress (`xdp`).

What it must never do: import the faults package or the experiments (a fault uses these, as the
fabric's build does), decide when a fault starts or ends, or leave anything attached that the
journal does not record.
"""
