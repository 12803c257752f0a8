/* Benchmark of the CPU kernels at FashionCNN's shapes: prints ms per call (median of 50)
 * for forward and backward of batch norm, relu and 2x2 max pool on (128,28,28,32) and
 * (128,14,14,64) NHWC, and cross-entropy on (128,10). Built, not registered as a test. */
#include "autograd/kernels.h"
#include "tests/common/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REPS 50

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median over REPS timed calls after 3 warm-up calls. */
#define TIME_MS(result, stmt)                   \
  do {                                          \
    double t_[REPS];                            \
    for (int w_ = 0; w_ < 3; w_++) { stmt; }    \
    for (int r_ = 0; r_ < REPS; r_++) {         \
      double t0_ = now_ms();                    \
      stmt;                                     \
      t_[r_] = now_ms() - t0_;                  \
    }                                           \
    qsort(t_, REPS, sizeof t_[0], cmp_double);  \
    (result) = t_[REPS / 2];                    \
  } while (0)

static void bench_shape(int N, int H, int W, int C) {
  const int64_t n = (int64_t)N * H * W * C;
  const int M = N * H * W;
  float *x = qt_test_uniform(n, 1), *y = qt_test_uniform(n, 2), *dy = qt_test_uniform(n, 3), *dx = calloc((size_t)n, 4);
  float *gamma = qt_test_uniform(C, 4), *beta = qt_test_uniform(C, 5), *mean = malloc(C * 4), *invstd = malloc(C * 4);
  float *rm = calloc(C, 4), *rv = calloc(C, 4), *dg = calloc(C, 4), *db = calloc(C, 4);
  double f, b, e, be;
  TIME_MS(f, qt_batch_norm_forward_train(y, mean, invstd, x, gamma, beta, rm, rv, 0.1f, 1e-5f, M, C));
  TIME_MS(b, qt_batch_norm_backward(dx, dg, db, dy, x, mean, invstd, gamma, M, C));
  TIME_MS(e, qt_batch_norm_forward_eval(y, x, gamma, beta, mean, invstd, 1e-5f, M, C));
  TIME_MS(be, qt_batch_norm_backward_eval(dx, dg, db, dy, x, mean, invstd, gamma, M, C));
  printf("batch_norm  (%d,%d,%d,%d)  train fwd %.3f ms  bwd %.3f ms | eval fwd %.3f ms  bwd %.3f ms\n", N, H, W, C,
         f, b, e, be);
  TIME_MS(f, qt_relu_forward(y, x, n));
  TIME_MS(b, qt_relu_backward(dx, dy, y, n));
  printf("relu        (%d,%d,%d,%d)  fwd %.3f ms  bwd %.3f ms\n", N, H, W, C, f, b);
  qt_pool2d_shape s = {.N = N, .H = H, .W = W, .C = C, .KH = 2, .KW = 2, .stride_h = 2, .stride_w = 2};
  if (qt_pool2d_shape_init(&s) != 0) abort();
  int32_t *am = malloc((size_t)N * s.OH * s.OW * C * sizeof *am);
  TIME_MS(f, qt_max_pool2d_forward(y, am, x, &s));
  TIME_MS(b, qt_max_pool2d_backward(dx, dy, am, &s));
  printf("max_pool2x2 (%d,%d,%d,%d)  fwd %.3f ms  bwd %.3f ms\n", N, H, W, C, f, b);
  free(am);
  free(x), free(y), free(dy), free(dx), free(gamma), free(beta), free(mean), free(invstd);
  free(rm), free(rv), free(dg), free(db);
}

int main(void) {
  bench_shape(128, 28, 28, 32);
  bench_shape(128, 14, 14, 64);
  const int N = 128, C = 10;
  float *logits = qt_test_uniform(N * C, 6), *probs = malloc(N * C * 4), *dl = calloc(N * C, 4);
  int32_t *labels = malloc(N * sizeof *labels);
  for (int i = 0; i < N; i++) labels[i] = (i * 7) % C;
  double f, b;
  volatile float loss = 0;
  TIME_MS(f, loss = qt_cross_entropy_forward(probs, logits, labels, N, C));
  TIME_MS(b, qt_cross_entropy_backward(dl, probs, labels, 1.0f, N, C));
  printf("cross_entropy (%d,%d)       fwd %.4f ms  bwd %.4f ms (loss %.4f)\n", N, C, f, b, loss);
  free(logits), free(probs), free(dl), free(labels);
  return 0;
}
