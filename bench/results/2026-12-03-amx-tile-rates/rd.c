/* One core's read rate over SIZE MiB (AVX-512 loads summed): `rd SIZE_MIB REPS PREFETCH_BYTES`.
 * Recorded harness; gcc -O2 -march=native -o rd rd.c */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){ size_t sz=(size_t)atol(argv[1])<<20; int reps=atoi(argv[2]); int pf=atoi(argv[3]);
 char*b=aligned_alloc(4096,sz); memset(b,1,sz); __m512i acc=_mm512_setzero_si512();
 double t0=now(); for(int r=0;r<reps;++r) for(size_t i=0;i<sz;i+=64){ if(pf) _mm_prefetch(b+i+pf,_MM_HINT_T0); acc=_mm512_add_epi32(acc,_mm512_load_si512(b+i)); }
 double dt=now()-t0; printf("%zu MB pf %d: %.1f GB/s\n", sz>>20, pf, (double)sz*reps/dt/1e9); return _mm512_reduce_add_epi32(acc)==7; }
