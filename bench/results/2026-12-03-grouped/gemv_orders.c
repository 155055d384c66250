/* Recorded harness (2026-12-03): SmolLM2's 120 layer GEMVs and its head at one row, cold, two
 * threads, the weight in blocks order (three streams per 48-channel tile) against grouped (one),
 * with and without a software prefetch 16 steps ahead.
 *   gcc -O3 -march=native -fopenmp gemv_orders.c -o gemv_orders && OMP_NUM_THREADS=2 ./gemv_orders */
#define _GNU_SOURCE
#include <time.h>
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <sys/mman.h>
// 120 matrices like SmolLM2's layers + head, k=576 (and 1536 for down), n channels.
// layout A: [n/16][k2n][16][2] (3 streams per 48-ch tile); layout B: [n/48][k2n][48][2] (1 stream)
static double now(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
#define AHEAD 16
static void gemv(const uint16_t *x, int64_t k, const uint16_t *w, int64_t n, float *out, int layoutB, int pf) {
    const int64_t k2n = k/2, groups = n/48;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0;
        const uint16_t *p = w + g * 3 * k2n * 32;
        for (int64_t k2 = 0; k2 < k2n; ++k2) {
            int32_t pair; memcpy(&pair, x + 2*k2, 4);
            __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
            const uint16_t *b0, *b1, *b2;
            if (layoutB) { b0 = p + k2*96; b1 = b0 + 32; b2 = b0 + 64;
                if (pf && k2 + AHEAD < k2n) { _mm_prefetch((const char*)(b0 + AHEAD*96), _MM_HINT_T0); _mm_prefetch((const char*)(b0 + AHEAD*96+32), _MM_HINT_T0); _mm_prefetch((const char*)(b0 + AHEAD*96+64), _MM_HINT_T0);} }
            else { b0 = p + k2*32; b1 = p + (k2n + k2)*32; b2 = p + (2*k2n + k2)*32;
                if (pf && k2 + AHEAD < k2n) { _mm_prefetch((const char*)(b0 + AHEAD*32), _MM_HINT_T0); _mm_prefetch((const char*)(b1 + AHEAD*32), _MM_HINT_T0); _mm_prefetch((const char*)(b2 + AHEAD*32), _MM_HINT_T0);} }
            a0 = _mm512_dpbf16_ps(a0, xv, (__m512bh)_mm512_loadu_si512(b0));
            a1 = _mm512_dpbf16_ps(a1, xv, (__m512bh)_mm512_loadu_si512(b1));
            a2 = _mm512_dpbf16_ps(a2, xv, (__m512bh)_mm512_loadu_si512(b2));
        }
        _mm512_storeu_ps(out + 48*g, a0); _mm512_storeu_ps(out + 48*g+16, a1); _mm512_storeu_ps(out + 48*g+32, a2);
    }
}
int main(int argc, char **argv) {
    int layers = 30;
    int64_t shapes[4][2] = {{576, 960}, {576, 576}, {576, 3072}, {1536, 576}};
    size_t total = 0;
    for (int s = 0; s < 4; ++s) total += shapes[s][0] * shapes[s][1] * 2;
    total *= layers;
    size_t head = 576 * 49152 * 2;
    char *mem = mmap(NULL, total + head + (4<<20), PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
    char *base = (char*)(((uintptr_t)mem + (2<<20) - 1) & ~(uintptr_t)((2<<20)-1));
    madvise(base, total + head, MADV_HUGEPAGE);
    memset(base, 1, total + head);
    uint16_t x[1536]; for (int i = 0; i < 1536; ++i) x[i] = 0x3f80;
    float *out = aligned_alloc(64, 49152*4);
    char *flush = malloc(512<<20);
    for (int rep = 0; rep < 5; ++rep) for (int variant = 0; variant < 4; ++variant) {
        int layoutB = variant & 1, pf = variant >> 1;
        memset(flush, rep, 512<<20);
        double t = now(); size_t off = 0;
        for (int l = 0; l < layers; ++l) for (int s = 0; s < 4; ++s) {
            gemv(x, shapes[s][0], (uint16_t*)(base + off), shapes[s][1], out, layoutB, pf);
            off += shapes[s][0] * shapes[s][1] * 2;
        }
        gemv(x, 576, (uint16_t*)(base + off), 49152, out, layoutB, pf);
        double dt = now() - t;
        printf("rep %d layout %s prefetch %d: %.3f ms  %.1f GB/s\n", rep, layoutB ? "B(1 stream)" : "A(3 streams)", pf, dt*1e3, (total+head)/dt/1e9);
    }
    // plain read bandwidth
    double t = now(); double sum = 0;
#pragma omp parallel for reduction(+:sum)
    for (size_t i = 0; i < (total+head)/64; ++i) sum += base[i*64];
    printf("touch-read %.1f GB/s (%g)\n", (total+head)/(now()-t)/1e9, sum);
}
