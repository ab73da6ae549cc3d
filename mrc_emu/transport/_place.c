/*
 * mrc_emu.transport._place: the responder's common case in C: check a full data packet and
 * place it.
 *
 * Why it exists: nearly every datagram a responder receives is an RDMA WRITE_ONLY for a known
 * QP, in its PSN window, new, with the right P_Key, R_Key, protection domain and bounds and a
 * correct ICRC, or, from an RC peer (rdma_rxe, docs/interop.md), the FIRST, MIDDLE or LAST of a
 * multi-packet WRITE at the expected PSN that fits the message its FIRST's RETH opened. CPython spent about 20 us on each (a packet record, the ICRC, a Python-int
 * bitmap, a dozen checks); this does the same checks and the same placement in well under
 * one. Anything else (duplicates, every refusal and NAK, out-of-window and out-of-sequence
 * PSNs, an RC packet at any PSN but the expected one, WRITE_WITH_IMM and LAST_WITH_IMMEDIATE,
 * ACKs, garbage) it leaves untouched and says so: responder.py then
 * handles the datagram in Python, which stays the reference (the tests run both and compare
 * placement, ACKs and drops). Sans-IO like the rest of the transport: bytes in, memory and QP
 * state out; no sockets, no clock.
 *
 * QpState: the state of one responder QP that both this code and responder.py read and write
 *   (a base class; responder.py adds the fields only Python uses). `received` is the SACK
 *   bitmap as responder.py sees it, a Python int whose bit (window-1-i) says PSN epsn+i
 *   arrived; here it is kept as bit i of an array of words, so that advancing is a shift.
 *   `message` is the RC peer's WRITE under way as responder.py sees it, None or the tuple
 *   (region, offset of its next byte, bytes left); here the region and two numbers.
 *
 * Placer(qps, regions, stats, address, dport, sport_base): one responder's tables (QPN ->
 *   QpState, R_Key -> MemoryRegion, the stats dict), its packed address and port (the ICRC
 *   covers them) and the UDP source port of EV 0.
 *   place(payload, src, sport, now[, tclass]) -> bool: True when the packet was checked and
 *   placed (stats and QP state updated as responder.py would); False when it is not the common
 *   case, with nothing changed. tclass is the traffic class it arrived with: a CE mark is
 *   counted per EV (ce_counts) and may make a CNP due, as responder.py does; a trimmed DSCP is
 *   never the common case.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

#include "../wire/crc32.h"

/* numbers Python has too: tests/test_c_constants.py holds each equal to its Python constant */
#define MAX_WINDOW 8192 /* PSNs: the largest MPR (config.py MAX_MPR x MPR_PSNS) */
#define WORDS (MAX_WINDOW / 64)
#define OP_WRITE_FIRST 0x06 /* an RC peer's multi-packet WRITE: FIRST (with RETH), MIDDLE, LAST */
#define OP_WRITE_MIDDLE 0x07
#define OP_WRITE_LAST 0x08
#define OP_WRITE_ONLY 0x0A
#define BTH_LEN 12
#define HEAD_LEN 28 /* BTH + RETH */
#define DSCP_TRIMMED 10 /* wire/format.py */
#define DSCP_TRIMMED_LASTHOP 11
#define ECN_CE 3
#define REORDER_BUCKETS 16 /* responder.py REORDER_BUCKETS: 0, then [2^(b-1), 2^b - 1] PSNs late */

typedef struct {
    PyObject_HEAD
    PyObject *peer, *pending_imm, *ce_counts;
    PyObject *msg_mr; /* the RC peer's WRITE under way: its region (NULL: none), next byte, bytes left */
    long long msg_start, msg_left, not_ends;
    long long epsn, pd, since_ack, ack_every, unacked_since, echo_psn, echo_ev, echo_at, cnp_last, cnp_interval;
    int pkey, window;
    char in_order_only, ack_due, ecn, cnp, cnp_due;
    uint64_t bits[WORDS]; /* bit i: PSN epsn+i arrived */
    long long top_psn, reorder_max;  /* the highest PSN placed; the most PSNs a packet came behind it */
    long long reorder[REORDER_BUCKETS];  /* placed packets by how far behind the highest they came */
} QpState;

static PyObject *qp_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    QpState *self = (QpState *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(Py_None);
    self->peer = Py_None;
    self->pending_imm = PyDict_New();
    self->ce_counts = PyDict_New();
    if (self->pending_imm == NULL || self->ce_counts == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->unacked_since = -1;
    return (PyObject *)self;
}

static int qp_traverse(QpState *self, visitproc visit, void *arg) {
    Py_VISIT(self->peer);
    Py_VISIT(self->pending_imm);
    Py_VISIT(self->ce_counts);
    Py_VISIT(self->msg_mr);
    return 0;
}

static int qp_clear(QpState *self) {
    Py_CLEAR(self->peer);
    Py_CLEAR(self->pending_imm);
    Py_CLEAR(self->ce_counts);
    Py_CLEAR(self->msg_mr);
    return 0;
}

static void qp_dealloc(QpState *self) {
    PyObject_GC_UnTrack(self);
    qp_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *qp_get_received(QpState *self, void *closure) {
    int nbytes = self->window / 8;
    unsigned char out[MAX_WINDOW / 8];
    memset(out, 0, (size_t)nbytes);
    for (int w = 0; w < self->window / 64; w++) {
        uint64_t word = self->bits[w];
        while (word) {
            int i = w * 64 + __builtin_ctzll(word);
            out[i >> 3] |= (unsigned char)(0x80 >> (i & 7));
            word &= word - 1;
        }
    }
    PyObject *raw = PyBytes_FromStringAndSize((const char *)out, nbytes);
    if (raw == NULL)
        return NULL;
    PyObject *value = PyObject_CallMethod((PyObject *)&PyLong_Type, "from_bytes", "Os", raw, "big");
    Py_DECREF(raw);
    return value;
}

static int qp_set_received(QpState *self, PyObject *value, void *closure) {
    if (value == NULL || !PyLong_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "received: an int");
        return -1;
    }
    int nbytes = self->window / 8;
    PyObject *raw = PyObject_CallMethod(value, "to_bytes", "is", nbytes, "big"); /* OverflowError if out of range */
    if (raw == NULL)
        return -1;
    const unsigned char *in = (const unsigned char *)PyBytes_AS_STRING(raw);
    memset(self->bits, 0, sizeof(self->bits));
    for (int i = 0; i < self->window; i++)
        if (in[i >> 3] & (0x80 >> (i & 7)))
            self->bits[i >> 6] |= 1ULL << (i & 63);
    Py_DECREF(raw);
    return 0;
}

static PyObject *qp_get_window(QpState *self, void *closure) { return PyLong_FromLong(self->window); }

static int qp_set_window(QpState *self, PyObject *value, void *closure) {
    long window = value == NULL ? -1 : PyLong_AsLong(value);
    if (window == -1 && PyErr_Occurred())
        return -1;
    if (window <= 0 || window > MAX_WINDOW || window % 64) {
        PyErr_Format(PyExc_ValueError, "window %ld: a multiple of 64 up to %d", window, MAX_WINDOW);
        return -1;
    }
    self->window = (int)window;
    memset(self->bits, 0, sizeof(self->bits));
    return 0;
}

static PyObject *qp_get_reorder(QpState *self, void *closure) {
    PyObject *out = PyList_New(REORDER_BUCKETS);
    for (int b = 0; out != NULL && b < REORDER_BUCKETS; b++) {
        PyObject *n = PyLong_FromLongLong(self->reorder[b]);
        if (n == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, b, n);
    }
    return out;
}

static int qp_set_reorder(QpState *self, PyObject *value, void *closure) {
    if (value == NULL || !PyList_Check(value) || PyList_GET_SIZE(value) != REORDER_BUCKETS) {
        PyErr_Format(PyExc_TypeError, "reorder: a list of %d counts", REORDER_BUCKETS);
        return -1;
    }
    long long counts[REORDER_BUCKETS];
    for (int b = 0; b < REORDER_BUCKETS; b++) {
        counts[b] = PyLong_AsLongLong(PyList_GET_ITEM(value, b));
        if (counts[b] == -1 && PyErr_Occurred())
            return -1;
    }
    memcpy(self->reorder, counts, sizeof(counts));
    return 0;
}

static PyObject *qp_get_message(QpState *self, void *closure) {
    if (self->msg_mr == NULL)
        Py_RETURN_NONE;
    return Py_BuildValue("(OLL)", self->msg_mr, self->msg_start, self->msg_left);
}

static int qp_set_message(QpState *self, PyObject *value, void *closure) {
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "a QP's message cannot be deleted (set None)");
        return -1;
    }
    if (value == Py_None) {
        Py_CLEAR(self->msg_mr);
        self->msg_start = self->msg_left = 0;
        return 0;
    }
    PyObject *mr;
    long long start, left;
    if (!PyTuple_Check(value) || !PyArg_ParseTuple(value, "OLL", &mr, &start, &left)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "message: None or (region, offset, bytes left)");
        return -1;
    }
    Py_XSETREF(self->msg_mr, Py_NewRef(mr));
    self->msg_start = start;
    self->msg_left = left;
    return 0;
}

/* peer, pending_imm and ce_counts: objects the placement reads at every packet, so never deleted
   (a deletion would leave NULL where it looks; set None for any peer, or empty the dict, instead) */
typedef struct {
    size_t offset;
    const char *name;
} QpObject;

static const QpObject qp_peer = {offsetof(QpState, peer), "peer"},
                      qp_pending_imm = {offsetof(QpState, pending_imm), "pending_imm"},
                      qp_ce_counts = {offsetof(QpState, ce_counts), "ce_counts"};

static PyObject *qp_get_object(QpState *self, void *closure) {
    const QpObject *field = closure;
    PyObject *value = *(PyObject **)((char *)self + field->offset);
    if (value == NULL)
        PyErr_Format(PyExc_AttributeError, "%s: cleared by the garbage collector", field->name);
    return Py_XNewRef(value);
}

static int qp_set_object(QpState *self, PyObject *value, void *closure) {
    const QpObject *field = closure;
    if (value == NULL) {
        PyErr_Format(PyExc_TypeError, "a QP's %s cannot be deleted (the C placement reads it at every packet)",
                     field->name);
        return -1;
    }
    Py_XSETREF(*(PyObject **)((char *)self + field->offset), Py_NewRef(value));
    return 0;
}

#define QP_OBJECT(name, doc) {#name, (getter)qp_get_object, (setter)qp_set_object, doc, (void *)&qp_##name}

static PyGetSetDef qp_getset[] = {
    QP_OBJECT(peer, "the requester's packed address (None: any)"),
    QP_OBJECT(pending_imm, "PSN -> immediate, placed but not complete"),
    QP_OBJECT(ce_counts, "EV -> CE-marked packets not yet reported"),
    {"reorder", (getter)qp_get_reorder, (setter)qp_set_reorder,
     "placed packets by how many PSNs behind the highest placed they came (bucket 0: none; b: 2^(b-1)..2^b-1)", NULL},
    {"received", (getter)qp_get_received, (setter)qp_set_received, "bit (window-1-i): PSN epsn+i arrived", NULL},
    {"message", (getter)qp_get_message, (setter)qp_set_message,
     "an RC peer's WRITE under way after its FIRST: (region, offset of the next byte, bytes left), or None", NULL},
    {"window", (getter)qp_get_window, (setter)qp_set_window, "the SACK window in PSNs (setting it clears received)",
     NULL},
    {NULL},
};

static PyMemberDef qp_members[] = {
    {"epsn", T_LONGLONG, offsetof(QpState, epsn), 0, "expected PSN (unbounded): everything below arrived"},
    {"pd", T_LONGLONG, offsetof(QpState, pd), 0, "protection domain"},
    {"since_ack", T_LONGLONG, offsetof(QpState, since_ack), 0, "packets placed since the last ACK"},
    {"ack_every", T_LONGLONG, offsetof(QpState, ack_every), 0, "an ACK is due after this many"},
    {"unacked_since", T_LONGLONG, offsetof(QpState, unacked_since), 0, "arrival of the first unacknowledged (-1)"},
    {"echo_psn", T_LONGLONG, offsetof(QpState, echo_psn), 0, "the PSN the next ACK echoes"},
    {"echo_ev", T_LONGLONG, offsetof(QpState, echo_ev), 0, "its EV"},
    {"echo_at", T_LONGLONG, offsetof(QpState, echo_at), 0, "its arrival time"},
    {"pkey", T_INT, offsetof(QpState, pkey), 0, "P_Key"},
    {"in_order_only", T_BOOL, offsetof(QpState, in_order_only), 0, "go-back-N: only the expected PSN"},
    {"ack_due", T_BOOL, offsetof(QpState, ack_due), 0, "an ACK is to be sent at the next pump"},
    {"ecn", T_BOOL, offsetof(QpState, ecn), 0, "the echoed packet was CE-marked"},
    {"cnp", T_BOOL, offsetof(QpState, cnp), 0, "DCQCN: answer CE marks with CNPs"},
    {"cnp_due", T_BOOL, offsetof(QpState, cnp_due), 0, "a CNP is to be sent at the next pump"},
    {"cnp_last", T_LONGLONG, offsetof(QpState, cnp_last), 0, "when the last CNP was due"},
    {"cnp_interval", T_LONGLONG, offsetof(QpState, cnp_interval), 0, "at most one CNP per this long (ns)"},
    {"not_ends", T_LONGLONG, offsetof(QpState, not_ends), 0, "placed FIRSTs and MIDDLEs (they end no message)"},
    {"top_psn", T_LONGLONG, offsetof(QpState, top_psn), 0, "the highest PSN placed (unbounded)"},
    {"reorder_max", T_LONGLONG, offsetof(QpState, reorder_max), 0, "the most PSNs a placed packet came behind it"},
    {NULL},
};

static PyTypeObject QpStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mrc_emu.transport._place.QpState",
    .tp_doc = "A responder QP's state, shared by the C placement and responder.py.",
    .tp_basicsize = sizeof(QpState),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = qp_new,
    .tp_dealloc = (destructor)qp_dealloc,
    .tp_traverse = (traverseproc)qp_traverse,
    .tp_clear = (inquiry)qp_clear,
    .tp_members = qp_members,
    .tp_getset = qp_getset,
};

typedef struct {
    PyObject_HEAD
    PyObject *qps, *regions, *stats;
    unsigned char address[16];
    int dport, sport_base;
} Placer;

static PyObject *s_pd, *s_va, *s_view, *s_packets_placed, *s_bytes_placed, *s_ce_received;

static int placer_init(Placer *self, PyObject *args, PyObject *kwargs) {
    PyObject *qps, *regions, *stats;
    Py_buffer address;
    if (!PyArg_ParseTuple(args, "O!O!O!y*ii", &PyDict_Type, &qps, &PyDict_Type, &regions, &PyDict_Type, &stats,
                          &address, &self->dport, &self->sport_base))
        return -1;
    if (address.len != 16) {
        PyBuffer_Release(&address);
        PyErr_SetString(PyExc_ValueError, "address: 16 bytes (packed IPv6)");
        return -1;
    }
    memcpy(self->address, address.buf, 16);
    PyBuffer_Release(&address);
    Py_INCREF(qps);
    Py_INCREF(regions);
    Py_INCREF(stats);
    Py_XSETREF(self->qps, qps);
    Py_XSETREF(self->regions, regions);
    Py_XSETREF(self->stats, stats);
    return 0;
}

static int placer_traverse(Placer *self, visitproc visit, void *arg) {
    Py_VISIT(self->qps);
    Py_VISIT(self->regions);
    Py_VISIT(self->stats);
    return 0;
}

static int placer_clear(Placer *self) {
    Py_CLEAR(self->qps);
    Py_CLEAR(self->regions);
    Py_CLEAR(self->stats);
    return 0;
}

static void placer_dealloc(Placer *self) {
    PyObject_GC_UnTrack(self);
    placer_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* the RoCEv2 ICRC of a UDP payload p[0..n) between src and dst (see wire/headers.py icrc) */
static uint32_t roce_icrc(const unsigned char *src, const unsigned char *dst, int sport, int dport,
                          const unsigned char *p, size_t n) {
    unsigned udp_len = (unsigned)n + 8;
    unsigned char head[56];
    memset(head, 0xFF, 8);
    head[8] = 0x6F, head[9] = head[10] = head[11] = 0xFF;  /* version, traffic class, flow label masked */
    head[12] = udp_len >> 8, head[13] = udp_len & 0xFF, head[14] = 17, head[15] = 0xFF;  /* hop limit masked */
    memcpy(head + 16, src, 16);
    memcpy(head + 32, dst, 16);
    head[48] = sport >> 8, head[49] = sport & 0xFF, head[50] = dport >> 8, head[51] = dport & 0xFF;
    head[52] = udp_len >> 8, head[53] = udp_len & 0xFF, head[54] = head[55] = 0xFF;  /* checksum masked */
    uint32_t crc = crc32_update(0, head, sizeof(head));
    unsigned char bth8[8];
    memcpy(bth8, p, 8);
    bth8[4] = 0xFF;  /* FECN, BECN, reserved */
    crc = crc32_update(crc, bth8, 8);
    return crc32_update(crc, p + 8, n - 4 - 8);
}

/* stats[key] += by */
static int add_stat(PyObject *stats, PyObject *key, long long by) {
    PyObject *old = PyDict_GetItemWithError(stats, key);
    if (old == NULL && PyErr_Occurred())
        return -1;
    long long value = old == NULL ? 0 : PyLong_AsLongLong(old);
    if (value == -1 && PyErr_Occurred())
        return -1;
    PyObject *updated = PyLong_FromLongLong(value + by);
    if (updated == NULL)
        return -1;
    int r = PyDict_SetItem(stats, key, updated);
    Py_DECREF(updated);
    return r;
}

/* the region's pd, va and its memoryview (a new reference in *view_obj, to hold while writing
   through it) if it is one this code can write; 0 (and *view_obj NULL) if not */
static int region_of(PyObject *mr, long long *pd, long long *va, PyObject **view_obj) {
    PyObject *pd_obj = PyObject_GetAttr(mr, s_pd), *va_obj = NULL;
    int ok = 0;
    *view_obj = NULL;
    if (pd_obj == NULL || (va_obj = PyObject_GetAttr(mr, s_va)) == NULL ||
        (*view_obj = PyObject_GetAttr(mr, s_view)) == NULL)
        goto done;
    *pd = PyLong_AsLongLong(pd_obj);
    *va = PyLong_AsLongLong(va_obj);
    if (PyErr_Occurred() || !PyMemoryView_Check(*view_obj))
        goto done;
    Py_buffer *view = PyMemoryView_GET_BUFFER(*view_obj);
    ok = !view->readonly && view->itemsize == 1 && PyBuffer_IsContiguous(view, 'C');
done:
    PyErr_Clear();  /* anything odd about the region: Python decides */
    Py_XDECREF(pd_obj);
    Py_XDECREF(va_obj);
    if (!ok)
        Py_CLEAR(*view_obj);
    return ok;
}

/* `table`[k] (a dict keyed by Python ints: QPNs, R_Keys) as a new reference in *out, NULL if absent;
   -1 with an exception set if the lookup failed */
static int table_get(PyObject *table, unsigned long k, PyObject **out) {
    PyObject *key = PyLong_FromUnsignedLong(k);
    if (key == NULL)
        return -1;
    *out = Py_XNewRef(PyDict_GetItemWithError(table, key));
    Py_DECREF(key);
    return *out == NULL && PyErr_Occurred() ? -1 : 0;
}

static PyObject *placer_place(Placer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "place(payload, src, sport, now[, tclass])");
        return NULL;
    }
    if (self->qps == NULL || self->regions == NULL || self->stats == NULL) {
        PyErr_SetString(PyExc_TypeError, "a Placer made without its tables: Placer(qps, regions, stats, address, dport, "
                                         "sport_base)");
        return NULL;
    }
    long sport = PyLong_AsLong(args[2]);
    long long now = PyLong_AsLongLong(args[3]);
    long tclass = nargs == 5 ? PyLong_AsLong(args[4]) : 0;
    if (PyErr_Occurred())
        return NULL;
    int ce = (tclass & 3) == ECN_CE;
    if ((tclass >> 2) == DSCP_TRIMMED || (tclass >> 2) == DSCP_TRIMMED_LASTHOP)
        Py_RETURN_FALSE; /* a trim, or a whole packet at the trimmed priority: Python tells them apart */
    if (!PyBytes_Check(args[1]) || PyBytes_GET_SIZE(args[1]) != 16 || sport < 0 || sport > 0xFFFF)
        Py_RETURN_FALSE;
    const unsigned char *src = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    Py_buffer payload;
    if (PyObject_GetBuffer(args[0], &payload, PyBUF_SIMPLE) < 0)
        return NULL;
    /* the QP, the region and its view are held until the end: reading the region's attributes may
       run Python code, which may drop them from their tables */
    PyObject *result = Py_False, *found = NULL, *mr = NULL, *view_obj = NULL;
    const unsigned char *p = payload.buf;
    size_t n = (size_t)payload.len;
    /* WRITE_ONLY and an RC peer's FIRST carry a RETH (a FIRST's: the whole message); MIDDLE and LAST do not */
    int op = n >= BTH_LEN ? p[0] : -1, reth = op == OP_WRITE_ONLY || op == OP_WRITE_FIRST;
    if ((!reth && op != OP_WRITE_MIDDLE && op != OP_WRITE_LAST) || (p[1] & 0x0F))
        goto done;
    size_t head = reth ? HEAD_LEN : BTH_LEN, pad = (p[1] >> 4) & 3;
    if (n < head + 4 || n - 4 < head + pad)
        goto done;
    size_t end = n - 4, length = end - pad - head;
    uint32_t dma_len = reth ? be32(p + 24) : 0;
    if ((op == OP_WRITE_ONLY && dma_len != length) || (op == OP_WRITE_FIRST && dma_len < length))
        goto done;  /* (the decoder's BAD_LENGTH) */
    uint32_t wire_icrc = (uint32_t)p[n - 4] | ((uint32_t)p[n - 3] << 8) | ((uint32_t)p[n - 2] << 16) |
                         ((uint32_t)p[n - 1] << 24);
    if (roce_icrc(src, self->address, (int)sport, self->dport, p, n) != wire_icrc)
        goto done;
    int pkey = (p[2] << 8) | p[3];
    uint32_t qpn = be32(p + 4) & 0xFFFFFF, psn_word = be32(p + 8);
    long long psn = psn_word & 0xFFFFFF;
    if (table_get(self->qps, qpn, &found) < 0)
        goto fail;
    if (found == NULL)
        goto done;
    if (!PyObject_TypeCheck(found, &QpStateType))
        goto done;
    QpState *qp = (QpState *)found;
    if (qp->peer == NULL || (qp->peer != Py_None && (!PyBytes_Check(qp->peer) || PyBytes_GET_SIZE(qp->peer) != 16 ||
                                memcmp(PyBytes_AS_STRING(qp->peer), src, 16) != 0)))
        goto done;
    if (pkey != qp->pkey || qp->window <= 0 || qp->pending_imm == NULL || !PyDict_Check(qp->pending_imm) ||
        PyDict_GET_SIZE(qp->pending_imm))
        goto done;  /* (NULL: only after the garbage collector cleared the QP) */
    if (ce && (qp->ce_counts == NULL || !PyDict_CheckExact(qp->ce_counts)))
        goto done;
    long long diff = (psn - qp->epsn) & 0xFFFFFF;  /* config.psn_abs */
    if (diff >= (1 << 23))
        diff -= 1 << 24;
    if (diff < 0 || diff >= qp->window || (diff > 0 && qp->in_order_only) ||
        (qp->bits[diff >> 6] >> (diff & 63) & 1) || (op != OP_WRITE_ONLY && diff != 0))
        goto done;  /* (an RC peer's message is placed in PSN order only) */
    long long mr_pd, mr_va;
    uint64_t start, need = length;
    if (reth) {  /* the region its R_Key names, the whole message (a FIRST's) within it, as an RC responder checks */
        uint64_t va = ((uint64_t)be32(p + 12) << 32) | be32(p + 16);
        if (table_get(self->regions, be32(p + 20), &mr) < 0)
            goto fail;
        if (mr == NULL)
            goto done;
        if (!region_of(mr, &mr_pd, &mr_va, &view_obj) || mr_pd != qp->pd || mr_va < 0 || va < (uint64_t)mr_va)
            goto done;
        start = va - (uint64_t)mr_va;
        if (op == OP_WRITE_FIRST)
            need = dma_len;
    } else {  /* a MIDDLE or LAST continues the message its FIRST opened (regions.py next_of_message) */
        if (qp->msg_mr == NULL || (long long)length > qp->msg_left ||
            (op == OP_WRITE_LAST && (long long)length != qp->msg_left) || qp->msg_start < 0)
            goto done;
        mr = Py_NewRef(qp->msg_mr);
        if (!region_of(mr, &mr_pd, &mr_va, &view_obj))
            goto done;
        start = (uint64_t)qp->msg_start;
    }
    Py_buffer *region = PyMemoryView_GET_BUFFER(view_obj);
    if (start > (uint64_t)region->len || (uint64_t)region->len - start < need)
        goto done;
    /* the common case: place it, and account for it as responder.py does */
    memcpy((char *)region->buf + start, p + head, length);
    if (add_stat(self->stats, s_packets_placed, 1) < 0 || add_stat(self->stats, s_bytes_placed, (long long)length) < 0)
        goto fail;
    if (op == OP_WRITE_FIRST) {  /* a FIRST always starts over (a retried message's too) */
        Py_XSETREF(qp->msg_mr, Py_NewRef(mr));
        qp->msg_start = (long long)(start + length);
        qp->msg_left = (long long)dma_len - (long long)length;
    } else if (op == OP_WRITE_MIDDLE) {
        qp->msg_start += (long long)length;
        qp->msg_left -= (long long)length;
    } else if (op == OP_WRITE_LAST) {
        Py_CLEAR(qp->msg_mr);
        qp->msg_start = qp->msg_left = 0;
    }
    qp->not_ends += op == OP_WRITE_FIRST || op == OP_WRITE_MIDDLE;
    qp->echo_psn = psn;
    qp->echo_ev = sport - self->sport_base;
    qp->echo_at = now;
    qp->ecn = (char)ce;
    if (ce) {  /* counted per EV for the next ACK; DCQCN's NP: a CNP at most once per interval */
        PyObject *ev = PyLong_FromLongLong(qp->echo_ev);
        int r = ev == NULL ? -1 : add_stat(qp->ce_counts, ev, 1);
        Py_XDECREF(ev);
        if (r < 0 || add_stat(self->stats, s_ce_received, 1) < 0)
            goto fail;
        if (qp->cnp && now - qp->cnp_last >= qp->cnp_interval) {
            qp->cnp_due = 1;
            qp->cnp_last = now;
        }
    }
    long long late = 0, abs_psn = qp->epsn + diff;  /* how far out of PSN order it came (responder.py) */
    if (abs_psn < qp->top_psn)
        late = qp->top_psn - abs_psn;
    else
        qp->top_psn = abs_psn;
    int bucket = late ? 64 - __builtin_clzll((unsigned long long)late) : 0;
    qp->reorder[bucket < REORDER_BUCKETS ? bucket : REORDER_BUCKETS - 1] += 1;
    if (late > qp->reorder_max)
        qp->reorder_max = late;
    qp->bits[diff >> 6] |= 1ULL << (diff & 63);
    int words = qp->window / 64, run = 0, w = 0;
    for (; w < words && qp->bits[w] == ~0ULL; w++)
        run += 64;
    if (w < words)
        run += __builtin_ctzll(~qp->bits[w]);
    if (run) {  /* arrived in order from epsn on: shift them out */
        int skip = run / 64, shift = run % 64;
        for (int j = 0; j < words; j++) {
            int from = j + skip;
            uint64_t lo = from < words ? qp->bits[from] >> shift : 0;
            uint64_t hi = (shift && from + 1 < words) ? qp->bits[from + 1] << (64 - shift) : 0;
            qp->bits[j] = lo | hi;
        }
        qp->epsn += run;
    }
    qp->since_ack += 1;
    if (qp->unacked_since < 0)
        qp->unacked_since = now;
    if ((psn_word >> 31) || qp->since_ack >= qp->ack_every)
        qp->ack_due = 1;
    result = Py_True;
done:
    Py_INCREF(result);
    goto release;
fail:
    result = NULL;
release:
    PyBuffer_Release(&payload);
    Py_XDECREF(found);
    Py_XDECREF(mr);
    Py_XDECREF(view_obj);
    return result;
}

static PyMethodDef placer_methods[] = {
    {"place", (PyCFunction)(void (*)(void))placer_place, METH_FASTCALL,
     "place(payload, src, sport, now[, tclass]) -> bool: placed (the common case), or left to Python untouched."},
    {NULL},
};

static PyTypeObject PlacerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mrc_emu.transport._place.Placer",
    .tp_doc = "A responder's tables, for placing the common data packet in C.",
    .tp_basicsize = sizeof(Placer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)placer_init,
    .tp_dealloc = (destructor)placer_dealloc,
    .tp_traverse = (traverseproc)placer_traverse,
    .tp_clear = (inquiry)placer_clear,
    .tp_methods = placer_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_place", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__place(void) {
    if (PyType_Ready(&QpStateType) < 0 || PyType_Ready(&PlacerType) < 0)
        return NULL;
    s_pd = PyUnicode_InternFromString("pd");
    s_va = PyUnicode_InternFromString("va");
    s_view = PyUnicode_InternFromString("view");
    s_packets_placed = PyUnicode_InternFromString("packets_placed");
    s_bytes_placed = PyUnicode_InternFromString("bytes_placed");
    s_ce_received = PyUnicode_InternFromString("ce_received");
    if (s_pd == NULL || s_va == NULL || s_view == NULL || s_packets_placed == NULL || s_bytes_placed == NULL ||
        s_ce_received == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&QpStateType);
    Py_INCREF(&PlacerType);
    if (PyModule_AddObject(m, "QpState", (PyObject *)&QpStateType) < 0 ||
        PyModule_AddObject(m, "Placer", (PyObject *)&PlacerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
