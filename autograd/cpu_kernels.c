/* Element-wise CPU kernels (relu, relu6, add) and softmax cross-entropy, with their plain reference
 * twins. Element-wise loops are OpenMP `parallel for simd` over contiguous halves; the
 * cross-entropy loss is summed per row and the rows are combined by one thread in order, so
 * the loss is bit-identical run to run whatever the thread count. Batch norm lives in
 * cpu_batch_norm.c, pooling in cpu_pool.c. */
#include "autograd/autograd.h"
#include "autograd/kernels.h"

#include <math.h>
#include <stdlib.h>

/* Below this many elements the OpenMP team costs more than it saves. */
#define ELEM_PARALLEL_MIN 65536

/* ---- relu ------------------------------------------------------------------------------- */

/* `x < 0 ? 0 : x` keeps NaN (as PyTorch's clamp_min) and compiles to one vmaxps. */
void qt_relu_forward(float *out, const float *inp, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= ELEM_PARALLEL_MIN)
  for (int64_t i = 0; i < n; i++) out[i] = inp[i] < 0.0f ? 0.0f : inp[i];
}

void qt_relu_forward_ref(float *out, const float *inp, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = (isnan(inp[i]) || inp[i] >= 0.0f) ? inp[i] : 0.0f;
}

/* PyTorch's threshold_backward: the gradient passes unless out <= 0 (so it passes where the
 * output is NaN, and an inf/NaN dout never leaks into a zeroed position). */
void qt_relu_backward(float *restrict dinp, const float *restrict dout, const float *restrict out, int64_t n) {
  if (!dinp) return;
#pragma omp parallel for simd schedule(static) if (n >= ELEM_PARALLEL_MIN)
  for (int64_t i = 0; i < n; i++) dinp[i] += out[i] <= 0.0f ? 0.0f : dout[i];
}

void qt_relu_backward_ref(float *dinp, const float *dout, const float *out, int64_t n) {
  if (!dinp) return;
  for (int64_t i = 0; i < n; i++)
    if (!(out[i] <= 0.0f)) dinp[i] += dout[i];
}

/* ---- relu6 ------------------------------------------------------------------------------ */

/* min(max(x, 0), 6) as PyTorch's hardtanh(x, 0, 6): NaN stays NaN (neither compare holds). */
void qt_relu6_forward(float *out, const float *inp, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= ELEM_PARALLEL_MIN)
  for (int64_t i = 0; i < n; i++) out[i] = inp[i] < 0.0f ? 0.0f : inp[i] > 6.0f ? 6.0f : inp[i];
}

/* -0 stays -0 (as relu keeps it): fmaxf may return either zero. */
void qt_relu6_forward_ref(float *out, const float *inp, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float v = inp[i];
    out[i] = (isnan(v) || (v >= 0.0f && v <= 6.0f)) ? v : v < 0.0f ? 0.0f : 6.0f;
  }
}

/* PyTorch's hardtanh_backward: the gradient passes unless x <= 0 or x >= 6, judged on the
 * output (the same test, since the clamp keeps the order), so relu6 can run in place. */
void qt_relu6_backward(float *restrict dinp, const float *restrict dout, const float *restrict out, int64_t n) {
  if (!dinp) return;
#pragma omp parallel for simd schedule(static) if (n >= ELEM_PARALLEL_MIN)
  for (int64_t i = 0; i < n; i++) dinp[i] += out[i] <= 0.0f || out[i] >= 6.0f ? 0.0f : dout[i];
}

void qt_relu6_backward_ref(float *dinp, const float *dout, const float *out, int64_t n) {
  if (!dinp) return;
  for (int64_t i = 0; i < n; i++)
    if (!(out[i] <= 0.0f) && !(out[i] >= 6.0f)) dinp[i] += dout[i];
}

/* ---- add -------------------------------------------------------------------------------- */

/* out may alias a or b (element-wise, same index), so no restrict here. */
void qt_add_forward(float *out, const float *a, const float *b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= ELEM_PARALLEL_MIN)
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void qt_add_forward_ref(float *out, const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void qt_add_backward(float *da, float *db, const float *dout, int64_t n) {
  if (da) {
#pragma omp parallel for simd schedule(static) if (n >= ELEM_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) da[i] += dout[i];
  }
  if (db) {
#pragma omp parallel for simd schedule(static) if (n >= ELEM_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) db[i] += dout[i];
  }
}

void qt_add_backward_ref(float *da, float *db, const float *dout, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    if (da) da[i] += dout[i];
    if (db) db[i] += dout[i];
  }
}

/* ---- softmax cross-entropy -------------------------------------------------------------- */

static void check_label(int32_t label, int i, int C) {
  QT_ASSERT(label >= 0 && label < C, "cross_entropy: label %d of row %d is outside [0, %d)", label, i, C);
}

/* Softmax of one row into p; returns -log softmax[label], stable (max subtracted). */
static float softmax_row_nll(float *restrict p, const float *restrict x, int32_t label, int C) {
  float m = x[0];
  for (int j = 1; j < C; j++) m = x[j] > m ? x[j] : m;
  float sum = 0.0f;
  for (int j = 0; j < C; j++) {
    p[j] = expf(x[j] - m);
    sum += p[j];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int j = 0; j < C; j++) p[j] *= inv;
  return logf(sum) - (x[label] - m);
}

float qt_cross_entropy_forward(float *probs, const float *logits, const int32_t *labels, int N, int C) {
  QT_ASSERT(N > 0 && C > 0, "cross_entropy_forward: empty input (N=%d, C=%d)", N, C);
  float stack_nll[256];
  float *nll = N <= 256 ? stack_nll : malloc((size_t)N * sizeof *nll);
  QT_ASSERT(nll, "cross_entropy_forward: out of memory for %d row losses", N);
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= ELEM_PARALLEL_MIN)
  for (int i = 0; i < N; i++) {
    check_label(labels[i], i, C);
    nll[i] = softmax_row_nll(probs + (int64_t)i * C, logits + (int64_t)i * C, labels[i], C);
  }
  double total = 0;
  for (int i = 0; i < N; i++) total += nll[i];
  if (nll != stack_nll) free(nll);
  return (float)(total / N);
}

float qt_cross_entropy_forward_ref(float *probs, const float *logits, const int32_t *labels, int N, int C) {
  double total = 0;
  for (int i = 0; i < N; i++) {
    const float *x = logits + (int64_t)i * C;
    check_label(labels[i], i, C);
    double m = x[0];
    for (int j = 1; j < C; j++)
      if (x[j] > m) m = x[j];
    double sum = 0;
    for (int j = 0; j < C; j++) sum += exp(x[j] - m);
    for (int j = 0; j < C; j++) probs[(int64_t)i * C + j] = (float)(exp(x[j] - m) / sum);
    total += log(sum) - (x[labels[i]] - m);
  }
  return (float)(total / N);
}

void qt_cross_entropy_backward(float *dlogits, const float *probs, const int32_t *labels, float dloss, int N, int C) {
  if (!dlogits) return;
  const float scale = dloss / (float)N;
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= ELEM_PARALLEL_MIN)
  for (int i = 0; i < N; i++) {
    check_label(labels[i], i, C);
    float *restrict d = dlogits + (int64_t)i * C;
    const float *restrict p = probs + (int64_t)i * C;
#pragma omp simd
    for (int j = 0; j < C; j++) d[j] += scale * (p[j] - (j == labels[i] ? 1.0f : 0.0f));
  }
}

void qt_cross_entropy_backward_ref(float *dlogits, const float *probs, const int32_t *labels, float dloss, int N,
                                   int C) {
  if (!dlogits) return;
  for (int i = 0; i < N; i++) {
    check_label(labels[i], i, C);
    for (int j = 0; j < C; j++)
      dlogits[(int64_t)i * C + j] += (float)((double)dloss / N * (probs[(int64_t)i * C + j] - (j == labels[i])));
  }
}
