/* Every CPU kernel with a reduction (batch norm statistics, dgamma/dbeta, cross-entropy loss,
 * pools) gives bit-identical results run to run AND for 1, 2 or 3 OpenMP threads: reductions
 * use fixed chunks combined in a fixed order, never the thread count or timing. */
#include "autograd/kernels.h"
#include "tests/common/testutil.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 16, H = 28, W = 28, C = 32, NC = 10 };
#define NX ((int64_t)N * H * W * C)

typedef struct {
  float y[NX], mean[C], invstd[C], rm[C], rv[C], dx[NX], dg[C], db[C];
  float dx_eval[NX], dg_eval[C], db_eval[C];
  float pool[NX / 4], pool_dx[NX], avg[NX], avg_dx[NX], gap[N * C], gap_dx[NX];
  int32_t argmax[NX / 4];
  float probs[128 * NC], dlogits[128 * NC], loss;
} results;

static void run_all(results *r, const float *x, const float *dy, const float *gamma, const float *beta,
                    const float *logits, const int32_t *labels) {
  memset(r, 0, sizeof *r);
  const int M = N * H * W;
  for (int c = 0; c < C; c++) r->rv[c] = 1.0f;
  qt_batch_norm_forward_train(r->y, r->mean, r->invstd, x, gamma, beta, r->rm, r->rv, 0.1f, 1e-5f, M, C);
  qt_batch_norm_backward(r->dx, r->dg, r->db, dy, x, r->mean, r->invstd, gamma, M, C);
  qt_batch_norm_backward_eval(r->dx_eval, r->dg_eval, r->db_eval, dy, x, r->mean, r->invstd, gamma, M, C);
  qt_pool2d_shape s = {.N = N, .H = H, .W = W, .C = C, .KH = 2, .KW = 2, .stride_h = 2, .stride_w = 2};
  QT_CHECK(qt_pool2d_shape_init(&s) == 0);
  qt_max_pool2d_forward(r->pool, r->argmax, x, &s);
  qt_max_pool2d_backward(r->pool_dx, dy, r->argmax, &s);
  qt_pool2d_shape a = {.N = N, .H = H, .W = W, .C = C, .KH = 3, .KW = 3, .stride_h = 1, .stride_w = 1,
                       .pad_h = 1, .pad_w = 1};
  QT_CHECK(qt_pool2d_shape_init(&a) == 0);
  qt_avg_pool2d_forward(r->avg, x, &a);
  qt_avg_pool2d_backward(r->avg_dx, dy, &a);
  qt_global_avg_pool_forward(r->gap, x, N, H * W, C);
  qt_global_avg_pool_backward(r->gap_dx, 0, dy, N, H * W, C);
  r->loss = qt_cross_entropy_forward(r->probs, logits, labels, 128, NC);
  qt_cross_entropy_backward(r->dlogits, r->probs, labels, 1.0f, 128, NC);
}

int main(void) {
  float *x = malloc(NX * 4), *dy = malloc(NX * 4), gamma[C], beta[C], logits[128 * NC];
  int32_t labels[128];
  qt_test_fill_uniform(x, NX, 2.0f, 5.0f, 1);
  qt_test_fill_uniform(dy, NX, -1.0f, 1.0f, 2);
  qt_test_fill_uniform(gamma, C, 0.5f, 1.5f, 3);
  qt_test_fill_uniform(beta, C, -1.0f, 1.0f, 4);
  qt_test_fill_uniform(logits, 128 * NC, -5.0f, 5.0f, 5);
  for (int i = 0; i < 128; i++) labels[i] = (i * 7) % NC;

  results *first = malloc(sizeof *first), *again = malloc(sizeof *again);
  omp_set_num_threads(2);
  run_all(first, x, dy, gamma, beta, logits, labels);
  const int threads[] = {2, 2, 1, 3};
  for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
    omp_set_num_threads(threads[t]);
    run_all(again, x, dy, gamma, beta, logits, labels);
    if (memcmp(first, again, sizeof *first) != 0) {
      const unsigned char *a = (const void *)first, *b = (const void *)again;
      size_t at = 0;
      while (a[at] == b[at]) at++;
      qt_test_fail("run with %d threads differs from the first run at byte %zu of %zu", threads[t], at,
                   sizeof *first);
    }
  }
  free(first), free(again), free(x), free(dy);
  return qt_test_finish();
}
