/* One pass over a pair of pieces for `tensorscope.diffing`: every statistic of the diff's fast
 * path at once, each element read once, in float64.
 *
 * numpy needs ~17 vectorised passes per piece for the same figures (3.6 ns per float16 pair on
 * one thread, measured); this loop reads both inputs once. It is optional: when it is not built,
 * `diffing._Accumulator` computes the same figures with numpy (and the tests compare the two).
 *
 * Semantics are those of `_Accumulator.add`'s finite path, operation for operation:
 *   x, y   = a, b widened exactly to float64 (float16, bfloat16, float32, float64, int8-32,
 *            one-byte floats through their 256-entry table)
 *   d      = x - y;  ad = |d|;  ay = |y|
 *   sums   = Σ d·d, Σ x·x, Σ y·y, Σ x·y, Σ ad        (float64; one partial sum per lane)
 *   max_abs = max ad
 *   max_rel = max ad / ay over ay != 0; zero_ref = #(ay == 0 and ad != 0)
 *   mismatched = #(ad > atol + ay * rtol)            (torch.isclose's order of operations)
 * A NaN or an infinity in either input (or a sum that overflows) returns None: the caller then
 * takes its careful path for that piece. The GIL is released while the loop runs, so pieces run
 * on every core from the diff's thread pool.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Each piece is walked in blocks of BLOCK elements: both sides are widened into two small
 * float64 arrays (L1-resident), then the statistics run over them. Both loops are branch-free so
 * the compiler vectorises them, and on x86-64 (gcc, Linux) they are built three times, for
 * AVX-512 (x86-64-v4), AVX2 and the baseline, the CPU picking one at load time. */
#define BLOCK 512

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* float16 -> float64, exactly, without branches: the half's bits shifted into float32's place
 * (sign, exponent, mantissa), times 2^112 to rebias the exponent (subnormals land on float32
 * subnormals scaled by a power of two: exact). Inf/NaN (exponent 31) come out finite here: they
 * are caught from the raw bits by the caller. */
static inline double half_bits_to_double(uint16_t h) {
    uint32_t u = ((uint32_t)(int32_t)(int16_t)h << 13) & 0x8FFFE000u;
    float f;
    memcpy(&f, &u, sizeof f);
    return (double)(f * 5.192296858534828e+33f);   /* 2^112 */
}

static inline double bf16_bits_to_double(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return (double)f;
}

/* Widen n (<= BLOCK) elements; returns non-zero when one of them is Inf or NaN. Code 't': bytes
 * that index a 256-entry float64 table (float8 and other one-byte floats). */
VECTOR_CLONES
static int widen(const char *p, char code, const double *table, Py_ssize_t n, double *out) {
    int special = 0;
    if (code == 't') {
        const uint8_t *v = (const uint8_t *)p;
        for (Py_ssize_t i = 0; i < n; i++) {
            out[i] = table[v[i]];
            special |= !(fabs(out[i]) <= 1.7976931348623157e308);
        }
    } else if (code == 'e') {
        const uint16_t *h = (const uint16_t *)p;
        for (Py_ssize_t i = 0; i < n; i++) {
            out[i] = half_bits_to_double(h[i]);
            special |= (h[i] & 0x7c00) == 0x7c00;
        }
    } else if (code == 'b') {
        const uint16_t *h = (const uint16_t *)p;
        for (Py_ssize_t i = 0; i < n; i++) {
            out[i] = bf16_bits_to_double(h[i]);
            special |= (h[i] & 0x7f80) == 0x7f80;
        }
    } else if (code == 'f') {
        const float *f = (const float *)p;
        for (Py_ssize_t i = 0; i < n; i++) {
            out[i] = (double)f[i];
            special |= !(fabs(out[i]) <= 1.7976931348623157e308);
        }
    } else if (code == 'c') {
        const int8_t *v = (const int8_t *)p;
        for (Py_ssize_t i = 0; i < n; i++) out[i] = (double)v[i];
    } else if (code == 'B') {
        const uint8_t *v = (const uint8_t *)p;
        for (Py_ssize_t i = 0; i < n; i++) out[i] = (double)v[i];
    } else if (code == 'h') {
        const int16_t *v = (const int16_t *)p;
        for (Py_ssize_t i = 0; i < n; i++) out[i] = (double)v[i];
    } else if (code == 'i') {
        const int32_t *v = (const int32_t *)p;
        for (Py_ssize_t i = 0; i < n; i++) out[i] = (double)v[i];
    } else {
        const double *d = (const double *)p;
        for (Py_ssize_t i = 0; i < n; i++) {
            out[i] = d[i];
            special |= !(fabs(out[i]) <= 1.7976931348623157e308);
        }
    }
    return special;
}

typedef struct {
    double sq, xx, yy, xy, sa, mx, mr;
    double zr, mm, nz;   /* counts, exact in float64 up to 2^53 */
} Sums;

/* The statistics over n finite pairs. `omp simd` (compiled with -fopenmp-simd: no OpenMP runtime)
 * lets the compiler keep one partial sum per vector lane, the only reordering of the sums; the
 * maxima and counts are exact whatever the order. */
VECTOR_CLONES
static void block_stats(const double *restrict xs, const double *restrict ys, Py_ssize_t n,
                        double atol, double rtol, Sums *restrict s) {
    double sq = 0, xx = 0, yy = 0, xy = 0, sa = 0, mx = 0, mr = 0, zr = 0, mm = 0, nz = 0;
#pragma omp simd reduction(+:sq, xx, yy, xy, sa, zr, mm, nz) reduction(max:mx, mr)
    for (Py_ssize_t i = 0; i < n; i++) {
        double x = xs[i], y = ys[i];
        double d = x - y, ad = fabs(d), ay = fabs(y);
        sq += d * d;
        xx += x * x;
        yy += y * y;
        xy += x * y;
        sa += ad;
        mx = ad > mx ? ad : mx;
        /* |d| / |b| where b != 0, else 0, without a branch around the division (for b != 0
         * this is exactly ad / ay) */
        double ref = ay != 0.0 ? 1.0 : 0.0;
        double r = ad / (ay + (1.0 - ref)) * ref;
        mr = r > mr ? r : mr;
        nz += ref;
        zr += (ad != 0.0 ? 1.0 : 0.0) * (1.0 - ref);
        mm += ad > atol + ay * rtol ? 1.0 : 0.0;
    }
    s->sq += sq; s->xx += xx; s->yy += yy; s->xy += xy; s->sa += sa;
    s->mx = mx > s->mx ? mx : s->mx;
    s->mr = mr > s->mr ? mr : s->mr;
    s->zr += zr; s->mm += mm; s->nz += nz;
}

static Py_ssize_t itemsize(char code) {
    switch (code) {
    case 'c': case 'B': case 't': return 1;
    case 'e': case 'b': case 'h': return 2;
    case 'f': case 'i': return 4;
    case 'd': return 8;
    default: return 0;
    }
}

/* stats(a, code_a, b, code_b, atol, rtol) -> (sum_sq, xx, yy, dot, sum_abs, max_abs, max_rel,
 * zero_ref, mismatched) or None when a value is not finite. a and b: C-contiguous buffers of n
 * elements each, codes 'e' float16, 'b' bfloat16 (both as their uint16 bits), 'f' float32,
 * 'd' float64, 'c' int8, 'B' uint8, 'h' int16, 'i' int32 (all exact in float64), 't' bytes
 * indexing the 256-entry float64 table passed after rtol (table_a, then table_b). max_rel is -inf when every element of b is 0. */
static PyObject *stats(PyObject *self, PyObject *args) {
    Py_buffer ba, bb, ta = {0}, tb = {0};
    int ca, cb;
    double atol, rtol;
    if (!PyArg_ParseTuple(args, "y*Cy*Cdd|y*y*", &ba, &ca, &bb, &cb, &atol, &rtol, &ta, &tb))
        return NULL;
    Py_ssize_t sa = itemsize((char)ca), sb = itemsize((char)cb);
    int tables_ok = (ca != 't' || ta.len == 256 * (Py_ssize_t)sizeof(double)) &&
                    (cb != 't' || tb.len == 256 * (Py_ssize_t)sizeof(double));
    if (!sa || !sb || ba.len % sa || bb.len % sb || ba.len / sa != bb.len / sb || !tables_ok) {
        PyBuffer_Release(&ba);
        PyBuffer_Release(&bb);
        if (ta.obj) PyBuffer_Release(&ta);
        if (tb.obj) PyBuffer_Release(&tb);
        PyErr_SetString(PyExc_ValueError, "stats: unknown dtype code, pieces of unequal length "
                        "or a missing 256-entry float64 table");
        return NULL;
    }
    Py_ssize_t n = ba.len / sa;
    Sums s;
    memset(&s, 0, sizeof s);   /* max lanes start at 0: |d| and ratios are >= 0 */
    int special = 0;
    Py_BEGIN_ALLOW_THREADS
    double xs[BLOCK], ys[BLOCK];
    const char *pa = (const char *)ba.buf, *pb = (const char *)bb.buf;
    for (Py_ssize_t at = 0; at < n && !special; at += BLOCK) {
        Py_ssize_t m = n - at < BLOCK ? n - at : BLOCK;
        special = widen(pa + at * sa, (char)ca, (const double *)ta.buf, m, xs) |
                  widen(pb + at * sb, (char)cb, (const double *)tb.buf, m, ys);
        block_stats(xs, ys, m, atol, rtol, &s);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&ba);
    PyBuffer_Release(&bb);
    if (ta.obj) PyBuffer_Release(&ta);
    if (tb.obj) PyBuffer_Release(&tb);
    if (special || !isfinite(s.sq) || !isfinite(s.xx) || !isfinite(s.yy))
        Py_RETURN_NONE;
    /* no element of b is non-zero: no ratio at all */
    double max_rel = s.nz == 0 ? -INFINITY : s.mr;
    return Py_BuildValue("dddddddLL", s.sq, s.xx, s.yy, s.xy, s.sa, s.mx, max_rel,
                         (long long)s.zr, (long long)s.mm);
}

static PyMethodDef methods[] = {
    {"stats", stats, METH_VARARGS, "One pass of the diff's statistics over a pair of pieces."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_diffkernel", "The diff's one-pass statistics (optional, C).", -1,
    methods,
};

/* Bumped whenever stats() changes its arguments or results: `diffing` uses a build only when it
 * carries the ABI it was written for (a stale build of an editable install is ignored). */
#define KERNEL_ABI 3

PyMODINIT_FUNC PyInit__diffkernel(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", KERNEL_ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
