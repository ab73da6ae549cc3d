/* SPDX-License-Identifier: GPL-2.0 */
/*
 * verdict.h: what the port program (port.bpf.c) does with an arriving packet, given the queue it
 * finds: pass it, mark it CE, trim it to its headers, or drop it.
 *
 * Why it exists: the rule is a pure function of the queue's bytes, the packet's length and what
 * the packet is (data? trimmable? ECN-capable?), and the same rule runs in two places: here, in
 * every switch port of the namespace fabric, and in the virtual fabric's ports (Python,
 * mrc_emu/topology/port_verdict.py). Kept apart from the program's BPF helpers, plain C on
 * __u64 like fluid.h, so tests/test_port_verdict.py compiles this file for the host and holds
 * the two equal on the same packet sequences. It must never hold a threshold of its own: every
 * number comes from the port's configuration (topology/port.py, written by fabric/datapath/ports.py).
 */
#ifndef MRC_EMU_VERDICT_H
#define MRC_EMU_VERDICT_H
#include <linux/types.h>

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

/* struct port_cfg's flags (Python: topology/port_verdict.py) */
#define PORT_ENABLED 1
#define PORT_ECN 2
#define PORT_TRIM 4
#define PORT_LASTHOP 8           /* faces a host: a trim here is a last-hop trim */

enum verdict { PASS, MARK, TRIM, DROP };

/* A packet of *len bytes arrives at a queue of `queue` bytes on a port with these `flags`; it is
 * `data` (RoCEv2 WRITE_ONLY[_IMM]), `trim_ok` (DSCP_TRIMMABLE) and `ect` (ECN-capable) or not.
 * Trimmable (data, trim_ok, a trimming port, longer than trim_len) and taking the queue over
 * `threshold`: it is cut to `trim_len` (*len says so). Then, taking the queue over `buffer`, it
 * is dropped. Markable (ECN-capable data on a marking port) and finding more than kmin: marked
 * with a probability rising linearly to pmax (in 1/2^32) at kmax, and always above kmax.
 * `random` is a uniform 32-bit draw. pmax < 2^32 and queue < 2^32 (it grows only up to the
 * buffer, a __u32): the product fits in 64 bits. */
static __always_inline enum verdict port_verdict(__u64 queue, __u32 *len, __u32 trim_len, int data, int trim_ok,
						 int ect, __u32 flags, __u64 threshold, __u64 buffer,
						 __u64 kmin, __u64 kmax, __u64 pmax, __u32 random)
{
	int trimmable = data && trim_ok && (flags & PORT_TRIM) && trim_len < *len;
	int markable = data && ect && (flags & PORT_ECN);
	enum verdict verdict = PASS;

	if (trimmable && queue + *len > threshold) {
		verdict = TRIM;
		*len = trim_len;
	}
	if (queue + *len > buffer)
		return DROP;
	if (verdict == TRIM)
		return TRIM;
	if (markable && queue > kmin &&
	    (queue > kmax || kmax <= kmin || random < pmax * (queue - kmin) / (kmax - kmin)))
		return MARK;
	return PASS;
}

#endif
