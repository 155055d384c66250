/* Paged decode attention on the CPU: one query token per sequence, K/V read in place through the
 * block table (no gathered copy). Built at run time by worker/kernels/library.py
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

#include "tiles.h"
#include "vec16.h"
#if defined(__SSE__)
#include <xmmintrin.h>
#define DENORMALS_OFF() const unsigned int saved_csr = _mm_getcsr(); _mm_setcsr(saved_csr | 0x8040)
#define DENORMALS_RESTORE() _mm_setcsr(saved_csr)
#else
#define DENORMALS_OFF() (void)0
#define DENORMALS_RESTORE() (void)0
#endif

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define HAVE_DPBF16 1 /* vec16.h included immintrin.h */
#else
#define HAVE_DPBF16 0
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


#if defined(__clang__) || __GNUC__ >= 12
#define SHUFFLE16(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUFFLE16(a, b, ...) __builtin_shuffle(a, b, (v16i){__VA_ARGS__})
#endif

/* Lane j: the sum of the 16 lanes of s[j] (a transpose and a sum in four halvings, 30 shuffles
 * and 15 adds for the 16 sums, where one horizontal sum each takes about as many per sum). */
static inline __attribute__((always_inline)) v16 sums16(const v16 s[LANES]) {
    v16 t[8], u[4], w[2];
    for (int j = 0; j < 8; ++j) /* lanes 0-7: s[j]'s halves summed, 8-15: s[j + 8]'s */
        t[j] = SHUFFLE16(s[j], s[j + 8], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               SHUFFLE16(s[j], s[j + 8], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29,
                         30, 31);
    for (int j = 0; j < 4; ++j) /* four lanes each: s[j], s[j + 4], s[j + 8], s[j + 12] */
        u[j] = SHUFFLE16(t[j], t[j + 4], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26,
                         27) +
               SHUFFLE16(t[j], t[j + 4], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30,
                         31);
    for (int j = 0; j < 2; ++j) /* two lanes each: s[j], s[j + 2], ..., s[j + 14] */
        w[j] = SHUFFLE16(u[j], u[j + 2], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28,
                         29) +
               SHUFFLE16(u[j], u[j + 2], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30,
                         31);
    return SHUFFLE16(w[0], w[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
           SHUFFLE16(w[0], w[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
}

/* Software prefetch a fixed distance ahead of a task's reads, which are its K rows in order, then
 * its V rows: short runs (a block is a few KB) at scattered places, which the hardware
 * prefetchers ramp up on too late (measured: a plain reader of the same pattern streams at
 * 17 GB/s, 31 GB/s with a prefetch 4 KB ahead, where a contiguous read does 40). */
#ifndef AHEAD_BYTES
#define AHEAD_BYTES 8192
#endif
struct ahead {
    const char *k, *v;
    const int64_t *table;
    int64_t block_size, lo, ctx, pos, block, off, pass;
    size_t row_bytes, first, bytes; /* the rows' stride; the task's bytes within a row */
};

static inline void ahead_one(struct ahead *a) {
    if (a->pass > 1) return;
    const char *r = (a->pass ? a->v : a->k) + a->first +
                    a->row_bytes * (size_t)(a->table[a->block] * a->block_size + a->off);
    for (size_t b = 0; b < a->bytes; b += 64) __builtin_prefetch(r + b, 0, 3);
    if (++a->off == a->block_size) a->off = 0, ++a->block;
    if (++a->pos == a->ctx) {
        a->pos = a->lo, a->block = a->lo / a->block_size, a->off = a->lo % a->block_size;
        ++a->pass;
    }
}

static inline void ahead_start(struct ahead *a) {
    a->pos = a->lo, a->block = a->lo / a->block_size, a->off = a->lo % a->block_size;
    a->pass = a->ctx > a->lo ? 0 : 2; /* no rows: nothing to fetch */
    const int64_t rows = a->bytes >= AHEAD_BYTES ? 1 : (int64_t)(AHEAD_BYTES / a->bytes);
    for (int64_t i = 0; i < rows; ++i) ahead_one(a);
}

/* acc[j] += sum over the rows t of p[j * n + t] * row t, for `heads` (1 to 4) query heads at
 * once, their sums kept in registers across the rows (a constant after inlining). */
static inline __attribute__((always_inline)) void weigh_rows(const char *rows, size_t row_bytes,
                                                             int64_t take, const float *p,
                                                             int64_t n, v16 *acc,
                                                             const int is_bf16,
                                                             const int64_t chunks,
                                                             const int heads) {
    const size_t elem = is_bf16 ? 2 : 4;
    v16 a[4][MAX_CHUNKS];
    for (int j = 0; j < heads; ++j)
        for (int64_t c = 0; c < chunks; ++c) a[j][c] = acc[j * chunks + c];
    for (int64_t t = 0; t < take; ++t) {
        const char *r = rows + row_bytes * (size_t)t;
        for (int64_t c = 0; c < chunks; ++c) {
            const v16 rv = load16(r + elem * (size_t)(c * LANES), 0, is_bf16);
            for (int j = 0; j < heads; ++j) a[j][c] += p[j * n + t] * rv;
        }
    }
    for (int j = 0; j < heads; ++j)
        for (int64_t c = 0; c < chunks; ++c) acc[j * chunks + c] = a[j][c];
}

/* One task's share of the work: sequence `seq`, kv heads [h0, h1) and their nh = (h1 - h0) * group
 * query heads, over the tokens [lo, ctx) of its window (n of them, at least 1). Every step below
 * takes it; `chunks` (head_dim / 16) is a constant in the common head sizes' copies. */
struct task {
    const char *q, *k_cache, *v_cache;
    const int64_t *table;
    char *out;
    int64_t q_seq_stride, ctx, lo, n, seq, h0, h1, group, nh, num_heads, head_dim, block_size;
    size_t elem, row_bytes; /* one element; one token's row, all kv heads */
    float scale;
};

/* The task's query heads into qv, scaled (as stored where `dp`: vdpbf16ps takes the bfloat16
 * rows, and the scale goes on the scores after their sums), and their sums in acc zeroed. */
static inline __attribute__((always_inline)) void load_queries(const struct task *w, v16 *qv,
                                                                v16 *acc, const int is_bf16,
                                                                const int64_t chunks,
                                                                const int dp) {
    for (int64_t h = 0; h < w->nh; ++h) {
        const char *qr = w->q + w->elem * (size_t)(w->seq * w->q_seq_stride +
                                                   (w->h0 * w->group + h) * w->head_dim);
        if (dp) memcpy(qv + h * chunks, qr, w->elem * (size_t)w->head_dim);
        for (int64_t c = 0; c < chunks; ++c) {
            if (!dp)
                qv[h * chunks + c] =
                    load16(qr + w->elem * (size_t)(c * LANES), 0, is_bf16) * w->scale;
            acc[h * chunks + c] = (v16){0};
        }
    }
}

/* K: scores[h * n + i] = q_h . k_(lo + i), scaled. Each token's dot products with the query heads
 * are vectors of partial sums; those of up to 16 tokens are reduced together (sums16), not one by
 * one. The prefetch runs ahead with the first kv head's rows. */
static inline __attribute__((always_inline)) void score_keys(const struct task *w, const v16 *qv,
                                                              float *scores, struct ahead *ahead,
                                                              const int is_bf16,
                                                              const int64_t chunks,
                                                              const int dp) {
    const int64_t group = w->group, n = w->n, lo = w->lo, ctx = w->ctx, bs = w->block_size;
    const size_t elem = w->elem, row_bytes = w->row_bytes;
    v16 part[MAX_GROUP][LANES];
    for (int64_t pos = lo; pos < ctx;) {
        const int64_t off = pos % bs;
        const int64_t take = (bs - off < ctx - pos) ? bs - off : ctx - pos;
        const char *first = w->k_cache + row_bytes * (size_t)(w->table[pos / bs] * bs + off);
        for (int64_t t0 = 0; t0 < take; t0 += LANES) {
            const int64_t count = take - t0 < LANES ? take - t0 : LANES;
            for (int64_t kvh = w->h0; kvh < w->h1; ++kvh) {
                const int64_t hb = (kvh - w->h0) * group;
                for (int64_t t = 0; t < count; ++t) {
                    if (kvh == w->h0) ahead_one(ahead);
                    const char *r = first + row_bytes * (size_t)(t0 + t) +
                                    elem * (size_t)(kvh * w->head_dim);
#if HAVE_DPBF16
                    if (dp) {
                        __m512bh rb[MAX_CHUNKS / 2];
                        for (int64_t c = 0; c < chunks / 2; ++c)
                            rb[c] = (__m512bh)_mm512_loadu_si512(r + 64 * c);
                        for (int64_t g = 0; g < group; ++g) {
                            const char *qh = (const char *)(qv + (hb + g) * chunks);
                            __m512 s = _mm512_dpbf16_ps(
                                _mm512_setzero_ps(), (__m512bh)_mm512_loadu_si512(qh), rb[0]);
                            for (int64_t c = 1; c < chunks / 2; ++c)
                                s = _mm512_dpbf16_ps(
                                    s, (__m512bh)_mm512_loadu_si512(qh + 64 * c), rb[c]);
                            memcpy(&part[g][t], &s, sizeof s);
                        }
                        continue;
                    }
#endif
                    v16 rv[MAX_CHUNKS];
                    for (int64_t c = 0; c < chunks; ++c)
                        rv[c] = load16(r + elem * (size_t)(c * LANES), 0, is_bf16);
                    for (int64_t g = 0; g < group; ++g) {
                        const v16 *qh = qv + (hb + g) * chunks;
                        v16 s = qh[0] * rv[0];
                        for (int64_t c = 1; c < chunks; ++c) s += qh[c] * rv[c];
                        part[g][t] = s;
                    }
                }
                for (int64_t g = 0; g < group; ++g) {
                    for (int64_t t = count; t < LANES; ++t) part[g][t] = (v16){0};
                    const v16 sums = dp ? sums16(part[g]) * w->scale : sums16(part[g]);
                    float *dst = scores + (hb + g) * n + (pos - lo + t0);
                    /* NOTE: a copy of variable length became `rep movsq` (~30 cycles to start:
                     * 9% of the hot kernel's samples); whole groups are one vector store. */
                    if (count == LANES)
                        memcpy(dst, &sums, sizeof sums);
                    else
                        for (int64_t t = 0; t < count; ++t) dst[t] = sums[t];
                }
            }
        }
        pos += take;
    }
}

/* Each query head's scores to unnormalized softmax weights (exp of the score minus the row's
 * maximum), their total in sum[h]. */
static inline __attribute__((always_inline)) void softmax_rows(const struct task *w,
                                                                float *scores, float *sum) {
    const int64_t count = w->ctx - w->lo;
    for (int64_t h = 0; h < w->nh; ++h) {
        float *sh = scores + h * w->n, top = -INFINITY, total = 0.0f;
#pragma omp simd reduction(max : top)
        for (int64_t i = 0; i < count; ++i) top = sh[i] > top ? sh[i] : top;
#pragma omp simd reduction(+ : total)
        for (int64_t i = 0; i < count; ++i) {
            sh[i] = exp_nonpositive(sh[i] - top);
            total += sh[i];
        }
        sum[h] = total;
    }
}

/* V: acc_h += the weighted sum of the V rows, a block at a time; the block's rows come from memory
 * once, and each kv head's query heads, up to four at a time, sum them in registers. */
static inline __attribute__((always_inline)) void weigh_values(const struct task *w,
                                                                const float *scores, v16 *acc,
                                                                struct ahead *ahead,
                                                                const int is_bf16,
                                                                const int64_t chunks) {
    const int64_t group = w->group, n = w->n, lo = w->lo, ctx = w->ctx, bs = w->block_size;
    const size_t row_bytes = w->row_bytes;
    for (int64_t pos = lo; pos < ctx;) {
        const int64_t off = pos % bs;
        const int64_t take = (bs - off < ctx - pos) ? bs - off : ctx - pos;
        const char *first = w->v_cache + row_bytes * (size_t)(w->table[pos / bs] * bs + off);
        for (int64_t t = 0; t < take; ++t) ahead_one(ahead);
        for (int64_t kvh = w->h0; kvh < w->h1; ++kvh) {
            const char *rows = first + w->elem * (size_t)(kvh * w->head_dim);
            for (int64_t g0 = 0; g0 < group; g0 += 4) {
                const int64_t h = (kvh - w->h0) * group + g0;
                const float *p = scores + h * n + (pos - lo);
                v16 *a = acc + h * chunks;
                switch (group - g0 < 4 ? group - g0 : 4) {
                case 1: weigh_rows(rows, row_bytes, take, p, n, a, is_bf16, chunks, 1); break;
                case 2: weigh_rows(rows, row_bytes, take, p, n, a, is_bf16, chunks, 2); break;
                case 3: weigh_rows(rows, row_bytes, take, p, n, a, is_bf16, chunks, 3); break;
                default: weigh_rows(rows, row_bytes, take, p, n, a, is_bf16, chunks, 4);
                }
            }
        }
        pos += take;
    }
}

/* Each query head's weighted sum divided by its weights' total, rounded to the dtype, into out. */
static inline __attribute__((always_inline)) void write_out(const struct task *w, const v16 *acc,
                                                             const float *sum, const int is_bf16,
                                                             const int64_t chunks) {
    for (int64_t h = 0; h < w->nh; ++h) {
        const int64_t o = (w->seq * w->num_heads + w->h0 * w->group + h) * w->head_dim;
        const float inv = sum[h] > 0.0f ? 1.0f / sum[h] : 0.0f;
        const float *a = (const float *)(acc + h * chunks);
        if (is_bf16) {
            uint16_t *dst = (uint16_t *)w->out + o;
            for (int64_t d = 0; d < w->head_dim; ++d) dst[d] = f32_to_bf16(a[d] * inv);
        } else {
            float *dst = (float *)w->out + o;
            for (int64_t d = 0; d < w->head_dim; ++d) dst[d] = a[d] * inv;
        }
    }
}

/* One task: the queries loaded, the K rows scored, the softmax, the V rows weighed, the result
 * written. It walks the sequence's blocks twice (K, then V); within a block the token rows of this
 * task's heads are adjacent, and a software prefetch runs AHEAD_BYTES ahead of the rows it reads,
 * across blocks and from the K rows on to the V. */
static inline __attribute__((always_inline)) int decode_task(
    const char *q, int64_t q_seq_stride, const char *k_cache, const char *v_cache,
    const int64_t *table, int64_t ctx, int64_t seq, int64_t h0, int64_t h1, int64_t num_heads,
    int64_t num_kv_heads, int64_t head_dim, int64_t block_size, int64_t window, float scale,
    char *out, const int is_bf16, const int64_t chunks) {
    const size_t elem = is_bf16 ? 2 : 4;
    const int64_t group = num_heads / num_kv_heads;
    const int64_t lo = (window > 0 && ctx > window) ? ctx - window : 0;
    const struct task w = {.q = q, .k_cache = k_cache, .v_cache = v_cache, .table = table,
                           .out = out, .q_seq_stride = q_seq_stride, .ctx = ctx, .lo = lo,
                           .n = ctx - lo > 0 ? ctx - lo : 1, .seq = seq, .h0 = h0, .h1 = h1,
                           .group = group, .nh = (h1 - h0) * group, .num_heads = num_heads,
                           .head_dim = head_dim, .block_size = block_size, .elem = elem,
                           .row_bytes = elem * (size_t)(num_kv_heads * head_dim), .scale = scale};
    /* scaled q, acc, then the scores: the thread's kept buffer. A malloc and a free per task
     * were ~1.2% of a 64-stream engine's samples; without them the step's attention took 5.01
     * against 5.40 ms with K/V in the caches, the same 8.25 from DRAM (alternated), and the
     * engine's 64-stream step stayed at 32.6 ms. */
    int owned = 0;
    v16 *qv = kept_scratch(sizeof(v16) * (size_t)(2 * w.nh * chunks) +
                               sizeof(float) * (size_t)(w.nh * w.n),
                           &owned);
    if (!qv) return 2;
    v16 *acc = qv + w.nh * chunks;
    float *scores = (float *)(acc + w.nh * chunks);
    float sum[MAX_GROUP * 64];
    /* bfloat16 with AVX512-BF16: q . k by vdpbf16ps on the rows as stored (two dot products of
     * 32 dims a token and head, where widening the row to float32 and multiplying took eight
     * instructions), q kept as it is and the scale applied to the 16 scores of a group after
     * their sums. The products are exact in float32 either way; the sums' order differs. On the
     * AMD EPYC (2 cores, alternated in one process, SmolLM2's shapes at 64 sequences): the step's
     * attention 6.05 -> 5.67 ms with K/V in the caches, 9.32 -> 9.17 from DRAM; a warmed
     * engine's 64-stream step 36.2 -> 35.9 ms. */
    const int dp = HAVE_DPBF16 && is_bf16 && chunks % 2 == 0;
    load_queries(&w, qv, acc, is_bf16, chunks, dp);
    struct ahead ahead = {.k = k_cache, .v = v_cache, .table = table, .block_size = block_size,
                          .lo = lo, .ctx = ctx, .row_bytes = w.row_bytes,
                          .first = elem * (size_t)(h0 * head_dim),
                          .bytes = elem * (size_t)((h1 - h0) * head_dim)};
    ahead_start(&ahead);
    score_keys(&w, qv, scores, &ahead, is_bf16, chunks, dp);
    softmax_rows(&w, scores, sum);
    weigh_values(&w, scores, acc, &ahead, is_bf16, chunks);
    write_out(&w, acc, sum, is_bf16, chunks);
    if (owned) free(qv);
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
#pragma omp parallel for schedule(static) if (rows >= 16)
    for (int64_t r = 0; r < rows; ++r) {
        memcpy(k_cache + slots[r] * row_bytes, k + r * src_stride_bytes, row_bytes);
        memcpy(v_cache + slots[r] * row_bytes, v + r * src_stride_bytes, row_bytes);
    }
}
