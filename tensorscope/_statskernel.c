/* One read of each element for `tensorscope.valuestats`: the statistics of one piece of values.
 *
 * Two entry points, each with a numpy twin in `valuestats.py` that the tests hold it to:
 *
 *   count(data, width, counts)  adds, for every `width`-byte element of `data` (1 or 2 bytes), one
 *       to the uint64 counter of its bit pattern in `counts` (lanes x 2^(8*width) counters; element
 *       i goes to lane i % lanes so that runs of one value do not wait on one counter). Python
 *       turns the counts into min/max/mean/std/NaN/Inf/zeros and any histogram exactly (a value per
 *       bit pattern): float16, bfloat16, the float8 types, int8/16, bool, in one increment each.
 *   moments(data, code, table, shift) -> (finite, nan, inf, zeros, min, max, mean - shift, m2) over
 *       the piece in float64, the sums taken over x - shift (the caller's guess of a typical value:
 *       data far from zero keeps the digits of its spread in the block means): blocks of BLOCK elements widened into an L1-resident buffer, each block's mean and
 *       sum of squared deviations in two passes over that buffer, blocks merged by Chan's update
 *       (numerically stable: no sum of squares of raw values is ever formed). Codes: 'e' float16,
 *       'b' bfloat16, 'h'/'H' int16/uint16, 'f'/'d' float32/64, 'i'/'I' int32/uint32, 'q'/'Q'
 *       int64/uint64, 't' one byte through a 256-entry float64 table given by the caller (every
 *       one-byte dtype: the table is numpy's own conversion, so the values are numpy's).
 *       float16 takes a vector path where the CPU has AVX2/F16C or AVX-512 (below).
 *   simd(level) -> the previous level: the float16 route (0 portable, 1 AVX2/F16C, 2 AVX-512,
 *       capped at what the CPU has), for the tests to hold every route to the same figures.
 *
 * The kernel decides nothing: it counts and sums what it is given. Every length is checked
 * against the buffer (sizes in Py_ssize_t, products checked before they are formed), every
 * scalar load goes through memcpy and every vector load is an unaligned one (no alignment is
 * assumed of any buffer), and the GIL is released only while the loop reads buffers whose
 * exporters the Py_buffer views keep alive.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define ABI 3
#define BLOCK 1024
#define MAX_LANES 8

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* ---- count ------------------------------------------------------------------------------- */

static inline void bump(char *counts, size_t index) {
    uint64_t v;
    memcpy(&v, counts + index * 8, 8);
    v += 1;
    memcpy(counts + index * 8, &v, 8);
}

static void count8(const unsigned char *p, Py_ssize_t n, char *counts, int lanes) {
    Py_ssize_t i = 0;
    if (lanes >= 4) {
        for (; i + 4 <= n; i += 4) {
            bump(counts, (size_t)p[i]);
            bump(counts, 256u + p[i + 1]);
            bump(counts, 512u + p[i + 2]);
            bump(counts, 768u + p[i + 3]);
        }
    } else if (lanes >= 2) {
        for (; i + 2 <= n; i += 2) {
            bump(counts, (size_t)p[i]);
            bump(counts, 256u + p[i + 1]);
        }
    }
    for (; i < n; i++) bump(counts, (size_t)p[i]);
}

static inline size_t load16(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return (size_t)h;
}

static void count16(const unsigned char *p, Py_ssize_t n, char *counts, int lanes) {
    Py_ssize_t i = 0;
    if (lanes >= 2) {
        for (; i + 2 <= n; i += 2) {
            bump(counts, load16(p + 2 * i));
            bump(counts, 65536u + load16(p + 2 * i + 2));
        }
    }
    for (; i < n; i++) bump(counts, load16(p + 2 * i));
}

static PyObject *py_count(PyObject *self, PyObject *args) {
    Py_buffer data, counts;
    int width;
    if (!PyArg_ParseTuple(args, "y*iw*", &data, &width, &counts)) return NULL;
    PyObject *ret = NULL;
    if (width != 1 && width != 2) {
        PyErr_SetString(PyExc_ValueError, "width must be 1 or 2");
        goto done;
    }
    Py_ssize_t per_lane = (Py_ssize_t)8 << (8 * width);   /* bytes of one lane of counters */
    if (data.len % width != 0 || counts.len % per_lane != 0 || counts.len / per_lane < 1 ||
            counts.len / per_lane > MAX_LANES) {
        PyErr_SetString(PyExc_ValueError, "data is not whole elements, or counts is not 1 to 8 "
                                          "lanes of uint64 counters for the width");
        goto done;
    }
    int lanes = (int)(counts.len / per_lane);
    Py_ssize_t n = data.len / width;
    Py_BEGIN_ALLOW_THREADS
    if (width == 1) count8((const unsigned char *)data.buf, n, (char *)counts.buf, lanes);
    else count16((const unsigned char *)data.buf, n, (char *)counts.buf, lanes);
    Py_END_ALLOW_THREADS
    ret = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&counts);
    return ret;
}

/* ---- moments ----------------------------------------------------------------------------- */

/* float16 -> float64 exactly: the bits shifted into float32's places times 2^112 (subnormals
 * included); exponent 31 (Inf, NaN) is rebuilt from the bits. */
static inline double half_to_double(uint16_t h) {
    uint32_t u = ((uint32_t)(int32_t)(int16_t)h << 13) & 0x8FFFE000u;
    float f;
    memcpy(&f, &u, sizeof f);
    double x = (double)(f * 5.192296858534828e+33f);
    if ((h & 0x7c00) == 0x7c00)
        x = (h & 0x03ff) ? NAN : ((h & 0x8000) ? -INFINITY : INFINITY);
    return x;
}

static inline double bf16_to_double(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return (double)f;
}

VECTOR_CLONES
static void widen(const unsigned char *p, char code, const double *table, Py_ssize_t n,
                  double *out) {
    switch (code) {
    case 't': for (Py_ssize_t i = 0; i < n; i++) out[i] = table[p[i]]; break;
    case 'e': for (Py_ssize_t i = 0; i < n; i++) {
        uint16_t h; memcpy(&h, p + 2 * i, 2); out[i] = half_to_double(h); } break;
    case 'b': for (Py_ssize_t i = 0; i < n; i++) {
        uint16_t h; memcpy(&h, p + 2 * i, 2); out[i] = bf16_to_double(h); } break;
    case 'h': for (Py_ssize_t i = 0; i < n; i++) {
        int16_t v; memcpy(&v, p + 2 * i, 2); out[i] = (double)v; } break;
    case 'H': for (Py_ssize_t i = 0; i < n; i++) {
        uint16_t v; memcpy(&v, p + 2 * i, 2); out[i] = (double)v; } break;
    case 'f': for (Py_ssize_t i = 0; i < n; i++) {
        float v; memcpy(&v, p + 4 * i, 4); out[i] = (double)v; } break;
    case 'i': for (Py_ssize_t i = 0; i < n; i++) {
        int32_t v; memcpy(&v, p + 4 * i, 4); out[i] = (double)v; } break;
    case 'I': for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t v; memcpy(&v, p + 4 * i, 4); out[i] = (double)v; } break;
    case 'q': for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v; memcpy(&v, p + 8 * i, 8); out[i] = (double)v; } break;
    case 'Q': for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v; memcpy(&v, p + 8 * i, 8); out[i] = (double)v; } break;
    default:  for (Py_ssize_t i = 0; i < n; i++) {
        double v; memcpy(&v, p + 8 * i, 8); out[i] = v; } break;
    }
}

typedef struct {
    double count, mean, m2, lo, hi;   /* count is exact in float64 up to 2^53 elements */
    long long nan, inf, zeros;
} Moments;

/* One block: counts, extremes and sum of the finite values, then their squared deviations from
 * the block's own mean; folded into `m` by Chan's update. */
VECTOR_CLONES
static void block_moments(const double *x, Py_ssize_t n, double shift, Moments *m) {
    /* counts kept as doubles inside a block (exact: n <= BLOCK), so the loop stays in one
     * vector type */
    double s = 0.0, lo = INFINITY, hi = -INFINITY, fin = 0.0, nan = 0.0, zeros = 0.0;
#pragma omp simd reduction(+:s, fin, nan, zeros) reduction(min:lo) reduction(max:hi)
    for (Py_ssize_t i = 0; i < n; i++) {
        double v = x[i];
        int f = fabs(v) <= 1.7976931348623157e308;
        nan += v != v ? 1.0 : 0.0;
        zeros += v == 0.0 ? 1.0 : 0.0;
        fin += f ? 1.0 : 0.0;
        s += f ? v - shift : 0.0;
        double a = f ? v : INFINITY, b = f ? v : -INFINITY;
        lo = a < lo ? a : lo;
        hi = b > hi ? b : hi;
    }
    m->nan += (long long)nan;
    m->zeros += (long long)zeros;
    m->inf += (long long)n - (long long)fin - (long long)nan;
    if (fin == 0.0) return;
    double bm = s / fin, q = 0.0;
#pragma omp simd reduction(+:q)
    for (Py_ssize_t i = 0; i < n; i++) {
        double v = x[i];
        double d = (fabs(v) <= 1.7976931348623157e308) ? (v - shift) - bm : 0.0;
        q += d * d;
    }
    double nb = fin, total = m->count + nb, delta = bm - m->mean;
    m->mean += delta * (nb / total);
    m->m2 += q + delta * delta * (m->count * nb / total);
    m->count = total;
    if (lo < m->lo) m->lo = lo;
    if (hi > m->hi) m->hi = hi;
}

/* ---- float16 with AVX2 and F16C ----------------------------------------------------------
 *
 * The hot path of `inspect --stats` (float16 checkpoints). Per block of up to FBLOCK elements
 * (a multiple of 16), one pass over the halves:
 *   - NaN/Inf/zero in the integer lanes, 16 at a time: |h| = h & 0x7fff, its maximum (a block
 *     whose maximum is 0x7c00 or more holds an Inf or a NaN and is handed to the portable path
 *     above, which has the rules for them), and the count of |h| == 0 (-0.0 included);
 *   - min and max in the integer lanes too, over an order-keeping key of the bits (a negative
 *     half's magnitude bits flipped: signed 16-bit order is then float order, -0.0 below +0.0);
 *   - every half widened (F16C) to float64 into an L1-resident buffer, and summed: the sum of up
 *     to 2^12 float16 values is exact in float64 in any order (each is a multiple of 2^-24 below
 *     2^16, so every partial sum is a multiple of 2^-24 below 2^28: 52 bits), so the lanes need no
 *     care and the block mean is the true one rounded once.
 * Then the squared deviations from the block mean over the buffer, and the block is folded in by
 * the same Chan update as `block_moments`. Loads are unaligned loads (no alignment is assumed).
 * The tests hold this path and the portable one to the same figures (`simd(0)`). The AVX-512
 * variant below is the same block, 32 halves a step. */
#define FBLOCK 2048
/* Software prefetch this many bytes ahead: a map of the page cache is read through 4 KiB pages,
 * at whose edges the hardware prefetcher stops. Measured over the 2 GB float16 file, warm cache,
 * the AVX2 block, one thread: 1.0 ns per element without, 0.46 at 1 KiB ahead, 0.40 at 4 KiB,
 * 0.35 at 16 KiB (0.29 in cache); 32 KiB ahead was slower again. */
#define PREFETCH_AHEAD 16384

#if defined(__GNUC__) && defined(__x86_64__)
#define HAVE_V3 1
#include <immintrin.h>
#define V3 __attribute__((target("avx2,f16c,fma")))
/* The vector level, set at load time: 2 the CPU runs AVX-512 (F, BW), 1 AVX2, F16C and FMA,
 * 0 neither; `use_level` is at most that (the tests lower it: `simd`). */
static int cpu_level;
static int use_level;

static inline double key_to_double(int key) {
    uint16_t h = (uint16_t)(key < 0 ? (key ^ 0x7fff) : key);
    return half_to_double(h);
}

/* One block of k (a multiple of 16, at most FBLOCK) halves at p. Returns 0, having changed
 * nothing, when the block holds an Inf or a NaN. */
V3 static int f16_block_v3(const unsigned char *p, Py_ssize_t k, double shift, double *buf,
                           Moments *m) {
    const __m256i mag = _mm256_set1_epi16(0x7fff), zero = _mm256_setzero_si256();
    __m256i amax = zero, zc = zero, kmin = _mm256_set1_epi16(0x7fff),
            kmax = _mm256_set1_epi16((short)0x8000);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    for (Py_ssize_t i = 0; i < k; i += 16) {
        /* (the address may lie past the buffer: a prefetch never faults, and no pointer past
         * the object is formed) */
        _mm_prefetch((const char *)((uintptr_t)p + (uintptr_t)(2 * i) + PREFETCH_AHEAD),
                     _MM_HINT_T0);
        __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(p + 2 * i));
        __m256i a = _mm256_and_si256(h, mag);
        amax = _mm256_max_epu16(amax, a);
        zc = _mm256_sub_epi16(zc, _mm256_cmpeq_epi16(a, zero));
        __m256i key = _mm256_xor_si256(h, _mm256_and_si256(_mm256_srai_epi16(h, 15), mag));
        kmin = _mm256_min_epi16(kmin, key);
        kmax = _mm256_max_epi16(kmax, key);
        __m256 f0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
        __m256 f1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
        __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(f0));
        __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(f0, 1));
        __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(f1));
        __m256d d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(f1, 1));
        _mm256_storeu_pd(buf + i, d0);
        _mm256_storeu_pd(buf + i + 4, d1);
        _mm256_storeu_pd(buf + i + 8, d2);
        _mm256_storeu_pd(buf + i + 12, d3);
        s0 = _mm256_add_pd(s0, d0);
        s1 = _mm256_add_pd(s1, d1);
        s2 = _mm256_add_pd(s2, d2);
        s3 = _mm256_add_pd(s3, d3);
    }
    uint16_t am[16], zs[16];
    int16_t lo16[16], hi16[16];
    _mm256_storeu_si256((__m256i *)(void *)am, amax);
    _mm256_storeu_si256((__m256i *)(void *)zs, zc);
    _mm256_storeu_si256((__m256i *)(void *)lo16, kmin);
    _mm256_storeu_si256((__m256i *)(void *)hi16, kmax);
    int top = 0, lo = 0x7fff, hi = -0x8000;
    long long zeros = 0;
    for (int j = 0; j < 16; j++) {
        top = am[j] > top ? am[j] : top;
        zeros += zs[j];
        lo = lo16[j] < lo ? lo16[j] : lo;
        hi = hi16[j] > hi ? hi16[j] : hi;
    }
    if (top >= 0x7c00) return 0;
    double sv[4];
    _mm256_storeu_pd(sv, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
    double nb = (double)k, bm = ((sv[0] + sv[1]) + (sv[2] + sv[3])) / nb;
    const __m256d vb = _mm256_set1_pd(bm);
    __m256d q0 = _mm256_setzero_pd(), q1 = q0, q2 = q0, q3 = q0;
    for (Py_ssize_t i = 0; i < k; i += 16) {
        __m256d t0 = _mm256_sub_pd(_mm256_loadu_pd(buf + i), vb);
        __m256d t1 = _mm256_sub_pd(_mm256_loadu_pd(buf + i + 4), vb);
        __m256d t2 = _mm256_sub_pd(_mm256_loadu_pd(buf + i + 8), vb);
        __m256d t3 = _mm256_sub_pd(_mm256_loadu_pd(buf + i + 12), vb);
        q0 = _mm256_fmadd_pd(t0, t0, q0);
        q1 = _mm256_fmadd_pd(t1, t1, q1);
        q2 = _mm256_fmadd_pd(t2, t2, q2);
        q3 = _mm256_fmadd_pd(t3, t3, q3);
    }
    _mm256_storeu_pd(sv, _mm256_add_pd(_mm256_add_pd(q0, q1), _mm256_add_pd(q2, q3)));
    double q = (sv[0] + sv[1]) + (sv[2] + sv[3]);
    m->zeros += zeros;
    double total = m->count + nb, delta = (bm - shift) - m->mean;
    m->mean += delta * (nb / total);
    m->m2 += q + delta * delta * (m->count * nb / total);
    m->count = total;
    double vlo = key_to_double(lo), vhi = key_to_double(hi);
    if (vlo < m->lo) m->lo = vlo;
    if (vhi > m->hi) m->hi = vhi;
    return 1;
}

/* The same block with AVX-512 (32 halves, one cache line, a step): the same figures, the same
 * exact sums, the same hand-over of a block with an Inf or a NaN. */
#define V4 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))
V4 static int f16_block_v4(const unsigned char *p, Py_ssize_t k, double shift, double *buf,
                           Moments *m) {
    const __m512i mag = _mm512_set1_epi16(0x7fff), zero = _mm512_setzero_si512(),
                  one = _mm512_set1_epi16(1);
    __m512i amax = zero, zc = zero, kmin = _mm512_set1_epi16(0x7fff),
            kmax = _mm512_set1_epi16((short)0x8000);
    __m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    Py_ssize_t i = 0;
    for (; i + 32 <= k; i += 32) {
        _mm_prefetch((const char *)((uintptr_t)p + (uintptr_t)(2 * i) + PREFETCH_AHEAD),
                     _MM_HINT_T0);
        __m512i h = _mm512_loadu_si512((const void *)(p + 2 * i));
        __m512i a = _mm512_and_si512(h, mag);
        amax = _mm512_max_epu16(amax, a);
        zc = _mm512_mask_add_epi16(zc, _mm512_cmpeq_epi16_mask(a, zero), zc, one);
        __m512i key = _mm512_xor_si512(h, _mm512_and_si512(_mm512_srai_epi16(h, 15), mag));
        kmin = _mm512_min_epi16(kmin, key);
        kmax = _mm512_max_epi16(kmax, key);
        __m512 f0 = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
        __m512 f1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
        __m512d d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(f0));
        __m512d d1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f0), 1)));
        __m512d d2 = _mm512_cvtps_pd(_mm512_castps512_ps256(f1));
        __m512d d3 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f1), 1)));
        _mm512_storeu_pd(buf + i, d0);
        _mm512_storeu_pd(buf + i + 8, d1);
        _mm512_storeu_pd(buf + i + 16, d2);
        _mm512_storeu_pd(buf + i + 24, d3);
        s0 = _mm512_add_pd(s0, d0);
        s1 = _mm512_add_pd(s1, d1);
        s2 = _mm512_add_pd(s2, d2);
        s3 = _mm512_add_pd(s3, d3);
    }
    if (i < k) {   /* 16 left (k is a multiple of 16) */
        __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(p + 2 * i));
        __m512i hz = _mm512_zextsi256_si512(h);
        __m512i a = _mm512_and_si512(hz, mag);
        amax = _mm512_max_epu16(amax, a);
        zc = _mm512_mask_add_epi16(zc, _mm512_mask_cmpeq_epi16_mask(0xFFFFu, a, zero), zc, one);
        __m512i key = _mm512_xor_si512(hz, _mm512_and_si512(_mm512_srai_epi16(hz, 15), mag));
        kmin = _mm512_mask_min_epi16(kmin, 0xFFFFu, kmin, key);
        kmax = _mm512_mask_max_epi16(kmax, 0xFFFFu, kmax, key);
        __m512 f0 = _mm512_cvtph_ps(h);
        __m512d d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(f0));
        __m512d d1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f0), 1)));
        _mm512_storeu_pd(buf + i, d0);
        _mm512_storeu_pd(buf + i + 8, d1);
        s0 = _mm512_add_pd(s0, d0);
        s1 = _mm512_add_pd(s1, d1);
    }
    uint16_t am[32], zs[32];
    int16_t lo16[32], hi16[32];
    _mm512_storeu_si512((void *)am, amax);
    _mm512_storeu_si512((void *)zs, zc);
    _mm512_storeu_si512((void *)lo16, kmin);
    _mm512_storeu_si512((void *)hi16, kmax);
    int top = 0, lo = 0x7fff, hi = -0x8000;
    long long zeros = 0;
    for (int j = 0; j < 32; j++) {
        top = am[j] > top ? am[j] : top;
        zeros += zs[j];
        lo = lo16[j] < lo ? lo16[j] : lo;
        hi = hi16[j] > hi ? hi16[j] : hi;
    }
    if (top >= 0x7c00) return 0;
    double nb = (double)k;
    double bm = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(s0, s1), _mm512_add_pd(s2, s3))) / nb;
    const __m512d vb = _mm512_set1_pd(bm);
    __m512d q0 = _mm512_setzero_pd(), q1 = q0, q2 = q0, q3 = q0;
    for (i = 0; i + 32 <= k; i += 32) {
        __m512d t0 = _mm512_sub_pd(_mm512_loadu_pd(buf + i), vb);
        __m512d t1 = _mm512_sub_pd(_mm512_loadu_pd(buf + i + 8), vb);
        __m512d t2 = _mm512_sub_pd(_mm512_loadu_pd(buf + i + 16), vb);
        __m512d t3 = _mm512_sub_pd(_mm512_loadu_pd(buf + i + 24), vb);
        q0 = _mm512_fmadd_pd(t0, t0, q0);
        q1 = _mm512_fmadd_pd(t1, t1, q1);
        q2 = _mm512_fmadd_pd(t2, t2, q2);
        q3 = _mm512_fmadd_pd(t3, t3, q3);
    }
    if (i < k) {
        __m512d t0 = _mm512_sub_pd(_mm512_loadu_pd(buf + i), vb);
        __m512d t1 = _mm512_sub_pd(_mm512_loadu_pd(buf + i + 8), vb);
        q0 = _mm512_fmadd_pd(t0, t0, q0);
        q1 = _mm512_fmadd_pd(t1, t1, q1);
    }
    double q = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(q0, q1), _mm512_add_pd(q2, q3)));
    m->zeros += zeros;
    double total = m->count + nb, delta = (bm - shift) - m->mean;
    m->mean += delta * (nb / total);
    m->m2 += q + delta * delta * (m->count * nb / total);
    m->count = total;
    double vlo = key_to_double(lo), vhi = key_to_double(hi);
    if (vlo < m->lo) m->lo = vlo;
    if (vhi > m->hi) m->hi = vhi;
    return 1;
}
#else
static const int cpu_level = 0;
static int use_level = 0;
#endif

static int itemsize_of(char code) {
    switch (code) {
    case 't': return 1;
    case 'e': case 'b': case 'h': case 'H': return 2;
    case 'f': case 'i': case 'I': return 4;
    case 'd': case 'q': case 'Q': return 8;
    default: return 0;
    }
}

static PyObject *py_moments(PyObject *self, PyObject *args) {
    Py_buffer data, tab;
    int code_int;
    double shift;
    if (!PyArg_ParseTuple(args, "y*Cy*d", &data, &code_int, &tab, &shift)) return NULL;
    PyObject *ret = NULL;
    char code = (char)code_int;
    int size = itemsize_of(code);
    double table[256];
    if (size == 0 || data.len % size != 0 || !isfinite(shift)) {
        PyErr_SetString(PyExc_ValueError, "unknown code, or data is not whole elements");
        goto done;
    }
    if (code == 't') {
        if (tab.len != (Py_ssize_t)sizeof table) {
            PyErr_SetString(PyExc_ValueError, "code 't' needs a table of 256 float64");
            goto done;
        }
        memcpy(table, tab.buf, sizeof table);
    }
    Moments m = {0.0, 0.0, 0.0, INFINITY, -INFINITY, 0, 0, 0};
    Py_ssize_t n = data.len / size;
    const unsigned char *p = (const unsigned char *)data.buf;
    Py_BEGIN_ALLOW_THREADS
    double buf[FBLOCK > BLOCK ? FBLOCK : BLOCK];
    Py_ssize_t i = 0;
#ifdef HAVE_V3
    if (code == 'e' && use_level > 0) {
        for (; n - i >= 16; ) {
            Py_ssize_t left = (n - i) / 16 * 16, k = left < FBLOCK ? left : FBLOCK;
            int done = use_level >= 2 ? f16_block_v4(p + i * size, k, shift, buf, &m)
                                      : f16_block_v3(p + i * size, k, shift, buf, &m);
            if (!done) {
                /* an Inf or a NaN in the block: the portable path, which has their rules */
                for (Py_ssize_t j = 0; j < k; j += BLOCK) {
                    Py_ssize_t kk = k - j < BLOCK ? k - j : BLOCK;
                    widen(p + (i + j) * size, code, table, kk, buf);
                    block_moments(buf, kk, shift, &m);
                }
            }
            i += k;
        }
    }
#endif
    for (; i < n; i += BLOCK) {
        Py_ssize_t k = n - i < BLOCK ? n - i : BLOCK;
        widen(p + i * size, code, table, k, buf);
        block_moments(buf, k, shift, &m);
    }
    Py_END_ALLOW_THREADS
    ret = Py_BuildValue("(dLLLdddd)", m.count, m.nan, m.inf, m.zeros, m.lo, m.hi, m.mean, m.m2);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&tab);
    return ret;
}

/* simd(level) -> the level in use before; uses the float16 vector path up to `level` (0 the
 * portable loop, 1 AVX2/F16C, 2 AVX-512), as far as the CPU has it, so that the tests can hold
 * each route to the same figures. */
static PyObject *py_simd(PyObject *self, PyObject *arg) {
    long level = PyLong_AsLong(arg);
    if (level == -1 && PyErr_Occurred()) return NULL;
    int was = use_level;
    use_level = level < 0 ? 0 : (level > cpu_level ? cpu_level : (int)level);
    return PyLong_FromLong(was);
}

static PyMethodDef methods[] = {
    {"simd", py_simd, METH_O, "simd(level) -> the previous level: the float16 vector path up to "
     "level (0 portable, 1 AVX2/F16C, 2 AVX-512) as far as the CPU has it"},
    {"count", py_count, METH_VARARGS,
     "count(data, width, counts): add each width-byte element's bit pattern to its uint64 counter"},
    {"moments", py_moments, METH_VARARGS,
     "moments(data, code, table, shift) -> (finite, nan, inf, zeros, min, max, mean - shift, m2)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_statskernel", NULL, -1, methods};

PyMODINIT_FUNC PyInit__statskernel(void) {
#ifdef HAVE_V3
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
            __builtin_cpu_supports("fma")) {
        cpu_level = 1;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
            cpu_level = 2;
    }
    use_level = cpu_level;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "ABI", ABI) < 0 ||
                      PyModule_AddIntConstant(m, "SIMD", cpu_level) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
