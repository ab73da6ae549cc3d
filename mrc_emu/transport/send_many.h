/*
 * mrc_emu/transport/send_many.h: the contract by which a driver's send function offers the
 * requester's C send loop (_spray.c) a whole batch of frames at once.
 *
 * Why it exists: handing the kernel one frame per system call costs a system call and a
 * Python call per frame. A send function (paths.Send) that can do better carries an attribute
 * `send_many`: a PyCapsule named SEND_MANY_CAPSULE whose pointer is a SendMany and whose context
 * is the send function itself (a capsule taken from another object is refused: SendMany takes
 * its sender as the C type that made it). The transport
 * stays sans-IO: it knows this function, not the socket behind it (io/_sockio.c's Sender,
 * above it in the layers, implements it with sendmmsg). Needs Python.h.
 *
 * SendMany(sender, frames, paths, n, &status) -> i
 *   Hands frames[0..n) to the network in order, frames[k] along paths[k] (a Path), with the
 *   meaning of each frame's outcome that send(frame, path) has. status 0: all n handled (i == n;
 *   a frame lost at the host itself, as in a full queue, counts as handled); 1: frames[i]
 *   cannot leave the host (the send would have returned False), those before it were handled
 *   and those after it not tried; -1: an exception is set, raised at frames[i] (those before it
 *   were handled, it and those after not).
 */
#ifndef MRC_EMU_SEND_MANY_H
#define MRC_EMU_SEND_MANY_H
#include <sys/uio.h>

#define SEND_MANY_CAPSULE "mrc_emu.transport.send_many"

typedef Py_ssize_t (*SendMany)(PyObject *sender, const struct iovec *frames, PyObject *const *paths, Py_ssize_t n,
                               int *status);

#endif
