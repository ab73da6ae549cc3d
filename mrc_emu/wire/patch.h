/*
 * mrc_emu/wire/patch.h: one data packet patched into a copy of its frame template, for the C fast paths.
 *
 * Why it exists: the encoder's `patch` (_fastpath.c) and the requester's batched send loop
 * (transport/_spray.c) write the same bytes: PSN and RETH, the payload, the ICRC and the UDP
 * checksum, into a frame that holds the template's headers. One copy of that code serves
 * both, so the golden tests of the one cover the other. Static functions only: each extension
 * includes it. Needs Python.h (the template's description is a Python tuple) and crc32.h.
 *
 * A template's description ("head", FrameTemplate._prepared) is the 8-tuple
 * (frame, fields_at, payload_at, payload_end, icrc_at, csum_at, crc, words):
 *   frame      bytearray holding the template (headers in place, pad bytes zero)
 *   fields_at  offset of BTH's PSN word; RETH (and ImmDt when there is one) follow it
 *   crc        CRC-32 state after the ICRC's constant, masked part (zlib's convention)
 *   words      sum of the UDP checksum's constant 16-bit words (pseudo header, BTH, length),
 *              reduced modulo 0xFFFF
 */
#ifndef MRC_EMU_PATCH_H
#define MRC_EMU_PATCH_H
#include <stdint.h>
#include <string.h>

#include "crc32.h"

typedef struct {
    PyObject *frame; /* borrowed: the template's bytearray */
    Py_ssize_t fields_at, payload_at, payload_end, icrc_at, csum_at;
    uint32_t crc;
    uint64_t words;
} PatchHead;

/* parse a head tuple; 0, or -1 with an exception set */
static int patch_head_parse(PyObject *head, PatchHead *h) {
    if (!PyTuple_Check(head) || PyTuple_GET_SIZE(head) != 8) {
        PyErr_SetString(PyExc_TypeError, "a frame template's head is an 8-tuple");
        return -1;
    }
    h->frame = PyTuple_GET_ITEM(head, 0);
    if (!PyByteArray_Check(h->frame)) {
        PyErr_SetString(PyExc_TypeError, "the template frame must be a bytearray");
        return -1;
    }
    h->fields_at = PyLong_AsSsize_t(PyTuple_GET_ITEM(head, 1));
    h->payload_at = PyLong_AsSsize_t(PyTuple_GET_ITEM(head, 2));
    h->payload_end = PyLong_AsSsize_t(PyTuple_GET_ITEM(head, 3));
    h->icrc_at = PyLong_AsSsize_t(PyTuple_GET_ITEM(head, 4));
    h->csum_at = PyLong_AsSsize_t(PyTuple_GET_ITEM(head, 5));
    h->crc = (uint32_t)PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(head, 6));
    h->words = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(head, 7));
    if (PyErr_Occurred())
        return -1;
    if (h->fields_at < 0 || h->csum_at < 0 || h->csum_at + 2 > h->fields_at || h->payload_at < h->fields_at + 20 ||
        h->payload_end < h->payload_at || h->payload_end > h->icrc_at ||
        h->icrc_at + 4 > PyByteArray_GET_SIZE(h->frame)) {
        PyErr_SetString(PyExc_ValueError, "frame offsets and payload length disagree");
        return -1;
    }
    return 0;
}

/* sum of the big-endian 16-bit words of p[0..n) (a trailing odd byte is the high half of a
   word), modulo 0xFFFF. Whole 32-bit words are summed as they lie in memory: on a
   little-endian host that is the sum of byte-swapped 16-bit words, which modulo 0xFFFF is
   256 times the big-endian sum (RFC 1071); multiplying by 256 again undoes it. */
static uint64_t be_words(const uint8_t *p, size_t n) {
    uint64_t native = 0, be = 0;
    size_t i = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    for (; i + 4 <= n; i += 4) {
        uint32_t w;
        memcpy(&w, p + i, 4);
        native += w;
    }
#endif
    for (; i + 1 < n; i += 2)
        be += ((uint32_t)p[i] << 8) | p[i + 1];
    if (i < n)
        be += (uint32_t)p[i] << 8;
    return (native % 0xFFFF) * 256 % 0xFFFF + be;
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

/* Patch one packet into f, a frame whose bytes before h->payload_at are the template's (and
   whose pad bytes after the payload are zero): PSN word, RETH, ImmDt when imm >= 0, the
   payload (payload_end - payload_at bytes), ICRC and UDP checksum. */
static void patch_frame(uint8_t *f, const PatchHead *h, uint32_t psn_word, uint64_t va, uint32_t rkey, long long imm,
                        const uint8_t *payload) {
    size_t length = (size_t)(h->payload_end - h->payload_at);
    uint8_t *x = f + h->fields_at;
    put_be32(x, psn_word);
    put_be32(x + 4, (uint32_t)(va >> 32));
    put_be32(x + 8, (uint32_t)va);
    put_be32(x + 12, rkey);
    put_be32(x + 16, (uint32_t)length);
    if (imm >= 0)
        put_be32(x + 20, (uint32_t)imm);
    memcpy(f + h->payload_at, payload, length);
    uint32_t c = crc32_update(h->crc, x, (size_t)(h->icrc_at - h->fields_at));
    /* the variable words: PSN word, RETH without its length (in `words`), ImmDt, payload,
       ICRC as it goes out (little-endian) */
    uint64_t sum = h->words + be_words(x, 16) + (imm >= 0 ? be_words(x + 20, 4) : 0) + be_words(f + h->payload_at, length);
    Py_ssize_t at = h->icrc_at;
    f[at] = c; f[at + 1] = c >> 8; f[at + 2] = c >> 16; f[at + 3] = c >> 24;
    sum += be_words(f + at, 4);
    uint32_t s = (uint32_t)(sum % 0xFFFF);
    uint16_t csum = s ? (uint16_t)(0xFFFF - s) : 0xFFFF;
    f[h->csum_at] = csum >> 8;
    f[h->csum_at + 1] = csum & 0xFF;
}

#endif
