/* shmbuf._native: the two hot paths of shmbuf's ring in C, over the same segment.
 *
 *   write: validate the common case, reserve, stamp odd, copy, stamp even, free the entry
 *   gather: copy rows by sequence number with the seqlock check
 *
 * The protocol is the one described at the top of ring.py (stamps 2s+1 / 2s+2, the
 * reservation entry before the head, lanes owned by one process written without the
 * lock); shmbuf/core/ring.py and shmbuf/core/gather.py are the pure-Python path. Both run on
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
 * Frames copied with x86's streamed stores (csrc/ring.h: copy_stream) are outside
 * those fences: a write that streams also takes an SFENCE after its odd stamps and
 * another before its even ones (csrc/write.c, steps 3 and 5).
 * The GIL is held from the first check to the last store of a write, except while
 * waiting (for the lock, or for an older writer of the same slots).
 *
 * One translation unit in parts, by concern (read them in this order):
 *   csrc/ring.h      the constants (layout.py, counters.py), the Ring's state, the shared
 *                    steps: slot of a sequence number, the seqlock read, prefetching
 *   csrc/lock.c      the header lock
 *   csrc/cast.c      the common casts of incoming values (float64 -> float32, ...)
 *   csrc/arrays.c    a numpy array's data and shape read from the object (checked once)
 *   csrc/write.c     reserving, waiting for older writers, stamping, copying, publishing
 *   csrc/gather.c    drawing windows and copying them with the seqlock check
 *   csrc/episodes.c  n-step windows that stop at an episode's end; an episode's last row
 *   csrc/trees.c     the priority trees
 *   csrc/records.c   the copies of ragged rows' records into and out of the arena (arena.py)
 *   _native.c        the Ring object (its lifetime, the guard of every method) and the module
 */
#include "csrc/ring.h"
#include "csrc/lock.c"
#include "csrc/cast.c"
#include "csrc/arrays.c"
#include "csrc/write.c"
#include "csrc/gather.c"
#include "csrc/episodes.c"
#include "csrc/trees.c"
#include "csrc/records.c"

/* ---- the Ring object --------------------------------------------------------------- */

/* configure(pid, ctime, fd, default_lane, timeout[, slot, lane stats, horizon]): this
 * process's identity and the handle's defaults (again after a fork, a claim, a new
 * timeout), and where its counters and a buffer file's horizon are. */
static PyObject *Ring_configure(Ring *r, PyObject *args) {
    long long pid;
    Py_ssize_t slot_off = -1, lanes_off = -1, horizon_off = -1;  /* byte offsets; -1: none */
    if (!PyArg_ParseTuple(args, "Ldind|nnn", &pid, &r->ctime, &r->fd, &r->default_lane, &r->timeout,
                          &slot_off, &lanes_off, &horizon_off))
        return NULL;
    if (horizon_off >= 0 && (horizon_off % 8 || horizon_off + 16 * r->lanes > r->mem.len)) {
        PyErr_SetString(PyExc_ValueError, "horizon outside the segment");
        return NULL;
    }
    r->horizon = horizon_off >= 0 ? (int64_t *)(r->base + horizon_off) : NULL;
    Py_ssize_t words = 9;                       /* a slot is 9 int64 (counters.py) */
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
GUARDED(Ring_records_read)
GUARDED(Ring_records_write)

static void free_fields(Ring *r) {
    for (int i = 0; r->fields && i < r->nfields; i++) {
        Py_XDECREF(r->fields[i].name);
        Py_XDECREF(r->fields[i].scalar_type);
        Py_XDECREF(r->fields[i].dtype);
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
 * fields = [(name, scalar_type, offset, stride, row_bytes, itemsize, shape, format, kind, dtype)]. */
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
        PyObject *dtype;
        if (!PyArg_ParseTuple(PyList_GetItem(fields, i), "UOnnnnO!OCO", &name, &st, &f->offset,
                              &f->stride, &f->row_bytes, &f->itemsize, &PyTuple_Type, &shape,
                              &format, &kind, &dtype))
            goto fail;
        Py_INCREF(dtype);
        f->dtype = dtype;
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
    for (int i = 0; i < r->nfields; i++)
        r->streams |= STREAMS && streamed(r, &r->fields[i]);
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
    {"records_read", (PyCFunction)(void (*)(void))Ring_records_read, METH_FASTCALL,
     "records_read(words, width, arena, A, fields, outs): copy the records of rows out of the arena"},
    {"records_write", (PyCFunction)(void (*)(void))Ring_records_write, METH_FASTCALL,
     "records_write(words, width, arena, A, fields, values, skip, hook): copy a write's values into its records"},
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

/* ---- the module --------------------------------------------------------------------- */

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

/* trace_steps(on): the steps of this process's writes since the last call (ring.h: step),
 * as a str; from now on recorded if on. Tests only. */
static PyObject *trace_steps(PyObject *module, PyObject *on) {
    int yes = PyObject_IsTrue(on);
    if (yes < 0)
        return NULL;
    PyObject *got = PyUnicode_FromStringAndSize(steps, nsteps > 0 ? nsteps : 0);
    nsteps = yes ? 0 : -1;
    return got;
}

/* published(): the rows this thread has published on the native path (ring.h). */
static PyObject *published(PyObject *module, PyObject *unused) {
    return PyLong_FromLongLong(published_here);
}

static PyMethodDef module_methods[] = {
    {"tree_set", (PyCFunction)(void (*)(void))tree_set, METH_FASTCALL, "tree_set(sum, min, slots, values)"},
    {"tree_find", (PyCFunction)(void (*)(void))tree_find, METH_FASTCALL, "tree_find(sum, u, out, leaf, seq, row)"},
    {"set_hook", set_hook, METH_O, "set_hook(f): call f(point) at protocol points (tests)"},
    {"probe_arrays", (PyCFunction)(void (*)(void))probe_arrays, METH_FASTCALL,
     "probe_arrays(a, b, address, dtype): read numpy arrays from their objects if this numpy lays them out as expected"},
    {"set_faults", set_faults, METH_O, "set_faults(bits): 1 no stamp check, 2 no waiting (tests)"},
    {"published", published, METH_NOARGS, "published(): rows this thread has published on the native path"},
    {"trace_steps", trace_steps, METH_O, "trace_steps(on): the steps of the writes since the last call (tests)"},
    {NULL},
};

static int exec_module(PyObject *m) {
    if (PyModule_AddIntConstant(m, "STREAMS", STREAMS) < 0)  /* copy_stream streams here */
        return -1;
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
