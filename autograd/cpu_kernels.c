/* Element-wise CPU kernels (relu, relu6, add) and softmax cross-entropy, with their plain reference
 * twins. Element-wise loops are OpenMP `parallel for simd` over contiguous halves; the
 * cross-entropy loss is summed per row and the rows are combined by one thread in order, so
 * the loss is bit-identical run to run whatever the thread count. Batch norm lives in
 * cpu_batch_norm.c, pooling in cpu_pool.c. */
#include "autograd/autograd.h"
#include "autograd/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

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

/* ---- relu / relu6 with the mask as bits ------------------------------------------------ */

/* One element: the output as qt_relu_forward / qt_relu6_forward compute it, and whether the
 * gradient passes (the test of qt_relu_backward / qt_relu6_backward on that output). */
static inline float relu_one(float v, int six, unsigned *pass) {
  const float o = six ? (v < 0.0f ? 0.0f : v > 6.0f ? 6.0f : v) : (v < 0.0f ? 0.0f : v);
  *pass = !(o <= 0.0f) && !(six && o >= 6.0f);
  return o;
}

/* Elements [i0, i1), i0 a multiple of 8, one element at a time. */
static void relu_mask_tail(float *out, uint8_t *mask, const float *inp, int64_t i0, int64_t i1, int six) {
  for (int64_t b = i0; b < i1; b += 8) {
    unsigned m = 0;
    for (int64_t i = b; i < b + 8 && i < i1; i++) {
      unsigned pass;
      out[i] = relu_one(inp[i], six, &pass);
      m |= pass << (i - b);
    }
    mask[b / 8] = (uint8_t)m;
  }
}

/* 64 elements from i: 8 mask bytes. The vector forms compute the scalar expressions exactly:
 * max(0, v) returns v when v is NaN or -0 (the second operand unless 0 > v), as `v < 0 ? 0 : v`;
 * min(6, o) likewise; the passing test is "not less-or-equal" (true on NaN). */
static inline void relu_mask_block(float *out, uint8_t *mask, const float *inp, int six) {
#if defined(__AVX512F__)
  const __m512 zero = _mm512_setzero_ps(), six_v = _mm512_set1_ps(6.0f);
  for (int j = 0; j < 4; j++) {
    __m512 o = _mm512_max_ps(zero, _mm512_loadu_ps(inp + 16 * j));
    __mmask16 k;
    if (six) {
      o = _mm512_min_ps(six_v, o);
      k = _mm512_cmp_ps_mask(o, zero, _CMP_NLE_UQ) & _mm512_cmp_ps_mask(o, six_v, _CMP_NGE_UQ);
    } else {
      k = _mm512_cmp_ps_mask(o, zero, _CMP_NLE_UQ);
    }
    _mm512_storeu_ps(out + 16 * j, o);
    const uint16_t bits = (uint16_t)k;
    memcpy(mask + 2 * j, &bits, 2); /* little endian: elements 0-7 in the first byte */
  }
#elif defined(__AVX2__)
  const __m256 zero = _mm256_setzero_ps(), six_v = _mm256_set1_ps(6.0f);
  for (int j = 0; j < 8; j++) {
    __m256 o = _mm256_max_ps(zero, _mm256_loadu_ps(inp + 8 * j));
    __m256 pass = _mm256_cmp_ps(o, zero, _CMP_NLE_UQ);
    if (six) {
      o = _mm256_min_ps(six_v, o);
      pass = _mm256_and_ps(_mm256_cmp_ps(o, zero, _CMP_NLE_UQ), _mm256_cmp_ps(o, six_v, _CMP_NGE_UQ));
    }
    _mm256_storeu_ps(out + 8 * j, o);
    mask[j] = (uint8_t)_mm256_movemask_ps(pass);
  }
#else
  relu_mask_tail(out, mask, inp, 0, 64, six);
#endif
}

void qt_relu_mask_span(float *out, uint8_t *mask, const float *inp, int64_t i0, int64_t i1, int six) {
  QT_ASSERT(i0 % 8 == 0, "relu mask span starting at %lld (want a multiple of 8)", (long long)i0);
  int64_t i = i0;
  for (; i + 64 <= i1; i += 64) relu_mask_block(out + i, mask + i / 8, inp + i, six);
  relu_mask_tail(out, mask, inp, i, i1, six);
}

void qt_relu_forward_mask(float *out, uint8_t *mask, const float *inp, int64_t n, int six) {
  const int64_t blocks = n / 64;
#pragma omp parallel for schedule(static) if (n >= ELEM_PARALLEL_MIN)
  for (int64_t b = 0; b < blocks; b++) relu_mask_block(out + 64 * b, mask + 8 * b, inp + 64 * b, six);
  relu_mask_tail(out, mask, inp, 64 * blocks, n, six);
}

void qt_relu_forward_mask_ref(float *out, uint8_t *mask, const float *inp, int64_t n, int six) {
  memset(mask, 0, (size_t)((n + 7) / 8));
  (six ? qt_relu6_forward_ref : qt_relu_forward_ref)(out, inp, n);
  for (int64_t i = 0; i < n; i++)
    if (!(out[i] <= 0.0f) && !(six && out[i] >= 6.0f)) mask[i / 8] |= (uint8_t)(1u << (i % 8));
}

/* Elements [i0, i1) one at a time. */
static void relu_grad_tail(float *dinp, int write, const float *dout, const uint8_t *mask, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; i++) {
    const float g = (mask[i / 8] >> (i % 8)) & 1u ? dout[i] : 0.0f;
    dinp[i] = write ? g : dinp[i] + g;
  }
}

static inline void relu_grad_block(float *dinp, int write, const float *dout, const uint8_t *mask) {
#if defined(__AVX512F__)
  for (int j = 0; j < 4; j++) {
    uint16_t bits;
    memcpy(&bits, mask + 2 * j, 2);
    __m512 g = _mm512_maskz_mov_ps((__mmask16)bits, _mm512_loadu_ps(dout + 16 * j));
    if (!write) g = _mm512_add_ps(_mm512_loadu_ps(dinp + 16 * j), g);
    _mm512_storeu_ps(dinp + 16 * j, g);
  }
#elif defined(__AVX2__)
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  for (int j = 0; j < 8; j++) {
    const __m256i m = _mm256_and_si256(_mm256_set1_epi32(mask[j]), lane_bit);
    const __m256 pass = _mm256_castsi256_ps(_mm256_cmpeq_epi32(m, lane_bit));
    __m256 g = _mm256_and_ps(pass, _mm256_loadu_ps(dout + 8 * j));
    if (!write) g = _mm256_add_ps(_mm256_loadu_ps(dinp + 8 * j), g);
    _mm256_storeu_ps(dinp + 8 * j, g);
  }
#else
  relu_grad_tail(dinp, write, dout, mask, 0, 64);
#endif
}

void qt_relu_grad_span(float *dinp, int write, const float *dout, const uint8_t *mask, int64_t i0, int64_t i1) {
  QT_ASSERT(i0 % 8 == 0, "relu gradient span starting at %lld (want a multiple of 8)", (long long)i0);
  int64_t i = i0;
  for (; i + 64 <= i1; i += 64) relu_grad_block(dinp + i, write, dout + i, mask + i / 8);
  relu_grad_tail(dinp, write, dout, mask, i, i1);
}

void qt_relu_grad_span_at(float *d, const uint8_t *mask, int64_t i0, int64_t n) {
  QT_ASSERT(i0 % 8 == 0, "relu gradient span starting at %lld (want a multiple of 8)", (long long)i0);
  const uint8_t *mk = mask + i0 / 8;
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) relu_grad_block(d + j, 1, d + j, mk + j / 8);
  for (; j < n; j++) d[j] = (mk[j / 8] >> (j % 8)) & 1u ? d[j] : 0.0f; /* relu_grad_tail's select */
}

/* No restrict: dinp may be dout (each element is read before it is written). */
void qt_relu_backward_mask(float *dinp, int write, const float *dout, const uint8_t *mask, int64_t n) {
  if (!dinp) return;
  const int64_t blocks = n / 64;
#pragma omp parallel for schedule(static) if (n >= ELEM_PARALLEL_MIN)
  for (int64_t b = 0; b < blocks; b++) relu_grad_block(dinp + 64 * b, write, dout + 64 * b, mask + 8 * b);
  relu_grad_tail(dinp, write, dout, mask, 64 * blocks, n);
}

void qt_relu_backward_mask_ref(float *dinp, int write, const float *dout, const uint8_t *mask, int64_t n) {
  if (!dinp) return;
  for (int64_t i = 0; i < n; i++) {
    const int pass = (mask[i / 8] >> (i % 8)) & 1;
    if (write)
      dinp[i] = pass ? dout[i] : 0.0f;
    else if (pass)
      dinp[i] += dout[i];
    else
      dinp[i] += 0.0f;
  }
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

/* d = dout (write) or d += dout */
static void grad_write_or_add(float *d, int write, const float *dout, int64_t n) {
  if (write) {
#pragma omp parallel for simd schedule(static) if (n >= ELEM_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) d[i] = dout[i];
  } else {
#pragma omp parallel for simd schedule(static) if (n >= ELEM_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) d[i] += dout[i];
  }
}

void qt_add_backward(float *da, int da_write, float *db, int db_write, const float *dout, int64_t n) {
  if (da) grad_write_or_add(da, da_write, dout, n);
  if (db) grad_write_or_add(db, db_write, dout, n);
}

void qt_add_backward_ref(float *da, int da_write, float *db, int db_write, const float *dout, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    if (da) da[i] = (da_write ? 0.0f : da[i]) + dout[i];
    if (db) db[i] = (db_write ? 0.0f : db[i]) + dout[i];
  }
}

/* ---- softmax cross-entropy -------------------------------------------------------------- */

static void check_label(int32_t label, int i, int C) {
  QT_ASSERT(label >= 0 && label < C, "cross_entropy: label %d of row %d is outside [0, %d)", label, i, C);
}

void qt_softmax_row(float *p, const float *x, int64_t C, float *max, float *sum) {
  float m = x[0];
  for (int64_t j = 1; j < C; j++) m = x[j] > m ? x[j] : m;
  float s = 0.0f;
  for (int64_t j = 0; j < C; j++) {
    p[j] = expf(x[j] - m);
    s += p[j];
  }
  const float inv = 1.0f / s;
#pragma omp simd
  for (int64_t j = 0; j < C; j++) p[j] *= inv;
  if (max) *max = m;
  if (sum) *sum = s;
}

/* Softmax of one row into p; returns -log softmax[label], stable (max subtracted). */
static float softmax_row_nll(float *restrict p, const float *restrict x, int32_t label, int C) {
  float m, sum;
  qt_softmax_row(p, x, C, &m, &sum);
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
