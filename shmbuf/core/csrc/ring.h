/* shmbuf/csrc/ring.h: what every part of shmbuf._native shares (one translation unit:
 * shmbuf/_native.c includes this, then its parts). The constants mirror layout.py and
 * counters.py (tests/core/test_native.py checks them); the inline helpers are the protocol's
 * steps that several parts take: a slot of a sequence number, a row's stamp, the
 * seqlock read of a row, the prefetch of windows' rows, waiting without the GIL. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <float.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>

/* Column indices of the int64 tables: layout.py (LANE_*, RES_*, TABLE_WIDTH, CONTROL ...). */
enum { LANE_HEAD = 0, LANE_BASE = 1, LANE_CLAIM_PID = 2, LANE_OWN_START = 4, LANE_OWN_COUNT = 5 };
enum { RES_PID = 0, RES_CTIME = 1, RES_LANE = 2, RES_START = 3, RES_COUNT = 4, RES_TOKEN = 5 };
enum { TABLE_WIDTH = 8, CTRL_LOCK_HOLDER = 0, MAX_FIELDS = 256 };
/* Sequence numbers a lane may reach (layout.py: MAX_SEQ): a head outside [0, MAX_SEQ] is
 * a segment shmbuf did not write, refused before anything is reserved. */
#define MAX_SEQ (((int64_t)1 << 62) - 1)  /* so every stamp, 2s + 2, fits an int64 */
/* The stats region (counters.py): per lane [pid, ctime, last write time], this handle's
 * slot [pid, ctime, batches, rows, retries, locks, lock wait ns, writes, redraws]. */
enum { LANE_STAT_WIDTH = 4, LS_PID = 0, LS_CTIME = 1, LS_TIME = 2, S_LOCKS = 5, S_LOCK_NS = 6, S_WRITES = 7 };

#define LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)

typedef struct {
    PyObject *name;          /* the key in a transition dict */
    PyObject *scalar_type;   /* numpy's scalar type of the dtype (np.float32, ...) */
    PyObject *dtype;         /* the dtype (arrays.c compares an array's with it) */
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
    int streams;             /* a field's rows are copied with streamed stores (streamed()) */
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
    int64_t *horizon;        /* a buffer file's, per lane [on disk, usable] (durable.py); NULL: none */
} Ring;

/* A buffer file's writes may not reserve past the lane's usable horizon, which is on the
 * disk before it is usable (shmbuf/core/durable.py): past it, Python moves it first. */
static inline int beyond_horizon(Ring *r, Py_ssize_t lane, int64_t end) {
    return r->horizon != NULL && end > LOAD_ACQ(&r->horizon[2 * lane + 1]);
}

static int64_t next_token = 0; /* unique per write in this process (with the pid) */
/* Rows this thread has published here (written with the GIL held, right after their even
 * stamps): a call that writes several rows tells by the difference how many of them an
 * exception (Ctrl-C) left written (ring.py: rows_published()). */
static __thread int64_t published_here = 0;
static PyObject *hook = NULL;   /* tests only: ring.set_hook(), called at protocol points */
/* Tests only (trace_steps()): the steps of this process's writes in the order they were
 * taken, one letter each: 'o' the odd stamps stored, 'F' a store fence (sfence), 'S' a
 * field's rows copied with streamed stores, 'c' with ordinary ones, 'e' the even stamps
 * stored, 'a' the stamps of an abandoned write zeroed. Off (-1) but while a test traces. */
static char steps[1 << 16];
static Py_ssize_t nsteps = -1;
static inline void step(char c) {
    if (nsteps >= 0 && nsteps < (Py_ssize_t)sizeof steps)
        steps[nsteps++] = c;
}
static long faults = 0;         /* tests only: protection broken on purpose (ring.py) */
enum { FAULT_NO_STAMP_CHECK = 1, FAULT_NO_WAIT = 2, FAULT_NO_SEGMENT_CHECK = 4 };

/* Call the test hook at `point` ("locked", "reserved", "writing", "published"): -1 if it raised. */
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

/* Copy n bytes with non-temporal stores where the machine has them (x86's SSE2): the
 * lines go to memory without being read first and without evicting what others cache.
 * For the frames of a ring larger than any cache, which nobody reads soon after they
 * are written (a sample reads a random row): a plain copy first reads every line it
 * overwrites, which doubles a writer's memory traffic and takes it from the learner.
 *
 * The stores are weakly ordered, outside x86's TSO (Intel SDM vol. 3A, 9.2.2: "writes
 * are not reordered with other writes, with the exception of streaming stores"): one
 * may become visible before an ordinary store that precedes it, or after one that
 * follows it. C11's fences do not cover them (on x86 a release fence emits no
 * instruction: TSO already orders ordinary stores). store_fence() is the x86 SFENCE:
 * every store before it, ordinary or streamed, is globally visible before any store
 * after it. A write that streams takes it twice (write.c, steps 3 and 5): after its odd
 * stamps, before its first streamed store, so that no streamed byte of the row can be
 * seen while the row's stamp still says "published" (a reader would take a torn row);
 * and after its last streamed store, before its even stamps, so that a reader who sees
 * the row published sees all of it. Elsewhere (no SSE2) nothing is streamed and
 * store_fence() is nothing: the C11 fences of write.c order the memcpy's stores. */
#if defined(__SSE2__)
#include <emmintrin.h>
static void copy_stream(char *dst, const char *src, Py_ssize_t n) {
    Py_ssize_t head = (Py_ssize_t)((16 - ((uintptr_t)dst & 15)) & 15);
    if (head > n)
        head = n;
    memcpy(dst, src, head);                  /* up to dst's first 16-byte boundary */
    dst += head, src += head, n -= head;
    for (; n >= 64; n -= 64, dst += 64, src += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)src), b = _mm_loadu_si128((const __m128i *)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + 32)), d = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(dst + 48), d);
    }
    memcpy(dst, src, n);                     /* the tail */
}
enum { STREAMS = 1 };
/* SFENCE, and a compiler barrier: no store of the C code moves across it either */
static inline void store_fence(void) {
    __asm__ __volatile__("sfence" ::: "memory");
    step('F');
}
#else
static void copy_stream(char *dst, const char *src, Py_ssize_t n) { memcpy(dst, src, n); }
enum { STREAMS = 0 };
static inline void store_fence(void) { }
#endif

/* Whether a field's rows are copied with copy_stream: rows of their own (frames), in
 * lanes of more than 64 MiB of that field (past any cache), at least 4 kB a row. */
static inline int streamed(const Ring *r, const Field *fd) {
    return fd->stride == fd->row_bytes && fd->row_bytes >= 4096 && fd->row_bytes * r->lc > ((Py_ssize_t)64 << 20);
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

/* ---- the validation fast path ------------------------------------------------------ */

/* 0 if a method may run with these arguments (ok: their types are as expected), else
 * -1 with TypeError naming the usage. (A closed handle: GUARDED, in _native.c.) */
static int usable(Ring *r, int ok, const char *usage) {
    (void)r;
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "expected %s", usage);
        return -1;
    }
    return 0;
}

/* A gather's answer (gather, reduce_windows): None if every window counted (no `bad`
 * one), else the verdict bytes (1: the window counts). */
static PyObject *verdicts(PyObject *bytes, Py_ssize_t bad) {
    if (bad)
        return bytes;
    Py_DECREF(bytes);
    Py_RETURN_NONE;
}

/* The seqlock read of row s (its stamp at `stamp`), in two steps around the copies of
 * its fields: read_begin acquires the stamp and says whether it names row s published;
 * read_end fences (no copy load moves past it) and says whether the stamp is unchanged.
 * A row read between the two, both true, is exactly row s. */
static inline int read_begin(const int64_t *stamp, int64_t s, int64_t *before) {
    *before = LOAD_ACQ(stamp);
    return *before == 2 * s + 2 || (faults & FAULT_NO_STAMP_CHECK);
}

static inline int read_end(const int64_t *stamp, int64_t before) {
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return LOAD(stamp) == before || (faults & FAULT_NO_STAMP_CHECK);
}

/* Ask for every line of the rows of windows [from, to) of `length` rows at first[w] of
 * lane lanes[w] (or one_lane): a random row of a large ring misses the caches and the
 * TLB, and prefetches let those misses overlap instead of waiting one by one. */
static inline void prefetch_windows(Ring *r, const int64_t *first, const int64_t *lanes,
                                    Py_ssize_t one_lane, Py_ssize_t from, Py_ssize_t to, Py_ssize_t length) {
    for (Py_ssize_t w = from; w < to; w++) {
        Py_ssize_t lane = lanes ? lanes[w] : one_lane, at = slot_of(r, 0, first[w]);
        for (Py_ssize_t j = 0; j < length; j++, at = at + 1 == r->lc ? 0 : at + 1) {
            const char *row = (const char *)stamp_of(r, lane * r->lc + at);
            /* every line the row touches: from its first line to the one of its last byte */
            for (uintptr_t b = (uintptr_t)row & ~(uintptr_t)63; b < (uintptr_t)row + r->row_stride; b += 64)
                __builtin_prefetch((const char *)b);
        }
    }
}

/* A gather's prefetch, called before it copies window w of n: at w = 0 the first
 * windows, then window w + ahead, `ahead` being 32 rows' worth of windows. Measured
 * (2-core EPYC, 1M rows of 176 bytes, a batch of 256): every row asked for at once
 * before the copy, 28 us (requests beyond the few a core tracks wait, and the first
 * rows' lines are gone again by their copy); 8 rows ahead 17 us, 32 rows 16 us, 64 18. */
static inline void prefetch_before(Ring *r, const int64_t *first, const int64_t *lanes,
                                   Py_ssize_t one_lane, Py_ssize_t w, Py_ssize_t n, Py_ssize_t length) {
    Py_ssize_t ahead = length < 32 ? 32 / length : 1;
    if (w == 0)
        prefetch_windows(r, first, lanes, one_lane, 0, ahead < n ? ahead : n, length);
    if (w + ahead < n)
        prefetch_windows(r, first, lanes, one_lane, w + ahead, w + ahead + 1, length);
}
