/*
 * mrc_emu/wire/crc32.h: CRC-32 as zlib.crc32 computes it, fast on x86-64, for the C fast paths.
 *
 * Why it exists: both ends of a data packet run the RoCEv2 ICRC over its whole payload, the
 * sender's encoder (_fastpath.c) and the responder's placement (transport/_place.c); one copy of
 * the carry-less-multiply CRC serves both. Static functions only: each extension includes it.
 * Needs <stdint.h>, <stddef.h> and <zlib.h> (link with -lz).
 */
#ifndef MRC_EMU_CRC32_H
#define MRC_EMU_CRC32_H
#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

/* CRC-32 continuing from `crc`, as zlib.crc32(data, crc).

   On x86-64 with PCLMULQDQ, whole 16-byte blocks are folded with carry-less multiplies
   (Intel, "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction", 2009:
   fold by four 128-bit lanes, then by one, then 128 -> 64 -> 32 bits and a Barrett reduction;
   the constants are that paper's for the bit-reflected polynomial 0x04C11DB7). That is about
   3.5x faster than zlib's table-driven code on a 4 KiB payload. The tail under 16 bytes, short
   inputs and other CPUs go through zlib, which the golden tests compare against. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_CLMUL 1
#define LOAD128(p) _mm_loadu_si128((const __m128i *)(p))

__attribute__((target("pclmul,sse4.1"))) static inline __m128i fold128(__m128i x, __m128i k, __m128i next) {
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

/* the raw (uninverted) CRC state over n bytes, n >= 64 and a multiple of 16 */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc32_clmul(uint32_t state, const uint8_t *p, size_t n) {
    const __m128i by4 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);  /* x^(4*128+-32) mod P, reflected */
    const __m128i by1 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);  /* x^(128+-32) mod P */
    const __m128i to32 = _mm_set_epi64x(0, 0x163cd6124LL);              /* x^64 mod P */
    const __m128i barrett = _mm_set_epi64x(0x1f7011641LL, 0x1db710641LL); /* mu, P */
    const __m128i low32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i x0 = _mm_xor_si128(LOAD128(p), _mm_cvtsi32_si128((int)state));
    __m128i x1 = LOAD128(p + 16), x2 = LOAD128(p + 32), x3 = LOAD128(p + 48);
    for (p += 64, n -= 64; n >= 64; p += 64, n -= 64) {
        x0 = fold128(x0, by4, LOAD128(p));
        x1 = fold128(x1, by4, LOAD128(p + 16));
        x2 = fold128(x2, by4, LOAD128(p + 32));
        x3 = fold128(x3, by4, LOAD128(p + 48));
    }
    x0 = fold128(fold128(fold128(x0, by1, x1), by1, x2), by1, x3);
    for (; n >= 16; p += 16, n -= 16)
        x0 = fold128(x0, by1, LOAD128(p));
    x0 = _mm_xor_si128(_mm_srli_si128(x0, 8), _mm_clmulepi64_si128(x0, by1, 0x10));
    x0 = _mm_xor_si128(_mm_srli_si128(x0, 4), _mm_clmulepi64_si128(_mm_and_si128(x0, low32), to32, 0x00));
    __m128i q = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(x0, low32), barrett, 0x10), low32);
    x0 = _mm_xor_si128(x0, _mm_clmulepi64_si128(q, barrett, 0x00));
    return (uint32_t)_mm_extract_epi32(x0, 1);
}

static int clmul_usable = -1;
#endif

static uint32_t crc32_update(uint32_t crc, const uint8_t *p, size_t n) {
#ifdef HAVE_CLMUL
    if (clmul_usable < 0) {
        __builtin_cpu_init();
        clmul_usable = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    }
    if (clmul_usable && n >= 64) {
        size_t blocks = n & ~(size_t)15;
        crc = ~crc32_clmul(~crc, p, blocks);
        p += blocks;
        n -= blocks;
    }
#endif
    return (uint32_t)crc32_z(crc, p, n);
}

#endif
