// SPDX-License-Identifier: GPL-2.0
/*
 * port.bpf.c: the congestion signals of one fabric egress port, as a tc clsact egress program.
 *
 * Why it exists: this kernel has no RED, fq_codel or netem, so nothing marks ECN or trims. The
 * port's shaping stays in TBF (fabric/build.py shape_node); this program runs before TBF, on the
 * same packets, and keeps a *virtual queue* of the port: the bytes it let through minus what the
 * shaped rate drained since (q = max(0, q - rate * dt) + len), with TBF's bucket modelled too (the
 * rate's supply beyond an empty queue refills it up to `burst`, and an arrival at an empty queue
 * spends tokens before it queues), so q follows the backlog TBF really holds: that is the queue
 * the program acts on (docs/fabric.md measures how close it is). For data packets (inner BTH opcode
 * RDMA WRITE ONLY / WITH IMMEDIATE) it marks CE with RED-style probability between kmin and kmax
 * (in the outer and the inner traffic class), trims a packet that would take the queue over the
 * trim threshold to its headers + trim_bytes of UDP payload (DSCP TRIMMED / TRIMMED_LASTHOP, every
 * length and the UDP checksum fixed), and drops any packet above the buffer (that rule is
 * verdict.h's, which the virtual fabric shares). Control packets are
 * never marked or trimmed; they and trimmed headers are queued ahead of data (skb->priority picks
 * the class of the HTB under TBF). One program serves every port of a fabric: ports are told apart by
 * interface index, which cabling.py makes unique across the fabric. Python (fabric/ports.py) sizes
 * the maps, writes each port's configuration and reads the counters; this file must never hold a
 * threshold of its own.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "fluid.h"
#include "verdict.h"

/* numbers Python has too (wire/format.py, fabric/ports.py, topology/port.py): tests/test_c_constants.py
 * holds each equal to its Python constant, and the map values' layouts to ports.py's */
#define ETH_LEN 14
#define IP6_LEN 40
#define UDP_LEN 8
#define NH_UDP 17
#define NH_IPV6 41
#define NH_ROUTING 43
#define ROCE_PORT 4791
#define OP_WRITE_ONLY 0x0A
#define OP_WRITE_ONLY_IMM 0x0B
#define DSCP_TRIMMABLE 26        /* only these data packets are trimmed (wire/format.py) */
/* skb->mark of a packet this program trimmed and sent round again (see port_egress) */
#define TRIMMED_HERE 0x6d726331
/* the classes of the HTB under each port's TBF (fabric/build.py shape_node; the same numbers as
 * mrc_emu/fabric/ports.py): skb->priority names one, and HTB serves CLASS_AHEAD first */
#define CLASS_AHEAD 0x20001      /* control packets and trimmed headers: sent ahead of data */
#define CLASS_DATA 0x20002       /* data packets, in arrival order */
#define DSCP_TRIMMED 10          /* the same numbers as mrc_emu/fabric/ports.py */
#define DSCP_TRIMMED_LASTHOP 11
#define ECN_CE 3
#define HIST_BUCKETS 128
#define MAX_TRIM_BYTES 256
#define PSEUDO_LEN 40            /* source, destination, UDP length, next header */

struct port_cfg {                /* written by Python at attach (and when the rate changes) */
	__u64 rate;              /* bytes per second the port drains: TBF's rate */
	__u32 flags;
	__u32 burst;             /* TBF's bucket */
	__u32 buffer;            /* drop a packet that would take the queue above this */
	__u32 kmin, kmax;
	__u32 pmax;              /* marking probability at kmax, in 1/2^32 */
	__u32 trim_threshold;
	__u32 trim_bytes;        /* UDP payload a trimmed packet keeps (a multiple of 4) */
	__u32 hist_width;        /* bytes per queue histogram bucket */
	__u32 epoch;             /* Python bumps it to zero the counters */
};

struct port_state {              /* one per port, changed under its lock */
	struct bpf_spin_lock lock;
	__u32 epoch;
	__u64 queue;             /* bytes waiting in TBF, as the fluid model has it */
	__u64 tokens;            /* TBF's bucket */
	__u64 last_ns;
	__u64 packets, bytes, max_queue, ce_marked, trimmed, dropped;
	__u64 hist[HIST_BUCKETS];        /* the queue arrivals found: 0, then ((i-1)w, iw] */
};

struct scratch {                 /* the pseudo header and a trimmed packet's UDP datagram */
	__u8 buf[PSEUDO_LEN + UDP_LEN + MAX_TRIM_BYTES];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);  /* resized by the loader to the fabric's highest interface index */
	__type(key, __u32);
	__type(value, struct port_cfg);
} ports_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct port_state);
} ports_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch SEC(".maps");

struct pkt {
	__u32 inner;             /* offset of the innermost IPv6 header (the one the receiver sees) */
	__u32 udp;               /* offset of the UDP header */
	__u8 data;               /* markable */
	__u8 trim_ok;            /* DSCP_TRIMMABLE: may be trimmed (RoCEv2's DSCP_NO_TRIM is dropped instead) */
	__u8 ect;
};

static __always_inline __u8 tclass(const __u8 *ip6)
{
	return (__u8)(((ip6[0] & 0x0f) << 4) | (ip6[1] >> 4));
}

/* Outer IPv6 -> [SRH] -> [inner IPv6] -> UDP 4791 -> BTH; anything else is not data. */
static __always_inline void classify(struct __sk_buff *skb, struct pkt *p)
{
	__u8 hdr[8], udp[9];
	__u32 off = ETH_LEN + IP6_LEN;

	if (skb->protocol != bpf_htons(ETH_P_IPV6) || bpf_skb_load_bytes(skb, ETH_LEN, hdr, 8) < 0)
		return;
	__u8 nh = hdr[6], tc = tclass(hdr);
	p->inner = ETH_LEN;
	if (nh == NH_ROUTING) {
		if (bpf_skb_load_bytes(skb, off, udp, 2) < 0)
			return;
		nh = udp[0];
		off += 8 + 8 * (__u32)udp[1];
	}
	if (nh == NH_IPV6) {
		if (bpf_skb_load_bytes(skb, off, hdr, 8) < 0)
			return;
		nh = hdr[6];
		tc = tclass(hdr);
		p->inner = off;
		off += IP6_LEN;
	}
	if (nh != NH_UDP || bpf_skb_load_bytes(skb, off, udp, 9) < 0)
		return;
	if (((udp[2] << 8) | udp[3]) != ROCE_PORT)
		return;
	__u8 dscp = tc >> 2;
	if (dscp == DSCP_TRIMMED || dscp == DSCP_TRIMMED_LASTHOP)
		return;          /* trimmed already: never marked or trimmed again */
	p->udp = off;
	p->data = udp[8] == OP_WRITE_ONLY || udp[8] == OP_WRITE_ONLY_IMM;
	p->trim_ok = dscp == DSCP_TRIMMABLE;
	p->ect = (tc & 3) == 1 || (tc & 3) == 2;
}

static __always_inline void set_tclass(struct __sk_buff *skb, __u32 off, __u8 or_ecn, int dscp)
{
	__u8 b[2];

	if (bpf_skb_load_bytes(skb, off, b, 2) < 0)
		return;
	__u8 tc = tclass(b) | or_ecn;
	if (dscp >= 0)
		tc = (__u8)((dscp << 2) | (tc & 3));
	b[0] = (b[0] & 0xf0) | (tc >> 4);
	b[1] = (b[1] & 0x0f) | (__u8)(tc << 4);
	bpf_skb_store_bytes(skb, off, b, 2, 0);
}

static __always_inline void mark_ce(struct __sk_buff *skb, const struct pkt *p)
{
	set_tclass(skb, ETH_LEN, ECN_CE, -1);
	if (p->inner != ETH_LEN)
		set_tclass(skb, p->inner, ECN_CE, -1);
}

static __always_inline void store_be16(struct __sk_buff *skb, __u32 off, __u32 value)
{
	__u16 v = bpf_htons((__u16)value);

	bpf_skb_store_bytes(skb, off, &v, 2, 0);
}

/* Cut the packet to its headers + trim_bytes of UDP payload; lengths, DSCP and checksum fixed. */
static __always_inline int trim(struct __sk_buff *skb, const struct pkt *p, __u32 trim_bytes, int dscp)
{
	__u32 zero = 0, udp_len = UDP_LEN + trim_bytes;
	__u32 new_len = p->udp + udp_len;
	struct scratch *s = bpf_map_lookup_elem(&scratch, &zero);

	if (!s || trim_bytes > MAX_TRIM_BYTES || (trim_bytes & 3))
		return -1;
	if (bpf_skb_change_tail(skb, new_len, 0) < 0)
		return -1;
	store_be16(skb, ETH_LEN + 4, new_len - ETH_LEN - IP6_LEN);
	if (p->inner != ETH_LEN)
		store_be16(skb, p->inner + 4, new_len - p->inner - IP6_LEN);
	store_be16(skb, p->udp + 4, udp_len);
	set_tclass(skb, ETH_LEN, 0, dscp);
	if (p->inner != ETH_LEN)
		set_tclass(skb, p->inner, 0, dscp);

	/* UDP checksum from scratch: pseudo header (addresses, length, next header) + datagram */
	if (bpf_skb_load_bytes(skb, p->inner + 8, s->buf, 32) < 0)
		return -1;
	__u32 *words = (__u32 *)(s->buf + 32);
	words[0] = bpf_htonl(udp_len);
	words[1] = bpf_htonl(NH_UDP);
	__u32 n = udp_len;
	if (n > UDP_LEN + MAX_TRIM_BYTES)
		return -1;
	if (bpf_skb_load_bytes(skb, p->udp, s->buf + PSEUDO_LEN, n) < 0)
		return -1;
	s->buf[PSEUDO_LEN + 6] = 0;
	s->buf[PSEUDO_LEN + 7] = 0;
	__s64 sum = bpf_csum_diff(0, 0, (__be32 *)s->buf, PSEUDO_LEN + n, 0);
	if (sum < 0)
		return -1;
	__u32 folded = (__u32)sum;
	folded = (folded & 0xffff) + (folded >> 16);
	folded = (folded & 0xffff) + (folded >> 16);
	__u16 check = (__u16)~folded;
	if (check == 0)
		check = 0xffff;
	bpf_skb_store_bytes(skb, p->udp + 6, &check, 2, 0);  /* summed as raw words: stored as is */
	return 0;
}

SEC("tc")
int port_egress(struct __sk_buff *skb)
{
	__u32 key = skb->ifindex;
	struct port_cfg *cfg = bpf_map_lookup_elem(&ports_cfg, &key);
	struct port_state *st = bpf_map_lookup_elem(&ports_state, &key);

	if (!cfg || !st || !(cfg->flags & PORT_ENABLED))
		return TC_ACT_OK;
	/* A packet this program trimmed comes round once more (below): the qdisc had taken its
	 * length before this hook ran, and TBF would charge the whole packet to the link. It was
	 * counted at its short length already; into the queue with it. */
	if (skb->mark == TRIMMED_HERE) {
		skb->mark = 0;
		skb->priority = CLASS_AHEAD;
		return TC_ACT_OK;
	}

	struct pkt p = {};
	classify(skb, &p);
	/* data waits in arrival order; everything else (ACKs, NAKs, probes, CNPs, headers trimmed
	 * upstream, routing protocols) goes ahead of it, as a switch's control class does */
	skb->priority = p.data ? CLASS_DATA : CLASS_AHEAD;
	__u32 flags = cfg->flags, len = skb->len;
	__u32 trim_len = p.udp + UDP_LEN + cfg->trim_bytes;
	__u32 width = cfg->hist_width ? cfg->hist_width : 1;
	__u64 now = bpf_ktime_get_ns(), rate = cfg->rate;
	__u32 random = bpf_get_prandom_u32(), epoch = cfg->epoch;
	__u64 burst = cfg->burst, buffer = cfg->buffer, kmin = cfg->kmin, kmax = cfg->kmax;
	__u64 pmax = cfg->pmax, threshold = cfg->trim_threshold;
	enum verdict verdict;

	bpf_spin_lock(&st->lock);
	if (st->epoch != epoch) {
		st->epoch = epoch;
		st->packets = st->bytes = st->max_queue = 0;
		st->ce_marked = st->trimmed = st->dropped = 0;
		/* a bounded loop, not unrolled: clang would make 128 stores one memset, which BPF lacks */
		for (int i = 0; i < HIST_BUCKETS; i++) {
			st->hist[i] = 0;
			asm volatile("" ::: "memory");
		}
	}
	/* TBF as a fluid: the rate's supply since the last packet drains the queue first, then
	 * refills the bucket (up to burst); an arrival at an empty queue spends tokens first
	 * (fluid.h: rate x dt without overflow, at any rate) */
	__u64 dt = now - st->last_ns;
	if (st->last_ns == 0 || dt > FLUID_RESET_NS) {
		st->queue = 0;
		st->tokens = burst;
	} else {
		__u64 supply = fluid_supply(dt, rate);
		__u64 drained = st->queue < supply ? st->queue : supply;
		st->queue -= drained;
		st->tokens = fluid_refill(st->tokens, supply - drained, burst);
	}
	st->last_ns = now;
	__u64 queue = st->queue;   /* what the arriving packet finds */
	__u64 bucket = queue ? 1 + (queue - 1) / width : 0;   /* bucket 0: an empty queue */
	__u32 slot = bucket < HIST_BUCKETS ? (__u32)bucket : HIST_BUCKETS - 1;
	/* The verifier of older kernels (Debian 12's 6.1) cannot bound the select clang makes of the
	 * clamp above ("math between map_value pointer and register with unbounded min value"):
	 * hide it from the optimiser and mask, a bound every verifier sees (HIST_BUCKETS is a power of two). */
	asm volatile("" : "+r"(slot));
	slot &= HIST_BUCKETS - 1;
	st->hist[slot] += 1;

	/* the rule itself (verdict.h), shared with the virtual fabric's ports */
	verdict = port_verdict(queue, &len, trim_len, p.data, p.trim_ok, p.ect, flags, threshold, buffer, kmin, kmax,
			       pmax, random);
	if (verdict == DROP) {
		st->dropped += 1;
	} else {
		if (verdict == TRIM)
			st->trimmed += 1;
		else if (verdict == MARK)
			st->ce_marked += 1;
		__u64 spent = queue == 0 ? (st->tokens < len ? st->tokens : len) : 0;
		st->tokens -= spent;
		st->queue += len - spent;
		st->packets += 1;
		st->bytes += len;
		if (st->queue > st->max_queue)
			st->max_queue = st->queue;
	}
	bpf_spin_unlock(&st->lock);

	if (verdict == DROP)
		return TC_ACT_SHOT;
	if (verdict == MARK)
		mark_ce(skb, &p);
	if (verdict == TRIM) {
		if (trim(skb, &p, cfg->trim_bytes, (flags & PORT_LASTHOP) ? DSCP_TRIMMED_LASTHOP : DSCP_TRIMMED) < 0)
			return TC_ACT_SHOT;  /* half-rewritten: never let it out */
		/* out through this device again, so that TBF takes it at its trimmed length */
		skb->mark = TRIMMED_HERE;
		skb->priority = CLASS_AHEAD;
		return bpf_redirect(skb->ifindex, 0);
	}
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
