/* Private to batch norm on the CPU (kernels.h), shared by its three files:
 *   cpu_batch_norm_stats.c   the training statistics (chunked, merged across processes)
 *   cpu_batch_norm.c         plain batch norm: the apply pass, the training and eval forwards,
 *                            backward, and the reference twins
 *   cpu_batch_norm_pooled.c  batch norm + relu (+ fake quant) + max pool in one pass, and the
 *                            backward of a batch norm whose max pool handed it its gradient
 * The plan, its patterns and the inline bodies below are what both compute with, so a pooled
 * pass produces the bits of the plain passes it replaces. */
#ifndef QT_AUTOGRAD_CPU_BATCH_NORM_INT_H
#define QT_AUTOGRAD_CPU_BATCH_NORM_INT_H

#include "autograd/autograd.h"
#include "autograd/kernels.h"
#include "quant/quant_elem.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define BN_PARALLEL_MIN 32768

/* After channel c's batch statistics (mean m; m2, the sum of squared deviations of count values;
 * is, the inverse standard deviation): the running statistics' update (momentum; the unbiased
 * variance m2 / (count - 1)) and the apply pass's constants, the mean as a float plus its
 * remainder (chi + clo) and gamma * is. Shared with the fused conv1 + batch norm kernel. */
static inline void bn_channel_finish(int c, double m, double m2, int64_t count, double is, float momentum,
                                     const float *gamma, float *running_mean, float *running_var, float *chi,
                                     float *clo, float *ca) {
  if (running_mean)
    running_mean[c] = (float)((double)momentum * m + (1.0 - (double)momentum) * (double)running_mean[c]);
  if (running_var)
    running_var[c] =
        (float)((double)momentum * (m2 / (double)(count - 1)) + (1.0 - (double)momentum) * (double)running_var[c]);
  chi[c] = (float)m;
  clo[c] = (float)(m - (double)chi[c]);
  ca[c] = (float)((gamma ? (double)gamma[c] : 1.0) * is);
}
/* Target floats per reduction chunk: 128 KB, which stays in L2 for the second pass. */
#define BN_CHUNK_ELEMS 32768

typedef struct {
  int64_t M;
  int C;
  int k;              /* rows per pattern */
  int L;              /* k*C floats per pattern */
  int64_t chunk_rows; /* multiple of k */
  int64_t nchunks;
} bn_plan;

static inline int gcd_int(int a, int b) {
  while (b) {
    int t = a % b;
    a = b;
    b = t;
  }
  return a;
}

static inline bn_plan bn_plan_make(int64_t M, int C) {
  bn_plan p = {.M = M, .C = C, .k = 1};
  int64_t lcm = (int64_t)C / gcd_int(C, 16) * 16;
  if (lcm <= 2048) {
    p.k = (int)(lcm / C);
    while ((int64_t)p.k * C < 128) p.k *= 2;
  }
  p.L = p.k * C;
  int64_t groups = BN_CHUNK_ELEMS / p.L;
  if (groups < 16) groups = 16;
  p.chunk_rows = groups * p.k;
  p.nchunks = (M + p.chunk_rows - 1) / p.chunk_rows;
  return p;
}

/* Replicates per-channel values v (C) into a pattern of L floats. */
static inline void pattern_fill(float *rep, const float *v, float dflt, const bn_plan *p) {
  for (int t = 0; t < p->k; t++)
    for (int c = 0; c < p->C; c++) rep[t * p->C + c] = v ? v[c] : dflt;
}

/* Folds the k row-slots of a pattern accumulator into one double per channel. */
static inline void pattern_fold(double *out, const float *acc, const bn_plan *p) {
  for (int c = 0; c < p->C; c++) {
    double s = 0;
    for (int t = 0; t < p->k; t++) s += acc[t * p->C + c];
    out[c] = s;
  }
}

/* Floats per scratch pattern, rounded to whole cache lines so threads never share one. */
static inline size_t pattern_stride(const bn_plan *p) { return ((size_t)p->L + 15) & ~(size_t)15; }

/* Per-thread scratch: nbuf patterns for each thread of the team. */
static inline float *thread_scratch(float *ws, int nbuf, const bn_plan *p) {
  return ws + (size_t)omp_get_thread_num() * (size_t)nbuf * pattern_stride(p);
}

/* 64-byte aligned, so the scratch patterns start on cache lines. */
static inline void *xmalloc(size_t n) {
  void *q = aligned_alloc(64, (n + 63) & ~(size_t)63);
  QT_ASSERT(q, "batch norm: out of memory allocating %zu bytes of scratch", n);
  return q;
}

/* The input as the kernels read it: x, or x / div computed on the fly where a caller fuses a
 * per-channel division into batch norm (drep: the divisors as a pattern, D = 1). A division is
 * the same float operation wherever it runs, so every pass sees exactly the values a division
 * written out first would hold. BN_INLINE bodies are specialized for D = 0 and D = 1. */
#define BN_X(ptr, i, di) (D ? (ptr)[i] / drep[di] : (ptr)[i])
#define BN_INLINE static inline __attribute__((always_inline))

/* dinp (=, or += without dinp_write) for one pattern of rows; called with a literal D (see
 * bn_apply_rows). dinp may be dout (written in place): not restrict; each element is read before
 * it is written. Written as 0 + v when dinp is fresh: the bits of adding to zeros, -0 included. */
BN_INLINE void bn_dinp_rows(float *ig, const float *dg, const float *restrict xg, const float *restrict mrep,
                            const float *restrict gmrep, const float *restrict psrep, const float *restrict arep, int L,
                            int dinp_write, const float *restrict drep, const int D) {
  if (dinp_write) {
#pragma omp simd
    for (int j = 0; j < L; j++) ig[j] = 0.0f + (dg[j] - gmrep[j] - (BN_X(xg, j, j) - mrep[j]) * psrep[j]) * arep[j];
  } else {
#pragma omp simd
    for (int j = 0; j < L; j++) ig[j] += (dg[j] - gmrep[j] - (BN_X(xg, j, j) - mrep[j]) * psrep[j]) * arep[j];
  }
}

/* For C a multiple of 16 with AVX-512 the pooled backward selects each row's gradient in
 * registers (cpu_batch_norm_pooled.c); otherwise it expands a chunk of it into scratch. */
#if defined(__AVX512F__)
#define POOLED512(C) ((C) % 16 == 0)
#else
#define POOLED512(C) 0
#endif

/* ---- cpu_batch_norm_stats.c ---- */

/* The training statistics of inp (or inp / in_div): mean, invstd, the running statistics'
 * update, and the apply pass's per-channel constants: chi + clo, the mean as two floats, and ca,
 * gamma * invstd. inp NHWC (hw 0) or blocked with hw pixels per image: the same bits. */
void qt_bn_train_stats(float *mean, float *invstd, float *chi, float *clo, float *ca, const float *inp,
                       const float *in_div, const float *gamma, float *running_mean, float *running_var, float momentum,
                       float eps, int M, int C, int64_t hw, const qt_batch_sync *sync, int64_t *M_total);

/* ---- cpu_batch_norm_pooled.c ---- */

/* Rows [r0, r0 + rows) of the gradient pg expands to, relu-masked (mask NULL: none), into dy. */
void qt_bn_pool_grad_rows(float *restrict dy, const qt_pool_grad *pg, const uint8_t *mask, int64_t r0, int64_t rows,
                          int C);
#if defined(__AVX512F__)
/* chunk_grad_sums of a pooled gradient selected in registers (C a multiple of 16); x: the whole
 * tensor. */
void qt_bn_chunk_grad_sums_pooled(double *sdy, double *sdyx, const qt_pool_grad *pg, const uint8_t *mask,
                                  const float *x, int64_t r0, int64_t rows, const bn_plan *p, const float *mrep,
                                  float *acc_s, float *acc_p, const float *drep);
#endif
/* bn_dinp of the gradient pg expands to (masked by relu_mask when not NULL); with div_sums, the
 * backward of x / div in the same pass. */
void qt_bn_dinp_pooled(float *dinp, int dinp_write, const qt_pool_grad *pg, const uint8_t *relu_mask, const float *inp,
                       const bn_plan *p, const float *mrep, const float *gmrep, const float *psrep, const float *arep,
                       const float *drep, double *div_sums);

#endif
