/* shmbuf._native: the two hot paths of shmbuf's ring in C, over the same segment.
 *
 *   write: validate the common case, reserve, stamp odd, copy, stamp even, free the entry
 *   gather: copy rows by sequence number with the seqlock check
 *
 * The protocol is the one described at the top of ring.py (stamps 2s+1 / 2s+2, the
 * reservation entry before the head, lanes owned by one process written without the
 * lock); shmbuf/ring.py and shmbuf/sampling.py are the pure-Python path. Both run on
 * the same segments at the same time. Everything else (claims, restores, reclaiming a
 * dead writer's entries, every error message about bad input) stays in Python: when a
 * call here meets anything but the common case *before it changed anything*, it
 * returns False and the caller takes the Python path, which checks, converts and
 * calls put() with canonical arrays.
 *
 * Memory ordering: stamps, heads and entry words are 64-bit atomics (GCC __atomic
 * builtins). A writer publishes a row with a release store of its even stamp after
 * a release fence that follows the odd stamp; a reader loads the stamp with acquire,
 * copies, issues an acquire fence and reloads it (the seqlock of the Linux kernel and
 * of Boehm, "Can seqlocks get along with programming language memory models?").
 * The GIL is held from the first check to the last store of a write, except while
 * waiting (for the lock, or for an older writer of the same slots).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <float.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>

/* Column indices of the int64 tables: layout.py. */
enum { LANE_HEAD = 0, LANE_BASE = 1, LANE_CLAIM_PID = 2, LANE_OWN_START = 4, LANE_OWN_COUNT = 5 };
enum { RES_PID = 0, RES_CTIME = 1, RES_LANE = 2, RES_START = 3, RES_COUNT = 4, RES_TOKEN = 5 };
enum { TABLE_WIDTH = 8, CTRL_LOCK_HOLDER = 0, MAX_FIELDS = 256 };
/* Sequence numbers a lane may reach (layout.py: MAX_SEQ): a head outside [0, MAX_SEQ] is
 * a segment shmbuf did not write, refused before anything is reserved. */
#define MAX_SEQ (((int64_t)1 << 62) - 1)  /* so every stamp, 2s + 2, fits an int64 */
/* The stats region (stats.py): per lane [pid, ctime, last write time], this handle's
 * slot [pid, ctime, batches, rows, retries, locks, lock wait ns, writes]. */
enum { LANE_STAT_WIDTH = 4, LS_PID = 0, LS_CTIME = 1, LS_TIME = 2, S_LOCKS = 5, S_LOCK_NS = 6, S_WRITES = 7 };

#define LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)

typedef struct {
    PyObject *name;          /* the key in a transition dict */
    PyObject *scalar_type;   /* numpy's scalar type of the dtype (np.float32, ...) */
    Py_ssize_t offset;       /* byte offset of row 0 in the segment */
    Py_ssize_t stride;       /* bytes from one row to the next */
    Py_ssize_t row_bytes;
    Py_ssize_t itemsize;
    int ndim;
    Py_ssize_t *shape;
    char *format;            /* the PEP 3118 format of an array of the dtype; NULL: none */
    char scalar;             /* a 0-d field that takes Python numbers: 'f' 'd' '?' 'i' 'u'; 0 */
} Field;

typedef struct {
    PyObject_HEAD
    Py_buffer mem;           /* the segment's mapping, kept mapped while this lives */
    Py_buffer busy_buf;      /* HeaderLock.busy: 1 while a Python thread here holds the lock */
    int closed;              /* close() was called: the memory goes when no call is inside */
    char *base;
    int64_t *lanes_tab, *res_tab, *ctrl;
    char *rows;
    Py_ssize_t row_stride, lanes, lc, n_res;
    double inv_lc;           /* 1.0 / lc (slot_of) */
    int nfields;
    Field *fields;
    PyObject *ndarray_type, *is_alive, *write_timeout, *lock_timeout, *format_error;
    Py_ssize_t inside;       /* calls running now (one may sleep, or call back into Python) */
    /* this process: set by configure() (again after a fork) */
    int64_t pid;
    double ctime;
    int fd;
    Py_ssize_t default_lane; /* -1: none (the caller claims one) */
    double timeout;
    Py_buffer prefaulted;    /* a byte per lane: 1 once this handle mapped its pages */
    Py_ssize_t hint;         /* the reservation entry used last */
    int64_t *stat_slot;      /* this handle's counters in the segment; NULL: none */
    int64_t *lane_stats;     /* per lane: last writer and time; NULL: none */
} Ring;

static int64_t next_token = 0; /* unique per write in this process (with the pid) */
static PyObject *hook = NULL;   /* tests only: ring.set_hook(), called at protocol points */
static long faults = 0;         /* tests only: protection broken on purpose (ring.py) */
enum { FAULT_NO_STAMP_CHECK = 1, FAULT_NO_WAIT = 2, FAULT_NO_SEGMENT_CHECK = 4 };

/* Call the test hook at `point` ("locked", "reserved", "writing"): -1 if it raised. */
static int at(const char *point) {
    if (hook == NULL)
        return 0;
    PyObject *r = PyObject_CallFunction(hook, "s", point);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The slot of sequence number s of a lane: lane * lc + s mod lc, inside the lane for
 * any s (a corrupted table word never makes an address outside the segment). A 64-bit
 * division costs 40-90 cycles, a few per row of a write or a gather; for 0 <= s < 2**52
 * a multiplication by 1/lc gives the quotient within 1, and one correction makes it
 * exact. */
static inline Py_ssize_t slot_of(Ring *r, Py_ssize_t lane, int64_t s) {
    int64_t m;
    if ((uint64_t)s < ((uint64_t)1 << 52)) {
        m = s - (int64_t)((double)s * r->inv_lc) * r->lc;
        m += m < 0 ? r->lc : m >= r->lc ? -r->lc : 0;
    } else {
        m = s % r->lc;
        m += m < 0 ? r->lc : 0;
    }
    return lane * r->lc + m;
}

/* -1 with FormatError if `first`, a lane's head, cannot be one: a write of n rows from
 * it must stay within [0, MAX_SEQ]. */
static int check_head(Ring *r, Py_ssize_t lane, int64_t first, Py_ssize_t n) {
    if (first >= 0 && first <= MAX_SEQ - n)
        return 0;
    PyErr_Format(r->format_error, "lane %zd's head is %lld, not a sequence number in [0, 2**62): "
                 "the segment's lane table was not written by shmbuf; nothing was written. Create "
                 "a new buffer", lane, (long long)first);
    return -1;
}

static inline int64_t *stamp_of(Ring *r, Py_ssize_t slot) {
    return (int64_t *)(r->rows + slot * r->row_stride);
}

/* memcpy, with the sizes of most small fields inlined (a call per field per row adds up) */
static inline void copy(char *dst, const char *src, Py_ssize_t n) {
    switch (n) {
    case 1: memcpy(dst, src, 1); break;
    case 4: memcpy(dst, src, 4); break;
    case 8: memcpy(dst, src, 8); break;
    default: memcpy(dst, src, n);
    }
}

/* Sleep without the GIL; then -1 (exception set) on Ctrl-C or a closed handle. */
static int pause_for(Ring *r, double *delay) {
    struct timespec ts = {0, (long)(*delay * 1e9)};
    Py_BEGIN_ALLOW_THREADS
    nanosleep(&ts, NULL);
    Py_END_ALLOW_THREADS
    *delay = *delay * 2 > 1e-3 ? 1e-3 : *delay * 2;
    if (PyErr_CheckSignals() < 0)
        return -1;
    if (r->closed) {
        PyErr_SetString(PyExc_ValueError, "the buffer handle was closed during the call");
        return -1;
    }
    return 0;
}

/* ---- the header lock (shared lanes only) ---------------------------------------- */

/* Take the flock of this handle's descriptor. Not while a thread of this process holds
 * it through the Python path (same open file description: flock would succeed). The
 * GIL is held from here to unlock(), so no other thread of ours runs in between. */
static int lock(Ring *r, double deadline, double timeout) {
    double delay = 20e-6, waited_from = 0;
    for (int spins = 0;; spins++) {
        if (*(int64_t *)r->busy_buf.buf == 0) {
            if (flock(r->fd, LOCK_EX | LOCK_NB) == 0) {
                r->ctrl[CTRL_LOCK_HOLDER] = r->pid;
                if (r->stat_slot) {          /* counters: plain stores, our slot only */
                    r->stat_slot[S_LOCKS]++;
                    if (spins)
                        r->stat_slot[S_LOCK_NS] += (int64_t)((now() - waited_from) * 1e9);
                }
                return 0;
            }
            if (errno != EWOULDBLOCK && errno != EINTR) {
                PyErr_SetFromErrno(PyExc_OSError);
                return -1;
            }
        }
        if (spins == 0 && r->stat_slot)
            waited_from = now();
        if (spins < 64)
            continue;                      /* the holder needs microseconds */
        if (now() >= deadline) {
            PyObject *exc = PyObject_CallFunction(r->lock_timeout, "d", timeout);
            if (exc != NULL) {
                PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
                Py_DECREF(exc);
            }
            return -1;
        }
        if (pause_for(r, &delay) < 0)
            return -1;
    }
}

static void unlock(Ring *r) { flock(r->fd, LOCK_UN); }

/* ---- waiting for older writers of our slots ---------------------------------------- */

/* True if each of our slots holds the published row of one lap before ours (then that
 * row's writer, and every older one, is done with it). */
static int older_done(Ring *r, Py_ssize_t lane, int64_t first, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t prev = first + i - r->lc;
        if (prev < 0)
            continue;                      /* first lap: nobody wrote this slot before */
        if (LOAD_ACQ(stamp_of(r, slot_of(r, lane, first + i))) != 2 * prev + 2)
            return 0;
    }
    return 1;
}

/* Block until no live writer of an older reservation, on any lap, owns rows in our
 * slots (ring.py: Ring._wait_for_older). 0, or -1 with an exception set. */
static int wait_for_older(Ring *r, Py_ssize_t lane, int64_t first, Py_ssize_t n,
                          Py_ssize_t entry, double deadline) {
    double delay = 20e-6;
    while (!older_done(r, lane, first, n)) {
        int64_t blocker = 0;
        for (Py_ssize_t i = 0; i < r->n_res && !blocker; i++) {
            int64_t *e = r->res_tab + i * TABLE_WIDTH;
            int64_t pid = LOAD_ACQ(&e[RES_PID]);
            if (pid == 0 || i == entry || LOAD(&e[RES_LANE]) != lane)
                continue;
            int64_t start = LOAD(&e[RES_START]), count = LOAD(&e[RES_COUNT]);
            if (start >= first)
                continue;
            /* their slots and ours, as arcs of the lane's circle, intersect */
            if ((first - start) % r->lc >= count && ((start - first) % r->lc + r->lc) % r->lc >= n)
                continue;
            double ctime;
            int64_t bits = LOAD(&e[RES_CTIME]);
            memcpy(&ctime, &bits, sizeof ctime);
            PyObject *alive = PyObject_CallFunction(r->is_alive, "Ld", (long long)pid, ctime);
            if (alive == NULL)
                return -1;
            int yes = PyObject_IsTrue(alive);
            Py_DECREF(alive);
            if (yes < 0)
                return -1;
            if (yes && LOAD_ACQ(&e[RES_PID]) == pid)
                blocker = pid;
        }
        if (!blocker)
            return 0;
        if (now() >= deadline) {
            PyErr_Format(r->write_timeout,
                         "rows %lld..%lld of lane %zd could not be written: live process(es) [%lld] "
                         "is still writing older rows into the same slots (a ring this small "
                         "wraps faster than they write). Use a larger capacity, or pass a "
                         "larger timeout=", (long long)first, (long long)(first + n - 1), lane,
                         (long long)blocker);
            return -1;
        }
        if (pause_for(r, &delay) < 0)
            return -1;
    }
    return 0;
}

/* ---- writing ------------------------------------------------------------------------ */

/* Copy rows [from, to) of field fd of a write whose row 0 is sequence number `first`
 * from its source (contiguous rows) into their slots. */
static void copy_rows(Ring *r, Field *fd, Py_ssize_t lane, int64_t first, Py_ssize_t from,
                      Py_ssize_t to, const char *src) {
    const char *s = src + from * fd->row_bytes;
    char *d = r->base + fd->offset + slot_of(r, lane, first + from) * fd->stride;
    if (fd->stride == fd->row_bytes) {
        memcpy(d, s, (to - from) * fd->row_bytes);          /* a field of its own: one copy */
    } else {
        for (Py_ssize_t i = from; i < to; i++, s += fd->row_bytes, d += fd->stride)
            copy(d, s, fd->row_bytes);                     /* packed: a row at a time */
    }
}

/* Write n rows into lane: src[f] points at n contiguous rows of field f. Returns 0 when
 * published, 1 when the Python path must take over (nothing was changed), -1 on an
 * error (exception set; anything reserved was abandoned: never sampled). */
static int write_rows(Ring *r, Py_ssize_t lane, Py_ssize_t n, const char **src, double timeout) {
    double deadline = now() + timeout;
    int64_t *lt = r->lanes_tab + lane * TABLE_WIDTH;
    int64_t *e = NULL;                      /* our reservation entry, if a shared writer */
    int64_t first;
    int64_t claim = LOAD_ACQ(&lt[LANE_CLAIM_PID]);

    if (claim == r->pid) {
        /* 1a. The lane is ours: nobody else moves its head, so no lock. Another thread
         * of ours may be waiting inside its write (the GIL let us in): wait for it. */
        double delay = 20e-6;
        while (LOAD(&lt[LANE_OWN_COUNT]) != 0) {
            if (now() >= deadline) {
                PyErr_Format(r->write_timeout, "lane %zd: another thread of this process is "
                             "still writing to it after %g s", lane, timeout);
                return -1;
            }
            if (pause_for(r, &delay) < 0)
                return -1;
        }
        first = LOAD(&lt[LANE_HEAD]);
        if (check_head(r, lane, first, n) < 0)
            return -1;
        STORE(&lt[LANE_OWN_START], first);   /* the entry first ... */
        STORE(&lt[LANE_OWN_COUNT], (int64_t)n);
        STORE_REL(&lt[LANE_HEAD], first + n); /* ... then the commit */
    } else {
        if (claim != 0)
            return 1;                         /* claimed by another: Python says what to do */
        /* 1b. A shared lane: reserve under the header lock. */
        if (lock(r, deadline, timeout) < 0)
            return -1;
        Py_ssize_t entry = -1;
        if (LOAD(&lt[LANE_CLAIM_PID]) == 0) {
            for (Py_ssize_t i = 0; i < r->n_res; i++) {
                Py_ssize_t j = (r->hint + i) % r->n_res;
                if (LOAD(&r->res_tab[j * TABLE_WIDTH + RES_PID]) == 0) {
                    entry = j;
                    break;
                }
            }
        }
        if (entry < 0) {                      /* claimed meanwhile, or no free entry: */
            unlock(r);                        /* Python claims, reclaims or explains */
            return 1;
        }
        r->hint = entry;
        first = LOAD(&lt[LANE_HEAD]);
        if (check_head(r, lane, first, n) < 0) {
            unlock(r);
            return -1;
        }
        e = r->res_tab + entry * TABLE_WIDTH;
        int64_t ctime_bits;
        memcpy(&ctime_bits, &r->ctime, sizeof ctime_bits);
        STORE(&e[RES_LANE], (int64_t)lane);
        STORE(&e[RES_START], first);
        STORE(&e[RES_COUNT], (int64_t)n);
        STORE(&e[RES_TOKEN], ++next_token);
        STORE(&e[RES_CTIME], ctime_bits);
        STORE_REL(&e[RES_PID], r->pid);       /* the entry is valid from here */
        STORE_REL(&lt[LANE_HEAD], first + n); /* the reservation is committed here */
        if (at("locked") < 0) {
            unlock(r);
            goto abandon;
        }
        unlock(r);
    }
    if ((!e && at("locked") < 0) || at("reserved") < 0)
        goto abandon;

    /* 2. Wait for older writers of our slots (only a ring that wraps onto them). */
    if (first + n > r->lc && !(faults & FAULT_NO_WAIT) &&
        wait_for_older(r, lane, first, n, e ? (e - r->res_tab) / TABLE_WIDTH : -1, deadline) < 0)
        goto abandon;

    /* 3. Stamp the slots odd ("being written"), then fence: no data store may become
     * visible before them. */
    for (Py_ssize_t i = 0; i < n; i++)
        STORE(stamp_of(r, slot_of(r, lane, first + i)), 2 * (first + i) + 1);
    __atomic_thread_fence(__ATOMIC_RELEASE);

    /* 4. Copy: up to the end of the lane, then what wraps to its start. */
    Py_ssize_t k = r->lc - slot_of(r, 0, first);
    if (k > n)
        k = n;
    for (int f = 0; f < r->nfields; f++) {
        copy_rows(r, &r->fields[f], lane, first, 0, k, src[f]);
        if (k < n)
            copy_rows(r, &r->fields[f], lane, first, k, n, src[f]);
        if (at("writing") < 0) {
            for (Py_ssize_t i = 0; i < n; i++)   /* abandon: these rows will never be valid */
                STORE_REL(stamp_of(r, slot_of(r, lane, first + i)), 0);
            goto abandon;
        }
    }

    /* 5. Publish: even stamps, each a release store (the data above is visible first). */
    for (Py_ssize_t i = 0; i < n; i++)
        STORE_REL(stamp_of(r, slot_of(r, lane, first + i)), 2 * (first + i) + 2);

    /* 6. Free the entry. */
    if (e)
        STORE_REL(&e[RES_PID], 0);
    else
        STORE_REL(&lt[LANE_OWN_COUNT], 0);

    /* 7. Counters (diagnostics, not protocol): the lane's last writer and time. */
    if (r->stat_slot)
        r->stat_slot[S_WRITES]++;
    if (r->lane_stats) {
        int64_t *ls = r->lane_stats + lane * LANE_STAT_WIDTH;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double t = ts.tv_sec + ts.tv_nsec * 1e-9;
        int64_t bits;
        STORE(&ls[LS_PID], r->pid);
        memcpy(&bits, &r->ctime, sizeof bits);
        STORE(&ls[LS_CTIME], bits);
        memcpy(&bits, &t, sizeof bits);
        STORE(&ls[LS_TIME], bits);
    }
    return 0;

abandon:  /* an error after the commit: free the entry; no stamp of ours is odd */
    if (e)
        STORE_REL(&e[RES_PID], 0);
    else
        STORE_REL(&lt[LANE_OWN_COUNT], 0);
    return -1;
}

/* ---- the validation fast path ------------------------------------------------------ */

/* 0 if a method may run with these arguments (ok: their types are as expected), else
 * -1 with TypeError (naming the usage) or ValueError (a closed handle). */
static int usable(Ring *r, int ok, const char *usage) {
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "expected %s", usage);
        return -1;
    }
    if (r->closed) {
        PyErr_SetString(PyExc_ValueError, "this buffer handle is closed");
        return -1;
    }
    return 0;
}

/* One value of field f as a pointer to its bytes, if it is the common case: a numpy
 * array (or scalar) of exactly the field's dtype and shape, C-contiguous (with a row
 * axis of n rows if rows >= 0), or a Python number the Python path would accept and
 * store identically. 1 if so, 0 if not (the Python path decides), -1 on an error. */
static int value_bytes(Ring *r, Field *f, PyObject *v, Py_ssize_t *rows, Py_buffer *view,
                       char *scratch, const char **out) {
    view->obj = NULL;
    if (f->scalar && *rows == -1 && (PyFloat_CheckExact(v) || PyLong_CheckExact(v) || PyBool_Check(v))) {
        if (PyBool_Check(v)) {
            if (f->scalar != '?')
                return 0;
            scratch[0] = (char)(v == Py_True);
        } else if (PyFloat_CheckExact(v)) {
            double d = PyFloat_AsDouble(v);
            if (f->scalar == 'd') {
                memcpy(scratch, &d, 8);
            } else if (f->scalar == 'f' && !(isfinite(d) && fabs(d) > FLT_MAX)) {
                float x = (float)d;
                memcpy(scratch, &x, 4);
            } else {
                return 0;                 /* float into an int or bool field: an error */
            }
        } else {
            int overflow = 0;
            long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (overflow || (x == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                return 0;
            }
            if (f->scalar == 'd') {
                double d = (double)x;
                memcpy(scratch, &d, 8);
            } else if (f->scalar == 'f') {
                float d = (float)x;
                memcpy(scratch, &d, 4);
            } else if (f->scalar == 'i' || f->scalar == 'u') {
                int bits = 8 * (int)f->itemsize;
                if (f->scalar == 'u' ? (x < 0 || (bits < 64 && x >> bits))
                                     : (bits < 64 && (x < -(1LL << (bits - 1)) || x >= (1LL << (bits - 1)))))
                    return 0;             /* would wrap: the Python path says so */
                memcpy(scratch, &x, f->itemsize);  /* little-endian: the low bytes */
            } else {
                return 0;
            }
        }
        *out = scratch;
        return 1;
    }
    if (f->format == NULL || (Py_TYPE(v) != (PyTypeObject *)r->ndarray_type &&
                              Py_TYPE(v) != (PyTypeObject *)f->scalar_type))
        return 0;
    if (PyObject_GetBuffer(v, view, PyBUF_STRIDES | PyBUF_FORMAT) < 0) {
        PyErr_Clear();                    /* not contiguous, or no buffer: Python path */
        view->obj = NULL;
        return 0;
    }
    int lead = *rows >= 0 || (*rows == -2);
    if (view->ndim != f->ndim + lead || view->itemsize != f->itemsize
        || strcmp(view->format, f->format) != 0 || !PyBuffer_IsContiguous(view, 'C'))
        return 0;
    for (int d = 0; d < f->ndim; d++)
        if (view->shape[d + lead] != f->shape[d])
            return 0;
    if (lead) {
        if (*rows == -2)
            *rows = view->shape[0];
        else if (view->shape[0] != *rows)
            return 0;
    }
    *out = view->buf;
    return 1;
}

/* add(transition, lane, timeout) / extend(batch, lane, timeout): the common case, or
 * False (nothing done) for the Python path. */
static PyObject *write_mapping(Ring *r, PyObject *const *args, Py_ssize_t nargs, int batch) {
    if (usable(r, nargs == 3, "(mapping, lane, timeout)") < 0)
        return NULL;
    PyObject *data = args[0];
    Py_ssize_t lane = r->default_lane;
    double timeout = r->timeout;
    if (args[1] != Py_None) {
        if (!PyLong_CheckExact(args[1]))
            Py_RETURN_FALSE;
        lane = PyLong_AsSsize_t(args[1]);
        if (lane < 0 || lane >= r->lanes) {
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
    }
    if (args[2] != Py_None) {
        if (!PyFloat_CheckExact(args[2]))
            Py_RETURN_FALSE;
        timeout = PyFloat_AsDouble(args[2]);
        if (!(timeout >= 0))
            Py_RETURN_FALSE;
    }
    if (lane < 0 || !((unsigned char *)r->prefaulted.buf)[lane] || !PyDict_CheckExact(data)
        || PyDict_Size(data) != r->nfields)
        Py_RETURN_FALSE;
    Py_buffer views[MAX_FIELDS];
    char scratch[MAX_FIELDS][8];
    const char *src[MAX_FIELDS];
    Py_ssize_t rows = batch ? -2 : -1;
    int f = 0, ok = 1;
    for (; f < r->nfields && ok; f++) {
        PyObject *v = PyDict_GetItemWithError(data, r->fields[f].name);
        if (v == NULL) {
            PyErr_Clear();
            views[f].obj = NULL;
            ok = 0;
        } else {
            ok = value_bytes(r, &r->fields[f], v, &rows, &views[f], scratch[f], &src[f]);
        }
    }
    PyObject *result = NULL;
    if (ok == 1 && batch && (rows < 1 || rows > r->lc))
        ok = 0;                           /* empty, or more than a lane: Python explains */
    if (ok == 1) {
        int done = write_rows(r, lane, batch ? rows : 1, src, timeout);
        result = done < 0 ? NULL : done == 0 ? Py_None : Py_False;
        Py_XINCREF(result);
    } else if (ok == 0) {
        result = Py_False;
        Py_INCREF(result);
    }
    for (int i = 0; i < f; i++)
        if (views[i].obj != NULL)
            PyBuffer_Release(&views[i]);
    return result;
}

static PyObject *Ring_add_impl(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    return write_mapping(r, args, nargs, 0);
}

static PyObject *Ring_extend_impl(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    return write_mapping(r, args, nargs, 1);
}

/* put(lane, n, arrays, timeout): write checked, converted, C-contiguous arrays (one per
 * field, n rows each; their sizes are checked here again, for memory safety). None when
 * published; False, with nothing done, if the lane is claimed by another process or the
 * reservation table is full (Python sorts that out under the lock, then calls again). */
static PyObject *Ring_put_impl(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    if (usable(r, nargs == 4 && PyList_Check(args[2]), "(lane, n, list of arrays, timeout)") < 0)
        return NULL;
    Py_ssize_t lane = PyLong_AsSsize_t(args[0]), n = PyLong_AsSsize_t(args[1]);
    double timeout = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (lane < 0 || lane >= r->lanes || n < 1 || n > r->lc || PyList_Size(args[2]) != r->nfields) {
        PyErr_SetString(PyExc_ValueError, "put: bad lane, row count or number of arrays");
        return NULL;
    }
    Py_buffer views[MAX_FIELDS];
    const char *src[MAX_FIELDS];
    int f = 0;
    for (; f < r->nfields; f++) {
        if (PyObject_GetBuffer(PyList_GetItem(args[2], f), &views[f], PyBUF_C_CONTIGUOUS) < 0)
            break;
        if (views[f].len != n * r->fields[f].row_bytes) {
            PyErr_Format(PyExc_ValueError, "put: field %d holds %zd bytes, expected %zd", f,
                         views[f].len, n * r->fields[f].row_bytes);
            PyBuffer_Release(&views[f]);
            break;
        }
        src[f] = views[f].buf;
    }
    int done = f == r->nfields ? write_rows(r, lane, n, src, timeout) : -1;
    for (int i = 0; i < f; i++)
        PyBuffer_Release(&views[i]);
    if (done < 0)
        return NULL;
    if (done == 1)
        Py_RETURN_FALSE;    /* claimed by another process, or no free entry: Python's turn */
    Py_RETURN_NONE;
}

/* put_rows(lanes, data, extra, timeout): row i of every field into lane lanes[i] (an
 * int64 array of n lanes), one call for the steps of n environments; or, with `lanes`
 * an int, one row given without a row axis into that lane. Each field's
 * value is looked up in the dict `data`, then in the dict `extra`, and must be the
 * common case of value_bytes() with n rows (other keys are ignored: the caller checked
 * them). Every lane must be owned by this process (claimed, so written without the
 * lock) and mapped by this handle. None when every row is published; False, with
 * nothing done, otherwise (the caller's Python path checks, explains and writes). */
static PyObject *Ring_put_rows_impl(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    if (usable(r, nargs == 4 && PyDict_CheckExact(args[1]) && PyDict_CheckExact(args[2]),
               "(lanes, dict, dict, timeout)") < 0)
        return NULL;
    double timeout = r->timeout;
    if (args[3] != Py_None) {
        if (!PyFloat_CheckExact(args[3]))
            Py_RETURN_FALSE;
        timeout = PyFloat_AsDouble(args[3]);
        if (!(timeout >= 0))
            Py_RETURN_FALSE;
    }
    Py_buffer lanev = {0};
    int64_t one;
    const int64_t *lanes = &one;
    Py_ssize_t n = 1, rows = -1;             /* an int: one row, without a row axis */
    int ok = 1;
    if (PyLong_CheckExact(args[0])) {
        one = PyLong_AsLongLong(args[0]);
        if (one == -1 && PyErr_Occurred())
            return NULL;
    } else {
        if (PyObject_GetBuffer(args[0], &lanev, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            return NULL;
        n = rows = lanev.len / 8;
        lanes = lanev.buf;
        ok = lanev.itemsize == 8 && (lanev.format[0] == 'l' || lanev.format[0] == 'q') && n >= 1;
    }
    /* 1. Every lane ours and mapped: then no write below can need the Python path. */
    for (Py_ssize_t i = 0; ok && i < n; i++)
        ok = lanes[i] >= 0 && lanes[i] < r->lanes && ((unsigned char *)r->prefaulted.buf)[lanes[i]]
             && LOAD_ACQ(&r->lanes_tab[lanes[i] * TABLE_WIDTH + LANE_CLAIM_PID]) == r->pid;
    Py_buffer views[MAX_FIELDS];
    char scratch[MAX_FIELDS][8];
    const char *src[MAX_FIELDS], *row[MAX_FIELDS];
    int f = 0;
    /* 2. Every field's n rows, the common case only. */
    for (; f < r->nfields && ok == 1; f++) {
        PyObject *v = PyDict_GetItemWithError(args[1], r->fields[f].name);
        if (v == NULL && !PyErr_Occurred())
            v = PyDict_GetItemWithError(args[2], r->fields[f].name);
        if (v == NULL) {
            views[f].obj = NULL;
            ok = PyErr_Occurred() ? -1 : 0;
        } else {
            ok = value_bytes(r, &r->fields[f], v, &rows, &views[f], scratch[f], &src[f]);
        }
    }
    PyObject *result = NULL;
    if (ok == 0) {
        result = Py_False;
        Py_INCREF(result);
    } else if (ok == 1) {
        /* 3. One write of one row per lane, in order (write_rows: the protocol). */
        Py_ssize_t i = 0;
        for (; i < n; i++) {
            for (int k = 0; k < r->nfields; k++)
                row[k] = src[k] + i * r->fields[k].row_bytes;
            if (write_rows(r, lanes[i], 1, row, timeout) != 0)
                break;
        }
        if (i == n) {
            result = Py_None;
            Py_INCREF(result);
        } else if (!PyErr_Occurred()) {   /* cannot happen for owned lanes; never silent */
            PyErr_Format(PyExc_RuntimeError, "put_rows: lane %lld stopped being ours", (long long)lanes[i]);
        }
    }
    for (int i = 0; i < f; i++)
        if (views[i].obj != NULL)
            PyBuffer_Release(&views[i]);
    if (lanev.obj != NULL)
        PyBuffer_Release(&lanev);
    return result;
}

/* ---- gathering ---------------------------------------------------------------------- */

/* draw(u, length, first, lane): windows of `length` rows drawn uniformly over every
 * lane's current rows, as sampling.py's draw_windows computes them with numpy: window
 * floor(u * total) of all lanes' windows, in lane order. Fills the int64 arrays `first`
 * and `lane` and returns True; False (nothing filled) if no lane holds `length` rows. */
static PyObject *Ring_draw_impl(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    if (usable(r, nargs == 4, "(u, length, first, lane)") < 0)
        return NULL;
    int64_t length = PyLong_AsLongLong(args[1]);
    if (length == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer b[3];
    int got = 0;
    int64_t *cum = NULL;
    PyObject *result = NULL;
    for (; got < 3; got++)
        if (PyObject_GetBuffer(args[got ? got + 1 : 0], &b[got],
                               PyBUF_C_CONTIGUOUS | (got ? PyBUF_WRITABLE : 0)) < 0)
            goto done;
    if ((cum = PyMem_Malloc(2 * r->lanes * sizeof(int64_t))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *lo = cum + r->lanes, total = 0;
    if (b[1].len != b[0].len || b[2].len != b[0].len || length < 1) {
        PyErr_SetString(PyExc_ValueError, "draw: bad sizes");
        goto done;
    }
    /* 1. Each lane's window [lo, head): the base is read before the head (ring.py: window) */
    for (Py_ssize_t i = 0; i < r->lanes; i++) {
        int64_t base = LOAD_ACQ(&r->lanes_tab[i * TABLE_WIDTH + LANE_BASE]);
        int64_t head = LOAD_ACQ(&r->lanes_tab[i * TABLE_WIDTH + LANE_HEAD]);
        if (head < 0 || head > MAX_SEQ)
            head = base = 0;                  /* not shmbuf's table: no window there */
        lo[i] = base < head ? base : head;
        if (lo[i] < head - r->lc)
            lo[i] = head - r->lc;
        if (head - lo[i] >= length)
            total += head - lo[i] - length + 1;
        cum[i] = total;
    }
    result = total ? Py_True : Py_False;
    Py_INCREF(result);
    /* 2. Window x of all of them: the first lane with cum > x, then its offset there */
    const double *u = b[0].buf;
    int64_t *first = b[1].buf, *lane = b[2].buf;
    for (Py_ssize_t w = 0; total && w < b[0].len / 8; w++) {
        int64_t x = (int64_t)(u[w] * (double)total);
        /* the first lane with cum > x: a binary search without branches (conditional
         * moves), as a random x makes every branch of the usual one a coin toss */
        const int64_t *at = cum;
        for (Py_ssize_t left = r->lanes; left > 1;) {
            Py_ssize_t half = left / 2;
            at = at[half - 1] <= x ? at + half : at;
            left -= half;
        }
        Py_ssize_t lo_lane = (at - cum) + (*at <= x);
        lane[w] = lo_lane;
        first[w] = x - (lo_lane ? cum[lo_lane - 1] : 0) + lo[lo_lane];
    }
done:
    PyMem_Free(cum);
    while (got--)
        PyBuffer_Release(&b[got]);
    return result;
}

/* gather(first, lane, length, outs[, per_row]): copy the windows of `length` rows
 * starting at the sequence numbers `first` (int64 array) of `lane` (an int, or an
 * int64 array). `outs` is either one array per field (C-contiguous, len(first) *
 * length rows: the windows one after the other), or a list of `length` such lists,
 * one per position in the window, each array of len(first) rows (row j of every
 * window into outs[j]: callers that treat a window's rows differently save a copy).
 * None instead of an array: that field (at that position) is not copied; its row's
 * stamps are checked all the same. Returns None if every window is intact, else bytes:
 * 1 for the intact windows, or with per_row true for the intact rows (n * length).
 * (sampling.py: copy_windows.) */
typedef struct {             /* one field to copy out of each row (gather) */
    char *dst;
    Py_ssize_t offset, stride, bytes;
} Todo;

static PyObject *Ring_gather_impl(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    if (usable(r, (nargs == 4 || nargs == 5 || nargs == 8) && PyList_Check(args[3]),
               "(first, lane, length, list of arrays[, per_row[, same, skip, skip_mask]])") < 0)
        return NULL;
    int per_row = nargs >= 5 && PyObject_IsTrue(args[4]);
    Py_ssize_t length = PyLong_AsSsize_t(args[2]);
    Py_ssize_t one_lane = PyLong_Check(args[1]) ? PyLong_AsSsize_t(args[1]) : -1;
    Py_ssize_t same = nargs == 8 ? PyLong_AsSsize_t(args[5]) : -1;
    Py_ssize_t skip = nargs == 8 ? PyLong_AsSsize_t(args[6]) : -1;
    long skip_mask = nargs == 8 ? PyLong_AsLong(args[7]) : 0;
    if (PyErr_Occurred())
        return NULL;
    if (same >= r->nfields || (same >= 0 && r->fields[same].row_bytes > 8) || skip >= r->nfields) {
        PyErr_SetString(PyExc_ValueError, "gather: same must name a field of at most 8 bytes, skip a field");
        return NULL;
    }
    Py_buffer firstv, lanev = {0}, *outs = NULL;
    Todo *todo = NULL;
    Py_ssize_t *todo_at = NULL;
    if (PyObject_GetBuffer(args[0], &firstv, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    Py_ssize_t n = firstv.len / 8, nout = 0, nf = r->nfields, want = 0;
    PyObject *result = NULL;
    int by_pos = PyList_Size(args[3]) > 0 && PyList_Check(PyList_GetItem(args[3], 0));
    if (one_lane < 0 && PyObject_GetBuffer(args[1], &lanev, PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    if (length < 1 || length > r->lc || (lanev.obj && lanev.len != firstv.len) || one_lane >= r->lanes
        || PyList_Size(args[3]) != (by_pos ? length : nf)) {
        PyErr_SetString(PyExc_ValueError, "gather: bad lane, length or number of outputs");
        goto done;
    }
    want = by_pos ? length * nf : nf;
    if ((outs = PyMem_Calloc(want, sizeof(Py_buffer))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; nout < want; nout++) {
        PyObject *list = by_pos ? PyList_GetItem(args[3], nout / nf) : args[3];
        Py_ssize_t f = nout % nf;
        if (!PyList_Check(list) || PyList_Size(list) != nf) {
            PyErr_SetString(PyExc_ValueError, "gather: a position's outputs are not a list of one per field");
            goto done;
        }
        PyObject *o = PyList_GetItem(list, f);
        if (o == Py_None)                  /* a field the caller does not need */
            continue;
        if (PyObject_GetBuffer(o, &outs[nout], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
            outs[nout].obj = NULL;
            goto done;
        }
        if (outs[nout].len != n * (by_pos ? 1 : length) * r->fields[f].row_bytes) {
            PyErr_SetString(PyExc_ValueError, "gather: an output has the wrong size");
            goto done;
        }
    }
    const int64_t *first = firstv.buf, *lanes = lanev.obj ? lanev.buf : NULL;
    for (Py_ssize_t w = 0; w < n; w++)  /* checked first: what follows trusts them */
        if (first[w] < 0 || (lanes && (lanes[w] < 0 || lanes[w] >= r->lanes))) {
            PyErr_SetString(PyExc_ValueError, "gather: a lane or sequence number is out of range");
            goto done;
        }
    /* The copies to make, per position (todo_at[j] .. todo_at[j + 1]), only the fields
     * asked for: the row loop below then does no per-field bookkeeping. */
    if ((todo = PyMem_Malloc((want + 1) * sizeof(Todo) + (length + 2) * sizeof(Py_ssize_t))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    todo_at = (Py_ssize_t *)(todo + want + 1);
    Py_ssize_t ntodo = 0;
    for (Py_ssize_t i = 0; i < want; i++) {
        if (i % nf == 0)
            todo_at[i / nf] = ntodo;
        if (outs[i].obj != NULL) {
            Field *fd = &r->fields[i % nf];
            todo[ntodo++] = (Todo){(char *)outs[i].buf, fd->offset, fd->stride, fd->row_bytes};
        }
    }
    todo_at[want / nf] = ntodo;
    Py_ssize_t same_bytes = same >= 0 ? r->fields[same].row_bytes : 0;
    result = PyBytes_FromStringAndSize(NULL, per_row ? n * length : n);
    if (result == NULL)
        goto done;
    char *ok = PyBytes_AsString(result), *win = ok;
    Py_ssize_t bad = 0;
    int big = n * length * (r->row_stride + 64) > (1 << 16);
    PyThreadState *ts = big ? PyEval_SaveThread() : NULL;   /* large copies: let others run */
    /* 0. Touch every row's line first: a random row of a large ring misses the TLB (4 kB
     * pages), and prefetches let those page walks overlap instead of waiting one by one. */
    for (Py_ssize_t w = 0; w < n; w++) {
        Py_ssize_t lane = lanes ? lanes[w] : one_lane, at = slot_of(r, 0, first[w]);
        for (Py_ssize_t j = 0; j < length; j++, at = at + 1 == r->lc ? 0 : at + 1) {
            const char *row = (const char *)stamp_of(r, lane * r->lc + at);
            for (Py_ssize_t b = 0; b < r->row_stride; b += 64)
                __builtin_prefetch(row + b);
        }
    }
    for (Py_ssize_t w = 0; w < n; w++) {
        Py_ssize_t lane = lanes ? lanes[w] : one_lane, at = slot_of(r, 0, first[w]);
        int64_t key0 = 0;                            /* row 0's value of field `same` */
        win = per_row ? ok + w * length : ok + w;    /* where this window's verdicts go */
        *win = 1;
        for (Py_ssize_t j = 0; j < length; j++, at = at + 1 == r->lc ? 0 : at + 1) {
            int64_t s = first[w] + j;
            Py_ssize_t slot = lane * r->lc + at;
            Py_ssize_t row = by_pos ? w : w * length + j;    /* its index in the outputs */
            int64_t *stamp = stamp_of(r, slot);
            int64_t before = LOAD_ACQ(stamp);          /* 1. the row it names, acquired */
            if (faults & FAULT_NO_STAMP_CHECK)
                before = 2 * s + 2;
            if (per_row)
                win[j] = 1;
            if (before != 2 * s + 2) {
                win[per_row ? j : 0] = 0;
                if (per_row)
                    continue;                          /* per row: the others may be intact */
                break;
            }
            for (Py_ssize_t k = todo_at[by_pos ? j : 0]; k < todo_at[by_pos ? j + 1 : 1]; k++) {
                const Todo *c = &todo[k];                 /* 2. copy every field asked for */
                copy(c->dst + row * c->bytes, r->base + c->offset + slot * c->stride, c->bytes);
            }
            int64_t key = 0;                           /* ... and the filters' values */
            unsigned char flag = 0;
            if (same_bytes == 8)                       /* (the common size: one load) */
                memcpy(&key, r->base + r->fields[same].offset + slot * r->fields[same].stride, 8);
            else if (same_bytes)
                memcpy(&key, r->base + r->fields[same].offset + slot * r->fields[same].stride, same_bytes);
            if (skip >= 0 && j == 0)
                flag = *(unsigned char *)(r->base + r->fields[skip].offset + slot * r->fields[skip].stride);
            __atomic_thread_fence(__ATOMIC_ACQUIRE);   /* 3. no copy load moves past ... */
            if (LOAD(stamp) != before && !(faults & FAULT_NO_STAMP_CHECK)) { /* 4. unchanged? */
                win[per_row ? j : 0] = 0;
                if (per_row)
                    continue;
                break;
            }
            /* 4b. The filters, on values known intact: a row whose `same` field differs
             * from row 0's, a window whose row 0 has a `skip` bit, does not count. */
            if (j == 0)
                key0 = key;
            if (((same >= 0 && key != key0) || (flag & skip_mask)) && !(faults & FAULT_NO_SEGMENT_CHECK)) {
                win[per_row ? j : 0] = 0;
                if (per_row)
                    continue;
                break;
            }
        }
    }
    /* 5. A window drawn before a clear() must still start at or after its lane's base
     * (per row: each row). */
    for (Py_ssize_t w = 0; w < n; w++) {
        Py_ssize_t lane = lanes ? lanes[w] : one_lane;
        int64_t base = LOAD_ACQ(&r->lanes_tab[lane * TABLE_WIDTH + LANE_BASE]);
        for (Py_ssize_t j = 0; j < (per_row ? length : 1); j++) {
            char *v = per_row ? ok + w * length + j : ok + w;
            if (*v && first[w] + j < base)
                *v = 0;
            bad += !*v;
        }
    }
    if (ts)
        PyEval_RestoreThread(ts);
    if (bad == 0) {
        Py_DECREF(result);
        result = Py_None;
        Py_INCREF(result);
    }
done:
    PyMem_Free(todo);
    if (outs != NULL) {
        for (Py_ssize_t i = 0; i < want; i++)
            if (outs[i].obj != NULL)
                PyBuffer_Release(&outs[i]);
        PyMem_Free(outs);
    }
    if (lanev.obj)
        PyBuffer_Release(&lanev);
    PyBuffer_Release(&firstv);
    return result;
}

/* ---- windows that stop at a segment's end (n-step returns, for shmbuf.episodes) -------- */

/* A 0-d numeric field's value as a double (its kind: Field.scalar). */
static double as_double(const Field *f, const char *p) {
    switch (f->scalar) {
    case 'f': { float x; memcpy(&x, p, 4); return x; }
    case 'd': { double x; memcpy(&x, p, 8); return x; }
    case '?': return *p != 0;
    case 'i': case 'u': {
        int64_t x = 0;
        memcpy(&x, p, f->itemsize);             /* little-endian: the low bytes */
        if (f->scalar == 'i' && f->itemsize < 8 && (x >> (8 * f->itemsize - 1)) & 1)
            x -= (int64_t)1 << (8 * f->itemsize);  /* sign-extend */
        return (double)x;
    }
    default: return 0.0;
    }
}

/* reduce_windows(first, lane, n, gamma, key, flag, end_bits, skip_bits, value, outs0,
 * outs_last, steps, total, last_flag): for each window starting at row t = first[w] of
 * its lane, walk rows t, t+1, ... of one segment (rows whose `key` field equals row t's)
 * adding gamma**j * `value` of each, and stop after the row whose `flag` has an end bit,
 * or after n rows: k rows taken. Row t's fields go to outs0 (one array or None per
 * field, len(first) rows), row t+k's to outs_last; steps[w] = k, total[w] the sum,
 * last_flag[w] the flag of row t+k-1. A window counts only if rows t .. t+k were all
 * intact (the seqlock of gather, each row) and of the segment, row t without a skip bit,
 * and t at or after its lane's base. Returns None if all count, else bytes (1: counts).
 * (episodes/transitions.py does the same with numpy on the pure-Python path.) */
static PyObject *Ring_reduce_windows_impl(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    if (usable(r, nargs == 14 && PyList_Check(args[9]) && PyList_Check(args[10]),
               "(first, lane, n, gamma, key, flag, end_bits, skip_bits, value, outs0, outs_last, "
               "steps, total, last_flag)") < 0)
        return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(args[2]);
    double gamma = PyFloat_AsDouble(args[3]);
    Py_ssize_t key = PyLong_AsSsize_t(args[4]), flag = PyLong_AsSsize_t(args[5]);
    long end_bits = PyLong_AsLong(args[6]), skip_bits = PyLong_AsLong(args[7]);
    Py_ssize_t value = PyLong_AsSsize_t(args[8]);
    Py_ssize_t one_lane = PyLong_Check(args[1]) ? PyLong_AsSsize_t(args[1]) : -1;
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t nf = r->nfields;
    if (n < 1 || n >= r->lc || key < 0 || key >= nf || r->fields[key].row_bytes != 8 || flag < 0
        || flag >= nf || r->fields[flag].row_bytes != 1 || value < 0 || value >= nf
        || !r->fields[value].scalar || one_lane >= r->lanes
        || PyList_Size(args[9]) != nf || PyList_Size(args[10]) != nf) {
        PyErr_SetString(PyExc_ValueError, "reduce_windows: bad n, fields or outputs");
        return NULL;
    }
    Py_buffer views[3 + 2 * MAX_FIELDS + 2];      /* first, lane, the outputs, steps, total, last */
    int nviews = 0;
    PyObject *result = NULL;
    Todo todo[2 * MAX_FIELDS];
    Py_ssize_t ntodo0 = 0, ntodo = 0;
#define VIEW(obj, flags) (PyObject_GetBuffer((obj), &views[nviews], (flags)) < 0 ? NULL : &views[nviews++])
    Py_buffer *fv = VIEW(args[0], PyBUF_C_CONTIGUOUS);
    if (fv == NULL)
        goto done;
    Py_ssize_t m = fv->len / 8;
    const int64_t *first = fv->buf, *lanes = NULL;
    if (one_lane < 0) {
        Py_buffer *lv = VIEW(args[1], PyBUF_C_CONTIGUOUS);
        if (lv == NULL)
            goto done;
        if (lv->len != fv->len) {
            PyErr_SetString(PyExc_ValueError, "reduce_windows: lanes and firsts differ in length");
            goto done;
        }
        lanes = lv->buf;
    }
    for (int pass = 0; pass < 2; pass++) {        /* the fields to copy out of row t, row t+k */
        for (Py_ssize_t f = 0; f < nf; f++) {
            PyObject *o = PyList_GetItem(args[9 + pass], f);
            if (o == Py_None)
                continue;
            Py_buffer *v = VIEW(o, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE);
            if (v == NULL)
                goto done;
            if (v->len != m * r->fields[f].row_bytes) {
                PyErr_SetString(PyExc_ValueError, "reduce_windows: an output has the wrong size");
                goto done;
            }
            todo[ntodo++] = (Todo){(char *)v->buf, r->fields[f].offset, r->fields[f].stride, r->fields[f].row_bytes};
        }
        if (pass == 0)
            ntodo0 = ntodo;
    }
    Py_buffer *sv = VIEW(args[11], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE);
    Py_buffer *tv = sv ? VIEW(args[12], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) : NULL;
    Py_buffer *gv = tv ? VIEW(args[13], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) : NULL;
    if (gv == NULL)
        goto done;
    if (sv->len != m * 8 || tv->len != m * 8 || gv->len != m) {
        PyErr_SetString(PyExc_ValueError, "reduce_windows: steps, total or last_flag has the wrong size");
        goto done;
    }
    int64_t *steps = sv->buf;
    double *total = tv->buf;
    unsigned char *last = gv->buf;
    for (Py_ssize_t w = 0; w < m; w++)            /* checked first: what follows trusts them */
        if (first[w] < 0 || (lanes && (lanes[w] < 0 || lanes[w] >= r->lanes))) {
            PyErr_SetString(PyExc_ValueError, "reduce_windows: a lane or sequence number is out of range");
            goto done;
        }
    result = PyBytes_FromStringAndSize(NULL, m);
    if (result == NULL)
        goto done;
    char *ok = PyBytes_AsString(result);
    Py_ssize_t bad = 0;
    const Field *fk = &r->fields[key], *ff = &r->fields[flag], *fval = &r->fields[value];
    PyThreadState *ts = m * (n + 1) * (r->row_stride + 64) > (1 << 16) ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t w = 0; w < m; w++) {          /* 0. prefetch the windows' rows (gather) */
        Py_ssize_t lane = lanes ? lanes[w] : one_lane, at = slot_of(r, 0, first[w]);
        for (Py_ssize_t j = 0; j <= n; j++, at = at + 1 == r->lc ? 0 : at + 1) {
            const char *row = (const char *)stamp_of(r, lane * r->lc + at);
            for (Py_ssize_t b = 0; b < r->row_stride; b += 64)
                __builtin_prefetch(row + b);
        }
    }
    for (Py_ssize_t w = 0; w < m; w++) {
        Py_ssize_t lane = lanes ? lanes[w] : one_lane, at = slot_of(r, 0, first[w]);
        int64_t key0 = 0;
        double sum = 0.0, g = 1.0;
        Py_ssize_t k = n;
        unsigned char lastf = 0;
        ok[w] = 0;
        for (Py_ssize_t j = 0; j <= k; j++, at = at + 1 == r->lc ? 0 : at + 1) {
            int64_t s = first[w] + j, kj;
            Py_ssize_t slot = lane * r->lc + at;
            int64_t *stamp = stamp_of(r, slot);
            int64_t before = LOAD_ACQ(stamp);     /* 1. the row it names, acquired */
            if (before != 2 * s + 2 && !(faults & FAULT_NO_STAMP_CHECK))
                break;
            const char *base = r->base;           /* 2. read: key, flag, value; copies */
            memcpy(&kj, base + fk->offset + slot * fk->stride, 8);
            unsigned char fj = *(const unsigned char *)(base + ff->offset + slot * ff->stride);
            double vj = j < k ? as_double(fval, base + fval->offset + slot * fval->stride) : 0.0;
            if (j == 0 || j == k)
                for (Py_ssize_t c = j == 0 ? 0 : ntodo0; c < (j == 0 ? ntodo0 : ntodo); c++)
                    copy(todo[c].dst + w * todo[c].bytes, base + todo[c].offset + slot * todo[c].stride,
                         todo[c].bytes);
            __atomic_thread_fence(__ATOMIC_ACQUIRE);  /* 3. no load above moves past ... */
            if (LOAD(stamp) != before && !(faults & FAULT_NO_STAMP_CHECK))  /* 4. unchanged? */
                break;
            if (faults & FAULT_NO_SEGMENT_CHECK) {
                /* tests only: the segment check off on purpose */
            } else if (j == 0) {                  /* 5. the segment's: row t not a skip */
                key0 = kj;
                if (fj & skip_bits)
                    break;
            } else if (kj != key0) {
                break;
            }
            if (j == k) {                         /* row t+k read: the window counts */
                ok[w] = 1;
                break;
            }
            sum += g * vj;                        /* 6. row t+j is a step taken */
            g *= gamma;
            lastf = fj;
            if (fj & end_bits)
                k = j + 1;                        /* its segment's last: row t+k ends it */
        }
        if (ok[w] && first[w] < LOAD_ACQ(&r->lanes_tab[lane * TABLE_WIDTH + LANE_BASE]))
            ok[w] = 0;                            /* 7. drawn before a clear() */
        steps[w] = k;
        total[w] = sum;
        last[w] = lastf;
        bad += !ok[w];
    }
    if (ts)
        PyEval_RestoreThread(ts);
    if (bad == 0) {
        Py_DECREF(result);
        result = Py_None;
        Py_INCREF(result);
    }
done:
#undef VIEW
    while (nviews--)
        PyBuffer_Release(&views[nviews]);
    return result;
}

/* ---- the object ---------------------------------------------------------------------- */

/* configure(pid, ctime, fd, default_lane, timeout): this process's identity and the
 * handle's defaults (again after a fork, a claim, a new timeout). */
/* Whether row s of a lane is published (raw stamp read) with its `kf` field (8 bytes)
 * equal to value: a guide for last_rows. */
static inline int episode_row(Ring *r, const Field *kf, Py_ssize_t lane, int64_t s, int64_t value) {
    if (s < 0)
        return 0;
    Py_ssize_t slot = slot_of(r, lane, s);
    int64_t v;
    memcpy(&v, r->base + kf->offset + slot * kf->stride, 8);  /* (may be unaligned) */
    return LOAD_ACQ(stamp_of(r, slot)) == 2 * s + 2 && v == value;
}

/* last_rows(end, lane, start, key, out): for each i, the last row at or after end[i] of
 * lane[i] (int64 arrays) that is published and whose `key` field (8 bytes) equals
 * start[i], looked for among rows end[i] .. head - 1 of the lane, into out[i] (row
 * end[i] is taken to be such a row). Raw reads, a guide only: callers copy
 * the rows they then use with gather's check. An episode's rows are contiguous and a
 * lane's unpublished rows are its newest (one writer owns it), so "published and of the
 * episode" holds for a prefix of end .. head - 1. (episodes/gather.py: last_rows.) */
static PyObject *Ring_last_rows_impl(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    if (usable(r, nargs == 5, "(end, lane, start, key, out)") < 0)
        return NULL;
    Py_ssize_t key = PyLong_AsSsize_t(args[3]);
    if (key == -1 && PyErr_Occurred())
        return NULL;
    if (key < 0 || key >= r->nfields || r->fields[key].row_bytes != 8) {
        PyErr_SetString(PyExc_ValueError, "last_rows: bad key field");
        return NULL;
    }
    Py_buffer b[4];
    int got = 0;
    int64_t *hi = NULL;
    PyObject *result = NULL;
    for (; got < 4; got++)
        if (PyObject_GetBuffer(args[got < 3 ? got : 4], &b[got],
                               PyBUF_C_CONTIGUOUS | (got == 3 ? PyBUF_WRITABLE : 0)) < 0)
            goto done;
    Py_ssize_t m = b[0].len / 8;
    if (b[1].len != b[0].len || b[2].len != b[0].len || b[3].len != b[0].len) {
        PyErr_SetString(PyExc_ValueError, "last_rows: arrays of different lengths");
        goto done;
    }
    const int64_t *end = b[0].buf, *lanes = b[1].buf, *start = b[2].buf;
    int64_t *lo = b[3].buf;           /* the answers, row lo of the episode all along */
    const Field *kf = &r->fields[key];
    if ((hi = PyMem_Malloc(3 * (m + 1) * sizeof(int64_t))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *step = hi + m + 1, *probe = step + m + 1;
    for (Py_ssize_t i = 0; i < m; i++) {
        if (lanes[i] < 0 || lanes[i] >= r->lanes || end[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "last_rows: a lane or row out of range");
            goto done;
        }
        lo[i] = end[i];
        int64_t head = LOAD_ACQ(&r->lanes_tab[lanes[i] * TABLE_WIDTH + LANE_HEAD]);
        hi[i] = head > 0 && head <= MAX_SEQ ? head - 1 : -1;  /* (a table not shmbuf's: no row) */
        step[i] = 1;
    }
    /* Each search gallops from its end (rows end+1, end+2, end+4, ...: an episode is
     * short next to a lane, and probes near the end share pages), then halves what is
     * left between the last probe inside and the first outside. Rows past hi are not of
     * the episode. All the searches advance together, one probe each per round, the
     * rows of a round fetched before any is read: their cache misses overlap. */
    for (int busy = 1; busy;) {
        busy = 0;
        for (Py_ssize_t i = 0; i < m; i++) {      /* this round's probes, fetched ahead */
            if (lo[i] >= hi[i])
                continue;
            busy = 1;
            if (step[i] > hi[i] - lo[i])
                step[i] = 0;                    /* past the newest row: halve from here */
            probe[i] = step[i] ? lo[i] + step[i] : lo[i] + (hi[i] - lo[i] + 1) / 2;
            Py_ssize_t slot = slot_of(r, lanes[i], probe[i]);
            __builtin_prefetch(stamp_of(r, slot));
            __builtin_prefetch(r->base + kf->offset + slot * kf->stride);
        }
        for (Py_ssize_t i = 0; i < m; i++) {      /* then read them */
            if (lo[i] >= hi[i])
                continue;
            if (episode_row(r, kf, lanes[i], probe[i], start[i])) {
                lo[i] = probe[i];
                step[i] = step[i] < INT64_MAX / 2 ? 2 * step[i] : 0;
            } else {
                hi[i] = probe[i] - 1;
                step[i] = 0;
            }
        }
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(hi);
    while (got--)
        PyBuffer_Release(&b[got]);
    return result;
}

static PyObject *Ring_configure(Ring *r, PyObject *args) {
    long long pid;
    Py_ssize_t slot_off = -1, lanes_off = -1;  /* byte offsets in the segment; -1: none */
    if (!PyArg_ParseTuple(args, "Ldind|nn", &pid, &r->ctime, &r->fd, &r->default_lane, &r->timeout,
                          &slot_off, &lanes_off))
        return NULL;
    Py_ssize_t words = 8;                       /* a slot is 8 int64 */
    if (slot_off >= 0 && (slot_off % 8 || slot_off + 8 * words > r->mem.len)) {
        PyErr_SetString(PyExc_ValueError, "stats slot outside the segment");
        return NULL;
    }
    if (lanes_off >= 0 && (lanes_off % 8 || lanes_off + 8 * LANE_STAT_WIDTH * r->lanes > r->mem.len)) {
        PyErr_SetString(PyExc_ValueError, "lane stats outside the segment");
        return NULL;
    }
    r->pid = pid;
    r->stat_slot = slot_off >= 0 ? (int64_t *)(r->base + slot_off) : NULL;
    r->lane_stats = lanes_off >= 0 ? (int64_t *)(r->base + lanes_off) : NULL;
    Py_RETURN_NONE;
}

/* Let go of the segment's mapping (the Python side can then unmap it and close its
 * descriptor): at close() when no call is inside, else when the last call leaves. */
static void release_memory(Ring *r) {
    if (r->mem.obj)
        PyBuffer_Release(&r->mem);
}

static PyObject *Ring_close(Ring *r, PyObject *unused) {
    r->closed = 1;
    if (r->inside == 0)
        release_memory(r);
    Py_RETURN_NONE;
}

/* Every method that touches the segment runs through this guard: it refuses a closed
 * handle, and counts the calls inside (a call may sleep without the GIL, or call back
 * into Python, while another thread closes the handle) so that the mapping is let go of
 * only when none is. */
#define GUARDED(name)                                                                   \
    static PyObject *name(Ring *r, PyObject *const *args, Py_ssize_t nargs) {           \
        if (r->closed) {                                                                \
            PyErr_SetString(PyExc_ValueError, "this buffer handle is closed");          \
            return NULL;                                                                \
        }                                                                               \
        r->inside++;                                                                    \
        PyObject *result = name##_impl(r, args, nargs);                                 \
        if (--r->inside == 0 && r->closed)                                              \
            release_memory(r);                                                          \
        return result;                                                                  \
    }
GUARDED(Ring_add)
GUARDED(Ring_extend)
GUARDED(Ring_put)
GUARDED(Ring_put_rows)
GUARDED(Ring_gather)
GUARDED(Ring_reduce_windows)
GUARDED(Ring_draw)
GUARDED(Ring_last_rows)

static void free_fields(Ring *r) {
    for (int i = 0; r->fields && i < r->nfields; i++) {
        Py_XDECREF(r->fields[i].name);
        Py_XDECREF(r->fields[i].scalar_type);
        PyMem_Free(r->fields[i].shape);
        PyMem_Free(r->fields[i].format);
    }
    PyMem_Free(r->fields);
    r->fields = NULL;
}

static void Ring_dealloc(Ring *r) {
    PyTypeObject *tp = Py_TYPE((PyObject *)r);
    free_fields(r);
    if (r->mem.obj)
        PyBuffer_Release(&r->mem);
    if (r->busy_buf.obj)
        PyBuffer_Release(&r->busy_buf);
    if (r->prefaulted.obj)
        PyBuffer_Release(&r->prefaulted);
    Py_XDECREF(r->ndarray_type);
    Py_XDECREF(r->is_alive);
    Py_XDECREF(r->write_timeout);
    Py_XDECREF(r->lock_timeout);
    Py_XDECREF(r->format_error);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(r);
    Py_DECREF(tp);
}

/* Ring(mem, geometry, fields, busy, prefaulted, ndarray, is_alive, WriteTimeout,
 *      lock_timeout, FormatError): see native.py, which builds every argument from a checked Layout.
 * geometry = (lanes_off, res_off, n_res, control_off, rows_off, row_stride, lanes, lc);
 * fields = [(name, scalar_type, offset, stride, row_bytes, itemsize, shape, format, kind)]. */
static PyObject *Ring_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *mem, *fields, *busy, *prefaulted, *ndarray, *is_alive, *wt, *lt, *fe;
    Py_ssize_t g[8];
    if (!PyArg_ParseTuple(args, "O(nnnnnnnn)O!OOOOOOO", &mem, &g[0], &g[1], &g[2], &g[3], &g[4],
                          &g[5], &g[6], &g[7], &PyList_Type, &fields, &busy, &prefaulted,
                          &ndarray, &is_alive, &wt, &lt, &fe))
        return NULL;
    if (PyList_Size(fields) < 1 || PyList_Size(fields) > MAX_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "1 to 256 fields");
        return NULL;
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    Ring *r = (Ring *)alloc(type, 0);
    if (r == NULL)
        return NULL;
    if (PyObject_GetBuffer(mem, &r->mem, PyBUF_WRITABLE) < 0
        || PyObject_GetBuffer(busy, &r->busy_buf, PyBUF_WRITABLE) < 0
        || PyObject_GetBuffer(prefaulted, &r->prefaulted, PyBUF_WRITABLE) < 0)
        goto fail;
    if (r->busy_buf.len < 8 || r->prefaulted.len < g[6]) {
        PyErr_SetString(PyExc_ValueError, "busy or prefaulted too small");
        goto fail;
    }
    r->base = r->mem.buf;
    r->lanes_tab = (int64_t *)(r->base + g[0]);
    r->res_tab = (int64_t *)(r->base + g[1]);
    r->n_res = g[2];
    r->ctrl = (int64_t *)(r->base + g[3]);
    r->rows = r->base + g[4];
    r->row_stride = g[5];
    r->lanes = g[6];
    r->lc = g[7];
    r->inv_lc = 1.0 / (double)r->lc;
    r->default_lane = -1;
    r->fd = -1;
    r->pid = -1;  /* nobody, until configure() */
    r->nfields = (int)PyList_Size(fields);
    r->fields = PyMem_Calloc(r->nfields, sizeof(Field));
    if (r->fields == NULL)
        goto fail;
    for (int i = 0; i < r->nfields; i++) {
        Field *f = &r->fields[i];
        PyObject *name, *st, *shape, *format;
        int kind;
        if (!PyArg_ParseTuple(PyList_GetItem(fields, i), "UOnnnnO!OC", &name, &st, &f->offset,
                              &f->stride, &f->row_bytes, &f->itemsize, &PyTuple_Type, &shape,
                              &format, &kind))
            goto fail;
        Py_INCREF(name);
        f->name = name;
        Py_INCREF(st);
        f->scalar_type = st;
        f->scalar = (char)kind;
        f->ndim = (int)PyTuple_Size(shape);
        f->shape = PyMem_Calloc(f->ndim + 1, sizeof(Py_ssize_t));
        if (f->shape == NULL)
            goto fail;
        for (int d = 0; d < f->ndim; d++)
            f->shape[d] = PyLong_AsSsize_t(PyTuple_GetItem(shape, d));
        if (format != Py_None) {
            Py_ssize_t len;
            const char *s = PyUnicode_AsUTF8AndSize(format, &len);
            if (s == NULL || (f->format = PyMem_Malloc(len + 1)) == NULL)
                goto fail;
            memcpy(f->format, s, len + 1);
        }
        if (f->offset < 0 || f->row_bytes < 1 || f->stride < f->row_bytes
            || f->offset + (g[6] * g[7] - 1) * f->stride + f->row_bytes > r->mem.len) {
            PyErr_Format(PyExc_ValueError, "field %d lies outside the segment", i);
            goto fail;
        }
    }
    if (PyErr_Occurred())
        goto fail;
    if (g[6] < 1 || g[7] < 1 || g[5] < 8 || g[4] + g[6] * g[7] * g[5] > r->mem.len
        || g[0] + g[6] * TABLE_WIDTH * 8 > r->mem.len || g[1] + g[2] * TABLE_WIDTH * 8 > r->mem.len) {
        PyErr_SetString(PyExc_ValueError, "the geometry does not fit in the segment");
        goto fail;
    }
    Py_INCREF(ndarray);
    r->ndarray_type = ndarray;
    Py_INCREF(is_alive);
    r->is_alive = is_alive;
    Py_INCREF(wt);
    r->write_timeout = wt;
    Py_INCREF(lt);
    r->lock_timeout = lt;
    Py_INCREF(fe);
    r->format_error = fe;
    return (PyObject *)r;
fail:
    Py_DECREF(r);
    return NULL;
}

static PyMethodDef Ring_methods[] = {
    {"add", (PyCFunction)(void (*)(void))Ring_add, METH_FASTCALL, "add(transition, lane, timeout)"},
    {"extend", (PyCFunction)(void (*)(void))Ring_extend, METH_FASTCALL, "extend(batch, lane, timeout)"},
    {"put", (PyCFunction)(void (*)(void))Ring_put, METH_FASTCALL, "put(lane, n, arrays, timeout)"},
    {"gather", (PyCFunction)(void (*)(void))Ring_gather, METH_FASTCALL, "gather(first, lane, length, outs[, per_row[, same, skip, skip_mask]])"},
    {"put_rows", (PyCFunction)(void (*)(void))Ring_put_rows, METH_FASTCALL, "put_rows(lanes, data, extra, timeout)"},
    {"reduce_windows", (PyCFunction)(void (*)(void))Ring_reduce_windows, METH_FASTCALL,
     "reduce_windows(first, lane, n, gamma, key, flag, end_bits, skip_bits, value, outs0, outs_last, "
     "steps, total, last_flag)"},
    {"draw", (PyCFunction)(void (*)(void))Ring_draw, METH_FASTCALL, "draw(u, length, first, lane)"},
    {"last_rows", (PyCFunction)(void (*)(void))Ring_last_rows, METH_FASTCALL, "last_rows(end, lane, start, key, out)"},
    {"configure", (PyCFunction)Ring_configure, METH_VARARGS, "configure(pid, ctime, fd, lane, timeout[, stats_slot_offset, lane_stats_offset])"},
    {"close", (PyCFunction)Ring_close, METH_NOARGS, "close()"},
    {NULL},
};

static PyType_Slot Ring_slots[] = {
    {Py_tp_new, Ring_new},
    {Py_tp_dealloc, Ring_dealloc},
    {Py_tp_methods, Ring_methods},
    {Py_tp_doc, "The native write and gather paths over one mapped segment."},
    {0, NULL},
};

static PyType_Spec Ring_spec = {"shmbuf._native.Ring", sizeof(Ring), 0, Py_TPFLAGS_DEFAULT, Ring_slots};

/* ---- priority trees (shmbuf/priority.py), arrays of the segment's priority region ----- */

/* The two float64 tree arrays of 2P nodes (P a power of two, node 1 the root, leaf
 * P + slot) as writable buffers; -1 if not. */
static int tree_views(PyObject *sum, PyObject *mn, Py_buffer *sv, Py_buffer *mv, Py_ssize_t *P) {
    if (PyObject_GetBuffer(sum, sv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return -1;
    if (mn != NULL && PyObject_GetBuffer(mn, mv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(sv);
        return -1;
    }
    *P = sv->len / 16;
    if (*P < 1 || (*P & (*P - 1)) || sv->len != 16 * *P || (mn != NULL && mv->len != sv->len)) {
        PyErr_SetString(PyExc_ValueError, "priority trees: two float64 arrays of 2P nodes, P a power of two");
        PyBuffer_Release(sv);
        if (mn != NULL)
            PyBuffer_Release(mv);
        return -1;
    }
    return 0;
}

/* min where 0 means "no row" */
static inline double nonzero_min(double a, double b) { return a == 0 ? b : b == 0 ? a : a < b ? a : b; }

/* tree_set(sum, min, slots, values): leaves P + slots[i] of both trees to values[i]
 * (the last of repeated slots wins), then every ancestor of each from its two children,
 * bottom up. The caller holds the header lock and has made the version odd. */
static PyObject *tree_set(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "tree_set(sum, min, slots, values)");
        return NULL;
    }
    Py_buffer sv, mv, kv, vv;
    Py_ssize_t P;
    if (tree_views(args[0], args[1], &sv, &mv, &P) < 0)
        return NULL;
    PyObject *result = NULL;
    int64_t *node = NULL;
    int got = 0;
    if (PyObject_GetBuffer(args[2], &kv, PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    got = 1;
    if (PyObject_GetBuffer(args[3], &vv, PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    got = 2;
    Py_ssize_t k = kv.len / 8;
    if (vv.len != kv.len) {
        PyErr_SetString(PyExc_ValueError, "tree_set: slots and values differ in length");
        goto done;
    }
    double *sum = sv.buf, *mn = mv.buf;
    const int64_t *slots = kv.buf;
    const double *values = vv.buf;
    for (Py_ssize_t i = 0; i < k; i++)
        if (slots[i] < 0 || slots[i] >= P) {
            PyErr_SetString(PyExc_ValueError, "tree_set: a slot out of range");
            goto done;
        }
    /* 1. the leaves, in order (the last of repeated slots wins) */
    for (Py_ssize_t i = 0; i < k; i++)
        sum[P + slots[i]] = mn[P + slots[i]] = values[i];
    /* 2. their ancestors, a level at a time from the leaves' parents up (a node's
     * children are final before it is computed; a node shared by several leaves is
     * computed again, to the same value), each level's children fetched before any is
     * read: the cache misses of a level overlap. */
    if ((node = PyMem_Malloc((k + 1) * sizeof(int64_t))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < k; i++)
        node[i] = P + slots[i];
    for (Py_ssize_t width = P; width > 1; width /= 2) {
        for (Py_ssize_t i = 0; i < k; i++) {
            node[i] >>= 1;
            __builtin_prefetch(&sum[2 * node[i]]);
            __builtin_prefetch(&mn[2 * node[i]]);
        }
        for (Py_ssize_t i = 0; i < k; i++) {
            int64_t a = node[i];
            sum[a] = sum[2 * a] + sum[2 * a + 1];
            mn[a] = nonzero_min(mn[2 * a], mn[2 * a + 1]);
        }
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(node);
    if (got > 1)
        PyBuffer_Release(&vv);
    if (got > 0)
        PyBuffer_Release(&kv);
    PyBuffer_Release(&mv);
    PyBuffer_Release(&sv);
    return result;
}

/* tree_find(sum, u, out, leaf, seq, row): for each u[i] in [0, total), the leaf where
 * the sum tree's prefix sums reach it: from the root, go left if u < the left child's
 * sum, else subtract it and go right; out[i] = the leaf's slot (clamped below len(seq),
 * the capacity: rounding may pass the last row), leaf[i] its value, row[i] = seq[slot].
 * All descents go down a level together, each level's children fetched before any is
 * read (their cache misses overlap). Raw reads, no lock: the caller checks the tree's
 * version around it. */
static PyObject *tree_find(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "tree_find(sum, u, out, leaf, seq, row)");
        return NULL;
    }
    Py_buffer sv, uv, ov, lv, qv, rv;
    Py_ssize_t P;
    if (tree_views(args[0], NULL, &sv, NULL, &P) < 0)
        return NULL;
    PyObject *result = NULL;
    int got = 0;
    double *x = NULL;
    if (PyObject_GetBuffer(args[1], &uv, PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    got = 1;
    if (PyObject_GetBuffer(args[2], &ov, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto done;
    got = 2;
    if (PyObject_GetBuffer(args[3], &lv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto done;
    got = 3;
    if (PyObject_GetBuffer(args[4], &qv, PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    got = 4;
    if (PyObject_GetBuffer(args[5], &rv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto done;
    got = 5;
    Py_ssize_t n = uv.len / 8, capacity = qv.len / 8;
    if (ov.len != uv.len || lv.len != uv.len || rv.len != uv.len || capacity < 1 || capacity > P) {
        PyErr_SetString(PyExc_ValueError, "tree_find: arrays of different lengths");
        goto done;
    }
    if ((x = PyMem_Malloc((n + 1) * sizeof(double))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const double *sum = sv.buf, *u = uv.buf;
    int64_t *node = ov.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        node[i] = 1;
        x[i] = u[i];
    }
    for (Py_ssize_t width = 1; width < P; width *= 2) {
        for (Py_ssize_t i = 0; i < n; i++)
            __builtin_prefetch(&sum[2 * node[i]]);
        for (Py_ssize_t i = 0; i < n; i++) {
            double left = sum[2 * node[i]];
            int right = !(x[i] < left);          /* (NaN: right; any leaf is in range) */
            x[i] -= right ? left : 0.0;
            node[i] = 2 * node[i] + right;
        }
    }
    const int64_t *seq = qv.buf;
    int64_t *row = rv.buf;
    double *leaf = lv.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        node[i] -= P;
        if (node[i] >= capacity)
            node[i] = capacity - 1;
        __builtin_prefetch(&seq[node[i]]);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        leaf[i] = sum[P + node[i]];
        row[i] = seq[node[i]];
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(x);
    if (got > 4)
        PyBuffer_Release(&rv);
    if (got > 3)
        PyBuffer_Release(&qv);
    if (got > 2)
        PyBuffer_Release(&lv);
    if (got > 1)
        PyBuffer_Release(&ov);
    if (got > 0)
        PyBuffer_Release(&uv);
    PyBuffer_Release(&sv);
    return result;
}

static PyObject *set_hook(PyObject *module, PyObject *f) {
    Py_XDECREF(hook);
    hook = f == Py_None ? NULL : f;
    Py_XINCREF(hook);
    Py_RETURN_NONE;
}

static PyObject *set_faults(PyObject *module, PyObject *arg) {
    faults = PyLong_AsLong(arg);
    return faults == -1 && PyErr_Occurred() ? NULL : (Py_INCREF(Py_None), Py_None);
}

static PyMethodDef module_methods[] = {
    {"tree_set", (PyCFunction)(void (*)(void))tree_set, METH_FASTCALL, "tree_set(sum, min, slots, values)"},
    {"tree_find", (PyCFunction)(void (*)(void))tree_find, METH_FASTCALL, "tree_find(sum, u, out, leaf, seq, row)"},
    {"set_hook", set_hook, METH_O, "set_hook(f): call f(point) at protocol points (tests)"},
    {"set_faults", set_faults, METH_O, "set_faults(bits): 1 no stamp check, 2 no waiting (tests)"},
    {NULL},
};

static int exec_module(PyObject *m) {
    PyObject *t = PyType_FromSpec(&Ring_spec);
    if (t == NULL)
        return -1;
    if (PyModule_AddObject(m, "Ring", t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot module_slots[] = {{Py_mod_exec, exec_module}, {0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "shmbuf._native",
                                    "The native hot paths of shmbuf (see ring.py).", 0, module_methods,
                                    module_slots};

PyMODINIT_FUNC PyInit__native(void) { return PyModuleDef_Init(&module); }
