/* shmbuf._native: writing (ring.py: Ring.put and what it waits for). */

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
    if (fd->stride == fd->row_bytes) {                      /* a field of its own: one copy */
        if (streamed(r, fd)) {
            copy_stream(d, s, (to - from) * fd->row_bytes);
            step('S');
        } else {
            memcpy(d, s, (to - from) * fd->row_bytes);
            step('c');
        }
    } else {
        step('c');
        for (Py_ssize_t i = from; i < to; i++, s += fd->row_bytes, d += fd->stride)
            copy(d, s, fd->row_bytes);                     /* packed: a row at a time */
    }
}

/* Ask for the lines of the rows of slots [first, first + n) of a lane (their stamps and
 * packed fields) to be brought into the cache for writing, all at once, at most the
 * first 16 kB of them (a longer write is a stream the hardware prefetches, and more
 * would evict what was asked for first): a write into a ring larger than the caches
 * misses on each line it touches, and misses asked for together overlap instead of
 * being waited for one row at a time (64 mujoco rows of 176 bytes: 176 lines; the C
 * call 4.7 -> 3.1 us on a 1M-row ring, docs/performance.md). A hint only: a prefetch
 * changes nothing the program sees, and never faults. */
static inline void prefetch_for_write(Ring *r, Py_ssize_t lane, int64_t first, Py_ssize_t n) {
    Py_ssize_t at = slot_of(r, 0, first), k = r->lc - at < n ? r->lc - at : n, budget = 16384;
    for (int part = 0; part < 2 && budget > 0; part++) {  /* up to the lane's end, then its start */
        const char *lo = (const char *)stamp_of(r, lane * r->lc + (part ? 0 : at));
        Py_ssize_t bytes = (part ? n - k : k) * r->row_stride;
        bytes = bytes < budget ? bytes : budget;
        budget -= bytes;
        for (uintptr_t b = (uintptr_t)lo & ~(uintptr_t)63; b < (uintptr_t)lo + bytes; b += 64)
            __builtin_prefetch((const char *)b, 1);
    }
}

/* Write n rows into lane: src[f] points at n contiguous rows of field f. Returns 0 when
 * published, 1 when the Python path must take over (nothing was changed), -1 on an
 * error (exception set; anything reserved was abandoned: never sampled). */
/* 0. A learner copying a large batch asks writers to wait (shmbuf/core/yielding.py):
 * ctrl[CTRL_YIELD] says until when, in CLOCK_MONOTONIC ns (0: nobody asks). A writer
 * looks before it reserves and before each field it copies, and waits (without the GIL)
 * until the mark is cleared or passes, never past its deadline and at most *budget ns in
 * all its write (20 ms): a learner that died while it copied holds a write up once.
 * Before the reservation a wait sees Ctrl-C (-1, nothing reserved); inside the copy it
 * does not (the write finishes, as it would without the wait, at most 20 ms later). */
static int yield_to_learner(Ring *r, double deadline, int64_t *budget, int signals) {
    int64_t mark = LOAD(&r->ctrl[CTRL_YIELD]), until = mark;
    if (mark == 0 || *budget <= 0)
        return 0;
    struct timespec ts, pause = {0, 50000};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t t = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec, t0 = t;
    if (until > t + *budget)
        until = t + *budget;
    if (deadline * 1e9 < (double)until)       /* (compared as doubles: a deadline may be inf) */
        until = (int64_t)(deadline * 1e9);
    if (t < until)
        step('y');
    while (t < until && LOAD(&r->ctrl[CTRL_YIELD]) == mark) {  /* (this copy only: not the next) */
        Py_BEGIN_ALLOW_THREADS
        nanosleep(&pause, NULL);
        Py_END_ALLOW_THREADS
        if (signals && PyErr_CheckSignals() < 0)
            return -1;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        t = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    }
    *budget -= t - t0;
    return 0;
}

static int write_rows(Ring *r, Py_ssize_t lane, Py_ssize_t n, const char **src, double timeout) {
    double deadline = now() + timeout;
    int64_t budget = 20000000;                /* ns this write may wait for learners */
    if (yield_to_learner(r, deadline, &budget, 1) < 0)
        return -1;
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
                char secs[32];              /* (PyErr_Format has no %g) */
                snprintf(secs, sizeof secs, "%g", timeout);
                PyErr_Format(r->write_timeout, "lane %zd: another thread of this process is "
                             "still writing to it after %s s", lane, secs);
                return -1;
            }
            if (pause_for(r, &delay) < 0)
                return -1;
        }
        first = LOAD(&lt[LANE_HEAD]);
        if (check_head(r, lane, first, n) < 0)
            return -1;
        if (beyond_horizon(r, lane, first + n))
            return 1;                         /* nothing reserved: Python moves the horizon */
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
        if (beyond_horizon(r, lane, first + n)) {
            unlock(r);                        /* nothing reserved: Python moves the horizon */
            return 1;
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
    if (n > 1)                            /* (one row: measured no better, or worse) */
        prefetch_for_write(r, lane, first, n);

    /* 2. Wait for older writers of our slots (only a ring that wraps onto them). */
    if (first + n > r->lc && !(faults & FAULT_NO_WAIT) &&
        wait_for_older(r, lane, first, n, e ? (e - r->res_tab) / TABLE_WIDTH : -1, deadline) < 0)
        goto abandon;

    /* 3. Stamp the slots odd ("being written"), then fence: no data store may become
     * visible before them (a reader who copied a byte of ours then finds the stamp
     * changed). The release fence orders the ordinary stores of the copy (on x86 it
     * emits nothing: TSO keeps stores in order; on ARM a DMB); streamed stores are
     * outside that order, so a write that streams also takes an SFENCE here: the odd
     * stamps are globally visible before any streamed byte (ring.h: copy_stream). */
    for (Py_ssize_t i = 0; i < n; i++)
        STORE(stamp_of(r, slot_of(r, lane, first + i)), 2 * (first + i) + 1);
    step('o');
    __atomic_thread_fence(__ATOMIC_RELEASE);
    if (r->streams)
        store_fence();

    /* 4. Copy: up to the end of the lane, then what wraps to its start. */
    Py_ssize_t k = r->lc - slot_of(r, 0, first);
    if (k > n)
        k = n;
    for (int f = 0; f < r->nfields; f++) {
        if (f > 0)
            yield_to_learner(r, deadline, &budget, 0);
        copy_rows(r, &r->fields[f], lane, first, 0, k, src[f]);
        if (k < n)
            copy_rows(r, &r->fields[f], lane, first, k, n, src[f]);
        if (at("writing") < 0) {
            /* abandon: these rows will never be valid. Our streamed bytes land first
             * (SFENCE): once our entry is free, the next writer of these slots may
             * write them, and a late byte of ours must not land over its row. */
            if (r->streams)
                store_fence();
            for (Py_ssize_t i = 0; i < n; i++)
                STORE_REL(stamp_of(r, slot_of(r, lane, first + i)), 0);
            step('a');
            goto abandon;
        }
    }

    /* 5. Publish: even stamps, each a release store (the ordinary stores of the copy
     * are visible first); a write that streams takes an SFENCE first: every streamed
     * byte is globally visible before the even stamps, so a reader who sees the row
     * published sees all of it. */
    if (r->streams)
        store_fence();
    for (Py_ssize_t i = 0; i < n; i++)
        STORE_REL(stamp_of(r, slot_of(r, lane, first + i)), 2 * (first + i) + 2);
    step('e');
    published_here += n;

    /* 6. Free the entry. */
    if (e)
        STORE_REL(&e[RES_PID], 0);
    else
        STORE_REL(&lt[LANE_OWN_COUNT], 0);
    if (at("published") < 0)   /* (tests: an exception after the publish; the rows stay written) */
        return -1;

    /* 6b. A lane of ours: its next write starts where this one ended (nobody else
     * moves its head): ask for those rows' lines now, to arrive while the caller does
     * whatever it does between writes. */
    if (!e && n > 1)
        prefetch_for_write(r, lane, first + n, n);

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

/* One value of field f as a pointer to its bytes, if it is the common case: a numpy
 * array (or scalar) of the field's shape, C-contiguous (with a row axis of n rows if
 * rows >= 0), of the field's dtype or of one cast.c converts (then into memory it
 * allocates at *owned, which the caller frees); or a Python number the Python path
 * would accept and store identically. 1 if so, 0 if not (the Python path decides), -1
 * on an error. */
static int value_bytes(Ring *r, Field *f, PyObject *v, Py_ssize_t *rows, Py_buffer *view,
                       PyObject **held, char *scratch, const char **out, char **owned) {
    view->obj = NULL;
    *held = NULL;
    *owned = NULL;
    if (f->scalar && *rows == -1 && (PyFloat_Check(v) || PyLong_CheckExact(v) || PyBool_Check(v))) {
        if (PyBool_Check(v)) {
            if (f->scalar != '?')
                return 0;
            scratch[0] = (char)(v == Py_True);
        } else if (PyFloat_Check(v)) {           /* (np.float64 too: a float subclass) */
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
    if (f->format == NULL)
        return 0;
    if ((*out = array_data(r, f, v, rows)) != NULL) {  /* the common case: an array as stored */
        Py_INCREF(v);
        *held = v;
        return 1;
    }
    if (Py_TYPE(v) != (PyTypeObject *)r->ndarray_type && Py_TYPE(v) != (PyTypeObject *)f->scalar_type) {
        int scalar = is_numpy_scalar(v);  /* another numpy scalar: one of the casts, maybe */
        if (scalar <= 0)
            return scalar;
    }
    if (PyObject_GetBuffer(v, view, PyBUF_STRIDES | PyBUF_FORMAT) < 0) {
        PyErr_Clear();                    /* not contiguous, or no buffer: Python path */
        view->obj = NULL;
        return 0;
    }
    int lead = *rows >= 0 || (*rows == -2);
    if (view->ndim != f->ndim + lead || !PyBuffer_IsContiguous(view, 'C'))
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
    if (view->itemsize == f->itemsize && strcmp(view->format, f->format) == 0) {
        *out = view->buf;         /* the field's dtype: copied as it is */
        return 1;
    }
    Py_ssize_t count = view->len / view->itemsize;   /* another: one of the common casts? */
    if ((*owned = PyMem_Malloc(count * f->itemsize + 1)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *out = *owned;
    return cast_values(kind_of(view->format, view->itemsize), view->itemsize, view->buf,
                       kind_of(f->format, f->itemsize), f->itemsize, *owned, count);
}

/* Give back what value_bytes() took for the first n fields: buffers, arrays, copies. */
static void release_values(Py_buffer *views, PyObject **held, char **owned, int n) {
    for (int i = 0; i < n; i++) {
        if (views[i].obj != NULL)
            PyBuffer_Release(&views[i]);
        Py_XDECREF(held[i]);
        PyMem_Free(owned[i]);
    }
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
    PyObject *held[MAX_FIELDS];          /* arrays read from their objects (arrays.c) */
    char scratch[MAX_FIELDS][8], *owned[MAX_FIELDS];
    const char *src[MAX_FIELDS];
    Py_ssize_t rows = batch ? -2 : -1;
    int f = 0, ok = 1;
    for (; f < r->nfields && ok; f++) {
        PyObject *v = PyDict_GetItemWithError(data, r->fields[f].name);
        if (v == NULL) {
            PyErr_Clear();
            views[f].obj = NULL;
            held[f] = NULL;
            owned[f] = NULL;
            ok = 0;
        } else {
            ok = value_bytes(r, &r->fields[f], v, &rows, &views[f], &held[f], scratch[f], &src[f], &owned[f]);
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
    release_values(views, held, owned, f);
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
    PyObject *held[MAX_FIELDS];          /* arrays read from their objects (arrays.c) */
    char scratch[MAX_FIELDS][8], *owned[MAX_FIELDS];
    const char *src[MAX_FIELDS], *row[MAX_FIELDS];
    int f = 0;
    /* 2. Every field's n rows, the common case only. */
    for (; f < r->nfields && ok == 1; f++) {
        PyObject *v = PyDict_GetItemWithError(args[1], r->fields[f].name);
        if (v == NULL && !PyErr_Occurred())
            v = PyDict_GetItemWithError(args[2], r->fields[f].name);
        if (v == NULL) {
            views[f].obj = NULL;
            held[f] = NULL;
            owned[f] = NULL;
            ok = PyErr_Occurred() ? -1 : 0;
        } else {
            ok = value_bytes(r, &r->fields[f], v, &rows, &views[f], &held[f], scratch[f], &src[f], &owned[f]);
        }
    }
    /* 3. No write at all if a row could not be written at once: its lane (ours: its head
     * stands still) must first move its horizon (a buffer file's; Python does it), or
     * another thread of ours is writing the lane, or an older writer is still in the
     * row's slot (the Python path waits for those, row by row). So what is written
     * below is all the rows: nothing between the rows lets go of the GIL (test hooks
     * aside). */
    for (Py_ssize_t i = 0; i < n && ok == 1; i++) {
        const int64_t *lt = r->lanes_tab + lanes[i] * TABLE_WIDTH;
        int64_t seq = LOAD(&lt[LANE_HEAD]);
        for (Py_ssize_t j = 0; j < i; j++)
            seq += lanes[j] == lanes[i];   /* (a lane given twice: its second row is the next) */
        if (beyond_horizon(r, lanes[i], seq + 1) || LOAD(&lt[LANE_OWN_COUNT]) != 0 || !older_done(r, lanes[i], seq, 1))
            ok = 0;
    }
    PyObject *result = NULL;
    if (ok == 0) {
        result = Py_False;
        Py_INCREF(result);
    } else if (ok == 1) {
        /* 4. One write of one row per lane, in order (write_rows: the protocol). */
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
    release_values(views, held, owned, f);
    if (lanev.obj != NULL)
        PyBuffer_Release(&lanev);
    return result;
}
