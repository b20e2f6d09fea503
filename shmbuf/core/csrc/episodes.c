/* shmbuf._native: what shmbuf.episodes reads (n-step windows that stop at an episode's
 * end, the search for an episode's last row). */

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
    for (Py_ssize_t w = 0; w < m; w++) {
        prefetch_before(r, first, lanes, one_lane, w, m, n + 1);  /* 0. rows ahead: their lines */
        Py_ssize_t lane = lanes ? lanes[w] : one_lane, at = slot_of(r, 0, first[w]);
        int64_t key0 = 0;
        double sum = 0.0, g = 1.0;
        Py_ssize_t k = n;
        unsigned char lastf = 0;
        ok[w] = 0;
        for (Py_ssize_t j = 0; j <= k; j++, at = at + 1 == r->lc ? 0 : at + 1) {
            int64_t s = first[w] + j, kj;
            Py_ssize_t slot = lane * r->lc + at;
            int64_t *stamp = stamp_of(r, slot), before;
            if (!read_begin(stamp, s, &before))   /* 1. the row it names, acquired */
                break;
            const char *base = r->base;           /* 2. read: key, flag, value; copies */
            memcpy(&kj, base + fk->offset + slot * fk->stride, 8);
            unsigned char fj = *(const unsigned char *)(base + ff->offset + slot * ff->stride);
            double vj = j < k ? as_double(fval, base + fval->offset + slot * fval->stride) : 0.0;
            if (j == 0 || j == k)
                for (Py_ssize_t c = j == 0 ? 0 : ntodo0; c < (j == 0 ? ntodo0 : ntodo); c++)
                    copy(todo[c].dst + w * todo[c].bytes, base + todo[c].offset + slot * todo[c].stride,
                         todo[c].bytes);
            if (!read_end(stamp, before))         /* 3-4. fenced: unchanged? */
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
    result = verdicts(result, bad);
done:
#undef VIEW
    while (nviews--)
        PyBuffer_Release(&views[nviews]);
    return result;
}

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
