/*
 * mrc_emu.transport._spray: the requester's send loop for first transmissions, in C.
 *
 * Why it exists: most packets a requester sends are the first transmission of a full-MTU
 * WRITE_ONLY packet, and for each CPython spent about 2 us of bookkeeping around the
 * encoder and the send (a packet record, the flight tables, the spray schedule, counters),
 * then a system call per frame. This does the same bookkeeping on the same Python objects, so
 * everything else (ACKs, loss detection, retransmissions, odd-sized packets: requester.py and
 * recovery.py) reads them unchanged; it encodes a batch of up to BATCH frames into its own
 * buffers (wire/patch.h, the encoder's own code) and, where the driver's send function offers
 * a batch sender (send_many.h: the socket driver's sendmmsg), hands the batch to the kernel in
 * one call. It is optional: without it the requester's own loop sends every packet
 * (tests/test_send_loop.py drives both loops through the same events and compares every frame,
 * the sent-packet table, every call to the CC and the EV statistics after each event).
 *
 * Pkt(psn, wr, offset, length, last): one packet of a WRITE; ev, sent_ns and tx are set when
 *     it is sent. The same fields as recovery.py's pure-Python PyPkt.
 *
 * spray(table, heads, paths, mtu, wr, send, now, next_psn, window_end, budget, bif, cwnd,
 *       schedule, cursor, clock, cc_sent, ack_req_every) -> (sent, next_psn, bif, cursor, failed_ev, counts)
 *   ack_req_every  QpConfig.ack_req_every: AckReq also on every this many PSNs and the window's last (0: not)
 *   table    the requester's sent-packet table (sent.SentPackets): each packet sent is
 *            recorded in its `pkts`, `flight` and `by_ev` as SentPackets.record does; the
 *            caller adds `bif` and `counts` to its byte counters
 *   heads    {ev: that EV's frame template head for full-MTU WRITE_ONLY packets (patch.h)}
 *   paths    {ev: Path}, handed to `send` with each frame; mtu: the packets' payload bytes
 *   wr       the WriteRequest at the head of the queue; its next_offset advances
 *   send     the link's send(frame, path) -> bool; if it has `send_many`, that sends each batch
 *   schedule the spray schedule (a list of EVs) and the cursor into it; the loop stops at its end
 *            so that Python counts the cycle (EvProfile.advance)
 *   clock    None: every packet is stamped `now`; else called for each packet's send time:
 *            through `send`, after each frame's send returned; through `send_many`, once per
 *            batch, when the kernel returned from it. Never before: a worker taken off the CPU
 *            inside the send would otherwise age its packets, and their ACK timeouts would
 *            fire on the emulator's own wait
 *   cc_sent  the CC profile's on_sent(stamp, ev, mtu), called for each packet once it is recorded,
 *            with its send time, as the Python loop calls it (None: not called)
 *   It sends while budget, window (PSN, and bytes: bif + mtu <= cwnd, UEC's CanSend, as the
 *   Python loop's gate) and schedule allow and the next packet is a
 *   full-MTU one with no immediate; it returns on the first frame that cannot leave the host
 *   (failed_ev, else None), leaving that packet in flight as the Python loop does; the frames
 *   of its batch after it are neither sent nor recorded. counts: {ev: packets}: the caller adds them
 *   to the EVs' packets_sent and ev_flight (mtu bytes each). One call at a time (its batch waits in
 *   static slots): a call from inside `send`, `clock` or `cc_sent`, or from another thread
 *   meanwhile, raises RuntimeError.
 *
 * deliver(table, psns, seen) -> (acked, in_flight)
 *   SentPackets.deliver for a table of Pkt records: every PSN of `psns` (a range or a list)
 *   still in the table leaves it (and `flight`, and its EV's `ev_flight`), its WRITE's `acked`
 *   grows, and `seen` (EV -> [packets, latest send time, that packet's transmissions, bytes])
 *   takes it, exactly as the Python loop adds one packet after another (ties of send time keep
 *   the earlier packet's); acked: the bytes; in_flight: those of them that were in flight, which
 *   the caller takes off bytes_in_flight (what the Python loop cost per ACK: docs/transport.md).
 *
 * front(table, ev) -> Pkt or None
 *   SentPackets.front for a table of Pkt records: the oldest packet still in flight on `ev`,
 *   the stale entries before it dropped from by_ev[ev] (the loss rules ask this of every EV
 *   that delivered, on every ACK).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#include "../wire/patch.h"
#include "send_many.h"

typedef struct {
    PyObject_HEAD
    PyObject *wr;
    long long psn, offset, length, ev, sent_ns, left_ns, tx;
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
    p->left_ns = 0;
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
    {"sent_ns", T_LONGLONG, offsetof(Pkt, sent_ns), 0, "time of the latest transmission (once the kernel had it)"},
    {"left_ns", T_LONGLONG, offsetof(Pkt, left_ns), 0, "when that transmission's send began (the earliest it left)"},
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
    *s_pkts, *s_flight, *s_by_ev, *s_send_many, *s_ev_flight, *s_acked, *s_popleft;

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

#define BATCH 16       /* frames per batch: as many as the kernel forwards in one sendmmsg without the slots falling out of cache */
#define SLOT_BYTES 9216 /* the largest frame a fabric MTU of 9000 can carry */
#define MAX_CACHED 64  /* EVs whose template and path one call keeps parsed */

static uint8_t slots[BATCH][SLOT_BYTES];
static int spraying; /* a call is using the slots: `send` (Python) cannot start another that would overwrite them */

/* what a call knows of one EV: its template's head (parsed once), its path. It holds its own
   references, and an export of the template's bytes: the loop calls back into Python (send, the
   clock, the table's append) between batches, and that code may drop the schedule's EV, the path
   or the head from their containers, or resize the template, while this entry still serves */
typedef struct {
    PyObject *ev;
    long long value;
    PatchHead head;
    PyObject *head_obj; /* the head tuple, which holds head.frame */
    Py_buffer frame;    /* head.frame's bytes, exported: it cannot be resized meanwhile */
    PyObject *path;
} EvEntry;

static void ev_entry_release(EvEntry *e) {
    if (e->ev == NULL)
        return;
    PyBuffer_Release(&e->frame);
    Py_CLEAR(e->head_obj);
    Py_CLEAR(e->path);
    Py_CLEAR(e->ev);
}

/* one packet of a batch, encoded in its slot */
typedef struct {
    EvEntry *entry;
    long long psn, offset;
    int last;
} Planned;

static EvEntry *ev_entry(EvEntry *cache, int *cached, EvEntry *scratch, PyObject *heads, PyObject *paths, PyObject *ev) {
    for (int i = 0; i < *cached; i++)
        if (cache[i].ev == ev)
            return &cache[i];
    EvEntry *e = *cached < MAX_CACHED ? &cache[*cached] : scratch;
    if (e == scratch)
        ev_entry_release(scratch); /* its previous EV's */
    /* owned at once: looking an EV up may run Python code (its hash), which may drop what was found */
    Py_INCREF(ev);
    PyObject *head = Py_XNewRef(PyDict_GetItemWithError(heads, ev)), *path = NULL;
    if (head != NULL)
        path = Py_XNewRef(PyDict_GetItemWithError(paths, ev));
    if (head == NULL || path == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_KeyError, "an EV of the schedule has no template head or path");
        goto fail;
    }
    if (patch_head_parse(head, &e->head) < 0)
        goto fail;
    if (e->head.icrc_at + 4 > SLOT_BYTES) {
        PyErr_SetString(PyExc_ValueError, "a frame larger than the send loop's slots");
        goto fail;
    }
    e->value = PyLong_AsLongLong(ev);
    if ((e->value == -1 && PyErr_Occurred()) || PyObject_GetBuffer(e->head.frame, &e->frame, PyBUF_SIMPLE) < 0)
        goto fail;
    e->ev = ev;
    e->head_obj = head;
    e->path = path;
    if (e != scratch)
        *cached += 1;
    return e;
fail:
    Py_DECREF(ev);
    Py_XDECREF(head);
    Py_XDECREF(path);
    return NULL;
}

/* the packet's record in the table, as SentPackets.record leaves it; 0, or -1 with an exception */
static int record(PyObject *pkts, PyObject *flight, PyObject *by_ev, PyObject *wr, const Planned *p, long long mtu,
                  PyObject *stamp_obj, long long stamp, long long left) {
    int result = -1;
    Pkt *pkt = pkt_make(p->psn, wr, p->offset, mtu, p->last);
    PyObject *psn_obj = PyLong_FromLongLong(p->psn), *entry = NULL, *appended = NULL;
    if (pkt == NULL || psn_obj == NULL)
        goto done;
    pkt->ev = p->entry->value;
    pkt->sent_ns = stamp;
    pkt->left_ns = left;
    pkt->tx = 1;
    if (PyDict_SetItem(pkts, psn_obj, (PyObject *)pkt) < 0 || PyDict_SetItem(flight, psn_obj, Py_None) < 0)
        goto done;
    PyObject *queue = PyDict_GetItemWithError(by_ev, p->entry->ev); /* borrowed */
    if (queue == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_KeyError, "an EV of the schedule has no queue");
        goto done;
    }
    entry = PyTuple_Pack(2, psn_obj, stamp_obj);
    if (entry == NULL)
        goto done;
    appended = PyObject_CallMethodOneArg(queue, s_append, entry);
    if (appended != NULL)
        result = 0;
done:
    Py_XDECREF((PyObject *)pkt);
    Py_XDECREF(psn_obj);
    Py_XDECREF(entry);
    Py_XDECREF(appended);
    return result;
}

/* cc_sent(stamp, ev, mtu): the CC hears of one packet sent; 0, or -1 with an exception */
static int tell_cc(PyObject *cc_sent, PyObject *stamp_obj, PyObject *ev, PyObject *mtu_obj) {
    if (cc_sent == Py_None)
        return 0;
    PyObject *args[3] = {stamp_obj, ev, mtu_obj};
    PyObject *r = PyObject_Vectorcall(cc_sent, args, 3, NULL);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* the send time: `now`, or the clock's (a new reference in *stamp_obj) */
static int read_clock(PyObject *clock, PyObject *now_obj, long long now, PyObject **stamp_obj, long long *stamp) {
    if (clock == Py_None) {
        Py_INCREF(now_obj);
        *stamp_obj = now_obj;
        *stamp = now;
        return 0;
    }
    *stamp_obj = PyObject_CallNoArgs(clock);
    if (*stamp_obj == NULL)
        return -1;
    *stamp = PyLong_AsLongLong(*stamp_obj);
    if (*stamp == -1 && PyErr_Occurred()) {
        Py_CLEAR(*stamp_obj);
        return -1;
    }
    return 0;
}

/* the clock's time into *t: 0, or -1 with an exception */
static int read_time(PyObject *clock, long long *t) {
    PyObject *obj = PyObject_CallNoArgs(clock);
    if (obj == NULL)
        return -1;
    *t = PyLong_AsLongLong(obj);
    Py_DECREF(obj);
    return (*t == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* frame by frame through the Python `send`, each stamped and recorded once `send` has returned,
   and the CC told, as the Python loop does (a refused frame too: it stays in flight). A stamp read
   before the send would age the packet by however long the worker was off the CPU inside it.
   Returns the frames handled (status as SendMany's) */
static Py_ssize_t send_each(PyObject *send, PyObject *pkts, PyObject *flight, PyObject *by_ev, PyObject *wr,
                            const Planned *plan, const struct iovec *iov, Py_ssize_t k, long long mtu,
                            PyObject *mtu_obj, PyObject *clock, PyObject *now_obj, long long now,
                            PyObject *cc_sent, int *status) {
    *status = 0;
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *view = PyMemoryView_FromMemory((char *)iov[j].iov_base, (Py_ssize_t)iov[j].iov_len, PyBUF_READ);
        if (view == NULL) {
            *status = -1;
            return j;
        }
        long long left = now;
        if (clock != Py_None && read_time(clock, &left) < 0) {
            Py_DECREF(view);
            *status = -1;
            return j;
        }
        PyObject *args[2] = {view, plan[j].entry->path};
        PyObject *sent = PyObject_Vectorcall(send, args, 2, NULL);
        /* the view is of a slot that the next batch overwrites: should `send` have kept it, release it */
        if (Py_REFCNT(view) > 1) {
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            PyObject *released = PyObject_CallMethodNoArgs(view, s_release);
            if (released == NULL)
                PyErr_Clear();
            Py_XDECREF(released);
            PyErr_Restore(type, value, traceback);
        }
        Py_DECREF(view);
        int ok = sent == NULL ? -1 : PyObject_IsTrue(sent);
        Py_XDECREF(sent);
        if (ok < 0) {
            *status = -1;
            return j;
        }
        PyObject *stamp_obj;
        long long stamp;
        if (read_clock(clock, now_obj, now, &stamp_obj, &stamp) < 0) {
            *status = -1;
            return j;
        }
        int r = record(pkts, flight, by_ev, wr, &plan[j], mtu, stamp_obj, stamp, left);
        if (r == 0)
            r = tell_cc(cc_sent, stamp_obj, plan[j].entry->ev, mtu_obj);
        Py_DECREF(stamp_obj);
        if (r < 0) {
            *status = -1;
            return j;
        }
        if (ok == 0) {
            *status = 1;
            return j;
        }
    }
    return k;
}

static PyObject *spray_on(PyObject *pkts, PyObject *flight, PyObject *by_ev, PyObject *heads, PyObject *paths,
                          long long mtu, PyObject *mtu_obj, PyObject *wr, PyObject *send, PyObject *now_obj,
                          PyObject *next_psn_obj, PyObject *window_end_obj, PyObject *budget_obj, PyObject *bif_obj,
                          PyObject *cwnd_obj, PyObject *schedule, PyObject *cursor_obj, PyObject *clock,
                          PyObject *cc_sent, long long ack_req_every) {
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
    /* the driver's batch sender, if its send function offers one (transport/send_many.h) */
    SendMany send_many = NULL;
    PyObject *capsule = PyObject_GetAttr(send, s_send_many);
    if (capsule == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();
    } else {
        send_many = (SendMany)PyCapsule_GetPointer(capsule, SEND_MANY_CAPSULE);
        /* the function takes `send` as its own kind of object: only the object that made the capsule */
        void *maker = send_many == NULL ? NULL : PyCapsule_GetContext(capsule);
        Py_DECREF(capsule); /* the pointer is to a function of a module that stays loaded */
        if (send_many == NULL)
            return NULL;
        if (maker != send) {
            PyErr_SetString(PyExc_TypeError, "send.send_many is another object's batch sender");
            return NULL;
        }
    }
    PyObject *local = PyObject_GetAttr(wr, s_local), *rkey_obj = PyObject_GetAttr(wr, s_rkey),
             *imm = PyObject_GetAttr(wr, s_imm), *counts = PyDict_New(), *failed = Py_None, *out = NULL;
    Py_buffer buffer = {0};
    int have_buffer = 0;
    long long sent = 0;
    Py_INCREF(failed);
    EvEntry cache[MAX_CACHED], scratch;
    int cached = 0;
    scratch.ev = NULL;
    Planned plan[BATCH];
    struct iovec iov[BATCH];
    PyObject *batch_paths[BATCH];
    if (local == NULL || rkey_obj == NULL || imm == NULL || counts == NULL)
        goto done;
    unsigned long long rkey = PyLong_AsUnsignedLongLongMask(rkey_obj);
    if (PyErr_Occurred())
        goto done;
    if (PyObject_GetBuffer(local, &buffer, PyBUF_SIMPLE) < 0)
        goto done;
    have_buffer = 1;
    if (buffer.len != wr_length) {
        PyErr_SetString(PyExc_ValueError, "the WRITE's length and its buffer disagree");
        goto done;
    }
    for (;;) {
        /* the batch: the packets the loop would send one by one, each encoded in its slot */
        Py_ssize_t k = 0;
        long long p_psn = next_psn, p_offset = next_offset, p_bif = bif, p_sent = sent;
        Py_ssize_t p_cursor = cursor;
        while (k < BATCH && p_sent < budget && (double)(p_bif + mtu) <= cwnd && p_psn < window_end &&
               p_cursor < PyList_GET_SIZE(schedule)) {  /* read again: the callbacks may have shortened it */
            if (p_offset < 0 || wr_length - p_offset < mtu)
                break;  /* a short packet: the Python loop sends it */
            int last = p_offset + mtu >= wr_length;
            if (last && imm != Py_None)
                break;  /* it carries the immediate */
            EvEntry *e = ev_entry(cache, &cached, &scratch, heads, paths, PyList_GET_ITEM(schedule, p_cursor));
            if (e == NULL)
                goto done;
            if (e->head.payload_end - e->head.payload_at != mtu) {
                PyErr_SetString(PyExc_ValueError, "a template head not of the MTU's length");
                goto done;
            }
            if (e == &scratch && k > 0)
                break;  /* the scratch entry serves one packet per batch (only with more EVs than MAX_CACHED) */
            /* a full window waits for no delayed ACK; QpConfig.ack_req_every: every N PSNs and the
               window's last (an RC responder acknowledges only what asks) */
            int ack_req = last || (double)(p_bif + 4 * mtu) > cwnd ||
                          (ack_req_every > 0 && (p_psn % ack_req_every == ack_req_every - 1 || p_psn + 1 >= window_end));
            uint8_t *f = slots[k];
            const PatchHead *h = &e->head;
            memcpy(f, e->frame.buf, (size_t)h->payload_at);
            memset(f + h->payload_end, 0, (size_t)(h->icrc_at - h->payload_end));
            patch_frame(f, h, (uint32_t)(((unsigned long long)(ack_req != 0) << 31) | (p_psn & 0xFFFFFF)),
                        (uint64_t)(remote_va + p_offset), (uint32_t)rkey, -1, (const uint8_t *)buffer.buf + p_offset);
            iov[k].iov_base = f;
            iov[k].iov_len = (size_t)(h->icrc_at + 4);
            batch_paths[k] = e->path;
            plan[k].entry = e;
            plan[k].psn = p_psn;
            plan[k].offset = p_offset;
            plan[k].last = last;
            k++;
            p_psn++;
            p_offset += mtu;
            p_bif += mtu;
            p_sent++;
            p_cursor++;
            if (e == &scratch)
                break;
        }
        if (k == 0)
            break;
        int status;
        Py_ssize_t handled, recorded;
        if (send_many != NULL) {
            /* one system call for the batch: every packet of it is stamped with the moment the
               kernel returned from it (a stamp read before would age the batch by however long
               the worker was off the CPU inside the call), and recorded once its answer is known */
            long long left = now;  /* when the call began: no packet of the batch left before */
            if (clock != Py_None && read_time(clock, &left) < 0)
                goto done;
            handled = send_many(send, iov, batch_paths, k, &status);
            recorded = handled + (status == 1);  /* a refused frame stays in flight, as the Python loop leaves it */
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            PyObject *stamp_obj;
            long long stamp;
            if (read_clock(clock, now_obj, now, &stamp_obj, &stamp) < 0) {
                Py_XDECREF(type);
                Py_XDECREF(value);
                Py_XDECREF(traceback);
                goto done;
            }
            int r = 0;
            for (Py_ssize_t j = 0; j < recorded && r == 0; j++) {
                r = record(pkts, flight, by_ev, wr, &plan[j], mtu, stamp_obj, stamp, left);
                if (r == 0)
                    r = tell_cc(cc_sent, stamp_obj, plan[j].entry->ev, mtu_obj);
            }
            Py_DECREF(stamp_obj);
            if (type != NULL) {
                PyErr_Clear();
                PyErr_Restore(type, value, traceback);
            }
            if (r < 0 && status != -1)
                status = -1;
        } else {
            handled = send_each(send, pkts, flight, by_ev, wr, plan, iov, k, mtu, mtu_obj, clock, now_obj, now,
                                cc_sent, &status);
            recorded = handled + (status == 1);
        }
        /* recorded and on their way (or lost at the host's own port): counted either way */
        Py_ssize_t counted = status == -1 ? handled : recorded;
        for (Py_ssize_t j = 0; j < counted; j++)
            if (count_one(counts, plan[j].entry->ev) < 0) {
                status = -1;
                break;
            }
        next_psn += counted;
        next_offset += counted * mtu;
        bif += counted * mtu;
        sent += counted;
        cursor += counted;
        if (status == -1)
            goto done;
        if (status == 1) {
            Py_DECREF(failed);
            failed = plan[handled].entry->ev;
            Py_INCREF(failed);
            break;
        }
    }
    out = Py_BuildValue("(LLLnOO)", sent, next_psn, bif, cursor, failed, counts);
done:
    if (local != NULL && rkey_obj != NULL && imm != NULL) {
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
    for (int i = 0; i < cached; i++)
        ev_entry_release(&cache[i]);
    ev_entry_release(&scratch);
    if (have_buffer)
        PyBuffer_Release(&buffer);
    Py_XDECREF(local);
    Py_XDECREF(rkey_obj);
    Py_XDECREF(imm);
    Py_XDECREF(counts);
    Py_XDECREF(failed);
    return out;
}

/* ---- delivery: SentPackets.deliver in C ---------------------------------------------- */

#define MAX_SEEN 64 /* EVs aggregated before they are merged into `seen` */

typedef struct {
    long long ev, count, latest, tx, nbytes, in_flight, left;
    PyObject *ev_obj;
} EvSeen;

/* seen[ev] (a list [packets, latest send time, its transmissions, bytes, when its send began]) and ev_flight[ev]
   take what the aggregate holds, as if each packet had been added in turn */
static int merge_seen(EvSeen *agg, int n, PyObject *seen, PyObject *ev_flight) {
    int result = 0;
    for (int i = 0; i < n; i++) {
        EvSeen *a = &agg[i];
        if (result == 0) {
            PyObject *entry = PyDict_GetItemWithError(seen, a->ev_obj); /* borrowed */
            if (entry == NULL && PyErr_Occurred()) {
                result = -1;
            } else if (entry == NULL) {
                PyObject *fresh = Py_BuildValue("[LLLLL]", a->count, a->latest, a->tx, a->nbytes, a->left);
                if (fresh == NULL || PyDict_SetItem(seen, a->ev_obj, fresh) < 0)
                    result = -1;
                Py_XDECREF(fresh);
            } else if (!PyList_Check(entry) || PyList_GET_SIZE(entry) != 5) {
                PyErr_SetString(PyExc_TypeError, "a seen entry is a list of five");
                result = -1;
            } else {
                long long count = PyLong_AsLongLong(PyList_GET_ITEM(entry, 0)),
                          latest = PyLong_AsLongLong(PyList_GET_ITEM(entry, 1)),
                          nbytes = PyLong_AsLongLong(PyList_GET_ITEM(entry, 3));
                /* a list of five (checked above): PyList_SetItem cannot fail, and takes each new value */
                PyObject *c = PyErr_Occurred() ? NULL : PyLong_FromLongLong(count + a->count),
                         *b = c == NULL ? NULL : PyLong_FromLongLong(nbytes + a->nbytes);
                PyObject *sent = NULL, *tx = NULL, *left = NULL;
                if (b != NULL && a->latest > latest) {  /* a later send; ties keep the earlier packet's */
                    sent = PyLong_FromLongLong(a->latest);
                    tx = sent == NULL ? NULL : PyLong_FromLongLong(a->tx);
                    left = tx == NULL ? NULL : PyLong_FromLongLong(a->left);
                }
                if (b == NULL || (a->latest > latest && left == NULL)) {
                    Py_XDECREF(c);
                    Py_XDECREF(b);
                    Py_XDECREF(sent);
                    Py_XDECREF(tx);
                    result = -1;
                } else {
                    PyList_SetItem(entry, 0, c);
                    PyList_SetItem(entry, 3, b);
                    if (left != NULL) {
                        PyList_SetItem(entry, 1, sent);
                        PyList_SetItem(entry, 2, tx);
                        PyList_SetItem(entry, 4, left);
                    }
                }
            }
            if (result == 0 && a->in_flight) {
                PyObject *old = PyDict_GetItemWithError(ev_flight, a->ev_obj); /* borrowed */
                long long v = old == NULL ? 0 : PyLong_AsLongLong(old);
                PyObject *updated = PyErr_Occurred() ? NULL : PyLong_FromLongLong(v - a->in_flight);
                if (updated == NULL || PyDict_SetItem(ev_flight, a->ev_obj, updated) < 0)
                    result = -1;
                Py_XDECREF(updated);
            }
        }
        Py_CLEAR(a->ev_obj);
    }
    return result;
}

/* wr.acked += add */
static int add_acked(PyObject *wr, long long add) {
    long long acked;
    if (get_ll(wr, s_acked, &acked) < 0)
        return -1;
    PyObject *v = PyLong_FromLongLong(acked + add);
    int r = v == NULL ? -1 : PyObject_SetAttr(wr, s_acked, v);
    Py_XDECREF(v);
    return r;
}

/* deliver(table, psns, seen) -> (acked, in_flight): SentPackets.deliver's loop, the caller
   subtracting in_flight from bytes_in_flight. Every packet in the table must be a Pkt. */
static PyObject *deliver(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "deliver(table, psns, seen): seen is a dict");
        return NULL;
    }
    PyObject *table = args[0], *seen = args[2];
    PyObject *pkts = PyObject_GetAttr(table, s_pkts), *flight = NULL, *ev_flight = NULL, *it = NULL, *out = NULL,
             *wr = NULL;
    EvSeen agg[MAX_SEEN];
    int nagg = 0;
    long long acked = 0, in_flight = 0, wr_add = 0;
    if (pkts == NULL || (flight = PyObject_GetAttr(table, s_flight)) == NULL ||
        (ev_flight = PyObject_GetAttr(table, s_ev_flight)) == NULL || (it = PyObject_GetIter(args[1])) == NULL)
        goto done;
    if (!PyDict_Check(pkts) || !PyDict_Check(flight) || !PyDict_Check(ev_flight)) {
        PyErr_SetString(PyExc_TypeError, "the table's pkts, flight and ev_flight must be dicts");
        goto done;
    }
    PyObject *psn;
    while ((psn = PyIter_Next(it)) != NULL) {
        PyObject *found = PyDict_GetItemWithError(pkts, psn); /* borrowed */
        if (found == NULL) {
            Py_DECREF(psn);
            if (PyErr_Occurred())
                goto done;
            continue;  /* unknown: delivered before, or never sent */
        }
        if (!PyObject_TypeCheck(found, &PktType)) {
            Py_DECREF(psn);
            PyErr_SetString(PyExc_TypeError, "the C delivery takes only _spray.Pkt records");
            goto done;
        }
        Pkt *pkt = (Pkt *)found;
        Py_INCREF(pkt);
        int failed = PyDict_DelItem(pkts, psn) < 0;
        int in = failed ? -1 : PyDict_Contains(flight, psn);
        if (in == 1 && PyDict_DelItem(flight, psn) < 0)
            in = -1;
        Py_DECREF(psn);
        if (in < 0) {
            Py_DECREF(pkt);
            goto done;
        }
        long long length = pkt->length;
        acked += length;
        if (pkt->wr != wr) {  /* wr.acked grows once per run of packets of one WRITE */
            if (wr != NULL && add_acked(wr, wr_add) < 0) {
                Py_DECREF(pkt);
                goto done;
            }
            Py_XSETREF(wr, Py_NewRef(pkt->wr));
            wr_add = 0;
        }
        wr_add += length;
        EvSeen *a = NULL;
        for (int i = 0; i < nagg; i++)
            if (agg[i].ev == pkt->ev) {
                a = &agg[i];
                break;
            }
        if (a == NULL) {
            if (nagg == MAX_SEEN) {
                int r = merge_seen(agg, nagg, seen, ev_flight);
                nagg = 0;
                if (r < 0) {
                    Py_DECREF(pkt);
                    goto done;
                }
            }
            a = &agg[nagg];
            a->ev_obj = PyLong_FromLongLong(pkt->ev);
            if (a->ev_obj == NULL) {
                Py_DECREF(pkt);
                goto done;
            }
            nagg++;
            a->ev = pkt->ev;
            a->count = a->nbytes = a->in_flight = 0;
            a->latest = pkt->sent_ns;
            a->tx = pkt->tx;
            a->left = pkt->left_ns;
        } else if (pkt->sent_ns > a->latest) {
            a->latest = pkt->sent_ns;
            a->tx = pkt->tx;
            a->left = pkt->left_ns;
        }
        a->count += 1;
        a->nbytes += length;
        if (in == 1) {
            a->in_flight += length;
            in_flight += length;
        }
        Py_DECREF(pkt);
    }
    if (PyErr_Occurred())
        goto done;
    if (wr != NULL && add_acked(wr, wr_add) < 0)
        goto done;
    Py_CLEAR(wr);
    int r = merge_seen(agg, nagg, seen, ev_flight);
    nagg = 0;
    if (r == 0)
        out = Py_BuildValue("(LL)", acked, in_flight);
done:
    for (int i = 0; i < nagg; i++)
        Py_CLEAR(agg[i].ev_obj);
    Py_XDECREF(wr);
    Py_XDECREF(it);
    Py_XDECREF(pkts);
    Py_XDECREF(flight);
    Py_XDECREF(ev_flight);
    return out;
}

/* front(table, ev) -> Pkt or None: SentPackets.front, the stale entries of by_ev[ev] dropped on the way */
static PyObject *front(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "front(table, ev)");
        return NULL;
    }
    PyObject *pkts = PyObject_GetAttr(args[0], s_pkts), *flight = NULL, *by_ev = NULL, *queue = NULL, *out = NULL;
    long long ev = PyLong_AsLongLong(args[1]);
    if (pkts == NULL || (ev == -1 && PyErr_Occurred()) || (flight = PyObject_GetAttr(args[0], s_flight)) == NULL ||
        (by_ev = PyObject_GetAttr(args[0], s_by_ev)) == NULL || (queue = PyObject_GetItem(by_ev, args[1])) == NULL)
        goto done;
    if (!PyDict_Check(pkts) || !PyDict_Check(flight)) {
        PyErr_SetString(PyExc_TypeError, "the table's pkts and flight must be dicts");
        goto done;
    }
    for (;;) {
        if (PyObject_Size(queue) <= 0) {
            if (!PyErr_Occurred())
                out = Py_NewRef(Py_None);
            goto done;
        }
        PyObject *entry = PySequence_GetItem(queue, 0);
        if (entry == NULL)
            goto done;
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2) {
            Py_DECREF(entry);
            PyErr_SetString(PyExc_TypeError, "a by_ev entry is a (PSN, send time) pair");
            goto done;
        }
        PyObject *psn = PyTuple_GET_ITEM(entry, 0);
        long long sent = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 1));
        PyObject *pkt = PyErr_Occurred() ? NULL : PyDict_GetItemWithError(pkts, psn); /* borrowed */
        int in = PyErr_Occurred() ? -1 : (pkt == NULL ? 0 : PyDict_Contains(flight, psn));
        Py_DECREF(entry);
        if (in < 0)
            goto done;
        if (in == 1 && !PyObject_TypeCheck(pkt, &PktType)) {
            PyErr_SetString(PyExc_TypeError, "the C front takes only _spray.Pkt records");
            goto done;
        }
        if (in == 1 && ((Pkt *)pkt)->ev == ev && ((Pkt *)pkt)->sent_ns == sent) {
            out = Py_NewRef(pkt);
            goto done;
        }
        PyObject *dropped = PyObject_CallMethodNoArgs(queue, s_popleft);
        if (dropped == NULL)
            goto done;
        Py_DECREF(dropped);
    }
done:
    Py_XDECREF(pkts);
    Py_XDECREF(flight);
    Py_XDECREF(by_ev);
    Py_XDECREF(queue);
    return out;
}

static PyObject *spray(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 17) {
        PyErr_SetString(PyExc_TypeError, "spray(table, heads, paths, mtu, wr, send, now, next_psn, window_end, "
                                         "budget, bif, cwnd, schedule, cursor, clock, cc_sent, ack_req_every)");
        return NULL;
    }
    PyObject *table = args[0], *heads = args[1], *paths = args[2], *wr = args[4], *send = args[5],
             *now_obj = args[6], *schedule = args[12], *clock = args[14], *cc_sent = args[15];
    if (!PyDict_Check(heads) || !PyDict_Check(paths) || !PyList_Check(schedule)) {
        PyErr_SetString(PyExc_TypeError, "heads and paths must be dicts, the schedule a list");
        return NULL;
    }
    long long mtu = PyLong_AsLongLong(args[3]), ack_req_every = PyLong_AsLongLong(args[16]);
    if (PyErr_Occurred())
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
    PyObject *out = NULL;
    if (spraying) {
        PyErr_SetString(PyExc_RuntimeError, "spray: another call is using the send slots (from its send or clock, or another thread)");
    } else {
        spraying = 1;
        out = spray_on(pkts, flight, by_ev, heads, paths, mtu, args[3], wr, send, now_obj, args[7], args[8], args[9],
                       args[10], args[11], schedule, args[13], clock, cc_sent, ack_req_every);
        spraying = 0;
    }
    Py_DECREF(pkts);
    Py_DECREF(flight);
    Py_DECREF(by_ev);
    return out;
}

static PyMethodDef methods[] = {
    {"spray", (PyCFunction)(void (*)(void))spray, METH_FASTCALL,
     "Send first transmissions of full-MTU packets of one WRITE (see the module comment)."},
    {"deliver", (PyCFunction)(void (*)(void))deliver, METH_FASTCALL,
     "SentPackets.deliver's loop over PSNs (see the module comment)."},
    {"front", (PyCFunction)(void (*)(void))front, METH_FASTCALL,
     "SentPackets.front: the oldest packet in flight on an EV (see the module comment)."},
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
    s_send_many = PyUnicode_InternFromString("send_many");
    s_ev_flight = PyUnicode_InternFromString("ev_flight");
    s_acked = PyUnicode_InternFromString("acked");
    s_popleft = PyUnicode_InternFromString("popleft");
    if (!s_local || !s_remote_va || !s_rkey || !s_imm || !s_length || !s_next_offset || !s_append || !s_release ||
        !s_pkts || !s_flight || !s_by_ev || !s_send_many || !s_ev_flight || !s_acked || !s_popleft)
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
