/* shmbuf._native: the priority trees (shmbuf/priority/trees.py), arrays of the segment's
 * priority region. */

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
