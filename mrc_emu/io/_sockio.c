/*
 * mrc_emu.io._sockio: batched datagram receive with the kernel's arrival time, and a sendmmsg
 * loop of pre-built frames (the physical reference of the benchmarks).
 *
 * Why it exists: a worker serves the sockets of many hosts, and two things matter there.
 * (1) It must know when each datagram really arrived, not when the worker got round to
 * reading it: the difference is the emulator's own lag, which must never be taken for the
 * network's delay (RTT samples, timers). The kernel stamps every datagram on arrival
 * (SO_TIMESTAMPNS); recvmmsg hands over up to 64 with their stamps in one system call.
 * (2) Receiving one datagram per Python call costs several microseconds of interpreter time;
 * one call per batch leaves that time to the transport.
 *
 * recv_batch(fd, max_count[, drops]) -> list of (payload: bytes, src: bytes (16, packed IPv6),
 *                                                sport: int, arrival_realtime_ns: int, tclass: int,
 *                                                ifindex: int)
 *   Non-blocking; [] when nothing waits. arrival is CLOCK_REALTIME (0 when the socket has no
 *   SO_TIMESTAMPNS); the caller maps it to its own clock. tclass is the IPv6 traffic class
 *   the datagram arrived with (its low two bits are ECN), 0 when not known. ifindex is the
 *   interface it arrived on (IPV6_PKTINFO; after the kernel's SRv6 decapsulation still the
 *   NIC's: the arrival port), 0 when not known. A datagram longer than a slot (MSG_TRUNC), or
 *   whose control data did not fit (MSG_CTRUNC: its stamp, traffic class or port may be
 *   missing), is dropped, never passed on as if whole, and counted in `drops` (a dict:
 *   "truncated", "control_truncated"). Raises OSError on other errors.
 *
 * enable_stamps(fd): SO_TIMESTAMPNS, IPV6_RECVTCLASS and IPV6_RECVPKTINFO on a socket.
 *
 * Sender(fd, errors): a callable sender(frame, path) -> bool, SocketLink.send in C (see sockets.py):
 *   sendto of one whole frame to path.first_hop (its packed address made once per hop), so each
 *   frame's failure is known at once, for that frame. A host whose own port of that plane is
 *   down (ENETUNREACH, EHOSTUNREACH, ENETDOWN, EINVAL) gives False; a full queue (ENOBUFS,
 *   EAGAIN) True, as a NIC's full queue loses a frame; either is counted in `errors` (errno
 *   name -> count) and send_errors; any other error raises OSError. frames_sent counts the rest.
 *   It saves the interpreter's call of a Python method and its parsing of the address tuple,
 *   about 1 us of the 8-10 us a frame costs; the send itself stays one system call per frame.
 *   Its attribute send_many offers the requester's C send loop (transport/_spray.c) a batch
 *   sender (transport/send_many.h): sendmmsg of a burst's frames, each frame's failure known
 *   and meaning the same as above, at one system call per batch.
 *
 * send_loop(fd, frames, addrs, count, batch) -> sent
 *   Sends frames[i % len(frames)] to addrs[i % len(frames)] (packed IPv6, 16 bytes) until
 *   `count` frames left, `batch` per sendmmsg: what the kernel's forwarding allows with no
 *   per-packet user-space work at all. Frames that hit ENOBUFS are counted as not sent. The GIL
 *   is released meanwhile; the frames are held (a copy of the list), whatever other threads do.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <arpa/inet.h>
#include <errno.h>
#include <structmember.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "../transport/send_many.h"

#define MAX_BATCH 16 /* larger batches measured slower here: the slots fall out of cache */
/* what a failed send means (the same errnos as sockets.py's PORT_DOWN_ERRNOS, QUEUE_FULL_ERRNOS) */
#define PORT_DOWN(err) ((err) == ENETUNREACH || (err) == EHOSTUNREACH || (err) == ENETDOWN || (err) == EINVAL)
#define QUEUE_FULL(err) ((err) == ENOBUFS || (err) == EAGAIN)
#define SLOT_BYTES 9216 /* the largest frame a fabric MTU of 9000 can deliver */

static unsigned char slots[MAX_BATCH][SLOT_BYTES];
static char controls[MAX_BATCH][CMSG_SPACE(sizeof(struct timespec)) + CMSG_SPACE(sizeof(int))
                                + CMSG_SPACE(sizeof(struct in6_pktinfo))];

/* drops[key] += 1 */
static int count_drop(PyObject *drops, const char *key) {
    if (drops == NULL)
        return 0;
    PyObject *old = PyDict_GetItemString(drops, key); /* borrowed; a dict of str keys raises nothing */
    long n = old == NULL ? 0 : PyLong_AsLong(old);
    if (n == -1 && PyErr_Occurred())
        return -1;
    PyObject *updated = PyLong_FromLong(n + 1);
    int r = updated == NULL ? -1 : PyDict_SetItemString(drops, key, updated);
    Py_XDECREF(updated);
    return r;
}

/* the cmsg's data, if it holds at least `size` bytes (the kernel's length says), else NULL */
static const void *cmsg_data(const struct cmsghdr *c, size_t size) {
    return c->cmsg_len >= CMSG_LEN(size) ? CMSG_DATA(c) : NULL;
}

static PyObject *recv_batch(PyObject *self, PyObject *args) {
    int fd, max_count;
    PyObject *drops = NULL;
    if (!PyArg_ParseTuple(args, "ii|O!", &fd, &max_count, &PyDict_Type, &drops))
        return NULL;
    if (max_count < 1)
        return PyList_New(0);
    if (max_count > MAX_BATCH)
        max_count = MAX_BATCH;
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iovs[MAX_BATCH];
    struct sockaddr_in6 names[MAX_BATCH];
    memset(msgs, 0, sizeof(struct mmsghdr) * max_count);
    for (int i = 0; i < max_count; i++) {
        iovs[i].iov_base = slots[i];
        iovs[i].iov_len = SLOT_BYTES;
        msgs[i].msg_hdr.msg_iov = &iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_name = &names[i];
        msgs[i].msg_hdr.msg_namelen = sizeof(names[i]);
        msgs[i].msg_hdr.msg_control = controls[i];
        msgs[i].msg_hdr.msg_controllen = sizeof(controls[i]);
    }
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    /* again while a batch held only dropped datagrams: [] must mean the socket was found empty */
    while (PyList_GET_SIZE(out) == 0) {
        for (int i = 0; i < max_count; i++) {  /* what recvmmsg set in the previous round */
            msgs[i].msg_hdr.msg_namelen = sizeof(names[i]);
            msgs[i].msg_hdr.msg_controllen = sizeof(controls[i]);
            msgs[i].msg_hdr.msg_flags = 0;
        }
        int got = recvmmsg(fd, msgs, (unsigned)max_count, MSG_DONTWAIT, NULL);
        if (got < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return out;
            Py_DECREF(out);
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        if (got == 0)
            return out;
        for (int i = 0; i < got; i++) {
            int flags = msgs[i].msg_hdr.msg_flags;
            if (flags & (MSG_TRUNC | MSG_CTRUNC)) {
                if (count_drop(drops, (flags & MSG_TRUNC) ? "truncated" : "control_truncated") < 0) {
                    Py_DECREF(out);
                    return NULL;
                }
                continue;
            }
            long long arrival = 0;
            int tclass = 0;
            unsigned ifindex = 0;
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&msgs[i].msg_hdr); c != NULL; c = CMSG_NXTHDR(&msgs[i].msg_hdr, c)) {
                const void *data;
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS &&
                    (data = cmsg_data(c, sizeof(struct timespec))) != NULL) {
                    struct timespec ts;
                    memcpy(&ts, data, sizeof(ts));
                    arrival = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
                } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS &&
                           (data = cmsg_data(c, sizeof(int))) != NULL) {
                    memcpy(&tclass, data, sizeof(int));
                } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO &&
                           (data = cmsg_data(c, sizeof(struct in6_pktinfo))) != NULL) {
                    struct in6_pktinfo info;
                    memcpy(&info, data, sizeof(info));
                    ifindex = info.ipi6_ifindex;
                }
            }
            PyObject *item = Py_BuildValue("(y#y#iLiI)", (const char *)slots[i], (Py_ssize_t)msgs[i].msg_len,
                                           (const char *)&names[i].sin6_addr, (Py_ssize_t)16,
                                           (int)ntohs(names[i].sin6_port), arrival, tclass, ifindex);
            int r = item == NULL ? -1 : PyList_Append(out, item);
            Py_XDECREF(item);
            if (r < 0) {
                Py_DECREF(out);
                return NULL;
            }
        }
    }
    return out;
}

static PyObject *enable_stamps(PyObject *self, PyObject *args) {
    int fd, on = 1;
    if (!PyArg_ParseTuple(args, "i", &fd))
        return NULL;
    if (setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof(on)) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    if (setsockopt(fd, IPPROTO_IPV6, IPV6_RECVTCLASS, &on, sizeof(on)) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    if (setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &on, sizeof(on)) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *send_loop(PyObject *self, PyObject *args) {
    int fd;
    PyObject *frames, *addrs;
    long long count;
    int batch;
    if (!PyArg_ParseTuple(args, "iO!O!Li", &fd, &PyList_Type, &frames, &PyList_Type, &addrs, &count, &batch))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(frames);
    if (n == 0 || PyList_GET_SIZE(addrs) != n) {
        PyErr_SetString(PyExc_ValueError, "frames and addrs: the same non-zero length");
        return NULL;
    }
    if (batch < 1 || batch > MAX_BATCH)
        batch = MAX_BATCH;
    /* the frames as they are now, held: without the GIL, another thread may empty the caller's list
       while the kernel reads them */
    PyObject *held = PyList_GetSlice(frames, 0, n);
    struct sockaddr_in6 *dests = PyMem_Calloc((size_t)n, sizeof(struct sockaddr_in6));
    struct iovec *iovs = PyMem_Calloc((size_t)n, sizeof(struct iovec));
    if (held == NULL || dests == NULL || iovs == NULL) {
        Py_XDECREF(held);
        PyMem_Free(dests);
        PyMem_Free(iovs);
        return held == NULL ? NULL : PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PyList_GET_ITEM(held, i), *a = PyList_GET_ITEM(addrs, i);
        if (!PyBytes_Check(f) || !PyBytes_Check(a) || PyBytes_GET_SIZE(a) != 16) {
            Py_DECREF(held);
            PyMem_Free(dests);
            PyMem_Free(iovs);
            PyErr_SetString(PyExc_TypeError, "frames: bytes; addrs: 16-byte packed IPv6 addresses");
            return NULL;
        }
        iovs[i].iov_base = PyBytes_AS_STRING(f);
        iovs[i].iov_len = (size_t)PyBytes_GET_SIZE(f);
        dests[i].sin6_family = AF_INET6;
        memcpy(&dests[i].sin6_addr, PyBytes_AS_STRING(a), 16);
    }
    long long sent = 0, next = 0;
    int failed = 0;
    struct mmsghdr msgs[MAX_BATCH];
    Py_BEGIN_ALLOW_THREADS
    while (next < count) {
        int k = (int)((count - next) < batch ? (count - next) : batch);
        memset(msgs, 0, sizeof(struct mmsghdr) * k);
        for (int j = 0; j < k; j++) {
            Py_ssize_t i = (Py_ssize_t)((next + j) % n);
            msgs[j].msg_hdr.msg_iov = &iovs[i];
            msgs[j].msg_hdr.msg_iovlen = 1;
            msgs[j].msg_hdr.msg_name = &dests[i];
            msgs[j].msg_hdr.msg_namelen = sizeof(dests[i]);
        }
        int r = sendmmsg(fd, msgs, (unsigned)k, 0);
        if (r < 0) {
            if (QUEUE_FULL(errno)) {
                next += 1; /* dropped at the host, as a full NIC queue would */
                continue;
            }
            failed = errno;
            break;
        }
        sent += r;
        next += r > 0 ? r : 1;
    }
    Py_END_ALLOW_THREADS
    Py_DECREF(held);
    PyMem_Free(dests);
    PyMem_Free(iovs);
    if (failed) {
        errno = failed;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLongLong(sent);
}

typedef struct {
    PyObject_HEAD
    int fd;
    long long frames_sent, send_errors;
    PyObject *errors;    /* errno name -> count, shared with the SocketLink */
    PyObject *addresses; /* first hop (str) -> struct sockaddr_in6 as bytes */
    vectorcallfunc vectorcall;
} Sender;

static PyObject *s_first_hop, *s_errorcode;
static PyObject *sender_call(Sender *self, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static PyObject *sender_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    int fd;
    PyObject *errors;
    if (!PyArg_ParseTuple(args, "iO!", &fd, &PyDict_Type, &errors))
        return NULL;
    Sender *self = (Sender *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->addresses = PyDict_New();
    if (self->addresses == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->fd = fd;
    Py_INCREF(errors);
    self->errors = errors;
    self->vectorcall = (vectorcallfunc)sender_call;
    return (PyObject *)self;
}

static int sender_traverse(Sender *self, visitproc visit, void *arg) {
    Py_VISIT(self->errors);
    Py_VISIT(self->addresses);
    return 0;
}

static int sender_clear(Sender *self) {
    Py_CLEAR(self->errors);
    Py_CLEAR(self->addresses);
    return 0;
}

static void sender_dealloc(Sender *self) {
    PyObject_GC_UnTrack(self);
    sender_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* the packed sockaddr of a path's first hop, made once per hop (borrowed) */
static PyObject *sender_address(Sender *self, PyObject *path) {
    PyObject *hop = PyObject_GetAttr(path, s_first_hop);
    if (hop == NULL)
        return NULL;
    PyObject *found = PyDict_GetItemWithError(self->addresses, hop);
    if (found == NULL && !PyErr_Occurred()) {
        const char *text = PyUnicode_Check(hop) ? PyUnicode_AsUTF8(hop) : NULL;
        struct sockaddr_in6 sa;
        memset(&sa, 0, sizeof(sa));
        sa.sin6_family = AF_INET6;
        if (text != NULL && inet_pton(AF_INET6, text, &sa.sin6_addr) == 1) {
            PyObject *packed = PyBytes_FromStringAndSize((const char *)&sa, sizeof(sa));
            if (packed != NULL && PyDict_SetItem(self->addresses, hop, packed) == 0)
                found = packed;
            Py_XDECREF(packed); /* the dict holds it */
        } else if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_ValueError, "first hop %R: not an IPv6 address", hop);
        }
    }
    Py_DECREF(hop);
    return found;
}

/* errors[errno name] += 1, as sockets.py names them (errno.errorcode) */
static int sender_count(Sender *self, int err) {
    self->send_errors += 1;
    PyObject *codes = PyImport_ImportModule("errno"), *table = NULL, *name = NULL, *old, *updated = NULL;
    int r = -1;
    if (codes == NULL || (table = PyObject_GetAttr(codes, s_errorcode)) == NULL)
        goto done;
    PyObject *number = PyLong_FromLong(err);
    if (number == NULL)
        goto done;
    name = PyObject_GetItem(table, number);
    if (name == NULL) {
        PyErr_Clear();
        name = PyObject_Str(number);
    }
    Py_DECREF(number);
    if (name == NULL)
        goto done;
    old = PyDict_GetItemWithError(self->errors, name);
    if (old == NULL && PyErr_Occurred())
        goto done;
    updated = PyLong_FromLong(old == NULL ? 1 : PyLong_AsLong(old) + 1);
    if (updated != NULL)
        r = PyDict_SetItem(self->errors, name, updated);
done:
    Py_XDECREF(codes);
    Py_XDECREF(table);
    Py_XDECREF(name);
    Py_XDECREF(updated);
    return r;
}

static PyObject *sender_call(Sender *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 2 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "send(frame, path)");
        return NULL;
    }
    PyObject *address = sender_address(self, args[1]);
    if (address == NULL)
        return NULL;
    Py_buffer frame;
    if (PyObject_GetBuffer(args[0], &frame, PyBUF_SIMPLE) < 0)
        return NULL;
    ssize_t r;
    int err;
    do {  /* interrupted: retried, as Python's sendto does, unless a signal handler raised */
        r = sendto(self->fd, frame.buf, (size_t)frame.len, 0, (const struct sockaddr *)PyBytes_AS_STRING(address),
                   sizeof(struct sockaddr_in6));
        err = errno;
    } while (r < 0 && err == EINTR && PyErr_CheckSignals() == 0);
    PyBuffer_Release(&frame);
    if (r >= 0) {
        self->frames_sent += 1;
        Py_RETURN_TRUE;
    }
    if (PyErr_Occurred())
        return NULL;
    if (sender_count(self, err) < 0)
        return NULL;
    if (PORT_DOWN(err))
        Py_RETURN_FALSE; /* the host's own port of that plane is down */
    if (QUEUE_FULL(err))
        Py_RETURN_TRUE; /* dropped locally, like a full NIC queue: loss recovery handles it */
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
}

/* SendMany (transport/send_many.h): sendmmsg of up to SEND_MANY_MAX frames a call, each frame's
   outcome meaning what sender_call's does. sendmmsg stops at the first frame the kernel refuses
   and reports only the frames before it; the next call starts at that frame and so hears its
   error (a frame lost that way to a full queue is retried once, which a NIC would not do). */
#define SEND_MANY_MAX 64
static Py_ssize_t sender_send_many(PyObject *obj, const struct iovec *frames, PyObject *const *paths, Py_ssize_t n,
                                   int *status) {
    Sender *self = (Sender *)obj;
    struct mmsghdr msgs[SEND_MANY_MAX];
    Py_ssize_t done = 0;
    *status = 0;
    while (done < n) {
        Py_ssize_t k = n - done < SEND_MANY_MAX ? n - done : SEND_MANY_MAX;
        memset(msgs, 0, sizeof(struct mmsghdr) * (size_t)k);
        for (Py_ssize_t j = 0; j < k; j++) {
            PyObject *address = sender_address(self, paths[done + j]);
            if (address == NULL) {
                if (j == 0) {
                    *status = -1;
                    return done;
                }
                PyErr_Clear(); /* the frames before it go first; the next round raises again at it */
                k = j;
                break;
            }
            msgs[j].msg_hdr.msg_iov = (struct iovec *)&frames[done + j];
            msgs[j].msg_hdr.msg_iovlen = 1;
            msgs[j].msg_hdr.msg_name = PyBytes_AS_STRING(address);
            msgs[j].msg_hdr.msg_namelen = sizeof(struct sockaddr_in6);
        }
        int r = sendmmsg(self->fd, msgs, (unsigned)k, 0);
        if (r > 0) {
            self->frames_sent += r;
            done += r;
            continue;
        }
        int err = errno;
        if (err == EINTR) {
            if (PyErr_CheckSignals() < 0) {
                *status = -1;
                return done;
            }
            continue;
        }
        if (sender_count(self, err) < 0) {
            *status = -1;
            return done;
        }
        if (PORT_DOWN(err)) {
            *status = 1; /* the host's own port of that plane is down */
            return done;
        }
        if (QUEUE_FULL(err)) {
            done += 1; /* dropped locally, like a full NIC queue */
            continue;
        }
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        *status = -1;
        return done;
    }
    return done;
}

static PyObject *sender_get_send_many(Sender *self, void *closure) {
    PyObject *capsule = PyCapsule_New((void *)sender_send_many, SEND_MANY_CAPSULE, NULL);
    if (capsule != NULL && PyCapsule_SetContext(capsule, self) < 0)  /* the sender it is for (send_many.h) */
        Py_CLEAR(capsule);
    return capsule;
}

static PyGetSetDef sender_getset[] = {
    {"send_many", (getter)sender_get_send_many, NULL, "the batch sender for C send loops (transport/send_many.h)", NULL},
    {NULL},
};

static PyMemberDef sender_members[] = {
    {"frames_sent", T_LONGLONG, offsetof(Sender, frames_sent), READONLY, "frames the kernel took"},
    {"send_errors", T_LONGLONG, offsetof(Sender, send_errors), READONLY, "sends that failed"},
    {NULL},
};

static PyTypeObject SenderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mrc_emu.io._sockio.Sender",
    .tp_doc = "sender(frame, path) -> bool: one frame to the path's first hop (see the module comment).",
    .tp_basicsize = sizeof(Sender),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = sender_new,
    .tp_dealloc = (destructor)sender_dealloc,
    .tp_traverse = (traverseproc)sender_traverse,
    .tp_clear = (inquiry)sender_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Sender, vectorcall),
    .tp_members = sender_members,
    .tp_getset = sender_getset,
};

static PyMethodDef methods[] = {
    {"recv_batch", recv_batch, METH_VARARGS, "Up to max_count waiting datagrams with their arrival times."},
    {"enable_stamps", enable_stamps, METH_VARARGS, "SO_TIMESTAMPNS, IPV6_RECVTCLASS and IPV6_RECVPKTINFO on a socket."},
    {"send_loop", send_loop, METH_VARARGS, "Send pre-built frames with sendmmsg (the physical reference)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sockio", NULL, -1, methods};

PyMODINIT_FUNC PyInit__sockio(void) {
    if (PyType_Ready(&SenderType) < 0)
        return NULL;
    s_first_hop = PyUnicode_InternFromString("first_hop");
    s_errorcode = PyUnicode_InternFromString("errorcode");
    if (s_first_hop == NULL || s_errorcode == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&SenderType);
    if (PyModule_AddObject(m, "Sender", (PyObject *)&SenderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
