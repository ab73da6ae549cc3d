/*
 * mrc_emu.wire._fastpath: the data path's per-packet work on a frame template, in C.
 *
 * Why it exists: CPython spends about 3 us to patch PSN and RETH into a template, copy the
 * payload, run the ICRC and finish the UDP checksum of a 1 KiB packet; the send itself costs
 * about 8 us. This does the same work in about 0.5 us (1.4 us for 4 KiB, most of it reading the
 * payload from memory). It is optional: mrc_emu/wire/encoder.py falls
 * back to its pure-Python path (same bytes, proven by the same golden tests) when this module
 * was not built.
 *
 * patch((frame, fields_at, payload_at, payload_end, icrc_at, csum_at, crc, words),
 *       psn_word, va, rkey, imm, payload) -> frame
 *   frame      writable buffer holding the template (headers in place, pad bytes zero)
 *   fields_at  offset of BTH's PSN word; RETH (and ImmDt when imm >= 0) follow it
 *   crc        CRC-32 state after the ICRC's constant, masked part (zlib's convention)
 *   words      sum of the UDP checksum's constant 16-bit words (pseudo header, BTH, length),
 *              reduced modulo 0xFFFF
 *   imm        the immediate, or None
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#include "crc32.h"

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

/* METH_FASTCALL: no argument tuple, no format string; this is called once per packet */
static PyObject *patch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 8) {
        PyErr_SetString(PyExc_TypeError, "patch(head, psn_word, va, rkey, imm, payload): head is an 8-tuple");
        return NULL;
    }
    PyObject *head = args[0];
    PyObject *frame_obj = PyTuple_GET_ITEM(head, 0);
    if (!PyByteArray_Check(frame_obj)) {
        PyErr_SetString(PyExc_TypeError, "the template frame must be a bytearray");
        return NULL;
    }
    Py_ssize_t fields_at = PyLong_AsSsize_t(PyTuple_GET_ITEM(head, 1));
    Py_ssize_t payload_at = PyLong_AsSsize_t(PyTuple_GET_ITEM(head, 2));
    Py_ssize_t payload_end = PyLong_AsSsize_t(PyTuple_GET_ITEM(head, 3));
    Py_ssize_t icrc_at = PyLong_AsSsize_t(PyTuple_GET_ITEM(head, 4));
    Py_ssize_t csum_at = PyLong_AsSsize_t(PyTuple_GET_ITEM(head, 5));
    unsigned long long crc = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(head, 6));
    unsigned long long words = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(head, 7));
    unsigned long long psn_word = PyLong_AsUnsignedLongLongMask(args[1]);
    unsigned long long va = PyLong_AsUnsignedLongLongMask(args[2]);
    unsigned long long rkey = PyLong_AsUnsignedLongLongMask(args[3]);
    long long imm = args[4] == Py_None ? -1 : (long long)PyLong_AsUnsignedLongMask(args[4]) & 0xFFFFFFFFLL;
    if (PyErr_Occurred())
        return NULL;
    Py_buffer payload;
    if (PyObject_GetBuffer(args[5], &payload, PyBUF_SIMPLE) < 0)
        return NULL;
    uint8_t *f = (uint8_t *)PyByteArray_AS_STRING(frame_obj);
    Py_ssize_t frame_len = PyByteArray_GET_SIZE(frame_obj);
    if (fields_at < 0 || csum_at < 0 || csum_at + 2 > fields_at || payload_at < fields_at + 20 ||
        payload_end > icrc_at || icrc_at + 4 > frame_len || payload_end - payload_at != payload.len) {
        PyBuffer_Release(&payload);
        PyErr_SetString(PyExc_ValueError, "frame offsets and payload length disagree");
        return NULL;
    }
    uint8_t *x = f + fields_at;
    put_be32(x, (uint32_t)psn_word);
    put_be32(x + 4, (uint32_t)(va >> 32));
    put_be32(x + 8, (uint32_t)va);
    put_be32(x + 12, (uint32_t)rkey);
    put_be32(x + 16, (uint32_t)payload.len);
    if (imm >= 0)
        put_be32(x + 20, (uint32_t)imm);
    memcpy(f + payload_at, payload.buf, payload.len);
    uint32_t c = crc32_update((uint32_t)crc, x, (size_t)(icrc_at - fields_at));
    /* the variable words: PSN word, RETH without its length (in `words`), ImmDt, payload,
       ICRC as it goes out (little-endian) */
    uint64_t sum = words + be_words(x, 16) + (imm >= 0 ? be_words(x + 20, 4) : 0) +
                   be_words(f + payload_at, (size_t)payload.len);
    f[icrc_at] = c; f[icrc_at + 1] = c >> 8; f[icrc_at + 2] = c >> 16; f[icrc_at + 3] = c >> 24;
    sum += be_words(f + icrc_at, 4);
    uint32_t s = (uint32_t)(sum % 0xFFFF);
    uint16_t csum = s ? (uint16_t)(0xFFFF - s) : 0xFFFF;
    f[csum_at] = csum >> 8;
    f[csum_at + 1] = csum & 0xFF;
    PyBuffer_Release(&payload);
    Py_INCREF(frame_obj);
    return frame_obj; /* the frame, ready to send */
}

static PyObject *crc32_py(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned long crc = 0;
    if (!PyArg_ParseTuple(args, "y*|k", &data, &crc))
        return NULL;
    uint32_t c = crc32_update((uint32_t)crc, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef methods[] = {
    {"patch", (PyCFunction)(void (*)(void))patch, METH_FASTCALL,
     "Patch one data packet into a frame template (see the module comment)."},
    {"crc32", crc32_py, METH_VARARGS, "crc32(data, crc=0): the same as zlib.crc32, for tests."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastpath(void) {
    return PyModule_Create(&module);
}
