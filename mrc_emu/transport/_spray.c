/*
 * mrc_emu.transport._spray: the requester's send loop for first transmissions, in C.
 *
 * Why it exists: most packets a requester sends are the first transmission of a full-MTU
 * WRITE_ONLY packet, and for each CPython spent about 2 us of bookkeeping around the
 * encoder and the send (a packet record, the flight tables, the spray schedule, counters).
 * This does the same bookkeeping on the same Python objects, so everything else (ACKs,
 * loss detection, retransmissions, odd-sized packets: requester.py and recovery.py) reads
 * them unchanged. It is optional: without it the requester's own loop sends every packet
 * (the unit tests run the transfers both ways and compare every frame).
 *
 * Pkt(psn, wr, offset, length, last): one packet of a WRITE; ev, sent_ns and tx are set when
 *     it is sent. The same fields as recovery.py's pure-Python PyPkt.
 *
 * spray(table, writers, paths, mtu, wr, send, now, next_psn, window_end, budget, bif, cwnd,
 *       schedule, cursor, clock) -> (sent, next_psn, bif, cursor, failed_ev, counts)
 *   table    the requester's sent-packet table (sent.SentPackets): each packet sent is
 *            recorded in its `pkts`, `flight` and `by_ev` as SentPackets.record does; the
 *            caller adds `bif` and `counts` to its byte counters
 *   writers  {ev: the C encoder bound to that EV's buffer for full-MTU WRITE_ONLY packets}
 *   paths    {ev: Path}, handed to `send` with each frame; mtu: the packets' payload bytes
 *   wr       the WriteRequest at the head of the queue; its next_offset advances
 *   send     the link's send(frame, path) -> bool
 *   schedule the spray schedule (a list of EVs) and the cursor into it; the loop stops at its end
 *            so that Python counts the cycle (EvProfile.advance)
 *   clock    None: every packet is stamped `now`; else called for each packet's send time
 *   It sends while budget, window (PSN and bytes) and schedule allow and the next packet is a
 *   full-MTU one with no immediate; it returns on the first send that fails (failed_ev, else
 *   None), leaving that packet in flight as the Python loop does. counts: {ev: packets}.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *wr;
    long long psn, offset, length, ev, sent_ns, tx;
    char last;
} Pkt;

static PyTypeObject PktType;

static Pkt *pkt_make(long long psn, PyObject *wr, long long offset, long long length, int last) {
    Pkt *p = PyObject_GC_New(Pkt, &PktType);
    if (p == NULL)
        return NULL;
    Py_INCREF(wr);
    p->wr = wr;
    p->psn = psn;
    p->offset = offset;
    p->length = length;
    p->last = (char)(last != 0);
    p->ev = -1;
    p->sent_ns = 0;
    p->tx = 0;
    PyObject_GC_Track(p);
    return p;
}

static PyObject *pkt_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"psn", "wr", "offset", "length", "last", NULL};
    long long psn, offset, length;
    PyObject *wr;
    int last;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LOLLp", names, &psn, &wr, &offset, &length, &last))
        return NULL;
    return (PyObject *)pkt_make(psn, wr, offset, length, last);
}

static int pkt_traverse(Pkt *self, visitproc visit, void *arg) {
    Py_VISIT(self->wr);
    return 0;
}

static int pkt_clear(Pkt *self) {
    Py_CLEAR(self->wr);
    return 0;
}

static void pkt_dealloc(Pkt *self) {
    PyObject_GC_UnTrack(self);
    pkt_clear(self);
    PyObject_GC_Del(self);
}

static PyMemberDef pkt_members[] = {
    {"psn", T_LONGLONG, offsetof(Pkt, psn), READONLY, "PSN (unbounded)"},
    {"wr", T_OBJECT_EX, offsetof(Pkt, wr), READONLY, "the WriteRequest"},
    {"offset", T_LONGLONG, offsetof(Pkt, offset), READONLY, "offset of the payload in the WRITE"},
    {"length", T_LONGLONG, offsetof(Pkt, length), READONLY, "payload bytes"},
    {"last", T_BOOL, offsetof(Pkt, last), READONLY, "the WRITE's last packet"},
    {"ev", T_LONGLONG, offsetof(Pkt, ev), 0, "EV of the latest transmission (-1: not sent)"},
    {"sent_ns", T_LONGLONG, offsetof(Pkt, sent_ns), 0, "time of the latest transmission"},
    {"tx", T_LONGLONG, offsetof(Pkt, tx), 0, "transmissions so far"},
    {NULL},
};

static PyTypeObject PktType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mrc_emu.transport._spray.Pkt",
    .tp_doc = "One packet of a WRITE, as the requester tracks it.",
    .tp_basicsize = sizeof(Pkt),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = pkt_new,
    .tp_dealloc = (destructor)pkt_dealloc,
    .tp_traverse = (traverseproc)pkt_traverse,
    .tp_clear = (inquiry)pkt_clear,
    .tp_members = pkt_members,
};

static PyObject *s_local, *s_remote_va, *s_rkey, *s_imm, *s_length, *s_next_offset, *s_append, *s_release,
    *s_pkts, *s_flight, *s_by_ev;

static int get_ll(PyObject *obj, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* counts[ev] += 1 */
static int count_one(PyObject *counts, PyObject *ev) {
    PyObject *n = PyDict_GetItemWithError(counts, ev);
    if (n == NULL && PyErr_Occurred())
        return -1;
    PyObject *m = PyLong_FromLongLong(n == NULL ? 1 : PyLong_AsLongLong(n) + 1);
    if (m == NULL)
        return -1;
    int r = PyDict_SetItem(counts, ev, m);
    Py_DECREF(m);
    return r;
}

/* one packet: encode, record, send. Returns 1 sent, 0 the send failed (recorded all the same), -1 error */
static int send_one(PyObject *pkts, PyObject *flight, PyObject *by_ev, PyObject *writer, PyObject *path,
                    PyObject *send, PyObject *wr, PyObject *rkey, PyObject *ev, PyObject *now_obj,
                    long long now, long long psn, long long offset, long long mtu, int last, int ack_req,
                    long long va, const char *payload) {
    int result = -1;
    PyObject *psn_word = NULL, *va_obj = NULL, *view = NULL, *frame = NULL, *psn_obj = NULL,
             *entry = NULL, *queue = NULL, *appended = NULL, *sent = NULL;
    Pkt *pkt = NULL;
    long long ev_value = PyLong_AsLongLong(ev);
    if (ev_value == -1 && PyErr_Occurred())
        return -1;
    psn_word = PyLong_FromLongLong(((long long)(ack_req != 0) << 31) | (psn & 0xFFFFFF));
    va_obj = PyLong_FromLongLong(va);
    view = PyMemoryView_FromMemory((char *)payload, (Py_ssize_t)mtu, PyBUF_READ);
    if (psn_word == NULL || va_obj == NULL || view == NULL)
        goto done;
    PyObject *args[5] = {psn_word, va_obj, rkey, Py_None, view};
    frame = PyObject_Vectorcall(writer, args, 5, NULL);
    if (frame == NULL)
        goto done;
    pkt = pkt_make(psn, wr, offset, mtu, last);
    psn_obj = PyLong_FromLongLong(psn);
    if (pkt == NULL || psn_obj == NULL)
        goto done;
    pkt->ev = ev_value;
    pkt->sent_ns = now;
    pkt->tx = 1;
    if (PyDict_SetItem(pkts, psn_obj, (PyObject *)pkt) < 0 || PyDict_SetItem(flight, psn_obj, Py_None) < 0)
        goto done;
    queue = PyDict_GetItemWithError(by_ev, ev);  /* borrowed */
    if (queue == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_KeyError, "an EV of the schedule has no queue");
        goto done;
    }
    entry = PyTuple_Pack(2, psn_obj, now_obj);
    if (entry == NULL)
        goto done;
    appended = PyObject_CallMethodOneArg(queue, s_append, entry);
    if (appended == NULL)
        goto done;
    PyObject *send_args[2] = {frame, path};
    sent = PyObject_Vectorcall(send, send_args, 2, NULL);
    if (sent == NULL)
        goto done;
    result = PyObject_IsTrue(sent);
done:
    Py_XDECREF(psn_word);
    Py_XDECREF(va_obj);
    if (view != NULL) {
        /* The view points into the WRITE's buffer without owning it, and the frame holds a copy:
           should the encoder have kept the view, release it, so that it can never be read later */
        if (Py_REFCNT(view) > 1) {
            PyObject *released = PyObject_CallMethodNoArgs(view, s_release);
            if (released == NULL)
                PyErr_Clear();
            Py_XDECREF(released);
        }
        Py_DECREF(view);
    }
    Py_XDECREF(frame);
    Py_XDECREF((PyObject *)pkt);
    Py_XDECREF(psn_obj);
    Py_XDECREF(entry);
    Py_XDECREF(appended);
    Py_XDECREF(sent);
    return result;
}

static PyObject *spray_on(PyObject *pkts, PyObject *flight, PyObject *by_ev, PyObject *writers, PyObject *paths,
                          long long mtu, PyObject *wr, PyObject *send, PyObject *now_obj, PyObject *next_psn_obj,
                          PyObject *window_end_obj, PyObject *budget_obj, PyObject *bif_obj, PyObject *cwnd_obj,
                          PyObject *schedule, PyObject *cursor_obj, PyObject *clock) {
    if (!PyDict_Check(pkts) || !PyDict_Check(flight) || !PyDict_Check(by_ev)) {
        PyErr_SetString(PyExc_TypeError, "the table's pkts, flight and by_ev must be dicts");
        return NULL;
    }
    long long now = PyLong_AsLongLong(now_obj), next_psn = PyLong_AsLongLong(next_psn_obj),
              window_end = PyLong_AsLongLong(window_end_obj), budget = PyLong_AsLongLong(budget_obj),
              bif = PyLong_AsLongLong(bif_obj);
    double cwnd = PyFloat_AsDouble(cwnd_obj);  /* a CC profile's window may be fractional */
    Py_ssize_t cursor = PyLong_AsSsize_t(cursor_obj);
    if (PyErr_Occurred())
        return NULL;
    if (mtu <= 0 || cursor < 0) {
        PyErr_SetString(PyExc_ValueError, "MTU must be positive and the cursor not negative");
        return NULL;
    }
    long long wr_length, next_offset, remote_va;
    if (get_ll(wr, s_length, &wr_length) < 0 || get_ll(wr, s_next_offset, &next_offset) < 0 ||
        get_ll(wr, s_remote_va, &remote_va) < 0)
        return NULL;
    PyObject *local = PyObject_GetAttr(wr, s_local), *rkey = PyObject_GetAttr(wr, s_rkey),
             *imm = PyObject_GetAttr(wr, s_imm), *counts = PyDict_New(), *failed = Py_None, *out = NULL;
    Py_buffer buffer = {0};
    int have_buffer = 0;
    long long sent = 0;
    Py_INCREF(failed);
    if (local == NULL || rkey == NULL || imm == NULL || counts == NULL)
        goto done;
    if (PyObject_GetBuffer(local, &buffer, PyBUF_SIMPLE) < 0)
        goto done;
    have_buffer = 1;
    if (buffer.len != wr_length) {
        PyErr_SetString(PyExc_ValueError, "the WRITE's length and its buffer disagree");
        goto done;
    }
    while (sent < budget && (double)bif < cwnd && next_psn < window_end && cursor < PyList_GET_SIZE(schedule)) {
        if (next_offset < 0 || wr_length - next_offset < mtu)
            break;  /* a short packet: the Python loop sends it */
        int last = next_offset + mtu >= wr_length;
        if (last && imm != Py_None)
            break;  /* it carries the immediate */
        PyObject *ev = PyList_GET_ITEM(schedule, cursor);  /* borrowed */
        PyObject *writer = PyDict_GetItemWithError(writers, ev), *path = PyDict_GetItemWithError(paths, ev);
        if (writer == NULL || path == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_KeyError, "an EV of the schedule has no writer or path");
            goto done;
        }
        int ack_req = last || (double)(bif + 4 * mtu) > cwnd;  /* a full window waits for no delayed ACK */
        PyObject *stamp_obj = now_obj;
        long long stamp = now;
        if (clock != Py_None) {
            stamp_obj = PyObject_CallNoArgs(clock);
            if (stamp_obj == NULL)
                goto done;
            stamp = PyLong_AsLongLong(stamp_obj);
            if (stamp == -1 && PyErr_Occurred()) {
                Py_DECREF(stamp_obj);
                goto done;
            }
        } else {
            Py_INCREF(stamp_obj);
        }
        int r = send_one(pkts, flight, by_ev, writer, path, send, wr, rkey, ev, stamp_obj, stamp, next_psn,
                         next_offset, mtu, last, ack_req, remote_va + next_offset,
                         (const char *)buffer.buf + next_offset);
        Py_DECREF(stamp_obj);
        if (r < 0)
            goto done;
        /* recorded and on its way (or lost at the host's own port): count it either way */
        next_psn += 1;
        next_offset += mtu;
        bif += mtu;
        sent += 1;
        cursor += 1;
        if (count_one(counts, ev) < 0)
            goto done;
        if (r == 0) {
            Py_DECREF(failed);
            failed = ev;
            Py_INCREF(failed);
            break;
        }
    }
    out = Py_BuildValue("(LLLnOO)", sent, next_psn, bif, cursor, failed, counts);
done:
    if (local != NULL && rkey != NULL && imm != NULL) {
        /* the WRITE's progress is written back even when an error ends the loop (with that
           error put aside meanwhile, as the C API wants no call with an exception set) */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyObject *offset_obj = PyLong_FromLongLong(next_offset);
        if (offset_obj == NULL || PyObject_SetAttr(wr, s_next_offset, offset_obj) < 0)
            Py_CLEAR(out);
        Py_XDECREF(offset_obj);
        if (type != NULL) {
            PyErr_Clear();
            PyErr_Restore(type, value, traceback);
        }
    }
    if (have_buffer)
        PyBuffer_Release(&buffer);
    Py_XDECREF(local);
    Py_XDECREF(rkey);
    Py_XDECREF(imm);
    Py_XDECREF(counts);
    Py_XDECREF(failed);
    return out;
}

static PyObject *spray(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 15) {
        PyErr_SetString(PyExc_TypeError, "spray(table, writers, paths, mtu, wr, send, now, next_psn, window_end, "
                                         "budget, bif, cwnd, schedule, cursor, clock)");
        return NULL;
    }
    PyObject *table = args[0], *writers = args[1], *paths = args[2], *wr = args[4], *send = args[5],
             *now_obj = args[6], *schedule = args[12], *clock = args[14];
    if (!PyDict_Check(writers) || !PyDict_Check(paths) || !PyList_Check(schedule)) {
        PyErr_SetString(PyExc_TypeError, "writers and paths must be dicts, the schedule a list");
        return NULL;
    }
    long long mtu = PyLong_AsLongLong(args[3]);
    if (mtu == -1 && PyErr_Occurred())
        return NULL;
    /* the table's three dicts, held for the call (new references, released at the end) */
    PyObject *pkts = PyObject_GetAttr(table, s_pkts), *flight = NULL, *by_ev = NULL;
    if (pkts != NULL)
        flight = PyObject_GetAttr(table, s_flight);
    if (flight != NULL)
        by_ev = PyObject_GetAttr(table, s_by_ev);
    if (by_ev == NULL) {
        Py_XDECREF(pkts);
        Py_XDECREF(flight);
        return NULL;
    }
    PyObject *out = spray_on(pkts, flight, by_ev, writers, paths, mtu, wr, send, now_obj, args[7], args[8], args[9],
                             args[10], args[11], schedule, args[13], clock);
    Py_DECREF(pkts);
    Py_DECREF(flight);
    Py_DECREF(by_ev);
    return out;
}

static PyMethodDef methods[] = {
    {"spray", (PyCFunction)(void (*)(void))spray, METH_FASTCALL,
     "Send first transmissions of full-MTU packets of one WRITE (see the module comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_spray", NULL, -1, methods};

PyMODINIT_FUNC PyInit__spray(void) {
    if (PyType_Ready(&PktType) < 0)
        return NULL;
    s_local = PyUnicode_InternFromString("local");
    s_remote_va = PyUnicode_InternFromString("remote_va");
    s_rkey = PyUnicode_InternFromString("rkey");
    s_imm = PyUnicode_InternFromString("imm");
    s_length = PyUnicode_InternFromString("length");
    s_next_offset = PyUnicode_InternFromString("next_offset");
    s_append = PyUnicode_InternFromString("append");
    s_release = PyUnicode_InternFromString("release");
    s_pkts = PyUnicode_InternFromString("pkts");
    s_flight = PyUnicode_InternFromString("flight");
    s_by_ev = PyUnicode_InternFromString("by_ev");
    if (!s_local || !s_remote_va || !s_rkey || !s_imm || !s_length || !s_next_offset || !s_append || !s_release ||
        !s_pkts || !s_flight || !s_by_ev)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&PktType);
    if (PyModule_AddObject(m, "Pkt", (PyObject *)&PktType) < 0) {
        Py_DECREF(&PktType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
