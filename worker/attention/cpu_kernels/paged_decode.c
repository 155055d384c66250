/* Paged decode attention on the CPU: one query token per sequence, K/V read in place through the
 * block table (no gathered copy). Built at run time by worker/attention/cpu_kernels/__init__.py
 * with the host's C compiler; called through ctypes with raw pointers.
 *
 * Layouts (element strides, row-major):
 *   q:             [num_seqs, num_heads, head_dim], sequence stride q_seq_stride
 *   out:           [num_seqs, num_heads, head_dim], dense
 *   k_cache, v_cache: [num_blocks * block_size, num_kv_heads, head_dim]
 *   block_tables:  [num_seqs, table_width] int64
 *   context_lens:  [num_seqs] int64: tokens in the cache, the new one included
 * Query heads kvh*group .. kvh*group+group-1 share kv head kvh (grouped-query attention).
 * Scores, softmax and the weighted sum are float32; only the output is rounded to the dtype.
 * One (sequence, kv head) pair is one task, so a row's result does not depend on its batch.
 * head_dim must be a multiple of 16 (at most 256). Returns 0; 1 for a shape the kernel does not
 * take; 2 when memory ran out.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec16.h"
#if defined(__SSE__)
#include <xmmintrin.h>
#define DENORMALS_OFF() const unsigned int saved_csr = _mm_getcsr(); _mm_setcsr(saved_csr | 0x8040)
#define DENORMALS_RESTORE() _mm_setcsr(saved_csr)
#else
#define DENORMALS_OFF() (void)0
#define DENORMALS_RESTORE() (void)0
#endif

#define MAX_GROUP 16
#define PARALLEL_MIN_ELEMENTS (1 << 17)

#define LANES 16
#define MAX_CHUNKS 16 /* head_dim up to 256 */

/* exp(x) for x <= 0 (a score minus its row maximum), vectorizable: 2^n * p(r), r = x - n ln 2,
 * with a degree-6 polynomial; relative error about 2e-7.
 * NOTE: below -46 it returns exactly 0. Such a weight (< 1e-20 against the maximum's 1) cannot
 * move a float32 sum of fewer than 1e12 terms, and keeping it would make p * v denormal, which
 * this CPU computes tens of times slower (measured: the whole kernel 2.4x slower on real K/V). */
#define EXP_CUTOFF (-46.0f)
static inline float exp_nonpositive(float x) {
    const float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
    const float underflow = x < EXP_CUTOFF ? 0.0f : 1.0f;
    x = x < EXP_CUTOFF ? EXP_CUTOFF : x;
    /* Round to nearest by the 1.5 * 2^23 trick (|x| < 2^22 here): unlike roundf it vectorizes. */
    const float n = (x * kLog2e + 12582912.0f) - 12582912.0f;
    const float r = (x - n * kLn2Hi) - n * kLn2Lo;
    float p = 1.38888889e-3f;
    p = p * r + 8.33333333e-3f;
    p = p * r + 4.16666667e-2f;
    p = p * r + 1.66666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const uint32_t scale_bits = (uint32_t)((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &scale_bits, sizeof two_n);
    return p * two_n * underflow;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even; NaN stays NaN */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* One task: sequence `seq`, kv heads [h0, h1). It walks the sequence's blocks twice (K, then
 * V); within a block the token rows of this task's heads are adjacent, and the next block is
 * prefetched while the current one is computed. NOTE: a block shorter than block_size (the
 * first, with a sliding window, or the last) prefetches only as many rows as it computes. */
static inline __attribute__((always_inline)) int decode_task(
    const char *q, int64_t q_seq_stride, const char *k_cache, const char *v_cache,
    const int64_t *table, int64_t ctx, int64_t seq, int64_t h0, int64_t h1, int64_t num_heads,
    int64_t num_kv_heads, int64_t head_dim, int64_t block_size, int64_t window, float scale,
    char *out, const int is_bf16, const int64_t chunks) {
    const size_t elem = is_bf16 ? 2 : 4;
    const int64_t group = num_heads / num_kv_heads;
    const int64_t lo = (window > 0 && ctx > window) ? ctx - window : 0;
    const int64_t n = ctx - lo > 0 ? ctx - lo : 1;
    const int64_t nh = (h1 - h0) * group; /* query heads of this task */
    const size_t row_bytes = elem * (size_t)(num_kv_heads * head_dim); /* one token, all heads */
    float *scores = malloc(sizeof(float) * (size_t)(nh * n));
    v16 *qv = malloc(sizeof(v16) * (size_t)(2 * nh * chunks)); /* scaled q, then acc */
    if (!scores || !qv) {
        free(scores);
        free(qv);
        return 2;
    }
    v16 *acc = qv + nh * chunks;
    float mx[MAX_GROUP * 64], sum[MAX_GROUP * 64];
    for (int64_t h = 0; h < nh; ++h) {
        const char *qr = q + elem * (size_t)(seq * q_seq_stride + (h0 * group + h) * head_dim);
        for (int64_t c = 0; c < chunks; ++c) {
            qv[h * chunks + c] = load16(qr + elem * (size_t)(c * LANES), 0, is_bf16) * scale;
            acc[h * chunks + c] = (v16){0};
        }
        mx[h] = -INFINITY;
    }
    for (int pass = 0; pass < 2; ++pass) {
        const char *cache = pass == 0 ? k_cache : v_cache;
        for (int64_t pos = lo; pos < ctx;) {
            const int64_t off = pos % block_size;
            const int64_t take = (block_size - off < ctx - pos) ? block_size - off : ctx - pos;
            const char *first =
                cache + row_bytes * (size_t)(table[pos / block_size] * block_size + off);
            /* The next block's rows are prefetched one per token computed here: spread out,
             * they never fill the core's queue of outstanding misses the way a burst does. */
            const char *next = pos + take < ctx ? cache + row_bytes * (size_t)(table[(pos + take) /
                                                                          block_size] * block_size)
                                                : NULL;
            for (int64_t t = 0; t < take; ++t) {
                const int64_t i = pos - lo + t;
                if (next)
                    for (size_t b = 0; b < row_bytes; b += 64)
                        __builtin_prefetch(next + row_bytes * (size_t)t + b, 0, 3);
                for (int64_t kvh = h0; kvh < h1; ++kvh) {
                    const char *r = first + row_bytes * (size_t)t + elem * (size_t)(kvh * head_dim);
                    v16 rv[MAX_CHUNKS];
                    for (int64_t c = 0; c < chunks; ++c)
                        rv[c] = load16(r + elem * (size_t)(c * LANES), 0, is_bf16);
                    for (int64_t h = (kvh - h0) * group; h < (kvh - h0 + 1) * group; ++h) {
                        if (pass == 0) {
                            v16 s = qv[h * chunks] * rv[0];
                            for (int64_t c = 1; c < chunks; ++c) s += qv[h * chunks + c] * rv[c];
                            const float score = hsum16(s);
                            scores[h * n + i] = score;
                            mx[h] = score > mx[h] ? score : mx[h];
                        } else {
                            const float p = scores[h * n + i];
                            for (int64_t c = 0; c < chunks; ++c) acc[h * chunks + c] += p * rv[c];
                        }
                    }
                }
            }
            pos += take;
        }
        if (pass == 0) {
            for (int64_t h = 0; h < nh; ++h) {
                float *sh = scores + h * n, total = 0.0f;
                const float top = mx[h];
#pragma omp simd reduction(+ : total)
                for (int64_t i = 0; i < ctx - lo; ++i) {
                    sh[i] = exp_nonpositive(sh[i] - top);
                    total += sh[i];
                }
                sum[h] = total;
            }
        }
    }
    for (int64_t h = 0; h < nh; ++h) {
        const int64_t o = (seq * num_heads + h0 * group + h) * head_dim;
        const float inv = sum[h] > 0.0f ? 1.0f / sum[h] : 0.0f;
        const float *a = (const float *)(acc + h * chunks);
        if (is_bf16) {
            uint16_t *dst = (uint16_t *)out + o;
            for (int64_t d = 0; d < head_dim; ++d) dst[d] = f32_to_bf16(a[d] * inv);
        } else {
            float *dst = (float *)out + o;
            for (int64_t d = 0; d < head_dim; ++d) dst[d] = a[d] * inv;
        }
    }
    free(scores);
    free(qv);
    return 0;
}

static inline __attribute__((always_inline)) int decode(
    const void *q, int64_t q_seq_stride, const void *k_cache, const void *v_cache,
    const int64_t *block_tables, int64_t table_width, const int64_t *context_lens,
    int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
    int64_t block_size, int64_t window, float scale, void *out, const int is_bf16) {
    const int64_t group = num_kv_heads > 0 ? num_heads / num_kv_heads : 0;
    if (head_dim < LANES || head_dim % LANES || head_dim > LANES * MAX_CHUNKS || group < 1 ||
        group > MAX_GROUP || num_kv_heads > 64 || group * num_kv_heads != num_heads ||
        block_size < 1)
        return 1;
    /* Whole sequences per task when there are enough of them to share the threads; else split
     * each sequence by kv head, so a lone request still uses every core. */
    const int64_t splits = num_seqs >= 8 ? 1 : num_kv_heads;
    const int64_t heads_per_task = num_kv_heads / splits;
    int failed = 0;
    /* A step of one short sequence is a few microseconds of work: cheaper on this thread than
     * the fork and join of the team (30 of them a step), which also waits for every thread to be
     * scheduled, so it stays serial below PARALLEL_MIN_ELEMENTS K and V elements read. */
    int64_t num_elements = 0;
    for (int64_t seq = 0; seq < num_seqs; ++seq) num_elements += context_lens[seq];
    num_elements *= 2 * num_kv_heads * head_dim;
    /* Flush-to-zero and denormals-are-zero inside the kernel only (each thread's MXCSR is put
     * back before the region ends, so torch's own kernels are unaffected). */
#pragma omp parallel if (num_elements >= PARALLEL_MIN_ELEMENTS)
    {
        DENORMALS_OFF();
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < num_seqs * splits; ++task) {
            const int64_t seq = task / splits, h0 = (task % splits) * heads_per_task;
            /* NOTE: the common head sizes get their own copy with the chunk count a constant,
             * so each row lives in registers; other multiples of 16 take the general loop. */
#define TASK(CHUNKS)                                                                            \
    decode_task((const char *)q, q_seq_stride, (const char *)k_cache, (const char *)v_cache,    \
                block_tables + seq * table_width, context_lens[seq], seq, h0,                   \
                h0 + heads_per_task, num_heads, num_kv_heads, head_dim, block_size, window,     \
                scale, (char *)out, is_bf16, CHUNKS)
            const int code = head_dim == 64    ? TASK(4)
                             : head_dim == 128 ? TASK(8)
                             : head_dim == 32  ? TASK(2)
                                               : TASK(head_dim / LANES);
#undef TASK
            if (code) {
#pragma omp atomic write
                failed = code;
            }
        }
        DENORMALS_RESTORE();
    }
    return failed;
}

int paged_decode_f32(const float *q, int64_t q_seq_stride, const float *k_cache,
                     const float *v_cache, const int64_t *block_tables, int64_t table_width,
                     const int64_t *context_lens, int64_t num_seqs, int64_t num_heads,
                     int64_t num_kv_heads, int64_t head_dim, int64_t block_size, int64_t window,
                     float scale, float *out) {
    return decode(q, q_seq_stride, k_cache, v_cache, block_tables, table_width, context_lens,
                  num_seqs, num_heads, num_kv_heads, head_dim, block_size, window, scale, out, 0);
}

int paged_decode_bf16(const uint16_t *q, int64_t q_seq_stride, const uint16_t *k_cache,
                      const uint16_t *v_cache, const int64_t *block_tables, int64_t table_width,
                      const int64_t *context_lens, int64_t num_seqs, int64_t num_heads,
                      int64_t num_kv_heads, int64_t head_dim, int64_t block_size, int64_t window,
                      float scale, uint16_t *out) {
    return decode(q, q_seq_stride, k_cache, v_cache, block_tables, table_width, context_lens,
                  num_seqs, num_heads, num_kv_heads, head_dim, block_size, window, scale, out, 1);
}

/* A step's new K and V rows written into the cache at their slots (what two index_copy_ calls
 * did, in one call): row r of k and v (src_stride elements apart, row_bytes long) to row
 * slots[r] of k_cache and v_cache. The caller checks dtypes and layouts. */
void kv_store(const char *k, const char *v, int64_t src_stride_bytes, char *k_cache,
              char *v_cache, const int64_t *slots, int64_t rows, int64_t row_bytes) {
    for (int64_t r = 0; r < rows; ++r) {
        memcpy(k_cache + slots[r] * row_bytes, k + r * src_stride_bytes, row_bytes);
        memcpy(v_cache + slots[r] * row_bytes, v + r * src_stride_bytes, row_bytes);
    }
}
