// SPDX-License-Identifier: GPL-2.0
/*
 * srv6.bpf.c: a node's SRv6 endpoint behaviours (End with NEXT-C-SID, End.X) as a tc clsact
 * ingress program, for kernels built without seg6local (CONFIG_IPV6_SEG6_LWTUNNEL unset).
 *
 * Why it exists: the fabric's SIDs are `seg6local` routes (fabric/config.py); a kernel without
 * the seg6 lightweight tunnel refuses them ("lwt encapsulation type not supported"), and then no
 * EV reaches anything. This program does on every fabric interface's ingress what those routes
 * do, before the IPv6 stack, and leaves the forwarding to the kernel: it rewrites the outer
 * destination address (and the SRH's Segments Left) exactly as seg6local End / End.X would, and
 * returns TC_ACT_OK, so the kernel routes the packet on its new destination (ip6_forward: the
 * hop limit, the FIB, the neighbour table, netfilter, the qdiscs and the port program, as with
 * seg6local, whose End and End.X also end in a route lookup and ip6_forward).
 *
 *   destination fc00:0:N:<argument> where N is this node's ID (the /48 of its SIDs):
 *   - fc00:0:N:f0d6:: exactly, N a host: its decapsulation address, a local address: untouched
 *     (the kernel's own SRH processing decapsulates, as with seg6local).
 *   - fc00:0:N:e00K::/64 with K one of this node's ports: End.X. Segments Left -1, the
 *     destination becomes that segment. The kernel then routes it: the next segment is always a
 *     SID of the neighbour behind port K (an End.X list names every hop), and every neighbour
 *     pair has one link, so the route is port K (datapath/srv6.py refuses other topologies).
 *   - otherwise End with NEXT-C-SID (block 32 bits, uSID 16 bits): a non-zero argument is
 *     shifted one uSID to the left (zeros in); a zero argument takes the SRH's next segment
 *     as End does.
 *   End and End.X on a packet without an SRH or with Segments Left 0, or with an SRH that does
 *   not hold together, drop it, as seg6local does.
 *
 * One program serves every node: the interface index, unique across the fabric (cabling.py),
 * says whose interface it is. Python (fabric/datapath/srv6.py) fills the map before attaching.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

/* numbers Python has too (topology/addressing.py, fabric/datapath/srv6.py): tests/test_c_constants.py */
#define ETH_LEN 14
#define IP6_LEN 40
#define NH_ROUTING 43
#define SRH_TYPE 4
#define SRH_FIXED_LEN 8
#define USID_BLOCK 0xfc000000    /* the 32-bit uSID block fc00:0000 */
#define DECAP_FUNCTION 0xf0d6
#define ENDX_BASE 0xe000
#define MAX_PORTS 256            /* End.X functions 0xE000 .. 0xE0FF */

#define NODE_HOST 1              /* srv6_node.flags: a host, whose decapsulation address is local */

struct srv6_node {               /* per interface index: the node it belongs to */
	__u32 node_id;           /* 0: not a fabric interface, nothing done */
	__u32 flags;
	__u8 endx[MAX_PORTS / 8];/* bit K: the node has port K, so 0xE000 + K is an End.X SID */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);  /* resized by Python to the fabric's highest interface index + 1 */
	__type(key, __u32);
	__type(value, struct srv6_node);
} srv6_nodes SEC(".maps");

#define DA_OFF (ETH_LEN + 24)
#define SRH_OFF (ETH_LEN + IP6_LEN)

struct srh_fixed {
	__u8 next_header, hdr_ext_len, routing_type, segments_left, last_entry, flags;
	__u16 tag;
};

/* End's SRH step (RFC 8986 4.1, as seg6local validates it): Segments Left -1 and that segment
 * as the destination; TC_ACT_SHOT where the packet has no usable SRH. */
static __always_inline int next_segment(struct __sk_buff *skb, __u8 next_header)
{
	struct srh_fixed srh;
	__u8 seg[16];

	if (next_header != NH_ROUTING)
		return TC_ACT_SHOT;
	if (bpf_skb_load_bytes(skb, SRH_OFF, &srh, sizeof(srh)))
		return TC_ACT_SHOT;
	if (srh.routing_type != SRH_TYPE || srh.segments_left == 0 || srh.segments_left > srh.last_entry + 1 ||
	    ((__u32)srh.last_entry + 1) * 2 > srh.hdr_ext_len)
		return TC_ACT_SHOT;
	__u8 left = srh.segments_left - 1;
	if (bpf_skb_load_bytes(skb, SRH_OFF + SRH_FIXED_LEN + 16 * (__u32)left, seg, sizeof(seg)))
		return TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, DA_OFF, seg, sizeof(seg), 0) ||
	    bpf_skb_store_bytes(skb, SRH_OFF + 3, &left, 1, 0))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

SEC("tc")
int srv6_ingress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u8 *pkt = data;
	__u32 key = skb->ifindex;
	struct srv6_node *node;

	if ((void *)(pkt + ETH_LEN + IP6_LEN) > data_end)
		return TC_ACT_OK;
	if (pkt[12] != 0x86 || pkt[13] != 0xdd || (pkt[ETH_LEN] >> 4) != 6)
		return TC_ACT_OK;
	node = bpf_map_lookup_elem(&srv6_nodes, &key);
	if (!node || !node->node_id)
		return TC_ACT_OK;
	__u8 *da = pkt + DA_OFF;
	__u32 block = ((__u32)da[0] << 24) | ((__u32)da[1] << 16) | ((__u32)da[2] << 8) | da[3];
	__u32 owner = ((__u32)da[4] << 8) | da[5];
	__u32 function = ((__u32)da[6] << 8) | da[7];
	if (block != USID_BLOCK || owner != node->node_id)
		return TC_ACT_OK;  /* not one of this node's SIDs: the kernel forwards it */
	__u8 rest = 0;
#pragma unroll
	for (int i = 8; i < 16; i++)
		rest |= da[i];
	if (function == DECAP_FUNCTION && !rest && (node->flags & NODE_HOST))
		return TC_ACT_OK;  /* a host's decapsulation address: local */
	__u8 next_header = pkt[ETH_LEN + 6];
	if ((function & 0xff00) == ENDX_BASE) {
		__u32 port = function & 0xff;
		if (node->endx[(port >> 3) & (MAX_PORTS / 8 - 1)] & (1 << (port & 7)))
			return next_segment(skb, next_header);  /* End.X */
	}
	if (function || rest) {  /* NEXT-C-SID: the next uSID comes up, zeros in */
		__u8 shifted[12];
#pragma unroll
		for (int i = 0; i < 10; i++)
			shifted[i] = da[6 + i];
		shifted[10] = 0;
		shifted[11] = 0;
		if (bpf_skb_store_bytes(skb, DA_OFF + 4, shifted, sizeof(shifted), 0))
			return TC_ACT_SHOT;
		return TC_ACT_OK;
	}
	return next_segment(skb, next_header);  /* End: the container is spent */
}

char LICENSE[] SEC("license") = "GPL";
