/* SPDX-License-Identifier: GPL-2.0 */
/*
 * fluid.h: the arithmetic of the port program's virtual queue (port.bpf.c): what the shaped rate
 * drains in dt, and TBF's bucket refilled by the rest.
 *
 * Why it exists: the drain is rate x dt / 1e9 bytes (rate in bytes/s, dt in ns). At 800 Gbit/s
 * (1e11 bytes/s) and dt up to FLUID_RESET_NS (1 s; a port idle for longer starts empty), the
 * product reaches 1e20, beyond 2^64 (1.8e19): it wrapped once a port had been idle 0.18 s,
 * and the queue drained by a wrong amount. BPF has no 128-bit multiply or divide, so the
 * product is split at 1e9 instead: rate = q x 1e9 + r with r < 1e9, and
 *     floor(rate x dt / 1e9) = q x dt + floor(r x dt / 1e9)     (exactly)
 * Bounds, for dt <= FLUID_RESET_NS = 1e9 (clamped here, whatever the caller passes):
 *     r x dt < 1e9 x 1e9 = 1e18 < 2^64;
 *     q x dt <= floor((2^64 - 1) / 1e9) x 1e9 <= 2^64 - 1, for every 64-bit rate;
 *     the sum is the exact quotient, at most rate.
 * So the drain is exact for any rate the 64-bit field holds, not only up to some line rate.
 * Plain C on __u64, nothing of BPF's: tests/test_ports.py compiles this file for the host and
 * checks both functions against Python's exact integers.
 */
#ifndef MRC_EMU_FLUID_H
#define MRC_EMU_FLUID_H
#include <linux/types.h>

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

#define NS_PER_S 1000000000ULL
#define FLUID_RESET_NS NS_PER_S /* a port idle longer than this starts again empty, its bucket full */

/* bytes a port draining `rate` bytes/s drains in dt ns (dt clamped to FLUID_RESET_NS) */
static __always_inline __u64 fluid_supply(__u64 dt, __u64 rate)
{
	if (dt > FLUID_RESET_NS)
		dt = FLUID_RESET_NS;
	return (rate / NS_PER_S) * dt + (rate % NS_PER_S) * dt / NS_PER_S;
}

/* TBF's bucket after `refill` more bytes of supply, at most `burst` (which Python may have lowered
 * below what the bucket holds); never wraps */
static __always_inline __u64 fluid_refill(__u64 tokens, __u64 refill, __u64 burst)
{
	if (tokens >= burst || refill >= burst - tokens)
		return burst;
	return tokens + refill;
}

#endif
