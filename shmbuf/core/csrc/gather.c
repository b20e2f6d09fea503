/* shmbuf._native: drawing and gathering windows (core/gather.py: draw_windows, copy_windows). */

/* ---- gathering ---------------------------------------------------------------------- */

/* draw(u, length, first, lane): windows of `length` rows drawn uniformly over every
 * lane's current rows, as gather.py's draw_windows computes them with numpy: window
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
 * stamps are checked all the same. Returns None if every window is intact, else bytes,
 * one verdict per window (with per_row true: per row, n * length): INTACT; TORN, a
 * row changed during its copy; or REDRAW, not torn but not to be used (a row not yet
 * published or no longer there, a filter said no, drawn before a clear).
 * (gather.py: copy_windows.) */
enum { TORN = 0, INTACT = 1, REDRAW = 2 };
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
    for (Py_ssize_t w = 0; w < n; w++) {
        prefetch_before(r, first, lanes, one_lane, w, n, length);  /* 0. rows ahead: their lines */
        Py_ssize_t lane = lanes ? lanes[w] : one_lane, at = slot_of(r, 0, first[w]);
        int64_t key0 = 0;                            /* row 0's value of field `same` */
        win = per_row ? ok + w * length : ok + w;    /* where this window's verdicts go */
        *win = INTACT;
        for (Py_ssize_t j = 0; j < length; j++, at = at + 1 == r->lc ? 0 : at + 1) {
            int64_t s = first[w] + j;
            Py_ssize_t slot = lane * r->lc + at;
            Py_ssize_t row = by_pos ? w : w * length + j;    /* its index in the outputs */
            int64_t *stamp = stamp_of(r, slot), before;
            int named = read_begin(stamp, s, &before);   /* 1. the row it names, acquired */
            if (per_row)
                win[j] = INTACT;
            if (!named) {                              /* not yet published, or no longer there */
                win[per_row ? j : 0] = REDRAW;
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
            if (!read_end(stamp, before)) {            /* 3-4. fenced: unchanged? */
                win[per_row ? j : 0] = TORN;
                if (per_row)
                    continue;
                break;
            }
            /* 4b. The filters, on values known intact: a row whose `same` field differs
             * from row 0's, a window whose row 0 has a `skip` bit, does not count. */
            if (j == 0)
                key0 = key;
            if (((same >= 0 && key != key0) || (flag & skip_mask)) && !(faults & FAULT_NO_SEGMENT_CHECK)) {
                win[per_row ? j : 0] = REDRAW;
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
            if (*v == INTACT && first[w] + j < base)
                *v = REDRAW;
            bad += *v != INTACT;
        }
    }
    if (ts)
        PyEval_RestoreThread(ts);
    result = verdicts(result, bad);
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
