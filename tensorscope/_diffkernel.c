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
 * takes its careful path for that piece. Given the positions of the rank test's sample
 * (`lowrank.sample_positions`), the pass also copies those elements of both sides out, each
 * block's right after its loop read it (no page or line of the pair is read twice; numpy's take
 * is the twin, `diffing.take`). The GIL is released while the loop runs, so pieces run
 * on every core from the diff's thread pool.
 *
 * On x86-64 CPUs with AVX-512 (checked at load time) the statistics run in `run_v4`: both sides
 * are widened in registers (F16C for float16), every sum is kept in vector accumulators, and
 * the ratio |d|/|b| is not divided per element: each block of
 * BLOCK elements only tests |d| > t·|b| against the largest ratio t found so far (shaved by 4
 * ulps, so that a product's rounding can never hide a larger ratio), and the rare block where
 * that holds (a new maximum, or a zero of b where a differs) is run again through the exact,
 * dividing loop; once a block had such zeros, the loop counts them itself (pruned tensors,
 * integers), and when a quarter of the blocks are flagged (values from a small set, whose
 * largest ratio recurs) it divides in the loop instead. The maxima and counts are those of the exact loop. Integers and one-byte floats
 * (through their table, gathered) are read directly too; a pair of two different dtypes is
 * widened into float64 blocks first. float16, one core,
 * measured on Zen 4: 0.45 ns per pair in cache (0.97 for the portable loop) and 0.62 streaming
 * from memory (0.74 without the software prefetch). `avx512(False)` turns the route off (the
 * tests run both).
 *
 * `spectrum` is the rank test's first step on the sample the pass copied out (Gram matrix,
 * Cholesky certificate, else the count from its eigenvalues), so that a diff whose pairs this
 * module reads from their stored bytes never needs numpy.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
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

/* Alignment-safe loads: a piece may start at any byte (a safetensors header of odd length puts
 * every tensor at an odd offset), and a typed load from a misaligned address is undefined
 * behaviour. memcpy into a local is one unaligned load once compiled (and vectorises the same). */
static inline uint16_t load_u16(const char *p) { uint16_t v; memcpy(&v, p, sizeof v); return v; }
static inline int16_t load_i16(const char *p) { int16_t v; memcpy(&v, p, sizeof v); return v; }
static inline int32_t load_i32(const char *p) { int32_t v; memcpy(&v, p, sizeof v); return v; }
static inline float load_f32(const char *p) { float v; memcpy(&v, p, sizeof v); return v; }
static inline double load_f64(const char *p) { double v; memcpy(&v, p, sizeof v); return v; }

/* Widen n (<= BLOCK) elements; returns non-zero when one of them is Inf or NaN. Code 't': bytes
 * that index a 256-entry float64 table (the other one-byte floats). float8_e5m2 ('E') is
 * float16's upper byte; float8_e4m3fn ('F') shifted into float16's places is its value times
 * 2^-8, subnormals included (both have 3 exponent bits below the binary point's reach: exact),
 * and its one NaN pattern (S.1111.111) comes out finite, so it is flagged from the bits. Every
 * element wider than a byte is read through the loads above, at any alignment. */
VECTOR_CLONES
static int widen(const char *p, char code, const double *table, Py_ssize_t n, double *out) {
    int special = 0;
    if (code == 't') {
        const uint8_t *v = (const uint8_t *)p;
        for (Py_ssize_t i = 0; i < n; i++) {
            out[i] = table[v[i]];
            special |= !(fabs(out[i]) <= 1.7976931348623157e308);
        }
    } else if (code == 'E') {   /* float8_e5m2: float16's upper byte */
        const uint8_t *v = (const uint8_t *)p;
        for (Py_ssize_t i = 0; i < n; i++) {
            out[i] = half_bits_to_double((uint16_t)(v[i] << 8));
            special |= (v[i] & 0x7c) == 0x7c;
        }
    } else if (code == 'F') {   /* float8_e4m3fn: its bits in float16's places, times 2^8 */
        const uint8_t *v = (const uint8_t *)p;
        for (Py_ssize_t i = 0; i < n; i++) {
            out[i] = half_bits_to_double((uint16_t)(((v[i] & 0x80) << 8) | ((v[i] & 0x7f) << 7)))
                     * 256.0;
            special |= (v[i] & 0x7f) == 0x7f;
        }
    } else if (code == 'e') {
        for (Py_ssize_t i = 0; i < n; i++) {
            uint16_t h = load_u16(p + 2 * i);
            out[i] = half_bits_to_double(h);
            special |= (h & 0x7c00) == 0x7c00;
        }
    } else if (code == 'b') {
        for (Py_ssize_t i = 0; i < n; i++) {
            uint16_t h = load_u16(p + 2 * i);
            out[i] = bf16_bits_to_double(h);
            special |= (h & 0x7f80) == 0x7f80;
        }
    } else if (code == 'f') {
        for (Py_ssize_t i = 0; i < n; i++) {
            out[i] = (double)load_f32(p + 4 * i);
            special |= !(fabs(out[i]) <= 1.7976931348623157e308);
        }
    } else if (code == 'c') {
        const int8_t *v = (const int8_t *)p;
        for (Py_ssize_t i = 0; i < n; i++) out[i] = (double)v[i];
    } else if (code == 'B') {
        const uint8_t *v = (const uint8_t *)p;
        for (Py_ssize_t i = 0; i < n; i++) out[i] = (double)v[i];
    } else if (code == 'h') {
        for (Py_ssize_t i = 0; i < n; i++) out[i] = (double)load_i16(p + 2 * i);
    } else if (code == 'i') {
        for (Py_ssize_t i = 0; i < n; i++) out[i] = (double)load_i32(p + 4 * i);
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            out[i] = load_f64(p + 8 * i);
            special |= !(fabs(out[i]) <= 1.7976931348623157e308);
        }
    }
    return special;
}

typedef struct {
    double sq, xx, yy, xy, sa, mx, mr;
    double zr, mm, nz;   /* counts, exact in float64 up to 2^53 */
} Sums;

/* The elements of a piece that the rank test samples (`lowrank.sample_positions`), copied out
 * while the block that holds them is in L1: `pos` holds `count` ascending element indices into
 * the flattened tensor, less `lo` indices into the piece (checked by `stats` before the pass:
 * 0 <= pos[k] - lo < n, ascending), `k` the next one to copy;
 * element pos[k] of a (of b) goes to oa + k·sa (ob + k·sb), through memcpy (any alignment). */
typedef struct {
    const char *pos;     /* int64 indices, read through memcpy */
    int64_t lo;          /* the piece's first element: pos[k] - lo indexes the piece */
    Py_ssize_t count, k;
    char *oa, *ob;
    Py_ssize_t sa, sb;
} Gather;

static inline int64_t load_i64(const char *p) { int64_t v; memcpy(&v, p, sizeof v); return v; }

/* One element of `size` bytes (1, 2, 4 or 8): a memcpy of a constant size, which compiles to one
 * load and one store (a variable size calls the library's memmove, per element). */
static inline void copy_item(char *dst, const char *src, Py_ssize_t size) {
    switch (size) {
    case 1: memcpy(dst, src, 1); break;
    case 2: memcpy(dst, src, 2); break;
    case 4: memcpy(dst, src, 4); break;
    default: memcpy(dst, src, 8); break;
    }
}

/* Copy the sampled elements below element `end` of the piece (a block was just read). */
static inline void gather_upto(Gather *g, const char *pa, const char *pb, Py_ssize_t end) {
    if (g == NULL) return;
    /* the fields in locals: the copies store through char pointers, which may alias *g, so
     * g->k kept in memory made each copy wait on the last one's store (5.7 ns a copy, measured) */
    const char *pos = g->pos;
    const int64_t lo = g->lo;
    const Py_ssize_t count = g->count, sa = g->sa, sb = g->sb;
    char *oa = g->oa, *ob = g->ob;
    Py_ssize_t k = g->k;
    while (k < count) {
        int64_t i = load_i64(pos + 8 * k) - lo;
        if (i >= end) break;
        copy_item(oa + k * sa, pa + (Py_ssize_t)i * sa, sa);
        copy_item(ob + k * sb, pb + (Py_ssize_t)i * sb, sb);
        k++;
    }
    g->k = k;
}

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

static Py_ssize_t itemsize(char code);

/* The exact ratio and zero-of-b figures over one widened block (the AVX-512 pass's re-run of a
 * flagged block). Ratios are 0 where b is 0. Returns the block's zero-of-b count, which is added
 * to s->zr only when `zeros` (the vector loop did not count them). */
VECTOR_CLONES
static double exact_block(const double *restrict xs, const double *restrict ys, Py_ssize_t n,
                          int zeros, Sums *restrict s) {
    double mr = 0, zr = 0;
#pragma omp simd reduction(+:zr) reduction(max:mr)
    for (Py_ssize_t i = 0; i < n; i++) {
        double ad = fabs(xs[i] - ys[i]), ay = fabs(ys[i]);
        double ref = ay != 0.0 ? 1.0 : 0.0;
        double r = ad / (ay + (1.0 - ref)) * ref;
        mr = r > mr ? r : mr;
        zr += (ad != 0.0 ? 1.0 : 0.0) * (1.0 - ref);
    }
    s->mr = mr > s->mr ? mr : s->mr;
    if (zeros) s->zr += zr;
    return zr;
}

#if defined(__GNUC__) && defined(__x86_64__)
#define HAVE_V4 1
#include <immintrin.h>
#define V4 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))

/* One step over 8 lanes into the accumulator set k: the sums, the maxima of |d| and |b|, the
 * tolerance count (atol + |b|·rtol rounded as torch rounds it: a product, then a sum, no fused
 * multiply-add) and the flag |d| > t·|b|. With ZC (a constant) the zeros of b where a differs
 * are counted here and raise no flag: for inputs with many zeros (integers, pruned tensors),
 * where they would flag every block. */
#define V4_DECL(k) __m512d sq##k = zero, xx##k = zero, yy##k = zero, xy##k = zero, \
    sa##k = zero, mx##k = zero, my##k = zero, mr##k = zero; \
    __m512i mm##k = _mm512_setzero_si512(), zr##k = _mm512_setzero_si512();
#define V4_STEP(k, X, Y, ZC, DIV) do { \
    __m512d x_ = (X), y_ = (Y), d_ = _mm512_sub_pd(x_, y_); \
    __m512d ad_ = _mm512_andnot_pd(sign, d_), ay_ = _mm512_andnot_pd(sign, y_); \
    sq##k = _mm512_fmadd_pd(d_, d_, sq##k); xx##k = _mm512_fmadd_pd(x_, x_, xx##k); \
    yy##k = _mm512_fmadd_pd(y_, y_, yy##k); xy##k = _mm512_fmadd_pd(x_, y_, xy##k); \
    sa##k = _mm512_add_pd(sa##k, ad_); \
    mx##k = _mm512_max_pd(mx##k, ad_); my##k = _mm512_max_pd(my##k, ay_); \
    __m512d tol_ = _mm512_add_pd(vatol, _mm512_mul_pd(ay_, vrtol)); \
    mm##k = _mm512_mask_sub_epi64(mm##k, _mm512_cmp_pd_mask(ad_, tol_, _CMP_GT_OQ), mm##k, \
                                  minus1); \
    if (DIV) { \
        __mmask8 kz_ = _mm512_cmp_pd_mask(ay_, zero, _CMP_EQ_OQ); \
        zr##k = _mm512_mask_sub_epi64(zr##k, _mm512_mask_cmp_pd_mask(kz_, ad_, zero, \
                                      _CMP_NEQ_OQ), zr##k, minus1); \
        mr##k = _mm512_max_pd(mr##k, _mm512_maskz_div_pd((__mmask8)~kz_, ad_, ay_)); \
    } else if (ZC) { \
        __mmask8 kz_ = _mm512_cmp_pd_mask(ay_, zero, _CMP_EQ_OQ); \
        zr##k = _mm512_mask_sub_epi64(zr##k, _mm512_mask_cmp_pd_mask(kz_, ad_, zero, \
                                      _CMP_NEQ_OQ), zr##k, minus1); \
        flag |= _mm512_mask_cmp_pd_mask((__mmask8)~kz_, ad_, _mm512_mul_pd(vt, ay_), \
                                        _CMP_GT_OQ); \
    } else { \
        flag |= _mm512_cmp_pd_mask(ad_, _mm512_mul_pd(vt, ay_), _CMP_GT_OQ); \
    } \
} while (0)
#define V4_FOLD(k) do { \
    s->sq += _mm512_reduce_add_pd(sq##k); s->xx += _mm512_reduce_add_pd(xx##k); \
    s->yy += _mm512_reduce_add_pd(yy##k); s->xy += _mm512_reduce_add_pd(xy##k); \
    s->sa += _mm512_reduce_add_pd(sa##k); s->mm += (double)_mm512_reduce_add_epi64(mm##k); \
    s->zr += (double)_mm512_reduce_add_epi64(zr##k); \
    double m_ = _mm512_reduce_max_pd(mx##k); s->mx = m_ > s->mx ? m_ : s->mx; \
    m_ = _mm512_reduce_max_pd(mr##k); s->mr = m_ > s->mr ? m_ : s->mr; \
    m_ = _mm512_reduce_max_pd(my##k); my_all = m_ > my_all ? m_ : my_all; \
} while (0)

/* Software prefetch this many bytes ahead on both sides of a direct pair: streaming from memory,
 * 0.62 ns per float16 pair against 0.74 without (measured, one thread; 512 to 4096 alike). */
#define PREFETCH_AHEAD 1024
#define PREFETCH(i) do { if (direct) { \
    _mm_prefetch((const char *)((uintptr_t)qa + (uintptr_t)((i) * w) + PREFETCH_AHEAD), \
                 _MM_HINT_T0); \
    _mm_prefetch((const char *)((uintptr_t)qb + (uintptr_t)((i) * w) + PREFETCH_AHEAD), \
                 _MM_HINT_T0); } } while (0)

/* 16 elements (fewer at the end: masked, the rest read as 0, which adds nothing to any figure
 * and raises no flag) of one side as two vectors of float64; `table` for code 't'. Always
 * inlined: called out of line per 16 elements, float16 took 0.85 ns per pair instead of 0.56. */
V4 static inline __attribute__((always_inline)) void v4_load(
        const char *p, char code, const double *table, Py_ssize_t left, __m512d *lo,
        __m512d *hi) {
    __mmask16 m16 = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
    __m512 f;
    __m512i w;
    switch (code) {
    case 'e':
        f = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m16, p));
        break;
    case 'b':
        w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m16, p));
        f = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
        break;
    case 'f':
        f = _mm512_maskz_loadu_ps(m16, p);
        break;
    case 'd':
        *lo = _mm512_maskz_loadu_pd((__mmask8)m16, p);
        /* (no pointer past the piece is formed when the second half is empty) */
        *hi = left > 8 ? _mm512_maskz_loadu_pd((__mmask8)(m16 >> 8), p + 64) : _mm512_setzero_pd();
        return;
    case 'E':   /* float8_e5m2: float16's upper byte (Inf and NaN stay Inf and NaN) */
        f = _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(
            _mm_maskz_loadu_epi8(m16, p)), 8));
        break;
    case 'F': { /* float8_e4m3fn: in float16's places times 2^8; its NaN made a NaN again */
        __m128i b8 = _mm_maskz_loadu_epi8(m16, p);
        __m256i h = _mm256_cvtepu8_epi16(b8);
        h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x80)), 8),
                            _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7f)), 7));
        f = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
        __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_and_si128(b8, _mm_set1_epi8(0x7f)),
                                            _mm_set1_epi8(0x7f));
        f = _mm512_mask_mov_ps(f, nan, _mm512_set1_ps(NAN));
        break;
    }
    case 't':   /* one-byte floats: their bytes index the 256-entry table */
        w = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m16, p));
        *lo = _mm512_mask_i32gather_pd(_mm512_setzero_pd(), (__mmask8)m16,
                                       _mm512_castsi512_si256(w), table, 8);
        *hi = _mm512_mask_i32gather_pd(_mm512_setzero_pd(), (__mmask8)(m16 >> 8),
                                       _mm512_extracti64x4_epi64(w, 1), table, 8);
        return;
    default:    /* integers, exact in float64 */
        if (code == 'c') w = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m16, p));
        else if (code == 'B') w = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m16, p));
        else if (code == 'h') w = _mm512_cvtepi16_epi32(_mm256_maskz_loadu_epi16(m16, p));
        else w = _mm512_maskz_loadu_epi32(m16, p);   /* 'i' */
        *lo = _mm512_cvtepi32_pd(_mm512_castsi512_si256(w));
        *hi = _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(w, 1));
        return;
    }
    *lo = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
    *hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
}

/* The statistics over n pairs with AVX-512. Pairs of one code are read directly (an Inf or a NaN
 * then makes a sum Inf or NaN: d = Inf - Inf is NaN); two different codes are widened block by
 * block (`widen`, which flags them: its float16 route makes them finite) and read as float64.
 * Sets s->nz to 1 when some b is non-zero. Returns non-zero when `widen` found an Inf or NaN. */
V4 static int run_v4(const char *pa, char ca, const double *ta, const char *pb, char cb,
                      const double *tb, Py_ssize_t n, double atol, double rtol, Sums *s,
                      Gather *g) {
    const __m512d zero = _mm512_setzero_pd(), sign = _mm512_set1_pd(-0.0);
    const __m512d vatol = _mm512_set1_pd(atol), vrtol = _mm512_set1_pd(rtol);
    const __m512i minus1 = _mm512_set1_epi64(-1);
    V4_DECL(0) V4_DECL(1)
    double xs[BLOCK], ys[BLOCK], my_all = 0;
    Py_ssize_t sa = itemsize(ca), sb = itemsize(cb);
    int special = 0;
    int direct = ca == cb;
    char code = direct ? ca : 'd';
    const double *tx = direct ? ta : NULL, *ty = direct ? tb : NULL;   /* code 't' only */
    /* count zeros of b in the vector loop: from the start for integers (they hold many), once
     * seen for the rest */
    int zc = !direct || ca == 'c' || ca == 'B' || ca == 'h' || ca == 'i';
    int div = 0;
    Py_ssize_t blocks = 0, flagged = 0;
    for (Py_ssize_t at = 0; at < n; at += BLOCK) {
        Py_ssize_t m = n - at < BLOCK ? n - at : BLOCK;
        const char *qa, *qb;
        if (direct) {
            qa = pa + at * sa;
            qb = pb + at * sb;
        } else {
            special |= widen(pa + at * sa, ca, ta, m, xs) | widen(pb + at * sb, cb, tb, m, ys);
            qa = (const char *)xs;
            qb = (const char *)ys;
        }
        Py_ssize_t w = direct ? sa : 8;
        /* the largest ratio so far, less 4 ulps: fl(t·|b|) < |d| for every ratio above it */
        double t = s->mr > 0 ? s->mr * (1.0 - 4.0 * 2.220446049250313e-16) : 0.0;
        __m512d vt = _mm512_set1_pd(t);
        __mmask8 flag = 0;
#define V4_LOOP(ZC, DIV) for (Py_ssize_t i = 0; i < m; i += 16) { \
            __m512d x0, x1, y0, y1; \
            PREFETCH(i); \
            v4_load(qa + i * w, code, tx, m - i, &x0, &x1); \
            v4_load(qb + i * w, code, ty, m - i, &y0, &y1); \
            V4_STEP(0, x0, y0, ZC, DIV); \
            V4_STEP(1, x1, y1, ZC, DIV); \
        }
        blocks++;
        if (div) {
            V4_LOOP(1, 1)
            gather_upto(g, pa, pb, at + m);   /* the block's lines are in L1 now */
            continue;
        } else if (zc) {
            V4_LOOP(1, 0)
        } else {
            V4_LOOP(0, 0)
        }
        /* after the block's loop, whose loads brought its lines in: copied from L1 (before it,
         * each sampled line was a cache miss the loop waited on: 11% of the pass, measured) */
        gather_upto(g, pa, pb, at + m);
        /* t = inf (a float64 ratio that overflowed) would make inf·0 a NaN and hide zeros of b */
        if (flag || !(t <= 1.7976931348623157e308)) {
            if (direct) {
                widen(qa, ca, ta, m, xs);
                widen(qb, cb, tb, m, ys);
            }
            if (exact_block(xs, ys, m, !zc, s) > 0)
                zc = 1;   /* zeros of b where a differs: count them in the loop from now on */
            /* A quarter of the blocks flagged after the first 64 (values from a small set,
             * float8 or integers, whose largest ratio recurs; new maxima alone flag ~ln(blocks)
             * of them): divide in the loop from now on instead. */
            if (++flagged * 4 >= blocks && blocks >= 64)
                div = 1;
        }
    }
    V4_FOLD(0);
    V4_FOLD(1);
    s->nz = my_all > 0;
    if (s->nz && s->mr < 0) s->mr = 0;
    return special;
}

static int cpu_v4;   /* set at load time: the CPU (and the OS) run AVX-512 */
static int use_v4;   /* cpu_v4, unless the tests turned it off (`avx512`) */
#else
static const int cpu_v4 = 0;
static int use_v4 = 0;
#endif

static Py_ssize_t itemsize(char code) {
    switch (code) {
    case 'c': case 'B': case 't': case 'E': case 'F': return 1;
    case 'e': case 'b': case 'h': return 2;
    case 'f': case 'i': return 4;
    case 'd': return 8;
    default: return 0;
    }
}

/* Every statistic over n pairs at pa and pb into s (which starts zeroed). Returns non-zero when
 * a value is Inf or NaN: the caller's careful path takes that piece. */
static int accumulate(const char *pa, char ca, const double *ta, const char *pb, char cb,
                      const double *tb, Py_ssize_t n, double atol, double rtol, Sums *s,
                      Gather *g) {
#ifdef HAVE_V4
    if (use_v4) {
        Sums p;
        memset(&p, 0, sizeof p);
        int special = run_v4(pa, ca, ta, pb, cb, tb, n, atol, rtol, &p, g);
        s->sq += p.sq; s->xx += p.xx; s->yy += p.yy; s->xy += p.xy; s->sa += p.sa;
        s->mx = p.mx > s->mx ? p.mx : s->mx;
        s->mr = p.mr > s->mr ? p.mr : s->mr;
        s->zr += p.zr; s->mm += p.mm; s->nz += p.nz;
        return special || !isfinite(p.sq) || !isfinite(p.xx) || !isfinite(p.yy);
    }
#endif
    double xs[BLOCK], ys[BLOCK];
    Py_ssize_t sa = itemsize(ca), sb = itemsize(cb);
    int special = 0;
    for (Py_ssize_t at = 0; at < n && !special; at += BLOCK) {
        Py_ssize_t m = n - at < BLOCK ? n - at : BLOCK;
        special = widen(pa + at * sa, ca, ta, m, xs) | widen(pb + at * sb, cb, tb, m, ys);
        block_stats(xs, ys, m, atol, rtol, s);
        gather_upto(g, pa, pb, at + m);
    }
    return special || !isfinite(s->sq) || !isfinite(s->xx) || !isfinite(s->yy);
}

static PyObject *result(const Sums *s) {
    /* no element of b is non-zero: no ratio at all */
    double max_rel = s->nz == 0 ? -INFINITY : s->mr;
    return Py_BuildValue("dddddddLL", s->sq, s->xx, s->yy, s->xy, s->sa, s->mx, max_rel,
                         (long long)s->zr, (long long)s->mm);
}

static int check_codes(char ca, char cb, const Py_buffer *ta, const Py_buffer *tb) {
    int tables_ok = (ca != 't' || ta->len == 256 * (Py_ssize_t)sizeof(double)) &&
                    (cb != 't' || tb->len == 256 * (Py_ssize_t)sizeof(double));
    return itemsize(ca) && itemsize(cb) && tables_ok;
}

/* stats(a, code_a, b, code_b, atol, rtol, table_a, table_b[, pos, lo, out_a, out_b]) ->
 * (sum_sq, xx, yy, dot, sum_abs, max_abs, max_rel, zero_ref, mismatched) or None when a value is
 * not finite (then out_a and out_b may be partly written: the caller gathers them itself). a and b:
 * C-contiguous buffers of n elements each, codes 'e' float16, 'b' bfloat16 (both as their uint16
 * bits), 'f' float32, 'd' float64, 'c' int8, 'B' uint8, 'h' int16, 'i' int32 (all exact in
 * float64), 'E' float8_e5m2, 'F' float8_e4m3fn (both as their bytes), 't' bytes of another
 * one-byte float indexing the 256-entry float64 table passed after rtol (table_a, then
 * table_b). max_rel is -inf when every element of b is 0. With pos (int64 element indices of
 * the flattened tensor, ascending, each in [lo, lo + n): the piece holds elements lo .. lo + n - 1)
 * the elements at those indices are also copied, in order, to out_a and out_b (writable buffers
 * of len(pos) elements of a's and b's itemsize), each block's while it is in L1: the rank test's
 * sample (`diffing._Sample`; its twin is numpy's take, which the tests hold it to). */
static PyObject *stats(PyObject *self, PyObject *args) {
    Py_buffer ba, bb, ta = {0}, tb = {0}, bp = {0}, oa = {0}, ob = {0};
    int ca, cb;
    double atol, rtol;
    long long lo = 0;
    if (!PyArg_ParseTuple(args, "y*Cy*Cdd|y*y*y*Lw*w*", &ba, &ca, &bb, &cb, &atol, &rtol, &ta,
                          &tb, &bp, &lo, &oa, &ob))
        return NULL;
    Gather gather, *g = NULL;
    Py_ssize_t sa = itemsize((char)ca), sb = itemsize((char)cb);
    PyObject *out = NULL;
    /* The buffers may start at any byte and the tables too (a memoryview slice): every element
     * is read through an alignment-safe load, and the tables are copied into aligned locals. */
    double table_a[256], table_b[256];
    if (!check_codes((char)ca, (char)cb, &ta, &tb) || ba.len < 0 || bb.len < 0 ||
            ba.len % sa || bb.len % sb || ba.len / sa != bb.len / sb) {
        PyErr_SetString(PyExc_ValueError, "stats: unknown dtype code, pieces of unequal length "
                        "or a missing 256-entry float64 table");
        goto done;
    }
    Py_ssize_t n = ba.len / sa;
    if (bp.obj != NULL) {
        /* every index checked before the pass: within the piece, ascending; the outputs exactly
         * len(pos) elements (count <= len / 8 and itemsizes <= 8: no product overflows) */
        Py_ssize_t count = bp.len / 8;
        int ok = bp.len % 8 == 0 && oa.obj != NULL && ob.obj != NULL && lo >= 0 &&
                 oa.len == count * sa && ob.len == count * sb;
        int64_t prev = lo;
        for (Py_ssize_t k = 0; ok && k < count; k++) {
            int64_t p = load_i64((const char *)bp.buf + 8 * k);
            /* p >= prev >= lo >= 0, so p - lo cannot overflow */
            ok = p >= prev && p - (int64_t)lo < (int64_t)n;
            prev = p;
        }
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "stats: sample positions outside the piece or not "
                            "ascending, or outputs not of their length");
            goto done;
        }
        gather.pos = (const char *)bp.buf;
        gather.lo = (int64_t)lo;
        gather.count = count;
        gather.k = 0;
        gather.oa = (char *)oa.buf;
        gather.ob = (char *)ob.buf;
        gather.sa = sa;
        gather.sb = sb;
        g = &gather;
    }
    if (ca == 't')
        memcpy(table_a, ta.buf, sizeof table_a);
    if (cb == 't')
        memcpy(table_b, tb.buf, sizeof table_b);
    Sums s;
    memset(&s, 0, sizeof s);   /* max lanes start at 0: |d| and ratios are >= 0 */
    int special;
    /* n elements of at most 8 bytes: every offset below (at * itemsize, at < n) is within the
     * buffers' lengths, so none of them can overflow */
    Py_BEGIN_ALLOW_THREADS
    special = accumulate((const char *)ba.buf, (char)ca, ca == 't' ? table_a : NULL,
                         (const char *)bb.buf, (char)cb, cb == 't' ? table_b : NULL,
                         n, atol, rtol, &s, g);
    Py_END_ALLOW_THREADS
    if (!special && g != NULL && g->k != g->count)
        special = 1;   /* (cannot happen: every index is below n) the caller gathers them */
    if (special) {
        out = Py_None;
        Py_INCREF(out);
    } else {
        out = result(&s);
    }
done:
    PyBuffer_Release(&ba);
    PyBuffer_Release(&bb);
    if (ta.obj) PyBuffer_Release(&ta);
    if (tb.obj) PyBuffer_Release(&tb);
    if (bp.obj) PyBuffer_Release(&bp);
    if (oa.obj) PyBuffer_Release(&oa);
    if (ob.obj) PyBuffer_Release(&ob);
    return out;
}

/* equal(a, b) -> whether two buffers hold the same bytes: memcmp with the GIL released. The byte
 * comparison of identical pairs, without numpy's temporary of one bool per element (a fresh
 * 2 MB allocation, faulted in, per 16 MiB piece). */
static PyObject *equal(PyObject *self, PyObject *args) {
    Py_buffer ba, bb;
    if (!PyArg_ParseTuple(args, "y*y*", &ba, &bb))
        return NULL;
    int same = ba.len == bb.len;
    if (same && ba.len) {
        Py_BEGIN_ALLOW_THREADS
        same = memcmp(ba.buf, bb.buf, (size_t)ba.len) == 0;
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&ba);
    PyBuffer_Release(&bb);
    return PyBool_FromLong(same);
}

/* Stage 1 of the rank test (`spectrum`; `lowrank.rank_of_sample`'s numpy route is its twin).
 * Largest sample: SAMPLE_MAX elements a side (the test's is at most 160 x 192). */
#define SAMPLE_MAX (1 << 22)

/* Σ x[i]·y[i] over n, in sixteen partial sums: the compiler keeps them in vector registers,
 * several of them, so that the additions' latency is hidden. */
VECTOR_CLONES
static double dot(const double *restrict x, const double *restrict y, Py_ssize_t n) {
    double acc[16] = {0};
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++)
            acc[j] += x[i + j] * y[i + j];
    double sum = 0.0;
    for (; i < n; i++) sum += x[i] * y[i];
    for (int j = 0; j < 16; j++) sum += acc[j];
    return sum;
}

/* The Gram matrix G of D = B - A (s x c, widened exactly to float64; G = D·Dᵀ when s <= c, else
 * Dᵀ·D: k x k, k = min(s, c)) into g (full, row-major), its trace into *total and ΣB² into
 * *sumsq_b. d: s·c doubles of scratch; when s > c, Dᵀ (s·c doubles) is made after G in g.
 * Returns -1 when a value of A or B is NaN or infinite, else 0. */
static int gram(const char *pa, char ca, const char *pb, char cb, Py_ssize_t s, Py_ssize_t c,
                double *d, double *g, double *total, double *sumsq_b) {
    Py_ssize_t sa = itemsize(ca), sb = itemsize(cb), k = s <= c ? s : c;
    double sum_b = 0.0, row_b[BLOCK];
    int special = 0;
    /* d = B - A row by row, B's squares summed on the way; rows of c elements, in blocks */
    for (Py_ssize_t r = 0; r < s; r++) {
        double *dr = d + r * c;
        for (Py_ssize_t at = 0; at < c; at += BLOCK) {
            Py_ssize_t m = c - at < BLOCK ? c - at : BLOCK;
            Py_ssize_t e = r * c + at;   /* < s·c <= SAMPLE_MAX: no overflow */
            special |= widen(pa + e * sa, ca, NULL, m, dr + at);
            special |= widen(pb + e * sb, cb, NULL, m, row_b);
            for (Py_ssize_t i = 0; i < m; i++) {
                dr[at + i] = row_b[i] - dr[at + i];
                sum_b += row_b[i] * row_b[i];
            }
        }
    }
    if (special)
        return -1;
    /* the vectors whose dot products G holds: D's rows (s <= c) or its columns, contiguous */
    const double *rows = d;
    Py_ssize_t len = c;
    if (s > c) {
        double *t = g + k * k;
        for (Py_ssize_t r = 0; r < s; r++)
            for (Py_ssize_t j = 0; j < c; j++)
                t[j * s + r] = d[r * c + j];
        rows = t;
        len = s;
    }
    double tr = 0.0;
    for (Py_ssize_t i = 0; i < k; i++) {
        for (Py_ssize_t j = 0; j <= i; j++)
            g[i * k + j] = g[j * k + i] = dot(rows + i * len, rows + j * len, len);
        tr += g[i * k + i];
    }
    *total = tr;
    *sumsq_b = sum_b;
    return 0;
}

/* Whether G - tau·I (k x k) has a Cholesky factor, i.e. every eigenvalue of G is above tau
 * (LAPACK's dpotrf fails exactly when a pivot is not positive). Works in place on the lower
 * triangle, row by row (the Cholesky-Banachiewicz order: row i needs rows < i only); the
 * strict upper triangle is left as it was. */
static int cholesky_above(double *g, Py_ssize_t k, double tau) {
    for (Py_ssize_t i = 0; i < k; i++) {
        double *gi = g + i * k;
        for (Py_ssize_t j = 0; j < i; j++) {
            const double *gj = g + j * k;
            gi[j] = (gi[j] - dot(gi, gj, j)) / gj[j];
        }
        double pivot = gi[i] - tau - dot(gi, gi, i);
        if (!(pivot > 0.0))
            return 0;
        gi[i] = sqrt(pivot);
    }
    return 1;
}

/* G (k x k, full, symmetric) reduced in place to a tridiagonal T = QᵀGQ with the same
 * eigenvalues, by Householder reflections (Golub and Van Loan, alg. 8.3.1): its diagonal into
 * diag, its off-diagonal into off (k - 1 entries). w: 2k doubles of scratch. */
VECTOR_CLONES
static void tridiagonalize(double *g, Py_ssize_t k, double *diag, double *off, double *w) {
    for (Py_ssize_t j = 0; j + 2 < k; j++) {
        Py_ssize_t n = k - j - 1;              /* the trailing block: rows and columns j+1 .. */
        double *v = w, *p = w + n;             /* v = G[j+1.., j] - alpha·e1, then p */
        double norm = 0.0;
        for (Py_ssize_t i = 0; i < n; i++) {
            v[i] = g[(j + 1 + i) * k + j];
            norm += v[i] * v[i];
        }
        norm = sqrt(norm);
        double alpha = v[0] > 0 ? -norm : norm;
        v[0] -= alpha;
        double vv = dot(v, v, n);
        off[j] = alpha;
        if (norm == 0.0 || vv == 0.0) {
            off[j] = g[(j + 1) * k + j];        /* the column is already reduced */
            continue;
        }
        /* p = (2/vv)·B·v (B: the trailing block), q = p - ((vᵀp)/vv)·v, B -= v·qᵀ + q·vᵀ */
        for (Py_ssize_t i = 0; i < n; i++)
            p[i] = (2.0 / vv) * dot(g + (j + 1 + i) * k + j + 1, v, n);
        double kk = dot(v, p, n) / vv;
        for (Py_ssize_t i = 0; i < n; i++) p[i] -= kk * v[i];
        for (Py_ssize_t i = 0; i < n; i++) {
            double *row = g + (j + 1 + i) * k + j + 1;
            for (Py_ssize_t l = 0; l < n; l++)
                row[l] -= v[i] * p[l] + p[i] * v[l];
        }
    }
    for (Py_ssize_t i = 0; i < k; i++) diag[i] = g[i * k + i];
    if (k >= 2)
        off[k - 2] = g[(k - 1) * k + k - 2];
}

/* How many eigenvalues of the tridiagonal T (diag, off) are below x: the Sturm count of the
 * pivots of T - x·I (as LAPACK's dlaebz, with its guard pivmin against a zero pivot). */
static Py_ssize_t below(const double *diag, const double *off, Py_ssize_t k, double x,
                        double pivmin) {
    Py_ssize_t count = 0;
    double q = diag[0] - x;
    for (Py_ssize_t i = 0;; i++) {
        if (fabs(q) < pivmin) q = -pivmin;
        if (q < 0) count++;
        if (i + 1 >= k) break;
        q = diag[i + 1] - x - off[i] * off[i] / q;
    }
    return count;
}

/* T's Gershgorin interval [lo, hi] (widened by its resolution) and the Sturm count's pivot
 * guard (as LAPACK's dstebz) into bounds[0..2]. */
static void bounds_of(const double *diag, const double *off, Py_ssize_t k, double *bounds) {
    double lo = INFINITY, hi = -INFINITY, big = 0.0;
    for (Py_ssize_t i = 0; i < k; i++) {
        double r = (i > 0 ? fabs(off[i - 1]) : 0.0) + (i + 1 < k ? fabs(off[i]) : 0.0);
        if (diag[i] - r < lo) lo = diag[i] - r;
        if (diag[i] + r > hi) hi = diag[i] + r;
        if (i + 1 < k && off[i] * off[i] > big) big = off[i] * off[i];
    }
    double pivmin = DBL_MIN * (big > 1.0 ? big : 1.0);
    double span = fabs(lo) > fabs(hi) ? fabs(lo) : fabs(hi);
    bounds[0] = lo - 2 * DBL_EPSILON * span - pivmin;
    bounds[1] = hi + 2 * DBL_EPSILON * span + pivmin;
    bounds[2] = pivmin;
}

/* Eigenvalues of T by index (out[j]: the (index[j]+1)-th smallest), by bisection of the Sturm
 * count within the bounds, to float64's resolution (absolute error ~ε·‖T‖, as LAPACK's). LANES
 * bisections advance together, so that their Sturm recurrences (a division each step: its
 * latency, not its throughput, bounds one alone) overlap; each lane's steps are those it would
 * take alone. */
#define LANES 4
static void eigenvalues_at(const double *diag, const double *off, Py_ssize_t k,
                           const Py_ssize_t *index, Py_ssize_t count, const double *bounds,
                           double *out) {
    double pivmin = bounds[2];
    double span = fabs(bounds[0]) > fabs(bounds[1]) ? fabs(bounds[0]) : fabs(bounds[1]);
    double tol = 2 * DBL_EPSILON * span + pivmin;
    for (Py_ssize_t g0 = 0; g0 < count; g0 += LANES) {
        Py_ssize_t lanes = count - g0 < LANES ? count - g0 : LANES;
        double a[LANES], b[LANES], x[LANES], q[LANES];
        Py_ssize_t want[LANES], below_x[LANES];
        int open[LANES];
        for (int l = 0; l < LANES; l++) {
            a[l] = bounds[0];
            b[l] = bounds[1];
            want[l] = index[g0 + (l < lanes ? l : lanes - 1)];   /* spare lanes repeat one */
        }
        for (int it = 0; it < 200; it++) {
            int any = 0;
            for (int l = 0; l < LANES; l++) {
                x[l] = 0.5 * (a[l] + b[l]);
                open[l] = !(x[l] <= a[l] || x[l] >= b[l] || b[l] - a[l] <= tol);
                any |= open[l];
            }
            if (!any)
                break;
            /* the Sturm counts at the LANES midpoints, in one walk over T */
            for (int l = 0; l < LANES; l++) {
                q[l] = diag[0] - x[l];
                below_x[l] = 0;
            }
            for (Py_ssize_t i = 0;; i++) {
                for (int l = 0; l < LANES; l++) {
                    if (fabs(q[l]) < pivmin) q[l] = -pivmin;
                    below_x[l] += q[l] < 0;
                }
                if (i + 1 >= k) break;
                double e2 = off[i] * off[i];
                for (int l = 0; l < LANES; l++)
                    q[l] = diag[i + 1] - x[l] - e2 / q[l];
            }
            for (int l = 0; l < LANES; l++) {
                if (!open[l]) continue;
                if (below_x[l] > want[l]) b[l] = x[l]; else a[l] = x[l];
            }
        }
        for (Py_ssize_t l = 0; l < lanes; l++) out[g0 + l] = 0.5 * (a[l] + b[l]);
    }
}

/* The count of the rank test (`lowrank._counted`, numpy's twin) from T, the tridiagonal form of
 * G (both scaled by 2^-e): r = how many eigenvalues stand above tau = max(1e-12·λmax, noise)
 * (noise unscaled, as the certificate's), *top_sum = the sum of those r (the trace less the
 * others: whichever side has fewer is bisected), and top[0..m) the m = min(r + 4, 12, k)
 * largest eigenvalues, clipped at 0, descending; all unscaled. index and values: k + 12 each of
 * scratch. */
static Py_ssize_t count_rank(const double *diag, const double *off, Py_ssize_t k, int e,
                             double noise, double *top_sum, double *top, Py_ssize_t *m,
                             Py_ssize_t *index, double *values) {
    double bounds[3];
    bounds_of(diag, off, k, bounds);
    Py_ssize_t last = k - 1;
    double largest;
    eigenvalues_at(diag, off, k, &last, 1, bounds, &largest);
    largest = ldexp(largest, e);
    double relative = 1e-12 * (largest > 0 ? largest : 0.0);
    double tau = noise > relative ? noise : relative;
    Py_ssize_t r = k - below(diag, off, k, ldexp(tau, -e), bounds[2]);
    *m = r + 4 < 12 ? r + 4 : 12;
    if (*m > k) *m = k;
    /* the side of the count to sum (the fewer), then the top m but the largest, in one batch */
    Py_ssize_t n = 0, lo = r <= k - r ? k - r : 0, hi = r <= k - r ? k : k - r;
    for (Py_ssize_t i = lo; i < hi; i++) index[n++] = i;
    for (Py_ssize_t j = 1; j < *m; j++) index[n++] = k - 1 - j;
    eigenvalues_at(diag, off, k, index, n, bounds, values);
    double sum = 0.0;
    for (Py_ssize_t i = 0; i < hi - lo; i++) sum += values[i];
    if (r > k - r) {
        double trace = 0.0;
        for (Py_ssize_t i = 0; i < k; i++) trace += diag[i];
        sum = trace - sum;
    }
    *top_sum = ldexp(sum, e);
    for (Py_ssize_t j = 0; j < *m; j++) {
        double v = j == 0 ? largest : ldexp(values[hi - lo + j - 1], e);
        top[j] = v > 0.0 ? v : 0.0;
    }
    return r;
}

/* spectrum(a, code_a, b, code_b, s, c, unit, certify) -> the rank test's first step on its sample
 * (`lowrank.rank_of_sample`, whose numpy route is the twin): a and b are the s x c samples of A
 * and B in C order, in their stored dtypes (codes as in `stats`, but not 't'), each at most
 * SAMPLE_MAX elements. Returns -1 when a value is NaN or infinite or G's trace is not finite;
 * with certify, 1 when every eigenvalue of G stands above the noise threshold tau
 * (`lowrank._threshold` of G's largest diagonal entry and unit²·ΣB², the same formula): the
 * Cholesky test; else (trace, ΣB², r, the sum of the r largest eigenvalues, the min(r + 4, 12,
 * k) largest eigenvalues clipped at 0, descending) where r counts the eigenvalues above the
 * threshold of the largest one (`count_rank`). The GIL is released while it runs. */
static PyObject *spectrum(PyObject *self, PyObject *args) {
    Py_buffer ba, bb;
    int ca, cb;
    Py_ssize_t s, c;
    double unit;
    int certify;
    if (!PyArg_ParseTuple(args, "y*Cy*Cnndp", &ba, &ca, &bb, &cb, &s, &c, &unit, &certify))
        return NULL;
    PyObject *out = NULL;
    double *d = NULL;
    Py_ssize_t sa = itemsize((char)ca), sb = itemsize((char)cb);
    /* s, c <= SAMPLE_MAX and s·c <= SAMPLE_MAX (checked by division: no product overflows) */
    if (sa == 0 || sb == 0 || ca == 't' || cb == 't' || s <= 0 || c <= 0 || s > SAMPLE_MAX ||
            c > SAMPLE_MAX / s || ba.len != s * c * sa || bb.len != s * c * sb ||
            !(unit >= 0.0 && unit < 1.0)) {
        PyErr_SetString(PyExc_ValueError, "spectrum: unknown dtype code, a sample that is not "
                        "s x c elements of it, or a unit outside [0, 1)");
        goto done;
    }
    Py_ssize_t k = s <= c ? s : c;
    /* D (s·c), G (k·k), Dᵀ when s > c (s·c), T's two diagonals (2k), the reflections' scratch
     * (2k), the count's indices and values (2k + 24): at most 3·SAMPLE_MAX + 6k + 24 doubles */
    Py_ssize_t after = s > c ? s * c : 0;
    d = PyMem_RawMalloc((size_t)(s * c + k * k + after + 6 * k + 24) * sizeof(double));
    if (d == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    double *g = d + s * c, *diag = g + k * k + after, *off = diag + k, *w = off + k;
    double *values = w + 2 * k;
    Py_ssize_t *index = (Py_ssize_t *)(values + k + 12);   /* (no wider than a double) */
    double total = 0.0, sumsq_b = 0.0, top_sum = 0.0, top[12] = {0};
    Py_ssize_t r = 0, m = 0;
    int got;
    Py_BEGIN_ALLOW_THREADS
    got = gram((const char *)ba.buf, (char)ca, (const char *)bb.buf, (char)cb, s, c, d, g,
               &total, &sumsq_b);
    if (got == 0 && !isfinite(total))
        got = -1;
    /* the noise threshold's rounding term, as `lowrank._threshold` has it */
    double root = 1.0 / sqrt((double)s) + 1.0 / sqrt((double)c);
    double noise = 4.0 * (unit * unit * sumsq_b) * (root * root);
    if (got == 0 && total > 0.0 && certify) {
        double most = 0.0;
        for (Py_ssize_t i = 0; i < k; i++) {
            diag[i] = g[i * k + i];
            if (diag[i] > most) most = diag[i];
        }
        /* Python's max(1e-12·top, noise): the first unless the second is larger (NaN is not) */
        double relative = 1e-12 * most;
        if (cholesky_above(g, k, noise > relative ? noise : relative)) {
            got = 1;
        } else {   /* G again from its upper triangle and diagonal, which the factor left */
            for (Py_ssize_t i = 0; i < k; i++) {
                g[i * k + i] = diag[i];
                for (Py_ssize_t j = 0; j < i; j++) g[i * k + j] = g[j * k + i];
            }
        }
    }
    if (got == 0 && total == 0.0) {
        m = k < 4 ? k : 4;   /* D = 0: so is G; no rank, its eigenvalues 0 */
    } else if (got == 0) {
        /* scaled by a power of two (exact) so that G's largest entry is about 1: the reflections'
         * sums of squares neither overflow nor underflow (LAPACK's dsyev scales likewise) */
        double most = 0.0;
        for (Py_ssize_t i = 0; i < k * k; i++)
            if (fabs(g[i]) > most) most = fabs(g[i]);
        int e;
        frexp(most, &e);
        for (Py_ssize_t i = 0; i < k * k; i++) g[i] = ldexp(g[i], -e);
        tridiagonalize(g, k, diag, off, w);
        r = count_rank(diag, off, k, e, noise, &top_sum, top, &m, index, values);
    }
    Py_END_ALLOW_THREADS
    if (got != 0) {
        out = PyLong_FromLong(got);
    } else {
        PyObject *values = PyTuple_New(m);
        for (Py_ssize_t j = 0; values != NULL && j < m; j++) {
            PyObject *v = PyFloat_FromDouble(top[j]);
            if (v == NULL) {
                Py_CLEAR(values);
                break;
            }
            PyTuple_SET_ITEM(values, j, v);
        }
        if (values != NULL)
            out = Py_BuildValue("ddndN", total, sumsq_b, r, top_sum, values);
    }
done:
    PyMem_RawFree(d);
    PyBuffer_Release(&ba);
    PyBuffer_Release(&bb);
    return out;
}

/* avx512(on) -> whether the AVX-512 pass was in use; turns it on (where the CPU has it) or off,
 * so that the tests can hold the portable loop and the AVX-512 pass to the same figures. */
static PyObject *avx512(PyObject *self, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    int was = use_v4;
    use_v4 = on && cpu_v4;
    return PyBool_FromLong(was);
}

static PyMethodDef methods[] = {
    {"stats", stats, METH_VARARGS, "One pass of the diff's statistics over a pair of pieces."},
    {"equal", equal, METH_VARARGS, "Whether two buffers hold the same bytes (memcmp, no GIL)."},
    {"spectrum", spectrum, METH_VARARGS, "The rank test's first step on its sample: full rank "
     "certified (1), not finite (-1), or its count (trace, ΣB², rank, top sum, top values)."},
    {"avx512", avx512, METH_O, "Use the AVX-512 pass (where the CPU has it) or not; returns the "
     "previous setting."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_diffkernel", "The diff's one-pass statistics (optional, C).", -1,
    methods,
};

/* Bumped whenever stats() changes its arguments or results: `diffing` uses a build only when it
 * carries the ABI it was written for (a stale build of an editable install is ignored). */
#define KERNEL_ABI 8

PyMODINIT_FUNC PyInit__diffkernel(void) {
#ifdef HAVE_V4
    __builtin_cpu_init();
    cpu_v4 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
    use_v4 = cpu_v4;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "ABI", KERNEL_ABI) < 0 ||
                      PyModule_AddIntConstant(m, "AVX512", cpu_v4) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
