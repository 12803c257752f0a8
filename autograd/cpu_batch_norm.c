/* Batch norm over NHWC activations (M = N*H*W rows of C contiguous channels) on the CPU, and
 * its plain reference twins. Semantics are PyTorch's BatchNorm2d: normalize with the biased
 * batch variance, update running stats with the unbiased one (M/(M-1)).
 *
 * Determinism: every reduction cuts the rows into fixed chunks (a function of M and C only,
 * never of the thread count or timing), keeps one double partial per chunk and channel, and
 * one thread combines the partials in chunk order. Results are bit-identical run to run and
 * for any OMP_NUM_THREADS.
 *
 * Vectorization for any C: a chunk is walked as groups of k rows, a "pattern" of L = k*C
 * floats with L a multiple of 16, so the inner loops run over L unit-stride lanes whatever C
 * is; per-channel constants are replicated into patterns of L floats. A float accumulator
 * lane sums only chunk_rows/k values before it is folded into double.
 *
 * Statistics are two-pass inside a chunk (mean, then squares around that mean, the chunk still
 * in cache) and chunks are merged with the exact parallel-variance identity, so a large mean
 * does not cancel the variance.
 *
 * gamma and beta may be NULL (PyTorch's affine=False: 1 and 0). Training with M == 1 aborts:
 * PyTorch refuses it too ("Expected more than 1 value per channel when training"; its native
 * kernel would store a NaN running_var, the unbiased variance being 0/0). */
#include "autograd/autograd.h"
#include "autograd/kernels.h"
#include "qat/quant_elem.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Below this many elements the OpenMP team costs more than it saves. */
#define BN_PARALLEL_MIN 32768
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

static int gcd_int(int a, int b) {
  while (b) {
    int t = a % b;
    a = b;
    b = t;
  }
  return a;
}

static bn_plan bn_plan_make(int64_t M, int C) {
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
static void pattern_fill(float *rep, const float *v, float dflt, const bn_plan *p) {
  for (int t = 0; t < p->k; t++)
    for (int c = 0; c < p->C; c++) rep[t * p->C + c] = v ? v[c] : dflt;
}

/* Folds the k row-slots of a pattern accumulator into one double per channel. */
static void pattern_fold(double *out, const float *acc, const bn_plan *p) {
  for (int c = 0; c < p->C; c++) {
    double s = 0;
    for (int t = 0; t < p->k; t++) s += acc[t * p->C + c];
    out[c] = s;
  }
}

/* Floats per scratch pattern, rounded to whole cache lines so threads never share one. */
static size_t pattern_stride(const bn_plan *p) { return ((size_t)p->L + 15) & ~(size_t)15; }

/* Per-thread scratch: nbuf patterns for each thread of the team. */
static float *thread_scratch(float *ws, int nbuf, const bn_plan *p) {
  return ws + (size_t)omp_get_thread_num() * (size_t)nbuf * pattern_stride(p);
}

/* 64-byte aligned, so the scratch patterns start on cache lines. */
static void *xmalloc(size_t n) {
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

/* ---- training forward ------------------------------------------------------------------- */

/* A chunk's mean from its first pass (dev: the sum of x - rep, rep the chunk's first row): mu, the
 * mean rounded to float, dev then the sum of x - mu; rep becomes mu's pattern for the second pass. */
static void chunk_mean(double *mu, double *dev, float *rep, int64_t rows, const bn_plan *p) {
  const int C = p->C;
  for (int c = 0; c < C; c++) {
    const double shift = rep[c];
    mu[c] = (float)(shift + dev[c] / (double)rows);
    dev[c] += (double)rows * (shift - mu[c]);
  }
  for (int t = 0; t < p->k; t++)
    for (int c = 0; c < C; c++) rep[t * C + c] = (float)mu[c];
}

/* Statistics of one chunk of `rows` rows, per channel: its mean rounded to float (mu), the sum
 * of deviations from that mean (dev, ~0 up to the rounding of mu) and of their squares (sq).
 * The first pass sums x - x[first row] so float lanes hold deviations, not the (possibly large)
 * mean itself; the second pass re-reads the chunk from cache. */
BN_INLINE void chunk_stats_impl(double *mu, double *dev, double *sq, const float *restrict x, int64_t rows,
                                const bn_plan *p, float *restrict acc, float *restrict rep,
                                const float *restrict drep, const int D) {
  const int L = p->L, C = p->C;
  const int64_t groups = rows / p->k, tail = rows - groups * p->k;
  const float *xt = x + groups * L;
  for (int t = 0; t < p->k; t++) /* shift: the chunk's first row */
    for (int c = 0; c < C; c++) rep[t * C + c] = BN_X(x, c, c);
  memset(acc, 0, (size_t)L * sizeof *acc);
  for (int64_t g = 0; g < groups; g++) {
    const float *restrict xg = x + g * L;
#pragma omp simd
    for (int j = 0; j < L; j++) acc[j] += BN_X(xg, j, j) - rep[j];
  }
  for (int64_t t = 0; t < tail; t++)
    for (int c = 0; c < C; c++) acc[c] += BN_X(xt, t * C + c, c) - rep[c];
  pattern_fold(dev, acc, p);
  chunk_mean(mu, dev, rep, rows, p);

  memset(acc, 0, (size_t)L * sizeof *acc);
  for (int64_t g = 0; g < groups; g++) {
    const float *restrict xg = x + g * L;
#pragma omp simd
    for (int j = 0; j < L; j++) {
      float d = BN_X(xg, j, j) - rep[j];
      acc[j] += d * d;
    }
  }
  for (int64_t t = 0; t < tail; t++)
    for (int c = 0; c < C; c++) {
      float d = BN_X(xt, t * C + c, c) - rep[c];
      acc[c] += d * d;
    }
  pattern_fold(sq, acc, p);
}

static void chunk_stats(double *mu, double *dev, double *sq, const float *x, int64_t rows, const bn_plan *p,
                        float *acc, float *rep, const float *drep) {
  if (drep)
    chunk_stats_impl(mu, dev, sq, x, rows, p, acc, rep, drep, 1);
  else
    chunk_stats_impl(mu, dev, sq, x, rows, p, acc, rep, NULL, 0);
}

/* Blocked activations (kernels.h; C % 16 == 0, hw pixels per image): row r's 16-channel block b at
 * blocked_row(r) + b * hw * 16. */
static inline int64_t blocked_row(int64_t r, int64_t hw, int C) { return r / hw * C * hw + r % hw * 16; }

/* One pass of chunk_stats_blocked_impl over 16-channel block b: into acc, per row slot and
 * channel, the sum over rows r0 .. r0 + rows of (x - rep), squared when SQ: chunk_stats_impl's
 * passes lane by lane (slot t of a pattern of KS = p->k rows gets the pattern's row t, the rows
 * after the last whole pattern slot 0, in row order). A block's rows are 16 floats apart within an
 * image; KS is a literal, so the slots' sums stay in registers. */
BN_INLINE void blocked_stats_block(float *restrict acc, const float *restrict x, int64_t r0, int64_t rows, int64_t hw,
                                   int C, int b, const float *restrict rep, const float *restrict drep, const int D,
                                   const int SQ, const int KS) {
  const float *restrict rp = rep + b * 16, *restrict dp = D ? drep + b * 16 : NULL;
  int64_t px = r0 % hw;
  const float *base = x + r0 / hw * C * hw + (int64_t)b * hw * 16; /* the image's block */
  const int64_t groups = rows / KS;
#if defined(__AVX512F__)
  /* the same operations, the slots' sums in registers (GCC keeps them in memory otherwise) */
  __m512 v[8]; /* KS <= 8: C % 16 == 0 makes bn_plan_make's k at most 128 / 16 */
  for (int t = 0; t < KS; t++) v[t] = _mm512_setzero_ps();
  const __m512 rv = _mm512_loadu_ps(rp), dv = D ? _mm512_loadu_ps(dp) : rv;
#define BN_BLOCKED_ROW(T)                                   \
  do {                                                      \
    __m512 xv = _mm512_loadu_ps(base + px * 16);            \
    if (D) xv = _mm512_div_ps(xv, dv);                      \
    const __m512 d = _mm512_sub_ps(xv, rv);                 \
    v[T] = _mm512_add_ps(v[T], SQ ? _mm512_mul_ps(d, d) : d); \
  } while (0)
#else
  for (int t = 0; t < KS; t++)
    for (int j = 0; j < 16; j++) acc[t * C + b * 16 + j] = 0.0f;
#define BN_BLOCKED_ROW(T)                                    \
  do {                                                       \
    const float *restrict xr = base + px * 16;               \
    float *restrict at = acc + (T) * C + b * 16;             \
    _Pragma("omp simd") for (int j = 0; j < 16; j++) {       \
      const float d = (D ? xr[j] / dp[j] : xr[j]) - rp[j];   \
      at[j] += SQ ? d * d : d;                               \
    }                                                        \
  } while (0)
#endif
  for (int64_t g = 0; g < groups; g++)
    for (int t = 0; t < KS; t++) {
      BN_BLOCKED_ROW(t);
      if (++px == hw) px = 0, base += (int64_t)C * hw;
    }
  for (int64_t r = groups * KS; r < rows; r++) { /* the tail rows: slot 0 */
    BN_BLOCKED_ROW(0);
    if (++px == hw) px = 0, base += (int64_t)C * hw;
  }
#undef BN_BLOCKED_ROW
#if defined(__AVX512F__)
  for (int t = 0; t < KS; t++) _mm512_storeu_ps(acc + t * C + b * 16, v[t]);
#endif
}

/* The pass over every block (acc: the pattern of p->k row slots). */
BN_INLINE void blocked_stats_pass(float *restrict acc, const float *restrict x, int64_t r0, int64_t rows, int64_t hw,
                                  const bn_plan *p, const float *restrict rep, const float *restrict drep, const int D,
                                  const int SQ) {
  for (int b = 0; b < p->C / 16; b++) switch (p->k) {
      case 1: blocked_stats_block(acc, x, r0, rows, hw, p->C, b, rep, drep, D, SQ, 1); break;
      case 2: blocked_stats_block(acc, x, r0, rows, hw, p->C, b, rep, drep, D, SQ, 2); break;
      case 4: blocked_stats_block(acc, x, r0, rows, hw, p->C, b, rep, drep, D, SQ, 4); break;
      default:
        QT_ASSERT(p->k == 8, "batch norm: %d rows per pattern of %d channels", p->k, p->C);
        blocked_stats_block(acc, x, r0, rows, hw, p->C, b, rep, drep, D, SQ, 8);
        break;
    }
}

/* chunk_stats_impl of rows r0 .. r0 + rows of a blocked input x (the whole tensor): the same
 * operations on the same values in the same order, so the same bits. */
BN_INLINE void chunk_stats_blocked_impl(double *mu, double *dev, double *sq, const float *restrict x, int64_t r0,
                                        int64_t rows, int64_t hw, const bn_plan *p, float *restrict acc,
                                        float *restrict rep, const float *restrict drep, const int D) {
  const int C = p->C;
  const float *x0 = x + blocked_row(r0, hw, C);
  for (int t = 0; t < p->k; t++) /* shift: the chunk's first row */
    for (int c = 0; c < C; c++) rep[t * C + c] = BN_X(x0, c / 16 * hw * 16 + c % 16, c);
  blocked_stats_pass(acc, x, r0, rows, hw, p, rep, drep, D, 0);
  pattern_fold(dev, acc, p);
  chunk_mean(mu, dev, rep, rows, p);
  blocked_stats_pass(acc, x, r0, rows, hw, p, rep, drep, D, 1);
  pattern_fold(sq, acc, p);
}

static void chunk_stats_blocked(double *mu, double *dev, double *sq, const float *x, int64_t r0, int64_t rows,
                                int64_t hw, const bn_plan *p, float *acc, float *rep, const float *drep) {
  if (drep)
    chunk_stats_blocked_impl(mu, dev, sq, x, r0, rows, hw, p, acc, rep, drep, 1);
  else
    chunk_stats_blocked_impl(mu, dev, sq, x, r0, rows, hw, p, acc, rep, NULL, 0);
}

/* One pattern of rows: og = ((x - mhi) - mlo) * a + b (mlo NULL: 0). Called with a literal D
 * from inside the parallel loops below (OpenMP outlines a parallel region before inlining, so the
 * loops are written out per D rather than in an always-inline body taking D). */
BN_INLINE void bn_apply_rows(float *og, const float *xg, const float *restrict mhi, const float *restrict mlo,
                             const float *restrict arep, const float *restrict brep, int L,
                             const float *restrict drep, const int D) {
  if (mlo) {
#pragma omp simd
    for (int j = 0; j < L; j++) og[j] = ((BN_X(xg, j, j) - mhi[j]) - mlo[j]) * arep[j] + brep[j];
  } else {
#pragma omp simd
    for (int j = 0; j < L; j++) og[j] = (BN_X(xg, j, j) - mhi[j]) * arep[j] + brep[j];
  }
}

/* out = ((x - mhi) - mlo) * a + b over all M rows, per-channel constants given as patterns (x
 * divided on the fly by drep when not NULL), then the relu and its mask when relu_mask. mhi + mlo
 * is the batch mean split into two floats (mlo NULL: 0), so a mean much larger than the spread
 * still yields outputs exact to float rounding. out may equal x (in-place eval BN), so neither
 * is restrict-qualified. */
static void bn_apply(float *out, const float *x, const float *mhi, const float *mlo, const float *arep,
                     const float *brep, const bn_plan *p, uint8_t *relu_mask, int six, const float *drep) {
  const int L = p->L, C = p->C;
  const int64_t groups = p->M / p->k, tail = p->M - groups * p->k;
  /* L is a multiple of 16: a pattern's relu mask bytes are its own */
  if (drep) {
#pragma omp parallel for schedule(static) if (p->M * C >= BN_PARALLEL_MIN)
    for (int64_t g = 0; g < groups; g++) {
      bn_apply_rows(out + g * L, x + g * L, mhi, mlo, arep, brep, L, drep, 1);
      if (relu_mask) qt_relu_mask_span(out, relu_mask, out, g * L, (g + 1) * L, six);
    }
  } else {
#pragma omp parallel for schedule(static) if (p->M * C >= BN_PARALLEL_MIN)
    for (int64_t g = 0; g < groups; g++) {
      bn_apply_rows(out + g * L, x + g * L, mhi, mlo, arep, brep, L, NULL, 0);
      if (relu_mask) qt_relu_mask_span(out, relu_mask, out, g * L, (g + 1) * L, six);
    }
  }
  for (int64_t t = 0; t < tail; t++) {
    const float *xt = x + (groups * p->k + t) * C;
    float *ot = out + (groups * p->k + t) * C;
    for (int c = 0; c < C; c++)
      ot[c] = (((drep ? xt[c] / drep[c] : xt[c]) - mhi[c]) - (mlo ? mlo[c] : 0.0f)) * arep[c] + brep[c];
  }
  if (relu_mask && tail) qt_relu_mask_span(out, relu_mask, out, groups * L, p->M * C, six);
}

/* SyncBN: replaces this process's per-channel (mean m, centred sum of squares m2) over M rows by
 * the whole batch's, merging every process's in process order; returns the total rows. */
static int64_t bn_merge_processes(double *m, double *m2, int64_t M, int C, const qt_batch_sync *sync) {
  const int R = sync->size;
  const int64_t n = 1 + 2 * (int64_t)C;
  double *send = xmalloc((size_t)(R + 1) * (size_t)n * sizeof(double)), *all = send + n;
  send[0] = (double)M;
  memcpy(send + 1, m, (size_t)C * sizeof(double));
  memcpy(send + 1 + C, m2, (size_t)C * sizeof(double));
  sync->allgather_f64(send, n, all);
  double total = 0;
  for (int r = 0; r < R; r++) total += all[r * n];
  for (int c = 0; c < C; c++) {
    double s = 0;
    for (int r = 0; r < R; r++) s += all[r * n] * all[r * n + 1 + c];
    const double mean = s / total;
    double q = 0;
    for (int r = 0; r < R; r++) {
      const double d = all[r * n + 1 + c] - mean;
      q += all[r * n + 1 + C + c] + all[r * n] * d * d;
    }
    m[c] = mean;
    m2[c] = q;
  }
  free(send);
  return (int64_t)total;
}

void qt_batch_norm_forward_train(float *out, float *mean, float *invstd, const float *inp,
                                 const float *gamma, const float *beta, float *running_mean,
                                 float *running_var, float momentum, float eps, int M, int C) {
  int64_t total;
  qt_batch_norm_forward_train_sync(out, mean, invstd, inp, gamma, beta, running_mean, running_var, momentum, eps, M, C,
                                   NULL, &total);
}

void qt_batch_norm_forward_train_sync(float *out, float *mean, float *invstd, const float *inp,
                                      const float *gamma, const float *beta, float *running_mean,
                                      float *running_var, float momentum, float eps, int M, int C,
                                      const qt_batch_sync *sync, int64_t *M_total) {
  qt_batch_norm_relu_forward_train(out, NULL, 0, mean, invstd, inp, NULL, gamma, beta, running_mean, running_var,
                                   momentum, eps, M, C, sync, M_total);
}

/* The training statistics of inp (or inp / in_div): mean, invstd, the running statistics'
 * update, and the apply pass's per-channel constants: chi + clo, the mean as two floats, and ca,
 * gamma * invstd. inp NHWC (hw 0) or blocked with hw pixels per image: the same bits. */
static void bn_train_stats(float *mean, float *invstd, float *chi, float *clo, float *ca, const float *inp,
                           const float *in_div, const float *gamma, float *running_mean, float *running_var,
                           float momentum, float eps, int M, int C, int64_t hw, const qt_batch_sync *sync,
                           int64_t *M_total) {
  const int synced = sync && sync->size > 1;
  QT_ASSERT((synced ? M > 0 : M > 1) && C > 0,
            "batch_norm_forward_train: needs more than one value per channel (M=%d, C=%d), as PyTorch", M, C);
  const bn_plan p = bn_plan_make(M, C);
  const int nthreads = omp_get_max_threads();
  const size_t npart = (size_t)p.nchunks * (size_t)C;
  double *part = xmalloc(3 * npart * sizeof(double));
  double *pmu = part, *pdev = part + npart, *psq = part + 2 * npart;
  float *ws = xmalloc(((size_t)nthreads * 2 + 1) * pattern_stride(&p) * sizeof(float));
  /* the divisors' pattern, read by every thread, after the threads' scratch */
  float *drep = in_div ? ws + (size_t)nthreads * 2 * pattern_stride(&p) : NULL;
  if (drep) pattern_fill(drep, in_div, 1.0f, &p);

#pragma omp parallel for schedule(static) if ((int64_t)M * C >= BN_PARALLEL_MIN)
  for (int64_t i = 0; i < p.nchunks; i++) {
    float *scratch = thread_scratch(ws, 2, &p);
    int64_t r0 = i * p.chunk_rows, rows = p.M - r0 < p.chunk_rows ? p.M - r0 : p.chunk_rows;
    if (hw)
      chunk_stats_blocked(pmu + i * C, pdev + i * C, psq + i * C, inp, r0, rows, hw, &p, scratch,
                          scratch + pattern_stride(&p), drep);
    else
      chunk_stats(pmu + i * C, pdev + i * C, psq + i * C, inp + r0 * C, rows, &p, scratch,
                  scratch + pattern_stride(&p), drep);
  }

  /* Merge the chunks in order (exact parallel-variance identity). */
  double *stat_m = xmalloc(2 * (size_t)C * sizeof(double)), *stat_m2 = stat_m + C; /* per channel */
  for (int c = 0; c < C; c++) {
    double s = 0;
    for (int64_t i = 0; i < p.nchunks; i++) {
      const double n = (double)(p.M - i * p.chunk_rows < p.chunk_rows ? p.M - i * p.chunk_rows : p.chunk_rows);
      s += n * pmu[i * C + c] + pdev[i * C + c];
    }
    const double m = s / (double)M;
    double m2 = 0;
    for (int64_t i = 0; i < p.nchunks; i++) {
      const double n = (double)(p.M - i * p.chunk_rows < p.chunk_rows ? p.M - i * p.chunk_rows : p.chunk_rows);
      const double dm = pmu[i * C + c] - m;
      m2 += psq[i * C + c] + 2.0 * dm * pdev[i * C + c] + n * dm * dm;
    }
    if (m2 < 0) m2 = 0;
    stat_m[c] = m;
    stat_m2[c] = m2;
  }
  int64_t Mt = M;
  if (synced) {
    Mt = bn_merge_processes(stat_m, stat_m2, M, C, sync);
    QT_ASSERT(Mt > 1, "batch_norm_forward_train: needs more than one value per channel over all processes (%lld)",
              (long long)Mt);
  }
  *M_total = Mt;
  for (int c = 0; c < C; c++) {
    const double m = stat_m[c], m2 = stat_m2[c];
    const double var = m2 / (double)Mt;
    const double is = 1.0 / sqrt(var + (double)eps);
    mean[c] = (float)m;
    invstd[c] = (float)is;
    if (running_mean)
      running_mean[c] = (float)((double)momentum * m + (1.0 - (double)momentum) * (double)running_mean[c]);
    if (running_var)
      running_var[c] = (float)((double)momentum * (m2 / (double)(Mt - 1)) +
                               (1.0 - (double)momentum) * (double)running_var[c]);
    chi[c] = (float)m;
    clo[c] = (float)(m - (double)chi[c]);
    ca[c] = (float)((gamma ? (double)gamma[c] : 1.0) * is);
  }
  free(stat_m);
  free(ws);
  free(part);
}

void qt_batch_norm_relu_forward_train(float *out, uint8_t *relu_mask, int six, float *mean, float *invstd,
                                      const float *inp, const float *in_div, const float *gamma, const float *beta,
                                      float *running_mean, float *running_var, float momentum, float eps, int M,
                                      int C, const qt_batch_sync *sync, int64_t *M_total) {
  const bn_plan p = bn_plan_make(M > 0 ? M : 1, C > 0 ? C : 1);
  const size_t ps = pattern_stride(&p);
  /* the apply pass's patterns, then the per-channel constants they replicate */
  float *ws = xmalloc((5 * ps + 3 * (size_t)(C > 0 ? C : 1)) * sizeof(float));
  float *mhi = ws, *mlo = ws + ps, *arep = ws + 2 * ps, *brep = ws + 3 * ps, *drep = in_div ? ws + 4 * ps : NULL;
  float *chi = ws + 5 * ps, *clo = chi + C, *ca = clo + C;
  bn_train_stats(mean, invstd, chi, clo, ca, inp, in_div, gamma, running_mean, running_var, momentum, eps, M, C, 0,
                 sync, M_total);
  pattern_fill(mhi, chi, 0, &p);
  pattern_fill(mlo, clo, 0, &p);
  pattern_fill(arep, ca, 0, &p);
  pattern_fill(brep, beta, 0, &p);
  if (drep) pattern_fill(drep, in_div, 1.0f, &p);
  bn_apply(out, inp, mhi, mlo, arep, brep, &p, relu_mask, six, drep);
  free(ws);
}

/* One normalized, relu'd value (bn_pool_band's, before the fake quant): selects on the bits, so
 * the loops around it vectorize (select_bits, qat/quant_elem.h). */
BN_INLINE float bn_pool_value(float x, float div, float chi, float clo, float ca, float bb, const int RELU,
                              const int D) {
  float v = (((D ? x / div : x) - chi) - clo) * ca + bb;
  if (RELU) v = select_bits(0.0f > v, 0.0f, v);
  if (RELU == 2) v = select_bits(6.0f < v, 6.0f, v);
  return v;
}

/* One row of windows (output row oh of an image) of qt_batch_norm_relu_pool_forward_train, with
 * literal RELU, FQ, D (a divisor) and BLK (img blocked, hw pixels: kernels.h; else NHWC): each
 * input normalized as bn_apply_rows does, clamped as relu_mask_block does (max(0, v) and min(6, v)
 * as x86 computes them: NaN and -0 kept), quantized as qt_fake_quant_forward does, and pooled with
 * max pool's comparison in its window order; with FQ, ya tracks the relu's output at the argmax.
 * The outputs are NHWC either way. */
BN_INLINE void bn_pool_band(float *out, int32_t *argmax, float *yarg, uint8_t *qmask, const float *img, int64_t o_row,
                            int oh, int W, int OW, int C, int64_t hw, int K, const float *restrict chi,
                            const float *restrict clo, const float *restrict ca, const float *restrict bb,
                            const float *restrict div, const qt_fq_params *fq, float *ya_scratch, const int RELU,
                            const int FQ, const int D, const int BLK) {
  const float s = FQ ? fq->scale : 1.0f, inv_s = 1.0f / s, zpf = FQ ? (float)fq->zero_point : 0.0f;
  const float lo = FQ ? (float)fq->qmin : 0.0f, hi = FQ ? (float)fq->qmax : 0.0f;
  /* lanes: NHWC all C channels of a pixel at once; blocked 16 at a time, blocks hw * 16 apart */
  const int NB = BLK ? C / 16 : 1, LW = BLK ? 16 : C, XS = BLK ? 16 : C;
  const int64_t BS = BLK ? hw * 16 : 0;
  for (int ow = 0; ow < OW; ow++) {
    const int64_t o = o_row + (int64_t)ow * C;
    const int32_t first = oh * K * W + ow * K;
    for (int b = 0; b < NB; b++) {
      const int c0 = b * LW;
      float *restrict mv = out + o + c0;
      int32_t *restrict mi = argmax + o + c0;
      float *restrict ya = (yarg ? yarg + o : ya_scratch) + c0;
      const float *restrict ch = chi + c0, *restrict cl = clo + c0, *restrict cs = ca + c0, *restrict cb = bb + c0;
      const float *restrict dv = D ? div + c0 : NULL;
      const float *restrict p0 = img + (int64_t)first * XS + b * BS;
      if (K == 2) {
        /* the 2x2 window written out inside the lanes' loop, so the running max stays in
         * registers: the same operations in the same order as the loops below */
        const int64_t o1 = XS, o2 = (int64_t)W * XS, o3 = (int64_t)(W + 1) * XS;
#pragma omp simd
        for (int c = 0; c < LW; c++) {
          const float d = D ? dv[c] : 1.0f;
          const float v0 = bn_pool_value(p0[c], d, ch[c], cl[c], cs[c], cb[c], RELU, D);
          float m = FQ ? quant_fake(v0, s, inv_s, zpf, lo, hi) : v0, y = v0;
          int32_t at = first;
#define BN_POOL_TAKE(OFF, IDX)                                                                            \
  do {                                                                                                    \
    const float v = bn_pool_value(p0[(OFF) + c], d, ch[c], cl[c], cs[c], cb[c], RELU, D);                 \
    const float q = FQ ? quant_fake(v, s, inv_s, zpf, lo, hi) : v;                 \
    const int take = (q > m) | (q != q);                                                                  \
    m = select_bits(take, q, m);                                                                          \
    at = take ? (IDX) : at;                                                                               \
    if (FQ) y = select_bits(take, v, y);                                                                  \
  } while (0)
          BN_POOL_TAKE(o1, first + 1);
          BN_POOL_TAKE(o2, first + W);
          BN_POOL_TAKE(o3, first + W + 1);
#undef BN_POOL_TAKE
          mv[c] = m;
          mi[c] = at;
          if (FQ) ya[c] = y;
        }
        continue;
      }
#pragma omp simd
      for (int c = 0; c < LW; c++) {
        const float v = bn_pool_value(p0[c], D ? dv[c] : 1.0f, ch[c], cl[c], cs[c], cb[c], RELU, D);
        mv[c] = FQ ? quant_fake(v, s, inv_s, zpf, lo, hi) : v;
        mi[c] = first;
        if (FQ) ya[c] = v;
      }
      /* the window after its first element, in max pool's order and with its comparison */
      for (int kh = 0; kh < K; kh++)
        for (int kw = kh == 0 ? 1 : 0; kw < K; kw++) {
          const int32_t idx = first + kh * W + kw;
          const float *restrict p = img + (int64_t)idx * XS + b * BS;
#pragma omp simd
          for (int c = 0; c < LW; c++) {
            const float v = bn_pool_value(p[c], D ? dv[c] : 1.0f, ch[c], cl[c], cs[c], cb[c], RELU, D);
            const float q = FQ ? quant_fake(v, s, inv_s, zpf, lo, hi) : v;
            const int take = (q > mv[c]) | (q != q);
            mv[c] = select_bits(take, q, mv[c]);
            mi[c] = take ? idx : mi[c];
            if (FQ) ya[c] = select_bits(take, v, ya[c]);
          }
        }
    }
    float *restrict ya = yarg ? yarg + o : ya_scratch;
    if (FQ && qmask)
      for (int c = 0; c < C; c++) {
        const float q = quant_round(ya[c], inv_s, zpf);
        qmask[o + c] = (uint8_t)((q >= lo) & (q <= hi) & qt_relu_passes(ya[c], RELU));
      }
  }
}

void qt_batch_norm_relu_pool_forward_train(float *out, int32_t *argmax, float *yarg, uint8_t *qmask, float *mean,
                                           float *invstd, const float *inp, const float *in_div, const float *gamma,
                                           const float *beta, float *running_mean, float *running_var,
                                           float momentum, float eps, int N, int H, int W, int C, int blocked, int K,
                                           int relu, const qt_fq_params *fq, const qt_batch_sync *sync,
                                           int64_t *M_total) {
  QT_ASSERT(N >= 1 && C >= 1 && K >= 1 && H >= K && W >= K && H % K == 0 && W % K == 0 && relu >= 0 && relu <= 2 &&
                (fq || (!qmask && !yarg)) && (!fq || fq->qmin < fq->qmax) && (!blocked || C % 16 == 0),
            "batch_norm_relu_pool_forward_train: %dx%dx%dx%d input not tiled by %dx%d windows, relu %d, a mask "
            "or argmax values without a fake quant, or blocked (%d) without C %% 16 == 0",
            N, H, W, C, K, K, relu, blocked);
  const int M = N * H * W, OH = H / K, OW = W / K;
  const int nthreads = omp_get_max_threads();
  /* per channel: the mean as two floats, gamma * invstd, beta (0 without), then ya per thread */
  float *ws = xmalloc((4 + (size_t)nthreads) * (size_t)C * sizeof(float));
  float *chi = ws, *clo = ws + C, *ca = ws + 2 * C, *bb = ws + 3 * C;
  const int64_t hw = (int64_t)H * W;
  bn_train_stats(mean, invstd, chi, clo, ca, inp, in_div, gamma, running_mean, running_var, momentum, eps, M, C,
                 blocked ? hw : 0, sync, M_total);
  for (int c = 0; c < C; c++) bb[c] = beta ? beta[c] : 0.0f;
  const int variant = ((relu * 2 + (fq != NULL)) * 2 + (in_div != NULL)) * 2 + (blocked != 0);
#pragma omp parallel for collapse(2) schedule(static) if ((int64_t)M * C >= BN_PARALLEL_MIN)
  for (int n = 0; n < N; n++)
    for (int oh = 0; oh < OH; oh++) {
      const float *img = inp + (int64_t)n * H * W * C;
      const int64_t o_row = ((int64_t)n * OH + oh) * OW * C;
      float *ya = ws + (4 + (size_t)omp_get_thread_num()) * (size_t)C;
#define BN_POOL_BAND(R, F, D, B) \
  bn_pool_band(out, argmax, yarg, qmask, img, o_row, oh, W, OW, C, hw, K, chi, clo, ca, bb, in_div, fq, ya, R, F, D, B)
      switch (variant) {
        case 0: BN_POOL_BAND(0, 0, 0, 0); break;
        case 1: BN_POOL_BAND(0, 0, 0, 1); break;
        case 2: BN_POOL_BAND(0, 0, 1, 0); break;
        case 3: BN_POOL_BAND(0, 0, 1, 1); break;
        case 4: BN_POOL_BAND(0, 1, 0, 0); break;
        case 5: BN_POOL_BAND(0, 1, 0, 1); break;
        case 6: BN_POOL_BAND(0, 1, 1, 0); break;
        case 7: BN_POOL_BAND(0, 1, 1, 1); break;
        case 8: BN_POOL_BAND(1, 0, 0, 0); break;
        case 9: BN_POOL_BAND(1, 0, 0, 1); break;
        case 10: BN_POOL_BAND(1, 0, 1, 0); break;
        case 11: BN_POOL_BAND(1, 0, 1, 1); break;
        case 12: BN_POOL_BAND(1, 1, 0, 0); break;
        case 13: BN_POOL_BAND(1, 1, 0, 1); break;
        case 14: BN_POOL_BAND(1, 1, 1, 0); break;
        case 15: BN_POOL_BAND(1, 1, 1, 1); break;
        case 16: BN_POOL_BAND(2, 0, 0, 0); break;
        case 17: BN_POOL_BAND(2, 0, 0, 1); break;
        case 18: BN_POOL_BAND(2, 0, 1, 0); break;
        case 19: BN_POOL_BAND(2, 0, 1, 1); break;
        case 20: BN_POOL_BAND(2, 1, 0, 0); break;
        case 21: BN_POOL_BAND(2, 1, 0, 1); break;
        case 22: BN_POOL_BAND(2, 1, 1, 0); break;
        default: BN_POOL_BAND(2, 1, 1, 1); break;
      }
#undef BN_POOL_BAND
    }
  free(ws);
}

void qt_batch_norm_forward_train_ref(float *out, float *mean, float *invstd, const float *inp,
                                     const float *gamma, const float *beta, float *running_mean,
                                     float *running_var, float momentum, float eps, int M, int C) {
  QT_ASSERT(M > 1 && C > 0,
            "batch_norm_forward_train_ref: needs more than one value per channel (M=%d, C=%d)", M, C);
  for (int c = 0; c < C; c++) {
    double s = 0;
    for (int64_t r = 0; r < M; r++) s += inp[r * C + c];
    const double m = s / M;
    double q = 0;
    for (int64_t r = 0; r < M; r++) {
      const double d = inp[r * C + c] - m;
      q += d * d;
    }
    const double is = 1.0 / sqrt(q / M + (double)eps);
    const double g = gamma ? gamma[c] : 1.0, b = beta ? beta[c] : 0.0;
    for (int64_t r = 0; r < M; r++) out[r * C + c] = (float)((inp[r * C + c] - m) * is * g + b);
    mean[c] = (float)m;
    invstd[c] = (float)is;
    if (running_mean) running_mean[c] = (float)(momentum * m + (1.0 - momentum) * running_mean[c]);
    if (running_var) running_var[c] = (float)(momentum * (q / (M - 1)) + (1.0 - momentum) * running_var[c]);
  }
}

/* ---- eval forward ----------------------------------------------------------------------- */

void qt_batch_norm_forward_eval(float *out, const float *inp, const float *gamma, const float *beta,
                                const float *running_mean, const float *running_var, float eps,
                                int M, int C) {
  qt_batch_norm_forward_eval_div(out, inp, NULL, gamma, beta, running_mean, running_var, eps, M, C);
}

void qt_batch_norm_forward_eval_div(float *out, const float *inp, const float *in_div, const float *gamma,
                                    const float *beta, const float *running_mean, const float *running_var, float eps,
                                    int M, int C) {
  QT_ASSERT(M > 0 && C > 0, "batch_norm_forward_eval: empty input (M=%d, C=%d)", M, C);
  const bn_plan p = bn_plan_make(M, C);
  float *ws = xmalloc(6 * (size_t)p.L * sizeof(float));
  float *drep = in_div ? ws + 5 * p.L : NULL;
  if (drep) pattern_fill(drep, in_div, 1.0f, &p);
  float *mrep = ws, *arep = ws + p.L, *brep = ws + 2 * p.L, *ca = ws + 3 * p.L;
  for (int c = 0; c < C; c++)
    ca[c] = (float)((gamma ? (double)gamma[c] : 1.0) / sqrt((double)running_var[c] + (double)eps));
  pattern_fill(mrep, running_mean, 0, &p);
  pattern_fill(arep, ca, 0, &p);
  pattern_fill(brep, beta, 0, &p);
  bn_apply(out, inp, mrep, NULL, arep, brep, &p, NULL, 0, drep);
  free(ws);
}

void qt_batch_norm_forward_eval_ref(float *out, const float *inp, const float *gamma,
                                    const float *beta, const float *running_mean,
                                    const float *running_var, float eps, int M, int C) {
  for (int c = 0; c < C; c++) {
    const double is = 1.0 / sqrt((double)running_var[c] + (double)eps);
    const double g = gamma ? gamma[c] : 1.0, b = beta ? beta[c] : 0.0;
    for (int64_t r = 0; r < M; r++) out[r * C + c] = (float)((inp[r * C + c] - running_mean[c]) * is * g + b);
  }
}

/* ---- backward ---------------------------------------------------------------------------- */

/* Per-chunk sums of dout and of dout*(x - mean), one double per chunk and channel; for the
 * eval backward (dx_scale != NULL) the chunk also does dinp += dout * dx_scale in the same pass. */
BN_INLINE void chunk_grad_sums_impl(double *sdy, double *sdyx, float *dinp, int dinp_write, const float *dout,
                                    const float *restrict x, int64_t rows, const bn_plan *p,
                                    const float *restrict mrep, const float *restrict dx_scale,
                                    float *restrict acc_s, float *restrict acc_p, const float *restrict drep,
                                    const int D) {
  const int L = p->L, C = p->C;
  const int64_t groups = rows / p->k, tail = rows - groups * p->k;
  memset(acc_s, 0, (size_t)L * sizeof *acc_s);
  memset(acc_p, 0, (size_t)L * sizeof *acc_p);
  if (dinp && dx_scale && dinp_write) { /* a fresh dinp: written as 0 + v, the bits of adding to zeros */
    for (int64_t g = 0; g < groups; g++) {
      /* dinp may be dout (written in place): each element is read before it is written */
      const float *restrict xg = x + g * L, *dg = dout + g * L;
      float *ig = dinp + g * L;
#pragma omp simd
      for (int j = 0; j < L; j++) {
        acc_s[j] += dg[j];
        acc_p[j] += dg[j] * (BN_X(xg, j, j) - mrep[j]);
        ig[j] = 0.0f + dg[j] * dx_scale[j];
      }
    }
  } else if (dinp && dx_scale) {
    for (int64_t g = 0; g < groups; g++) {
      const float *restrict xg = x + g * L, *restrict dg = dout + g * L;
      float *restrict ig = dinp + g * L;
#pragma omp simd
      for (int j = 0; j < L; j++) {
        acc_s[j] += dg[j];
        acc_p[j] += dg[j] * (BN_X(xg, j, j) - mrep[j]);
        ig[j] += dg[j] * dx_scale[j];
      }
    }
  } else {
    for (int64_t g = 0; g < groups; g++) {
      const float *restrict xg = x + g * L, *restrict dg = dout + g * L;
#pragma omp simd
      for (int j = 0; j < L; j++) {
        acc_s[j] += dg[j];
        acc_p[j] += dg[j] * (BN_X(xg, j, j) - mrep[j]);
      }
    }
  }
  for (int64_t t = 0; t < tail; t++) {
    const int64_t o = groups * L + t * C;
    for (int c = 0; c < C; c++) {
      acc_s[c] += dout[o + c];
      acc_p[c] += dout[o + c] * (BN_X(x, o + c, c) - mrep[c]);
      if (dinp && dx_scale) dinp[o + c] = (dinp_write ? 0.0f : dinp[o + c]) + dout[o + c] * dx_scale[c];
    }
  }
  pattern_fold(sdy, acc_s, p);
  pattern_fold(sdyx, acc_p, p);
}

static void chunk_grad_sums(double *sdy, double *sdyx, float *dinp, int dinp_write, const float *dout,
                            const float *x, int64_t rows, const bn_plan *p, const float *mrep, const float *dx_scale,
                            float *acc_s, float *acc_p, const float *drep) {
  if (drep)
    chunk_grad_sums_impl(sdy, sdyx, dinp, dinp_write, dout, x, rows, p, mrep, dx_scale, acc_s, acc_p, drep, 1);
  else
    chunk_grad_sums_impl(sdy, sdyx, dinp, dinp_write, dout, x, rows, p, mrep, dx_scale, acc_s, acc_p, NULL, 0);
}

/* Where a row's gradient comes from in a pooled backward: the row's window and position, advanced
 * one row at a time (pool_grad_rows' walk, for the fused loops below). */
typedef struct {
  int64_t n;
  int h, w, oh, kh, ow, kw;
} pool_walk;

static pool_walk pool_walk_at(const qt_pool_grad *pg, int64_t r0) {
  const int64_t HW = (int64_t)pg->H * pg->W;
  pool_walk q = {.n = r0 / HW};
  q.h = (int)((r0 - q.n * HW) / pg->W);
  q.w = (int)(r0 - q.n * HW - (int64_t)q.h * pg->W);
  q.oh = q.h / pg->KH, q.kh = q.h - q.oh * pg->KH, q.ow = q.w / pg->KW, q.kw = q.w - q.ow * pg->KW;
  return q;
}

static inline void pool_walk_next(pool_walk *q, const qt_pool_grad *pg) {
  if (++q->kw == pg->KW) q->kw = 0, q->ow++;
  if (++q->w == pg->W) {
    q->w = q->ow = q->kw = 0;
    if (++q->kh == pg->KH) q->kh = 0, q->oh++;
    if (++q->h == pg->H) q->h = q->oh = q->kh = 0, q->n++;
  }
}

/* The row's output offset (its window's, times C). */
static inline int64_t pool_walk_out(const pool_walk *q, const qt_pool_grad *pg, int C) {
  return ((q->n * (pg->H / pg->KH) + q->oh) * (pg->W / pg->KW) + q->ow) * C;
}

/* Rows [r0, r0 + rows) of the gradient pg expands to, relu-masked (mask NULL: none), into dy:
 * (pass && argmax) ? val : +0, the bits of the pool's backward into a fresh buffer (argmax ? 0 +
 * d : 0 + 0) then the relu's mask (a select of that or +0). r0 * C is a multiple of 8 (chunks
 * are whole patterns). The row's image, position and window advance one row at a time. */
static void pool_grad_rows(float *restrict dy, const qt_pool_grad *pg, const uint8_t *mask, int64_t r0,
                           int64_t rows, int C) {
  pool_walk q = pool_walk_at(pg, r0);
  for (int64_t r = 0; r < rows; r++) {
    const int64_t o = pool_walk_out(&q, pg, C);
    const int32_t idx = q.h * pg->W + q.w;
    const float *restrict v = pg->val + o;
    const int32_t *restrict am = pg->argmax + o;
    float *restrict d = dy + r * C;
#pragma omp simd
    for (int c = 0; c < C; c++) d[c] = am[c] == idx ? v[c] : 0.0f;
    pool_walk_next(&q, pg);
  }
  if (mask) qt_relu_grad_span_at(dy, mask, r0 * C, rows * C);
}

#if defined(__AVX512F__)
/* For C a multiple of 16 with AVX-512: the pooled passes with each row's gradient selected in
 * registers (argmax == position, and the relu mask's 16 bits, as one lane mask over val), never
 * stored. The sums and dinp are the expressions of chunk_grad_sums_impl and bn_dinp_rows, lane by
 * lane, in the same order per accumulator (row t of a pattern adds to slot t; tail rows to slot
 * 0), so the bits are those of the expanded path. */
#define POOLED512(C) ((C) % 16 == 0)

static inline __mmask16 pooled_select(const int32_t *am, int32_t idx, const uint8_t *mask, int64_t bit) {
  __mmask16 sel = _mm512_cmpeq_epi32_mask(_mm512_loadu_si512(am), _mm512_set1_epi32(idx));
  if (mask) {
    uint16_t bits;
    memcpy(&bits, mask + bit / 8, 2);
    sel &= (__mmask16)bits;
  }
  return sel;
}

/* Where row r (at image q->n's pixel idx) has its channels (NHWC) or its first 16-channel block
 * (pg->blocked) in x, the whole tensor. */
static inline const float *pooled_row(const float *x, const pool_walk *q, int32_t idx, int64_t r, const qt_pool_grad *pg,
                                      int C) {
  return pg->blocked ? x + q->n * C * pg->H * pg->W + (int64_t)idx * 16 : x + r * C;
}

/* x: the whole tensor. */
static void chunk_grad_sums_pooled(double *sdy, double *sdyx, const qt_pool_grad *pg, const uint8_t *mask,
                                   const float *x, int64_t r0, int64_t rows, const bn_plan *p,
                                   const float *mrep, float *acc_s, float *acc_p, const float *drep) {
  const int C = p->C, k = p->k;
  const int64_t bs = pg->blocked ? (int64_t)pg->H * pg->W * 16 : 16;
  const int64_t grouped = rows / k * k;
  memset(acc_s, 0, (size_t)p->L * sizeof *acc_s);
  memset(acc_p, 0, (size_t)p->L * sizeof *acc_p);
  pool_walk q = pool_walk_at(pg, r0);
  int t = 0;
  for (int64_t r = 0; r < rows; r++) {
    const int64_t o = pool_walk_out(&q, pg, C);
    const int32_t idx = q.h * pg->W + q.w;
    const int slot = r < grouped ? t : 0;
    const float *xr = pooled_row(x, &q, idx, r0 + r, pg, C);
    for (int c = 0; c < C; c += 16) {
      const __m512 dy = _mm512_maskz_loadu_ps(pooled_select(pg->argmax + o + c, idx, mask, (r0 + r) * C + c),
                                              pg->val + o + c);
      __m512 xv = _mm512_loadu_ps(xr + c / 16 * bs); /* this 16-channel block's */
      if (drep) xv = _mm512_div_ps(xv, _mm512_loadu_ps(drep + c));
      const __m512 d = _mm512_sub_ps(xv, _mm512_loadu_ps(mrep + c));
      float *as = acc_s + slot * C + c, *ap = acc_p + slot * C + c;
      _mm512_storeu_ps(as, _mm512_add_ps(_mm512_loadu_ps(as), dy));
      _mm512_storeu_ps(ap, _mm512_add_ps(_mm512_loadu_ps(ap), _mm512_mul_ps(dy, d)));
    }
    if (++t == k) t = 0;
    pool_walk_next(&q, pg);
  }
  pattern_fold(sdy, acc_s, p);
  pattern_fold(sdyx, acc_p, p);
}

/* x and dinp: the whole tensors. */
static void chunk_dinp_pooled(float *dinp, int dinp_write, const qt_pool_grad *pg, const uint8_t *mask,
                              const float *x, int64_t r0, int64_t rows, int C, const float *mrep,
                              const float *gmrep, const float *psrep, const float *arep, const float *drep,
                              float *qx) {
  const int64_t bs = pg->blocked ? (int64_t)pg->H * pg->W * 16 : 16;
  pool_walk q = pool_walk_at(pg, r0);
  if (qx) memset(qx, 0, (size_t)((rows + QT_CHANNEL_SUM_ROWS - 1) / QT_CHANNEL_SUM_ROWS) * (size_t)C * sizeof *qx);
  for (int64_t r = 0; r < rows; r++) {
    float *qs = qx ? qx + r / QT_CHANNEL_SUM_ROWS * C : NULL; /* the row's segment's partials */
    const int64_t o = pool_walk_out(&q, pg, C);
    const int32_t idx = q.h * pg->W + q.w;
    const float *xr = pooled_row(x, &q, idx, r0 + r, pg, C);
    float *ir = dinp + (xr - x); /* the same layout */
    for (int c = 0; c < C; c += 16) {
      const float *xb = xr + c / 16 * bs; /* this 16-channel block's */
      float *ib = ir + c / 16 * bs;
      const __m512 dy = _mm512_maskz_loadu_ps(pooled_select(pg->argmax + o + c, idx, mask, (r0 + r) * C + c),
                                              pg->val + o + c);
      __m512 xv = _mm512_loadu_ps(xb);
      if (drep) xv = _mm512_div_ps(xv, _mm512_loadu_ps(drep + c));
      const __m512 xm = _mm512_mul_ps(_mm512_sub_ps(xv, _mm512_loadu_ps(mrep + c)), _mm512_loadu_ps(psrep + c));
      const __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_sub_ps(dy, _mm512_loadu_ps(gmrep + c)), xm),
                                     _mm512_loadu_ps(arep + c));
      if (qx) { /* v is the quotient's gradient (0 + v, a fresh buffer's bits): divided into dinp, and its
                 * products with x summed */
        const __m512 dq = _mm512_add_ps(_mm512_setzero_ps(), v);
        _mm512_storeu_ps(qs + c, _mm512_add_ps(_mm512_loadu_ps(qs + c), _mm512_mul_ps(dq, _mm512_loadu_ps(xb))));
        const __m512 dx = _mm512_div_ps(dq, _mm512_loadu_ps(drep + c));
        _mm512_storeu_ps(ib, dinp_write ? dx : _mm512_add_ps(_mm512_loadu_ps(ib), dx));
        continue;
      }
      const __m512 base = dinp_write ? _mm512_setzero_ps() : _mm512_loadu_ps(ib);
      _mm512_storeu_ps(ib, _mm512_add_ps(base, v));
    }
    pool_walk_next(&q, pg);
  }
}
#else
#define POOLED512(C) 0
#endif

int qt_batch_norm_pool_takes_blocked(int C) { return C % 16 == 0 && POOLED512(C); }

/* Reduces sum(dout) and sum(dout*(x-mean)) per channel into sdy/sdyx (C doubles each),
 * deterministically; with dx_scale also applies the eval dinp update in the same pass. */
static void bn_grad_sums(double *sdy, double *sdyx, float *dinp, int dinp_write, const float *dout,
                         const float *inp, const float *mrep, const float *dx_scale, const bn_plan *p,
                         float *relu_dout, const uint8_t *relu_mask, const float *drep, const qt_pool_grad *pg) {
  const int C = p->C;
  const int nthreads = omp_get_max_threads();
  const size_t npart = (size_t)p->nchunks * (size_t)C;
  double *part = xmalloc(2 * npart * sizeof(double));
  /* per thread: the two accumulator patterns, then (pg) a chunk of the expanded gradient */
  const size_t per_thread = 2 * pattern_stride(p) + (pg && !POOLED512(C) ? (size_t)p->chunk_rows * (size_t)C : 0);
  float *ws = xmalloc((size_t)nthreads * per_thread * sizeof(float));
#pragma omp parallel for schedule(static) if (p->M * C >= BN_PARALLEL_MIN)
  for (int64_t i = 0; i < p->nchunks; i++) {
    float *scratch = ws + (size_t)omp_get_thread_num() * per_thread;
    int64_t r0 = i * p->chunk_rows, rows = p->M - r0 < p->chunk_rows ? p->M - r0 : p->chunk_rows;
    const float *dchunk = dout ? dout + r0 * C : NULL;
    if (pg && POOLED512(C)) {
#if defined(__AVX512F__)
      chunk_grad_sums_pooled(part + i * C, part + npart + i * C, pg, relu_mask, inp, r0, rows, p, mrep, scratch,
                             scratch + pattern_stride(p), drep);
#endif
      continue;
    }
    if (pg) { /* the chunk's gradient expanded (and masked) into scratch */
      float *dy = scratch + 2 * pattern_stride(p);
      pool_grad_rows(dy, pg, relu_mask, r0, rows, C);
      dchunk = dy;
    } else if (relu_mask) {
      /* fused relu backward: the chunk's gradient masked in place just before it is summed
       * (chunks are whole patterns, so their mask bytes are their own) */
      qt_relu_grad_span(relu_dout, 1, relu_dout, relu_mask, r0 * C, (r0 + rows) * C);
    }
    chunk_grad_sums(part + i * C, part + npart + i * C, dinp ? dinp + r0 * C : NULL, dinp_write, dchunk,
                    inp + r0 * C, rows, p, mrep, dx_scale, scratch, scratch + pattern_stride(p), drep);
  }
  for (int c = 0; c < C; c++) {
    double s = 0, q = 0;
    for (int64_t i = 0; i < p->nchunks; i++) {
      s += part[i * C + c];
      q += part[npart + i * C + c];
    }
    sdy[c] = s;
    sdyx[c] = q;
  }
  free(ws);
  free(part);
}

void qt_batch_norm_backward(float *dinp, float *dgamma, float *dbeta, const float *dout,
                            const float *inp, const float *mean, const float *invstd,
                            const float *gamma, int M, int C) {
  qt_batch_norm_backward_sync(dinp, 0, dgamma, dbeta, dout, inp, mean, invstd, gamma, M, C, NULL, M);
}

static void bn_backward(float *dinp, int dinp_write, float *dgamma, float *dbeta, const float *dout,
                        const float *inp, const float *in_div, const float *mean, const float *invstd,
                        const float *gamma, int M, int C, const qt_batch_sync *sync, int64_t M_total,
                        float *relu_dout, const uint8_t *relu_mask, const qt_pool_grad *pg, double *div_sums);

void qt_batch_norm_backward_sync(float *dinp, int dinp_write, float *dgamma, float *dbeta, const float *dout,
                                 const float *inp, const float *mean, const float *invstd,
                                 const float *gamma, int M, int C, const qt_batch_sync *sync,
                                 int64_t M_total) {
  bn_backward(dinp, dinp_write, dgamma, dbeta, dout, inp, NULL, mean, invstd, gamma, M, C, sync, M_total, NULL, NULL,
              NULL, NULL);
}

void qt_batch_norm_relu_backward(float *dinp, int dinp_write, float *dgamma, float *dbeta, float *dout,
                                 const uint8_t *relu_mask, const float *inp, const float *in_div, const float *mean,
                                 const float *invstd, const float *gamma, int M, int C, const qt_batch_sync *sync,
                                 int64_t M_total) {
  bn_backward(dinp, dinp_write, dgamma, dbeta, dout, inp, in_div, mean, invstd, gamma, M, C, sync, M_total, dout,
              relu_mask, NULL, NULL);
}

void qt_batch_norm_relu_backward_pooled(float *dinp, int dinp_write, float *dgamma, float *dbeta,
                                        const qt_pool_grad *pg, const uint8_t *relu_mask, const float *inp,
                                        const float *in_div, double *div_sums, const float *mean,
                                        const float *invstd, const float *gamma, int M, int C,
                                        const qt_batch_sync *sync, int64_t M_total) {
  QT_ASSERT(pg && pg->KH >= 1 && pg->KW >= 1 && pg->H % pg->KH == 0 && pg->W % pg->KW == 0 &&
                (int64_t)pg->N * pg->H * pg->W == M,
            "batch_norm_backward_pooled: %dx%dx%d input not tiled by %dx%d windows or not %d rows", pg ? pg->N : 0,
            pg ? pg->H : 0, pg ? pg->W : 0, pg ? pg->KH : 0, pg ? pg->KW : 0, M);
  QT_ASSERT(!div_sums || (in_div && dinp), "batch_norm_backward_pooled: the divisor's sums need a divisor and dinp");
  bn_backward(dinp, dinp_write, dgamma, dbeta, NULL, inp, in_div, mean, invstd, gamma, M, C, sync, M_total, NULL,
              relu_mask, pg, div_sums);
}

/* dinp (=, or += without dinp_write) for one pattern of rows; called with a literal D (see
 * bn_apply_rows). dinp may be dout (written in place): not restrict; each element is read before
 * it is written. Written as 0 + v when dinp is fresh: the bits of adding to zeros, -0 included. */
BN_INLINE void bn_dinp_rows(float *ig, const float *dg, const float *restrict xg, const float *restrict mrep,
                            const float *restrict gmrep, const float *restrict psrep, const float *restrict arep,
                            int L, int dinp_write, const float *restrict drep, const int D) {
  if (dinp_write) {
#pragma omp simd
    for (int j = 0; j < L; j++) ig[j] = 0.0f + (dg[j] - gmrep[j] - (BN_X(xg, j, j) - mrep[j]) * psrep[j]) * arep[j];
  } else {
#pragma omp simd
    for (int j = 0; j < L; j++) ig[j] += (dg[j] - gmrep[j] - (BN_X(xg, j, j) - mrep[j]) * psrep[j]) * arep[j];
  }
}

/* dinp (=, or += without dinp_write) from dout and the per-channel patterns, over all rows. */
static void bn_dinp(float *dinp, int dinp_write, const float *dout, const float *inp, const bn_plan *p,
                    const float *mrep, const float *gmrep, const float *psrep, const float *arep, const float *drep) {
  const int L = p->L, C = p->C;
  const int64_t groups = p->M / p->k, tail = p->M - groups * p->k;
  if (drep) {
#pragma omp parallel for schedule(static) if (p->M * C >= BN_PARALLEL_MIN)
    for (int64_t g = 0; g < groups; g++)
      bn_dinp_rows(dinp + g * L, dout + g * L, inp + g * L, mrep, gmrep, psrep, arep, L, dinp_write, drep, 1);
  } else {
#pragma omp parallel for schedule(static) if (p->M * C >= BN_PARALLEL_MIN)
    for (int64_t g = 0; g < groups; g++)
      bn_dinp_rows(dinp + g * L, dout + g * L, inp + g * L, mrep, gmrep, psrep, arep, L, dinp_write, NULL, 0);
  }
  for (int64_t t = 0; t < tail; t++) {
    const int64_t o = (groups * p->k + t) * C;
    for (int c = 0; c < C; c++)
      dinp[o + c] = (dinp_write ? 0.0f : dinp[o + c]) +
                    (dout[o + c] - gmrep[c] - ((drep ? inp[o + c] / drep[c] : inp[o + c]) - mrep[c]) * psrep[c]) *
                        arep[c];
  }
}

/* bn_dinp of the gradient pg expands to (masked by relu_mask when not NULL), a reduction chunk at
 * a time into thread scratch: the same per-element expressions as bn_dinp, so the same bits. With
 * div_sums (and drep): the quotient's gradient dq (as bn_dinp writes it into a fresh buffer) is
 * divided by the divisor into dinp (written, or added to) and div_sums gets per channel the sum of
 * dq * x (float over QT_CHANNEL_SUM_ROWS rows from each chunk's start, then double in order),
 * channel_scale's backward of x / div in the same pass. */
static void bn_dinp_pooled(float *dinp, int dinp_write, const qt_pool_grad *pg, const uint8_t *relu_mask,
                           const float *inp, const bn_plan *p, const float *mrep, const float *gmrep,
                           const float *psrep, const float *arep, const float *drep, double *div_sums) {
  const int L = p->L, C = p->C;
  const size_t per_thread = POOLED512(C) ? 1 : (size_t)p->chunk_rows * (size_t)C;
  float *ws = xmalloc((size_t)omp_get_max_threads() * per_thread * sizeof(float));
  const int64_t spc = (p->chunk_rows + QT_CHANNEL_SUM_ROWS - 1) / QT_CHANNEL_SUM_ROWS; /* segments per chunk */
  float *part = div_sums ? xmalloc((size_t)(p->nchunks * spc) * (size_t)C * sizeof(float)) : NULL;
#pragma omp parallel for schedule(static) if (p->M * C >= BN_PARALLEL_MIN)
  for (int64_t i = 0; i < p->nchunks; i++) {
    float *dy = ws + (size_t)omp_get_thread_num() * per_thread;
    const int64_t r0 = i * p->chunk_rows, rows = p->M - r0 < p->chunk_rows ? p->M - r0 : p->chunk_rows;
    float *qx = part ? part + i * spc * C : NULL;
    if (POOLED512(C)) {
#if defined(__AVX512F__)
      chunk_dinp_pooled(dinp, dinp_write, pg, relu_mask, inp, r0, rows, C, mrep, gmrep, psrep, arep, drep, qx);
#endif
      continue;
    }
    pool_grad_rows(dy, pg, relu_mask, r0, rows, C);
    const int64_t groups = rows / p->k, tail = rows - groups * p->k;
    /* with div_sums: the quotient's gradient into dy itself (bn_dinp_rows allows that), then below */
    float *di = qx ? dy : dinp + r0 * C;
    const int write = qx ? 1 : dinp_write;
    const float *xi = inp + r0 * C;
    for (int64_t g = 0; g < groups; g++) {
      if (drep)
        bn_dinp_rows(di + g * L, dy + g * L, xi + g * L, mrep, gmrep, psrep, arep, L, write, drep, 1);
      else
        bn_dinp_rows(di + g * L, dy + g * L, xi + g * L, mrep, gmrep, psrep, arep, L, write, NULL, 0);
    }
    for (int64_t t = 0; t < tail; t++) { /* bn_dinp's tail rows: only the last chunk has any */
      const int64_t o = (groups * p->k + t) * C;
      for (int c = 0; c < C; c++)
        di[o + c] = (write ? 0.0f : di[o + c]) +
                    (dy[o + c] - gmrep[c] - ((drep ? xi[o + c] / drep[c] : xi[o + c]) - mrep[c]) * psrep[c]) *
                        arep[c];
    }
    if (qx) {
      float *out = dinp + r0 * C;
      for (int64_t r = 0; r < rows; r++) {
        float *qs = qx + r / QT_CHANNEL_SUM_ROWS * C;
        if (r % QT_CHANNEL_SUM_ROWS == 0)
          for (int c = 0; c < C; c++) qs[c] = 0.0f;
        for (int c = 0; c < C; c++) {
          const float dq = dy[r * C + c];
          qs[c] += dq * xi[r * C + c];
          out[r * C + c] = dinp_write ? dq / drep[c] : out[r * C + c] + dq / drep[c];
        }
      }
    }
  }
  if (part) { /* every chunk's segments in order (the last chunk's past its rows unused) */
    for (int c = 0; c < C; c++) div_sums[c] = 0;
    for (int64_t i = 0; i < p->nchunks; i++) {
      const int64_t rows = p->M - i * p->chunk_rows < p->chunk_rows ? p->M - i * p->chunk_rows : p->chunk_rows;
      for (int64_t j = 0; j < (rows + QT_CHANNEL_SUM_ROWS - 1) / QT_CHANNEL_SUM_ROWS; j++)
        for (int c = 0; c < C; c++) div_sums[c] += part[(i * spc + j) * C + c];
    }
    free(part);
  }
  free(ws);
}

/* relu_mask: dout (== relu_dout) is masked in place, chunk by chunk, in the sums pass; pg (dout
 * NULL): the gradient is expanded from a pool's, chunk by chunk, in both passes. */
static void bn_backward(float *dinp, int dinp_write, float *dgamma, float *dbeta, const float *dout,
                        const float *inp, const float *in_div, const float *mean, const float *invstd,
                        const float *gamma, int M, int C, const qt_batch_sync *sync, int64_t M_total,
                        float *relu_dout, const uint8_t *relu_mask, const qt_pool_grad *pg, double *div_sums) {
  const int synced = sync && sync->size > 1;
  /* every process takes part in the sums' reduction, whatever gradients it wants */
  if (!dinp && !dgamma && !dbeta && !synced) return;
  QT_ASSERT(M > 0 && C > 0, "batch_norm_backward: empty input (M=%d, C=%d)", M, C);
  QT_ASSERT(!pg || !pg->blocked || qt_batch_norm_pool_takes_blocked(C),
            "batch_norm_backward_pooled: a blocked input with %d channels, which this build's kernels do not take", C);
  const bn_plan p = bn_plan_make(M, C);
  double *sums = xmalloc(4 * (size_t)C * sizeof(double));
  float *ws = xmalloc(8 * (size_t)p.L * sizeof(float));
  float *mrep = ws, *gmrep = ws + p.L, *psrep = ws + 2 * p.L, *arep = ws + 3 * p.L;
  float *cg = ws + 4 * p.L, *cp = ws + 5 * p.L, *ca = ws + 6 * p.L;
  float *drep = in_div ? ws + 7 * p.L : NULL;
  if (drep) pattern_fill(drep, in_div, 1.0f, &p);
  pattern_fill(mrep, mean, 0, &p);
  bn_grad_sums(sums, sums + C, NULL, 0, dout, inp, mrep, NULL, &p, relu_dout, relu_mask, drep, pg);
  /* dgamma/dbeta from this process's sums; dinp from the whole batch's */
  double *all = sums + 2 * C;
  memcpy(all, sums, 2 * (size_t)C * sizeof(double));
  if (synced) sync->sum_f64(all, 2 * (int64_t)C);
  if (!synced) M_total = M;
  for (int c = 0; c < C; c++) {
    const double sdy = sums[c], sdyx = sums[C + c], is = invstd[c];
    if (dbeta) dbeta[c] += (float)sdy;
    if (dgamma) dgamma[c] += (float)(sdyx * is);
    cg[c] = (float)(all[c] / M_total);
    cp[c] = (float)(is * is * all[C + c] / M_total);
    ca[c] = (float)((gamma ? (double)gamma[c] : 1.0) * is);
  }
  if (dinp) {
    pattern_fill(gmrep, cg, 0, &p);
    pattern_fill(psrep, cp, 0, &p);
    pattern_fill(arep, ca, 0, &p);
    if (pg)
      bn_dinp_pooled(dinp, dinp_write, pg, relu_mask, inp, &p, mrep, gmrep, psrep, arep, drep, div_sums);
    else
      bn_dinp(dinp, dinp_write, dout, inp, &p, mrep, gmrep, psrep, arep, drep);
  }
  free(ws);
  free(sums);
}

void qt_batch_norm_backward_ref(float *dinp, float *dgamma, float *dbeta, const float *dout,
                                const float *inp, const float *mean, const float *invstd,
                                const float *gamma, int M, int C) {
  for (int c = 0; c < C; c++) {
    double sdy = 0, sdyx = 0;
    for (int64_t r = 0; r < M; r++) {
      sdy += dout[r * C + c];
      sdyx += (double)dout[r * C + c] * ((double)inp[r * C + c] - mean[c]);
    }
    const double is = invstd[c], g = gamma ? gamma[c] : 1.0;
    if (dbeta) dbeta[c] += (float)sdy;
    if (dgamma) dgamma[c] += (float)(sdyx * is);
    if (dinp)
      for (int64_t r = 0; r < M; r++)
        dinp[r * C + c] += (float)(g * is *
                                   (dout[r * C + c] - sdy / M - ((double)inp[r * C + c] - mean[c]) * is * is * sdyx / M));
  }
}

void qt_batch_norm_backward_eval(float *dinp, float *dgamma, float *dbeta, const float *dout,
                                 const float *inp, const float *mean, const float *invstd,
                                 const float *gamma, int M, int C) {
  qt_batch_norm_backward_eval_ex(dinp, 0, dgamma, dbeta, dout, inp, NULL, mean, invstd, gamma, M, C);
}

void qt_batch_norm_backward_eval_ex(float *dinp, int dinp_write, float *dgamma, float *dbeta, const float *dout,
                                    const float *inp, const float *in_div, const float *mean, const float *invstd,
                                    const float *gamma, int M, int C) {
  if (!dinp && !dgamma && !dbeta) return;
  QT_ASSERT(M > 0 && C > 0, "batch_norm_backward_eval: empty input (M=%d, C=%d)", M, C);
  const bn_plan p = bn_plan_make(M, C);
  float *ws = xmalloc(4 * (size_t)p.L * sizeof(float));
  float *mrep = ws, *arep = ws + p.L, *ca = ws + 2 * p.L;
  float *drep = in_div ? ws + 3 * p.L : NULL;
  if (drep) pattern_fill(drep, in_div, 1.0f, &p);
  for (int c = 0; c < C; c++) ca[c] = (float)((gamma ? (double)gamma[c] : 1.0) * (double)invstd[c]);
  pattern_fill(arep, ca, 0, &p);
  if (dgamma || dbeta) {
    double *sums = xmalloc(2 * (size_t)C * sizeof(double));
    pattern_fill(mrep, mean, 0, &p);
    bn_grad_sums(sums, sums + C, dinp, dinp_write, dout, inp, mrep, arep, &p, NULL, NULL, drep, NULL);
    for (int c = 0; c < C; c++) {
      if (dbeta) dbeta[c] += (float)sums[c];
      if (dgamma) dgamma[c] += (float)(sums[C + c] * (double)invstd[c]);
    }
    free(sums);
  } else {
    const int L = p.L;
    const int64_t groups = p.M / p.k, tail = p.M - groups * p.k;
#pragma omp parallel for schedule(static) if ((int64_t)M * C >= BN_PARALLEL_MIN)
    for (int64_t g = 0; g < groups; g++) {
      const float *dg = dout + g * L; /* dinp may be dout when written */
      float *ig = dinp + g * L;
      if (dinp_write) {
#pragma omp simd
        for (int j = 0; j < L; j++) ig[j] = 0.0f + dg[j] * arep[j];
      } else {
#pragma omp simd
        for (int j = 0; j < L; j++) ig[j] += dg[j] * arep[j];
      }
    }
    for (int64_t t = 0; t < tail; t++) {
      const int64_t o = (groups * p.k + t) * C;
      for (int c = 0; c < C; c++) dinp[o + c] = (dinp_write ? 0.0f : dinp[o + c]) + dout[o + c] * arep[c];
    }
  }
  free(ws);
}

void qt_batch_norm_backward_eval_ref(float *dinp, float *dgamma, float *dbeta, const float *dout,
                                     const float *inp, const float *mean, const float *invstd,
                                     const float *gamma, int M, int C) {
  for (int c = 0; c < C; c++) {
    double sdy = 0, sdyx = 0;
    const double is = invstd[c], g = gamma ? gamma[c] : 1.0;
    for (int64_t r = 0; r < M; r++) {
      sdy += dout[r * C + c];
      sdyx += (double)dout[r * C + c] * ((double)inp[r * C + c] - mean[c]);
      if (dinp) dinp[r * C + c] += (float)(dout[r * C + c] * g * is);
    }
    if (dbeta) dbeta[c] += (float)sdy;
    if (dgamma) dgamma[c] += (float)(sdyx * is);
  }
}
