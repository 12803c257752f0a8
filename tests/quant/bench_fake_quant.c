/* Benchmark (not a test): fake quant on a (128, 28, 28, 32) NHWC activation, per tensor and
 * per channel (channel last), out of place with the mask (training), in place without it,
 * the STE backward, the LSQ backward and the reference twin, on the OpenMP threads the
 * environment gives (OMP_NUM_THREADS=2 for the figures in the notes), with warm caches (one
 * buffer set, ~29 MB, reused) and cold ones (cycling through sets far beyond the L3). Prints
 * the median of repeated runs and the memory traffic it implies. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant/quant.h"
#include "tests/common/testutil.h"

#define REPS 41

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *t, int k) {
  qsort(t, (size_t)k, sizeof(double), cmp);
  return t[k / 2];
}

int main(void) {
  const int64_t N = 128 * 28 * 28, C = 32, n = N * C;
  float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
  float *dy = malloc((size_t)n * sizeof(float)), *dx = calloc((size_t)n, sizeof(float));
  uint8_t *mask = malloc((size_t)n);
  qt_test_fill_uniform(x, n, -3.0f, 3.0f, 1);
  qt_test_fill_uniform(dy, n, -1.0f, 1.0f, 2);
  float scale[32], ds[32] = {0}, dz[32] = {0};
  int32_t zp[32];
  for (int c = 0; c < C; c++) scale[c] = 0.02f + 0.001f * c, zp[c] = 100 + c;
  double t[REPS];
  printf("fake quant, %lld floats (128x28x28x32 NHWC), %d threads, median of %d\n", (long long)n,
         omp_get_max_threads(), REPS);

#define BENCH(label, bytes, call)                                                                        \
  do {                                                                                                   \
    call;                                                                                                \
    for (int r = 0; r < REPS; r++) {                                                                     \
      double t0 = now();                                                                                 \
      call;                                                                                              \
      t[r] = now() - t0;                                                                                 \
    }                                                                                                    \
    double med = median(t, REPS);                                                                        \
    printf("  %-46s %8.3f ms  %6.1f GB/s\n", label, 1e3 * med, (double)(bytes) / med * 1e-9);          \
  } while (0)

  BENCH("forward per tensor + mask (out of place)", n * 9,
        qt_fake_quant_forward(y, mask, x, n, 1, 1, scale, zp, 0, 255));
  BENCH("forward per channel NHWC + mask", n * 9,
        qt_fake_quant_forward(y, mask, x, N, (int)C, 1, scale, zp, 0, 255));
  BENCH("forward per tensor, no mask, in place", n * 8,
        qt_fake_quant_forward(y, NULL, y, n, 1, 1, scale, zp, 0, 255));
  BENCH("backward (dx += dy * mask)", n * 13, qt_fake_quant_backward(dx, dy, mask, n));
  BENCH("LSQ backward per channel NHWC", n * 16,
        qt_fake_quant_lsq_backward(dx, ds, dz, dy, x, N, (int)C, 1, scale, zp, 0, 255, 1.0f));
  BENCH("LSQ backward per tensor", n * 16,
        qt_fake_quant_lsq_backward(dx, ds, dz, dy, x, 1, 1, n, scale, zp, 0, 255, 1.0f));
  BENCH("forward_ref per channel (1 thread, scalar)", n * 9,
        qt_fake_quant_forward_ref(y, mask, x, N, (int)C, 1, scale, zp, 0, 255));
  /* cold caches: cycle through 6 input/output/mask sets (~170 MB, beyond any L3) */
  {
    enum { SETS = 6 };
    float *xs[SETS], *ys[SETS];
    uint8_t *ms[SETS];
    for (int k = 0; k < SETS; k++) {
      xs[k] = malloc((size_t)n * sizeof(float)), ys[k] = malloc((size_t)n * sizeof(float)), ms[k] = malloc((size_t)n);
      memcpy(xs[k], x, (size_t)n * sizeof(float));
      memset(ys[k], 0, (size_t)n * sizeof(float)), memset(ms[k], 0, (size_t)n);
    }
    int k = 0;
    BENCH("forward per tensor + mask, cold caches", n * 9,
          (qt_fake_quant_forward(ys[k], ms[k], xs[k], n, 1, 1, scale, zp, 0, 255), k = (k + 1) % SETS));
    BENCH("forward per channel NHWC + mask, cold caches", n * 9,
          (qt_fake_quant_forward(ys[k], ms[k], xs[k], N, (int)C, 1, scale, zp, 0, 255), k = (k + 1) % SETS));
    for (int j = 0; j < SETS; j++) free(xs[j]), free(ys[j]), free(ms[j]);
  }
  /* a plain copy: the memory-bandwidth floor for touching the same bytes */
  BENCH("memcpy of the input (bandwidth floor, 8 B/elem)", n * 8, memcpy(y, x, (size_t)n * sizeof(float)));

  free(x), free(y), free(dy), free(dx), free(mask);
  return 0;
}
