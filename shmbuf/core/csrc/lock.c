/* shmbuf._native: the header lock (shared lanes only; lock.py is the Python path's). */

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
