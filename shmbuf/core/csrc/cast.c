/* The common casts of incoming values, in C (the write paths' value_bytes uses them).
 *
 * Gymnasium hands out float64 rewards, int64 actions and bool flags; fields are often
 * float32, int32 or float. The Python path checks that every value survives such a
 * cast (validate.py: check_cast) and casts with numpy, which costs a few microseconds a
 * field on every add. Here the same check and the same cast run in one pass over the
 * values, for the casts below only; anything else (a value that would not survive, a
 * cast not listed, an unusual format) returns 0 and the Python path decides, as
 * before, with its error message. The results are the values numpy's astype stores:
 *
 *   float64/float32 -> float32/float64   finite values beyond float32's range refused
 *   integer         -> integer           values outside the target's range refused
 *   integer, bool   -> float32/float64   (what numpy's astype gives: round to nearest)
 *   bool            -> integer           0 or 1
 *
 * Floats into integer or bool fields are refused by the Python path, so here too. */

typedef enum { K_NONE, K_BOOL, K_INT, K_UINT, K_FLOAT } Kind;

/* 1 if v is a numpy scalar (np.float64(0.5), np.True_, ...), 0 if not, -1 on an error.
 * numpy.generic is looked up once, at the first call. */
static PyObject *numpy_generic;

static int is_numpy_scalar(PyObject *v) {
    if (numpy_generic == NULL) {
        PyObject *np = PyImport_ImportModule("numpy");
        if (np == NULL)
            return -1;
        numpy_generic = PyObject_GetAttrString(np, "generic");
        Py_DECREF(np);
        if (numpy_generic == NULL)
            return -1;
    }
    return PyObject_IsInstance(v, numpy_generic);
}

/* A one-character PEP 3118 format (native order, as numpy gives for native dtypes) as a
 * kind of number of `size` bytes; K_NONE for anything else. */
static Kind kind_of(const char *format, Py_ssize_t size) {
    if (format == NULL || format[0] == 0 || (format[1] != 0 && format[0] != '=' && format[0] != '<'))
        return K_NONE;
    char c = format[1] != 0 ? format[1] : format[0];
    if ((format[0] == '<' || format[0] == '=') && format[2] != 0)
        return K_NONE;
    if (c == '?' && size == 1)
        return K_BOOL;
    if (strchr("bhilq", c) && (size == 1 || size == 2 || size == 4 || size == 8))
        return K_INT;
    if (strchr("BHILQ", c) && (size == 1 || size == 2 || size == 4 || size == 8))
        return K_UINT;
    if ((c == 'f' && size == 4) || (c == 'd' && size == 8))
        return K_FLOAT;
    return K_NONE;
}

static inline int64_t load_int(const char *p, Py_ssize_t size) {
    switch (size) {
    case 1: return *(const int8_t *)p;
    case 2: { int16_t x; memcpy(&x, p, 2); return x; }
    case 4: { int32_t x; memcpy(&x, p, 4); return x; }
    default: { int64_t x; memcpy(&x, p, 8); return x; }
    }
}

static inline uint64_t load_uint(const char *p, Py_ssize_t size) {
    switch (size) {
    case 1: return *(const uint8_t *)p;
    case 2: { uint16_t x; memcpy(&x, p, 2); return x; }
    case 4: { uint32_t x; memcpy(&x, p, 4); return x; }
    default: { uint64_t x; memcpy(&x, p, 8); return x; }
    }
}

static inline double load_float(const char *p, Py_ssize_t size) {
    if (size == 4) {
        float x;
        memcpy(&x, p, 4);
        return x;
    }
    double x;
    memcpy(&x, p, 8);
    return x;
}

/* Cast `count` values of kind `sk` (`ss` bytes each) at `src` into kind `dk` (`ds`
 * bytes each) at `dst`. 1 if every value survives (then all are stored), 0 if not, or
 * if the cast is not one of the common ones (nothing to rely on in `dst` then). */
static int cast_values(Kind sk, Py_ssize_t ss, const char *src, Kind dk, Py_ssize_t ds, char *dst,
                       Py_ssize_t count) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return 0;                             /* (the integer stores below take the low bytes) */
#endif
    if (sk == K_NONE || dk == K_NONE || dk == K_BOOL || (sk == K_FLOAT && dk != K_FLOAT)
        || (sk == K_UINT && ss == 8))     /* (uint64 beyond int64: the Python path) */
        return 0;
    /* 1. The range of the target, for integer targets. */
    int64_t lo = 0, hi = 0;
    if (dk == K_INT) {
        lo = ds == 8 ? INT64_MIN : -(INT64_C(1) << (8 * ds - 1));
        hi = ds == 8 ? INT64_MAX : (INT64_C(1) << (8 * ds - 1)) - 1;
    } else if (dk == K_UINT) {
        if (ds == 8 && sk == K_INT)
            hi = INT64_MAX;               /* non-negative int64 values fit any uint64 */
        else if (ds == 8)
            return 0;
        else
            hi = (INT64_C(1) << (8 * ds)) - 1;
    }
    for (Py_ssize_t i = 0; i < count; i++, src += ss, dst += ds) {
        if (dk == K_FLOAT) {              /* 2a. into a float: only float64 -> float32 can fail */
            double x = sk == K_FLOAT ? load_float(src, ss)
                     : sk == K_UINT ? (double)load_uint(src, ss)
                     : sk == K_BOOL ? (double)(*src != 0) : (double)load_int(src, ss);
            if (ds == 4) {
                if (isfinite(x) && fabs(x) > FLT_MAX)
                    return 0;             /* would become inf: the Python path says so */
                float y = sk == K_INT && ss == 8 ? (float)load_int(src, ss) : (float)x;
                memcpy(dst, &y, 4);       /* (int64 -> float32 rounded once, as numpy does) */
            } else {
                memcpy(dst, &x, 8);
            }
            continue;
        }
        int64_t v = sk == K_BOOL ? (*src != 0) : sk == K_UINT ? (int64_t)load_uint(src, ss)
                                                              : load_int(src, ss);
        if (v < lo || v > hi)             /* 2b. into an integer: would wrap, refused */
            return 0;
        memcpy(dst, &v, ds);              /* little-endian (see above): the low bytes */
    }
    return 1;
}
