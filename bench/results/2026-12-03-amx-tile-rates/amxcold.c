/* A 64-row GEMM's tile loop (k = 576, N channels) over MATS distinct weight matrices in turn,
 * so that with many the weights come from DRAM: `amxcold N MATS REPS VARIANT`. VARIANT 0: the
 * kernel's order (groups of 2 blocks, two passes of 32 rows, 2 x 2 tiles); 2: the same with the
 * kernel's prefetch AHEAD bytes ahead on a group's first pass (-DAHEAD=, -DHINT=); 1 and 3: 64
 * rows x 16 channels a pass (one weight tile a step, four of x), without / with the prefetch;
 * 4: the next group's panel prefetched over both passes; 5, 6, 7: 64 rows x 16 channels a pass
 * over k in chunks of 288, 192 or 576 (the x chunk in L1, the sums kept between chunks; -DPF5
 * adds the prefetch). Recorded harness;
 * gcc -O2 -march=native [-DAHEAD=4096] [-DHINT=_MM_HINT_T0] [-DPF5] -o amxcold amxcold.c */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
struct cfg { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; };
static double now(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
#ifndef AHEAD
#define AHEAD 4096
#endif
#ifndef HINT
#define HINT _MM_HINT_T0
#endif
/* m=64 rows, k=576, n channels, `mats` distinct weight matrices cycled (cold-ish) */
int main(int argc, char **argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);
  struct cfg c; memset(&c,0,sizeof c); c.palette=1; for(int t=0;t<8;++t){c.colsb[t]=64;c.rows[t]=16;}
  _tile_loadconfig(&c);
  const int64_t m = 64, k = 576, n = atol(argv[1]); int mats = atoi(argv[2]); int reps = atoi(argv[3]); int variant = atoi(argv[4]);
  const int64_t rb = k * 2, k2n = k / 2;
  char *x = aligned_alloc(4096, m * rb), *wall = aligned_alloc(4096, (size_t)mats * n * rb);
  memset(x, 1, m * rb); memset(wall, 1, (size_t)mats * n * rb);
  char sums[8][1024] __attribute__((aligned(64)));
  char *cbuf = aligned_alloc(4096, n / 16 * 4096);
  double t0 = now();
  for (int r = 0; r < reps; ++r) for (int mi = 0; mi < mats; ++mi) {
  const char *w = wall + (size_t)mi * n * rb;
  if (variant == 0 || variant == 2 || variant == 4)
  for (int64_t g = 0; g < n / 32; ++g) {
    const char *w0 = w + g * 2 * k2n * 64, *w1 = w0 + k2n * 64;
    for (int s = 0; s < 4; s += 2) {
      const char *a0 = x + 16 * s * rb, *a1 = a0 + 16 * rb;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (int64_t step = 0; step < rb; step += 64) {
          const char *b0 = w0 + step * 16, *b1 = w1 + step * 16;
          if (variant == 4) { const char *nx = w0 + 2 * k2n * 64 + ((s / 2) * (rb / 64) + step / 64) * 1024; for (int l = 0; l < 1024; l += 64) _mm_prefetch(nx + l, HINT); }
          if (variant == 2 && s == 0) for (int l = 0; l < 1024; l += 64) { _mm_prefetch(b0 + AHEAD + l, HINT); _mm_prefetch(b1 + AHEAD + l, HINT); }
          _tile_loadd(4, a0 + step, rb); _tile_loadd(6, b0, 64); _tile_dpbf16ps(0, 4, 6);
          _tile_loadd(7, b1, 64); _tile_dpbf16ps(1, 4, 7);
          _tile_loadd(5, a1 + step, rb); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
        }
      _tile_stored(0, sums[0], 64); _tile_stored(1, sums[1], 64); _tile_stored(2, sums[2], 64); _tile_stored(3, sums[3], 64);
    }
  }
  else if (variant >= 5) { /* 4x1, k in chunks of KC so the x chunk stays in L1; C kept in cbuf between chunks */
    const int64_t kc = variant == 5 ? 288 : variant == 6 ? 192 : 576;
    for (int64_t k0 = 0; k0 < k; k0 += kc)
    for (int64_t b = 0; b < n / 16; ++b) {
      char *cb = cbuf + b * 4096;
      if (k0 == 0) { _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); }
      else { _tile_loadd(0, cb, 64); _tile_loadd(1, cb + 1024, 64); _tile_loadd(2, cb + 2048, 64); _tile_loadd(3, cb + 3072, 64); }
      const char *w0 = w + b * k2n * 64;
      for (int64_t step = k0 * 2; step < (k0 + kc) * 2; step += 64) {
        const char *b0 = w0 + step * 16;
#ifdef PF5
        for (int l = 0; l < 1024; l += 64) _mm_prefetch(b0 + AHEAD + l, HINT);
#endif
        _tile_loadd(6, b0, 64);
        _tile_loadd(4, x + step, rb); _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(5, x + 16 * rb + step, rb); _tile_dpbf16ps(1, 5, 6);
        _tile_loadd(4, x + 32 * rb + step, rb); _tile_dpbf16ps(2, 4, 6);
        _tile_loadd(5, x + 48 * rb + step, rb); _tile_dpbf16ps(3, 5, 6);
      }
      _tile_stored(0, cb, 64); _tile_stored(1, cb + 1024, 64); _tile_stored(2, cb + 2048, 64); _tile_stored(3, cb + 3072, 64);
    }
  }
  else /* 4x1: 64 rows x 16 channels per pass; B once per step, 4 A loads (tiles 4,5 alternate) */
  for (int64_t b = 0; b < n / 16; ++b) {
    const char *w0 = w + b * k2n * 64;
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t step = 0; step < rb; step += 64) {
      const char *b0 = w0 + step * 16;
      if (variant == 3) for (int l = 0; l < 1024; l += 64) _mm_prefetch(b0 + AHEAD + l, _MM_HINT_T0);
      _tile_loadd(6, b0, 64);
      _tile_loadd(4, x + step, rb); _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(5, x + 16 * rb + step, rb); _tile_dpbf16ps(1, 5, 6);
      _tile_loadd(4, x + 32 * rb + step, rb); _tile_dpbf16ps(2, 4, 6);
      _tile_loadd(5, x + 48 * rb + step, rb); _tile_dpbf16ps(3, 5, 6);
    }
    _tile_stored(0, sums[0], 64); _tile_stored(1, sums[1], 64); _tile_stored(2, sums[2], 64); _tile_stored(3, sums[3], 64);
  }
  }
  double dt = now() - t0;
  double tdp = (double)reps * mats * (n / 16) * 4 * (k / 32);
  printf("n %ld mats %d variant %d: %.1f us/matrix, %.1f ns/TDP, %.0f GFLOP/s, w %.1f GB/s\n", n, mats, variant, dt / reps / mats * 1e6, dt / tdp * 1e9, tdp * 32768 / dt / 1e9, (double)reps * mats * n * rb / dt / 1e9);
  _tile_release();
  return sums[0][0];
}
