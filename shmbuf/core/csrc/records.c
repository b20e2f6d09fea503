/* shmbuf._native: the records of ragged rows (shmbuf/core/arena.py): the copies of
 * their bytes, out of the arena (a reader) and into it (a writer). The protocol around
 * them (H stored under the lock before a byte is written; the heads read again after the
 * copies) stays in arena.py, which calls these two in the middle of its steps; the
 * pure-Python loops there (read_python, write_python) give the same bytes. Both are
 * methods of the Ring (its guard keeps the segment mapped while one copies without the
 * GIL and another thread closes the handle); the arena is given as its byte offset in
 * the segment, checked to lie inside it.
 *
 * A record word is (lane, pos, length of each ragged dimension...), int64. A record is
 * its fields' values one after the other, each padded to 8 bytes, at byte pos % A of its
 * lane's arena of A bytes, never across the arena's end. Every word is checked before
 * anything is copied: a word that does not fit the arena (or an output) is an error,
 * never an access outside the buffers (the Python side checks words first; these checks
 * keep the C safe whatever it is given). */

enum { RECORD_PAD = 8, RECORD_MAX_FIELDS = 64, RECORD_NOGIL_BYTES = 1 << 16 };

/* A list's or tuple's length (-1, an error set, if it is neither: `what` says what it
 * should be) and its items, borrowed (the limited API has no PySequence_Fast_GET_ITEM). */
static Py_ssize_t record_len(PyObject *seq, const char *what) {
    if (PyList_Check(seq))
        return PyList_Size(seq);
    if (PyTuple_Check(seq))
        return PyTuple_Size(seq);
    PyErr_Format(PyExc_TypeError, "records: %s must be a list or a tuple", what);
    return -1;
}

static inline PyObject *record_item(PyObject *seq, Py_ssize_t i) {
    return PyList_Check(seq) ? PyList_GetItem(seq, i) : PyTuple_GetItem(seq, i);
}

typedef struct {
    Py_ssize_t dim;   /* its dimension's index in the word's lengths */
    int64_t elem;     /* bytes per element (prod(trailing) * itemsize) */
} RecField;

/* fields: a sequence of (dim, element bytes); width: words per record word (2 + dims). */
static int record_fields(PyObject *spec, Py_ssize_t width, RecField *f, Py_ssize_t *nf) {
    Py_ssize_t n = record_len(spec, "fields");
    if (n < 0)
        return -1;
    int ok = n >= 1 && n <= RECORD_MAX_FIELDS;
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        ok = PyArg_ParseTuple(record_item(spec, i), "nL", &f[i].dim, &f[i].elem)
             && f[i].dim >= 0 && f[i].dim < width - 2 && f[i].elem >= 1;
    }
    if (!ok) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "records: 1 to 64 fields (dim, element bytes), each dim a length of the word");
        return -1;
    }
    *nf = n;
    return 0;
}

/* The bytes of field f of a record whose word is w (its length times the element's),
 * checked: -1 if the length is negative or the product overflows. */
static inline int64_t field_bytes(const int64_t *w, const RecField *f) {
    int64_t len = w[2 + f->dim], bytes;
    if (len < 0 || __builtin_mul_overflow(len, f->elem, &bytes))
        return -1;
    return bytes;
}

/* The byte where the record of word w starts in its lane's arena (pos % A), if the word
 * fits: a lane below `lanes` (lanes < 0: the caller's one lane), pos >= 0, and its
 * fields, each padded to 8 bytes, inside the arena's A bytes from there (as
 * Arena.reserve places records). -1 if not. */
static int64_t record_at(const int64_t *w, const RecField *f, Py_ssize_t nf, int64_t lanes, int64_t A) {
    if ((lanes >= 0 && (w[0] < 0 || w[0] >= lanes)) || w[1] < 0)
        return -1;
    int64_t at = w[1] % A, end = at;
    for (Py_ssize_t k = 0; k < nf; k++) {
        int64_t b = field_bytes(w, &f[k]);
        if (b < 0 || b > A)
            return -1;
        end += (b + RECORD_PAD - 1) / RECORD_PAD * RECORD_PAD;  /* (end <= 2A + 7 here: no overflow) */
        if (end > A)
            return -1;
    }
    return at;
}

/* The words as (n, width) int64 rows: n, or -1 (an error set). */
static Py_ssize_t record_words(PyObject *obj, Py_buffer *wv, Py_ssize_t width) {
    if (width < 3) {
        PyErr_SetString(PyExc_ValueError, "records: a record word holds at least 3 int64");
        return -1;
    }
    if (PyObject_GetBuffer(obj, wv, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (wv->len % (8 * width) || ((uintptr_t)wv->buf) % 8) {
        PyErr_SetString(PyExc_ValueError, "records: the words must be an aligned C-contiguous int64 array (n, width)");
        PyBuffer_Release(wv);
        return -1;
    }
    return wv->len / (8 * width);
}

/* The arena of `bytes` bytes at byte `offset` of the segment; NULL (an error set) if it
 * does not lie inside it. */
static unsigned char *arena_at(Ring *r, Py_ssize_t offset, int64_t bytes) {
    if (offset < 0 || bytes < 0 || offset > r->mem.len || bytes > r->mem.len - offset) {
        PyErr_SetString(PyExc_ValueError, "records: the arena lies outside the segment");
        return NULL;
    }
    return (unsigned char *)r->base + offset;
}

/* ring.records_read(words, width, arena, A, fields, outs): a reader's copies. words: the
 * checked record words (n, width) of the rows a sampler returned; arena: the byte offset
 * in the segment of every lane's arena, lanes x A bytes; fields: per ragged field (record order) (dim, element bytes);
 * outs: per field (values: a writable C-contiguous buffer, offsets: int64, n + 1 or more:
 * where each row starts in values, in elements). Copies row i's bytes of each field to
 * values at offsets[i] * element bytes; releases the GIL while it copies a lot. Returns
 * None. The caller then reads each lane's head again (the seqlock's second read): the
 * acquire fence at the end keeps these loads before it. */
static PyObject *Ring_records_read_impl(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6)
        return PyErr_Format(PyExc_TypeError, "records_read(words, width, arena, A, fields, outs)");
    Py_ssize_t width = PyLong_AsSsize_t(args[1]), offset = PyLong_AsSsize_t(args[2]);
    int64_t A = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    RecField f[RECORD_MAX_FIELDS];
    Py_ssize_t nf = 0, n, nouts = 0;
    Py_buffer wv, bufs[2 * RECORD_MAX_FIELDS];
    PyObject *result = NULL, *outs = args[5];
    const unsigned char *arena;
    if (A < RECORD_PAD || A > r->mem.len) {
        PyErr_SetString(PyExc_ValueError, "records_read: an arena of A >= 8 bytes a lane");
        return NULL;
    }
    if ((arena = arena_at(r, offset, r->lanes * A)) == NULL || record_fields(args[4], width, f, &nf) < 0
        || (n = record_words(args[0], &wv, width)) < 0)
        return NULL;
    Py_ssize_t nout = record_len(outs, "outs");
    if (nout < 0)
        goto done;
    if (nout != nf) {
        PyErr_SetString(PyExc_ValueError, "records_read: one (values, offsets) per field");
        goto done;
    }
    for (; nouts < nf; nouts++) {  /* 0. the outputs: buffers held until the end */
        PyObject *vals, *offs;
        if (!PyArg_ParseTuple(record_item(outs, nouts), "OO", &vals, &offs))
            goto done;
        if (PyObject_GetBuffer(vals, &bufs[2 * nouts], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
            goto done;
        if (PyObject_GetBuffer(offs, &bufs[2 * nouts + 1], PyBUF_C_CONTIGUOUS) < 0) {
            PyBuffer_Release(&bufs[2 * nouts]);
            goto done;
        }
        if (bufs[2 * nouts + 1].len < 8 * (n + 1) || ((uintptr_t)bufs[2 * nouts + 1].buf) % 8) {
            PyErr_SetString(PyExc_ValueError, "records_read: offsets must be aligned int64, n + 1 of them");
            nouts++;
            goto done;
        }
    }
    const int64_t *words = wv.buf, lanes = r->lanes;
    int64_t total = 0;
    /* 1. every word checked (its record inside its lane's arena, each field's bytes
     * inside its output) before anything is copied */
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t *w = words + i * width;
        if (record_at(w, f, nf, lanes, A) < 0) {
            PyErr_Format(PyExc_ValueError, "records_read: row %zd's record word does not fit the arena", i);
            goto done;
        }
        for (Py_ssize_t k = 0; k < nf; k++) {
            int64_t b = field_bytes(w, &f[k]), o = ((const int64_t *)bufs[2 * k + 1].buf)[i], start;
            if (o < 0 || __builtin_mul_overflow(o, f[k].elem, &start) || start > bufs[2 * k].len
                || b > bufs[2 * k].len - start) {
                PyErr_Format(PyExc_ValueError, "records_read: row %zd of field %zd does not fit its output", i, k);
                goto done;
            }
            total += b;
        }
    }
    /* 2. the copies (the bytes may change meanwhile: a writer that covers them has moved
     * H first, and the caller's check after this refuses the row) */
    PyThreadState *ts = total > RECORD_NOGIL_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t *w = words + i * width;
        const unsigned char *src = arena + w[0] * A + w[1] % A;
        for (Py_ssize_t k = 0; k < nf; k++) {
            int64_t b = field_bytes(w, &f[k]);
            if (b)
                memcpy((char *)bufs[2 * k].buf + ((const int64_t *)bufs[2 * k + 1].buf)[i] * f[k].elem, src, b);
            src += (b + RECORD_PAD - 1) / RECORD_PAD * RECORD_PAD;
        }
    }
    /* 3. the copies' loads before the caller's loads of the heads (the seqlock's order) */
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (ts != NULL)
        PyEval_RestoreThread(ts);
    Py_INCREF(Py_None);
    result = Py_None;
done:
    for (Py_ssize_t k = 0; k < nouts; k++) {
        PyBuffer_Release(&bufs[2 * k]);
        PyBuffer_Release(&bufs[2 * k + 1]);
    }
    PyBuffer_Release(&wv);
    return result;
}

/* ring.records_write(words, width, arena, A, fields, values, skip, hook): a writer's
 * copies (its slots stamped odd, H already moved past its records under the lock).
 * words: the write's record words (n, width), their pos placed by Arena.reserve; arena:
 * the byte offset in the segment of the lane's arena of A bytes; fields as records_read's; values: per field a sequence of
 * C-contiguous arrays, one per row of the write from `skip` on (row i's: values[k][skip
 * + i], exactly its word's bytes); hook: None, or called as hook("record") after the
 * first field of each record (tests: a writer stopped there leaves it half-written). Every word and every value is checked before a byte is
 * written. Returns None. */
static PyObject *Ring_records_write_impl(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8)
        return PyErr_Format(PyExc_TypeError, "records_write(words, width, arena, A, fields, values, skip, hook)");
    Py_ssize_t width = PyLong_AsSsize_t(args[1]), offset = PyLong_AsSsize_t(args[2]);
    Py_ssize_t skip = PyLong_AsSsize_t(args[6]);
    int64_t A = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *hook_ = args[7] == Py_None ? NULL : args[7];
    RecField f[RECORD_MAX_FIELDS];
    Py_ssize_t nf = 0, n, held = 0;
    Py_buffer wv, *src = NULL;
    PyObject *result = NULL, *rows[RECORD_MAX_FIELDS] = {NULL};
    unsigned char *arena;
    if (A < RECORD_PAD || skip < 0) {
        PyErr_SetString(PyExc_ValueError, "records_write: a lane's arena of A >= 8 bytes, skip >= 0");
        return NULL;
    }
    if ((arena = arena_at(r, offset, A)) == NULL || record_fields(args[4], width, f, &nf) < 0
        || (n = record_words(args[0], &wv, width)) < 0)
        return NULL;
    PyObject *values = args[5];
    Py_ssize_t m = record_len(values, "values");
    int fits = m == nf;
    for (Py_ssize_t k = 0; fits && k < nf; k++) {  /* (borrowed: the caller holds them) */
        rows[k] = record_item(values, k);
        fits = (m = record_len(rows[k], "a field's rows")) >= 0 && m >= skip + n;
    }
    if (!fits) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "records_write: per field, the values of every row of the words");
        goto done;
    }
    if (n > 0 && (src = PyMem_Malloc(n * nf * sizeof(Py_buffer))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *words = wv.buf;
    int64_t total = 0;
    /* 1. every word checked (lanes < 0: its lane is the arena's, not checked), every
     * value's bytes exactly its word's, all held until the end */
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t *w = words + i * width;
        if (record_at(w, f, nf, -1, A) < 0) {
            PyErr_Format(PyExc_ValueError, "records_write: row %zd's record word does not fit the arena", i);
            goto done;
        }
        for (Py_ssize_t k = 0; k < nf; k++) {
            if (PyObject_GetBuffer(record_item(rows[k], skip + i), &src[held], PyBUF_C_CONTIGUOUS) < 0)
                goto done;
            int64_t b = field_bytes(w, &f[k]);
            if (src[held++].len != b) {
                PyErr_Format(PyExc_ValueError, "records_write: row %zd of field %zd holds %zd bytes, its word says %lld",
                             i, k, src[held - 1].len, (long long)b);
                goto done;
            }
            total += b;
        }
    }
    /* 2. the copies, record by record (the GIL let go of for large ones, unless a test
     * hook is called mid-record) */
    PyThreadState *ts = hook_ == NULL && total > RECORD_NOGIL_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char *dst = arena + words[i * width + 1] % A;
        for (Py_ssize_t k = 0; k < nf; k++) {
            const Py_buffer *s = &src[i * nf + k];
            if (s->len)
                memcpy(dst, s->buf, s->len);
            dst += (s->len + RECORD_PAD - 1) / RECORD_PAD * RECORD_PAD;
            if (hook_ != NULL && k == 0) {
                PyObject *r = PyObject_CallFunction(hook_, "s", "record");
                if (r == NULL)
                    goto done;
                Py_DECREF(r);
            }
        }
    }
    if (ts != NULL)
        PyEval_RestoreThread(ts);
    Py_INCREF(Py_None);
    result = Py_None;
done:
    for (Py_ssize_t j = 0; j < held; j++)
        PyBuffer_Release(&src[j]);
    PyMem_Free(src);
    PyBuffer_Release(&wv);
    return result;
}
