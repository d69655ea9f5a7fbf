/* psoup's hot loops with nothing else around them, to measure what this machine can do.
 *
 * reject_or4: the shared probe of a batch over four indexed attributes (Fig. 9): for
 *   each tuple, the OR of the four reject rows of its cells, inverted, ANDed with the
 *   interest row, stored as the tuple's result row (words uint64 per row).
 * reject_or4_timed: reject_or4 over the same batch reps times, timed inside C (seconds),
 *   so that the time is the loop's own and not that of crossing from Python per batch.
 * column_positions: the positions of the set bits of one query's bit column (one bit per
 *   tuple, contiguous), the least an invocation's find can do.
 * strided_positions: the same over a row-major bitmap (one word per tuple at a stride).
 * retain_or4: reject_or4 as an engine that answers later must run it: the batch's result
 *   rows written (streaming stores) to the next slice of a ring as long as the retention,
 *   not to one reused buffer the cache holds, and the batch's columns of 8-byte values
 *   copied into the next slice of a ring of stored columns (the tuples are kept too).
 *
 * Built by bench/floor.py with the system compiler: cc -O3 -march=native -shared -fPIC. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* A store that does not read the line first nor keep it in the cache, where the machine
 * has one (psoup's probe writes its results so: they are read at invocation, not now). */
#ifdef __x86_64__
#include <immintrin.h>
#define STREAM(p, v) _mm_stream_si64((long long *)(p), (long long)(v))
#else
#define STREAM(p, v) (*(p) = (v))
#endif

void reject_or4(const uint64_t *ta, const uint64_t *tb, const uint64_t *tc,
                const uint64_t *td, const int64_t *ra, const int64_t *rb,
                const int64_t *rc, const int64_t *rd, const uint64_t *interest,
                uint64_t *out, size_t n, size_t words)
{
    for (size_t i = 0; i < n; i++) {
        const uint64_t *a = ta + (size_t)ra[i] * words;
        const uint64_t *b = tb + (size_t)rb[i] * words;
        const uint64_t *c = tc + (size_t)rc[i] * words;
        const uint64_t *d = td + (size_t)rd[i] * words;
        uint64_t *o = out + i * words;
        for (size_t w = 0; w < words; w++)
            o[w] = ~(a[w] | b[w] | c[w] | d[w]) & interest[w];
    }
}

typedef void probe_fn(const uint64_t *, const uint64_t *, const uint64_t *,
                      const uint64_t *, const int64_t *, const int64_t *,
                      const int64_t *, const int64_t *, const uint64_t *, uint64_t *,
                      size_t, size_t);

/* One clock reading each side of all the batches: a ctypes call per 4,096 tuples costs
 * 20-30% of the loop itself at 1,024 queries, and that is Python's cost, not the
 * machine's. The probe is called through a volatile pointer so that the compiler can
 * neither inline it here (the loop timed is reject_or4's own code, the one Python calls)
 * nor fold the repetitions, which write the same rows, into one. */
double reject_or4_timed(const uint64_t *ta, const uint64_t *tb, const uint64_t *tc,
                        const uint64_t *td, const int64_t *ra, const int64_t *rb,
                        const int64_t *rc, const int64_t *rd, const uint64_t *interest,
                        uint64_t *out, size_t n, size_t words, size_t reps)
{
    probe_fn *volatile probe = reject_or4;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t r = 0; r < reps; r++)
        probe(ta, tb, tc, td, ra, rb, rc, rd, interest, out, n, words);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}

/* The loop of reject_or4 again rather than a shared helper: the bare loop stays exactly
 * the floor loop as the compiler sees it (a shared inline helper with a store-kind
 * flag measured 30-40% slower here, a flattering floor). */
void retain_or4(const uint64_t *ta, const uint64_t *tb, const uint64_t *tc,
                const uint64_t *td, const int64_t *ra, const int64_t *rb,
                const int64_t *rc, const int64_t *rd, const uint64_t *interest,
                uint64_t *out, size_t n, size_t words,
                const uint64_t *src, size_t src_stride, uint64_t *dst, size_t dst_stride,
                size_t columns)
{
    for (size_t c = 0; c < columns; c++)
        memcpy(dst + c * dst_stride, src + c * src_stride, n * sizeof(uint64_t));
    for (size_t i = 0; i < n; i++) {
        const uint64_t *a = ta + (size_t)ra[i] * words;
        const uint64_t *b = tb + (size_t)rb[i] * words;
        const uint64_t *c = tc + (size_t)rc[i] * words;
        const uint64_t *d = td + (size_t)rd[i] * words;
        uint64_t *o = out + i * words;
        size_t w = 0;
#ifdef __AVX512F__
        /* whole cache lines as one 64-byte streaming store each, where out has them */
        if (((uintptr_t)out & 63) == 0 && words % 8 == 0)
            for (; w < words; w += 8) {
                __m512i v = _mm512_or_si512(
                    _mm512_or_si512(_mm512_loadu_si512(a + w), _mm512_loadu_si512(b + w)),
                    _mm512_or_si512(_mm512_loadu_si512(c + w), _mm512_loadu_si512(d + w)));
                _mm512_stream_si512((void *)(o + w),
                                    _mm512_andnot_si512(v, _mm512_loadu_si512(interest + w)));
            }
#endif
        for (; w < words; w++)
            STREAM(o + w, ~(a[w] | b[w] | c[w] | d[w]) & interest[w]);
    }
#ifdef __x86_64__
    _mm_sfence();
#endif
}

size_t column_positions(const uint64_t *column, size_t nwords, int64_t *out)
{
    size_t k = 0;
    for (size_t w = 0; w < nwords; w++) {
        for (uint64_t bits = column[w]; bits; bits &= bits - 1)
            out[k++] = (int64_t)(w * 64 + (size_t)__builtin_ctzll(bits));
    }
    return k;
}

size_t strided_positions(const uint64_t *bitmap, size_t rows, size_t words,
                         size_t word, uint64_t mask, int64_t *out)
{
    size_t k = 0;
    for (size_t r = 0; r < rows; r++)
        if (bitmap[r * words + word] & mask)
            out[k++] = (int64_t)r;
    return k;
}
