/* The AMX tiles' rate on this VM, one core: `amxbench XBYTES WBYTES ITERS MODE`. MODE 0: the
 * four tdpbf16ps of a 2 x 2 step with nothing loaded (the multiplies' own rate); 1: each step
 * loads two 16-row tiles of x (rows 1152 bytes apart, SmolLM2's k = 576) and two 1 KB tiles of
 * weights, cycling through XBYTES of x and WBYTES of weights (L1, L2 or DRAM sized). Recorded
 * harness; gcc -O2 -march=native -o amxbench amxbench.c */
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
int main(int argc, char **argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);
  struct cfg c; memset(&c,0,sizeof c); c.palette=1; for(int t=0;t<8;++t){c.colsb[t]=64;c.rows[t]=16;}
  _tile_loadconfig(&c);
  size_t xbytes = (size_t)atol(argv[1]), wbytes = (size_t)atol(argv[2]); long iters = atol(argv[3]);
  char *x = aligned_alloc(4096, xbytes), *w = aligned_alloc(4096, wbytes);
  memset(x, 0, xbytes); memset(w, 0, wbytes);
  char sums[4][1024] __attribute__((aligned(64)));
  // mode 0: TDP only; mode 1: 2x2 with loads cycling through x (stride 64, 16 rows 1152 apart) and w (1KB steps)
  int mode = atoi(argv[4]);
  _tile_zero(0);_tile_zero(1);_tile_zero(2);_tile_zero(3);
  _tile_loadd(4, x, 64); _tile_loadd(5, x, 64); _tile_loadd(6, w, 64); _tile_loadd(7, w, 64);
  double t0 = now(); long tdp = 0;
  size_t xo = 0, wo = 0; const int64_t rb = 1152;
  for (long i = 0; i < iters; ++i) {
    if (mode == 1) {
      _tile_loadd(4, x + xo, rb); _tile_loadd(5, x + xo + 16*rb, rb);
      _tile_loadd(6, w + wo, 64); _tile_loadd(7, w + wo + 1024, 64);
      xo += 64; if (xo % rb == 0) { xo += 31*rb; } if (xo + 32*rb > xbytes) xo = 0;
      wo += 2048; if (wo + 2048 > wbytes) wo = 0;
    }
    _tile_dpbf16ps(0,4,6); _tile_dpbf16ps(1,4,7); _tile_dpbf16ps(2,5,6); _tile_dpbf16ps(3,5,7);
    tdp += 4;
  }
  double dt = now() - t0;
  _tile_stored(0, sums[0], 64);
  printf("x %zu w %zu mode %d: %.1f ns/TDP, %.1f GFLOP/s (1 core)\n", xbytes, wbytes, mode, dt/tdp*1e9, tdp*32768.0/dt/1e9);
  _tile_release();
  return sums[0][0];
}
